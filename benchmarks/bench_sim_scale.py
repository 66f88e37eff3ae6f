"""Scale on the engines: seconds per round, start-up and peak memory with 100 to 100,000 clients, 100 a round.

    nice -n 10 python benchmarks/bench_sim_scale.py --engines flower-sim --clients 100 1000 10000 --rounds 4
    nice -n 10 python benchmarks/bench_sim_scale.py --engines workers --clients 10000 100000 --rounds 4

The synthetic 8x8 image set of ``bench_scale.py`` (60 samples per client, a real dataset's shape) is
split IID over N clients; every round asks 100 of them (seeded), so a round's work is the same
whatever N is. fl-proto (no private state: what grows with N is the engine's bookkeeping, not the
states). Each (engine, N) runs in its own process. ``workers`` uses 2 worker processes;
``flower-sim`` a private Ray instance with one CPU per client actor (2 actors here). Round 1 and the
last round (which always scores the final model) are left out of the median; no other round's clock
includes an evaluation (``eval.every`` past the last round).

Each run reports:

* **s/round**: the median of rounds 2..R-1 (the run's own per-round clock);
* **start-up**: the seconds from ``run_experiment``'s call to the start of round 1 (reading the data,
  starting the engine, scoring the initial model) and, for ``flower-sim``, its parts: Ray and the
  Simulation Engine up to the ServerApp's Grid (``ray_and_engine``), writing the N node caches
  (``node_caches``), and the ``query`` that every node answers once (``query_nodes``). The child prints
  each part as it ends, so a run cut off by ``--timeout`` still says how far it got;
* **memory**, sampled every 0.5 s from this (parent) process: the main process's resident set (its
  exact peak, ``ru_maxrss``, when the run finishes), and the whole process tree (the run's process and
  every process below it: worker processes; Ray's GCS, raylet, agents and actors) twice: the sum of
  resident sets (RSS; counts pages shared copy-on-write by forked workers once per process) and the
  sum of proportional sets (PSS, ``/proc/PID/smaps_rollup``: shared pages split between their sharers,
  so it is the memory the tree really takes);
* the load average before and after the run: the machine may be shared, read each row with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
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

PHASE = "bench-phase"  # the child's stderr lines: "bench-phase NAME SECONDS"


def _descendants(pid: int) -> set[int]:
    from fedfew.flower.simulation import _descendants as below

    return below(pid)


def _field_kb(path: str, field: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory_mb(pid: int) -> tuple[float, float, float]:
    """(RSS of ``pid``, RSS summed over its tree, PSS summed over its tree), in MB."""
    tree = {pid} | _descendants(pid)
    rss = {p: _field_kb(f"/proc/{p}/status", "VmRSS:") for p in tree}
    pss = sum(_field_kb(f"/proc/{p}/smaps_rollup", "Pss:") for p in tree)
    return rss.get(pid, 0) / 1024, sum(rss.values()) / 1024, pss / 1024


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


# -- the child: one (engine, clients) run ---------------------------------------------------------
def phase(name: str, seconds: float) -> None:
    print(f"{PHASE} {name} {seconds:.1f}", file=sys.stderr, flush=True)


def instrument(started: list[float]) -> dict[str, float]:
    """Wrap (in this child only) the calls whose time makes up the start-up: the start of round 1
    (``Simulator.play``'s first call) and, for flower-sim, the Simulation Engine's start, the node
    caches and the ``query`` of every node. Returns the dict the wrappers fill (seconds); each part is
    also printed to stderr when it ends."""
    from fedfew.engine.simulator import Simulator

    phases: dict[str, float] = {}
    play = Simulator.play

    def first_play(self, *a, **k):  # type: ignore[no-untyped-def]
        if "startup" not in phases:
            phases["startup"] = time.perf_counter() - started[0]
            phase("startup", phases["startup"])
        return play(self, *a, **k)

    Simulator.play = first_play  # type: ignore[method-assign]
    try:
        from fedfew.flower import simulation
        from fedfew.flower.engine import FlowerEngine
    except ImportError:  # flwr not installed: workers only
        return phases

    def timed(owner: object, name: str, key: str, report: bool = True) -> None:
        inner = getattr(owner, name)

        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            if key == "query_nodes" and "node_caches" in phases:  # the caches are all written by now
                phase("node_caches", phases["node_caches"])
            t = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                phases[key] = phases.get(key, 0.0) + time.perf_counter() - t
                if report:
                    phase(key, phases[key])

        setattr(owner, name, wrapper)

    timed(simulation.Simulation, "__init__", "ray_and_engine")
    timed(simulation, "cache_client", "node_caches", report=False)  # once per node: reported in total
    timed(FlowerEngine, "_connect", "query_nodes")
    return phases


def one(args: argparse.Namespace) -> None:
    from fedfew.config.validation import load_config
    from fedfew.run.runner import run_experiment

    started = [time.perf_counter()]
    phases = instrument(started)
    started[0] = time.perf_counter()
    summary = run_experiment(load_config(json.loads(args.config)), args.out, progress=False)
    total = time.perf_counter() - started[0]
    seconds = [h["seconds"] for h in summary["history"]]
    rounds = [b - a for a, b in zip([0.0] + seconds[:-1], seconds)]
    print(json.dumps({"round_s": statistics.median(rounds[1:-1]), "rounds_s": [round(r, 2) for r in rounds],
                      "first_round_s": rounds[0], "startup_s": phases["startup"],
                      "main_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "total_s": total}))


# -- the parent ------------------------------------------------------------------------------------
def run_one(cfg: str, out: Path, timeout: float) -> dict:
    """Run one measurement in a child, sampling its memory; past ``timeout``, end it and every process
    below it (Ray's). Returns the child's JSON (or ``timed_out``), the peaks and the parts it reported."""
    child = subprocess.Popen([sys.executable, __file__, "--one", "--config", cfg, "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks = {"main_rss_mb": 0.0, "tree_rss_mb": 0.0, "tree_pss_mb": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for key, value in zip(peaks, memory_mb(child.pid)):
                peaks[key] = max(peaks[key], value)
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    begun = time.perf_counter()
    timed_out = False
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        for pid in _descendants(child.pid) | {child.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stdout, stderr = child.communicate()  # what it printed before
    stop.set()
    sampler.join()
    parts = {}
    for line in stderr.splitlines():
        if line.startswith(PHASE + " "):
            _, name, secs = line.split()
            parts[name] = float(secs)
    result: dict = {"wall_s": time.perf_counter() - begun, "parts": parts, **peaks}
    if timed_out:
        return {**result, "timed_out": True}
    if child.returncode != 0:
        return {**result, "failed": stderr.strip().splitlines()[-1:]}
    return {**result, **json.loads(stdout.strip().splitlines()[-1])}


def load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def commit() -> str:
    here = Path(__file__).parent
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=here).stdout.strip()
    return done.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def row(engine: str, clients: int, r: dict, before: str, after: str, timeout: float) -> str:
    parts = ", ".join(f"{k} {v:.1f}" for k, v in r["parts"].items() if k != "startup") or "-"
    memory = f"{r['tree_pss_mb']:,.0f} | {r['tree_rss_mb']:,.0f}"
    if r.get("timed_out"):
        return (f"| {engine} | {clients:,} | not finished within {timeout:.0f} s (ended, with all its processes) "
                f"| | {r['parts'].get('startup', '>' + str(round(r['wall_s'])))} | finished: {parts} | {memory} "
                f"| {r['main_rss_mb']:,.0f} (sampled) | {r['wall_s']:.0f} | {before} / {after} |")
    if "failed" in r:
        return f"| {engine} | {clients:,} | failed: {r['failed']} | | | | | | | {r['wall_s']:.0f} | {before} / {after} |"
    return (f"| {engine} | {clients:,} | {r['round_s']:.2f} | {r['first_round_s']:.1f} | {r['startup_s']:.1f} "
            f"| {parts} | {memory} | {r['main_peak_mb']:,.0f} | {r['wall_s']:.0f} | {before} / {after} |")


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
        print(f"load average before: {load()}; commit {commit()}; {os.cpu_count()} CPUs; nice {os.nice(0)}; "
              f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)
        print("| engine | clients | s/round (median of rounds 2..R-1) | round 1 s | start-up s (to round 1) "
              "| start-up parts s | peak MB, tree PSS | peak MB, tree RSS | peak MB, main process | wall s "
              "| load before / after |")
        print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        for clients in args.clients:
            data = write_data(folder, clients)
            for engine in args.engines:
                before = load()
                r = run_one(json.dumps(config(engine, clients, data, args.rounds)), folder / "runs", args.timeout)
                print(row(engine, clients, r, before, load(), args.timeout), flush=True)
                print(f"raw: {engine} {clients} {json.dumps(r)}", flush=True)
            data.unlink()
        print(f"load average after: {load()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
