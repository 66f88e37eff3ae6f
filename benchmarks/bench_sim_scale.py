"""Scale on the engines: seconds per round and peak memory with 100, 1,000 and 10,000 clients, 100 a round.

    python benchmarks/bench_sim_scale.py --engines workers flower-sim --clients 100 1000 10000 --rounds 4

The synthetic 8x8 image set of ``bench_scale.py`` (60 samples per client, a real dataset's shape) is
split IID over N clients; every round asks 100 of them (seeded), so a round's work is the same
whatever N is. fl-proto (no private state: what grows with N is the engine's bookkeeping, not the
states). Each (engine, N) runs in its own process; its peak memory is the largest sum of resident
memory of that process and every process below it (worker processes, Ray's raylet and actors),
sampled every 0.5 s. ``workers`` uses 2 worker processes; ``flower-sim`` a private Ray instance with
one CPU per client actor (2 actors here). Round 1 (start-up) and the last round (which always
scores the final model) are left out of the median; no other round's clock includes an evaluation
(``eval.every`` past the last round).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_scale import config as scale_config  # noqa: E402
from bench_scale import write_data  # noqa: E402


def tree_rss_mb(pid: int) -> float:
    from fedfew.flower.simulation import _descendants

    total = 0
    for p in {pid} | _descendants(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def config(engine: str, clients: int, data: Path, rounds: int) -> dict:
    cfg = scale_config("fl-proto", clients, data, rounds)
    cfg["algorithm"] = {"name": "fl-proto", "options": {"local_steps": 2}}
    cfg["federation"]["clients_per_round"] = 100
    cfg["eval"]["every"] = rounds + 1  # only the last round evaluates (the final model's scores)
    cfg["runtime"].update(checkpoint_every=0, client_states="auto")
    if engine == "workers":
        cfg["runtime"]["workers"] = 2
    else:
        cfg["runtime"]["engine"] = engine
        cfg["flower"] = {"sim": {"num_cpus": 1, "init_args": {"num_cpus": 2}}, "startup_timeout": 3000,
                         "round_timeout": 3000}
    return cfg


def one(args: argparse.Namespace) -> None:
    from fedfew.config import load_config
    from fedfew.runner import run_experiment

    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss_mb(os.getpid()))
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    summary = run_experiment(load_config(json.loads(args.config)), args.out, progress=False)
    total = time.perf_counter() - started
    stop.set()
    sampler.join()
    seconds = [h["seconds"] for h in summary["history"]]
    rounds = [b - a for a, b in zip([0.0] + seconds[:-1], seconds)]
    print(json.dumps({"round_s": statistics.median(rounds[1:-1]), "first_round_s": rounds[0],
                      "peak_mb": peak[0], "total_s": total}))


def run_one(cfg: str, out: Path, timeout: float) -> subprocess.CompletedProcess[str] | None:
    """Run one measurement in a child; past ``timeout``, end it and every process below it (Ray's)."""
    import signal

    from fedfew.flower.simulation import _descendants

    child = subprocess.Popen([sys.executable, __file__, "--one", "--config", cfg, "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in _descendants(child.pid) | {child.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        child.communicate()
        return None
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=["workers", "flower-sim"])
    parser.add_argument("--clients", nargs="+", type=int, default=[100, 1000, 10000])
    parser.add_argument("--rounds", type=int, default=4, help="at least 3 (rounds 2..R-1 are timed)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per (engine, clients) run")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3: rounds 2..R-1 are timed")
    if args.one:
        one(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"load average before: {open('/proc/loadavg').read().split()[:3]}", flush=True)
        print("| engine | clients | s/round (median of rounds 2..R-1) | round 1 s | peak memory MB (process tree) | wall s |")
        print("|---|---|---|---|---|---|", flush=True)
        for clients in args.clients:
            data = write_data(folder, clients)
            for engine in args.engines:
                cfg = json.dumps(config(engine, clients, data, args.rounds))
                done = run_one(cfg, folder / "runs", args.timeout)
                if done is None:
                    print(f"| {engine} | {clients:,} | not finished within {args.timeout:.0f} s | | | |", flush=True)
                    continue
                if done.returncode != 0:
                    print(f"| {engine} | {clients} | failed: {done.stderr.strip().splitlines()[-1:]} | | | |")
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"| {engine} | {clients:,} | {r['round_s']:.2f} | {r['first_round_s']:.1f} | {r['peak_mb']:.0f} "
                      f"| {r['total_s']:.0f} |", flush=True)
        print(f"load average after: {open('/proc/loadavg').read().split()[:3]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
