"""fedfew against the peers of ../shared/peers on their FL-MAML/Omniglot workload, side by side.

    python benchmarks/bench_peers.py tasks --seed 0          # the peers' 100 test tasks as fedfew JSON
    python benchmarks/bench_peers.py run --pairs 3           # loop vs fedfew, alternated, 3 pairs
    python benchmarks/bench_peers.py run --pairs 2 --peer flower_sim.py
    python benchmarks/bench_peers.py run --pairs 3 --set runtime.workers=0 --set runtime.threads=2
    python benchmarks/bench_peers.py peak                    # fp32 and bf16 matmul peak, 1 and 2 threads
    python benchmarks/bench_peers.py run --pairs 3 --set runtime.precision=bf16 \
        --variant workers2:runtime.workers=2 \
        --variant batched:runtime.workers=0,runtime.batch_clients=true   # peer and two fedfew settings

Each pair runs the peer and ``fedfew run benchmarks/peers.yaml`` as whole processes, one after the
other (the order alternates between pairs), and times them from outside (interpreter start to exit).
With ``--variant LABEL:key=value,key=value`` (repeatable) each pair becomes a group of the peer and
every variant, in an order that rotates between groups, and the ratios are printed per variant. It
prints, per run, the wall time, fedfew's steady per-round time and episodes per second, the
fraction of this machine's measured fp32 matmul peak that client compute reaches, and each side's
accuracy on the same 100 test tasks; then the median fedfew/peer wall-time ratio with its min-max.
The peers' venv is made by ``bash ../shared/peers/setup.sh`` (``PEERS_VENV``, default
``${TMPDIR:-/tmp}/peers-venv``). The machine is shared: compare ratios within one invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FEDFEW_SHARED", REPO.parent / "shared"))  # the peers and the data
PEERS = Path(os.environ.get("PEERS_DIR", SHARED / "peers"))
CONFIG = REPO / "benchmarks" / "peers.yaml"
BACKGROUND_CHARACTERS, DRAWERS, N_WAY, SHOTS, QUERIES, TASKS = 964, 20, 5, 1, 15, 100


def peers_tasks(seed: int) -> dict:
    """The peers' evaluation protocol (README, "Evaluation"): generator default_rng([seed, 2]); per task
    5 of the 659 evaluation characters, then per character 16 of its 20 drawings (first: support).
    In fedfew's Omniglot order (background characters first, 20 drawings each) character c, drawing d
    of the evaluation half is dataset position (964 + c) * 20 + d."""
    rng = np.random.default_rng([seed, 2])
    tasks = []
    for _ in range(TASKS):
        classes = rng.choice(659, N_WAY, replace=False)
        picks = [rng.choice(DRAWERS, SHOTS + QUERIES, replace=False) for _ in classes]
        positions = [[(BACKGROUND_CHARACTERS + int(c)) * DRAWERS + int(d) for d in p] for c, p in zip(classes, picks)]
        tasks.append({"classes": [BACKGROUND_CHARACTERS + int(c) for c in classes],
                      "support": [p[:SHOTS] for p in positions], "query": [p[SHOTS:] for p in positions]})
    return {"source": f"../shared/peers evaluation tasks, seed {seed}", "tasks": tasks}


def matmul_peak(threads: int, dtype: str = "float32") -> float:
    """Measured GFLOP/s of a 2048 x 2048 matmul at ``threads`` threads (best of 5)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048).to(getattr(torch, dtype)), torch.randn(2048, 2048).to(getattr(torch, dtype))
    a @ b
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 2048**3 / best / 1e9


def episode_gflop() -> float:
    """FLOPs of one FO-MAML episode of the workload (5 support + 75 query images, forward and
    backward through Conv4-64 at 28x28), counted by torch's FlopCounterMode."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fedfew.fewshot.episodes import Episode
    from fedfew.fewshot.learners import MAML
    from fedfew.models import build_model

    model = build_model("conv4", (1, 28, 28), 5, hidden=64)
    episode = Episode(torch.rand(5, 1, 28, 28), torch.arange(5), torch.rand(75, 1, 28, 28),
                      torch.arange(5).repeat_interleave(15), torch.arange(5), torch.arange(5), torch.arange(75))
    with FlopCounterMode(display=False) as counter:
        loss, _ = MAML(0.4, 1, 3, first_order=True).loss(model, episode)
        loss.backward()

    return counter.get_total_flops() / 1e9


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall


def run_fedfew(out: Path, seed: int, rounds: int, extra: list[str], data_root: Path) -> dict:
    command = [sys.executable, "-m", "fedfew.cli.main", "run", str(CONFIG), "--out", str(out), "--quiet",
               "--set", f"seed={seed}", "--set", f"federation.rounds={rounds}", "--set", f"eval.every={rounds}",
               "--set", f"partition.rng_entropy=[{seed}, 0]", "--set", f"dataset.root={data_root}"]
    for item in extra:
        command += ["--set", item]
    env = {**os.environ, "FEDFEW_DATA": str(data_root)}
    wall = timed(command, env)
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    summary = json.loads((folder / "summary.json").read_text())
    history = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    seconds = [h["seconds"] for h in history]
    per_round = [b - a for a, b in zip([0.0] + seconds[:-1], seconds)]
    steady = per_round[1:-1] or per_round  # the last round includes the test evaluation
    episodes = [len(h["clients"]["trained"]) * 5 for h in history]
    return {"wall": wall, "acc": summary["test"]["accuracy"], "ci95": summary["test"]["ci95"],
            "round": statistics.median(steady), "episodes_per_round": statistics.median(episodes)}


def run_peer(script: str, out: Path, seed: int, rounds: int, venv: Path, device: str | None = None) -> dict:
    target = out / "peer.json"
    command = [str(venv / "bin" / "python"), str(PEERS / script), "--rounds", str(rounds), "--seed", str(seed),
               "--json", str(target)] + (["--device", device] if device else [])
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    wall = timed(command, env)
    result = json.loads(target.read_text())
    return {"wall": wall, "acc": result["acc"], "ci95": result["ci95"], "round": result["round_steady_mean_s"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tasks = sub.add_parser("tasks", help="write the peers' test tasks as a fedfew tasks file")
    tasks.add_argument("--seed", type=int, default=0)
    tasks.add_argument("--out", type=Path, default=None)
    sub.add_parser("peak", help="this machine's measured matmul peak, fp32 and bf16, 1 and 2 threads")
    run = sub.add_parser("run", help="time fedfew against a peer, alternated")
    run.add_argument("--pairs", type=int, default=3)
    run.add_argument("--rounds", type=int, default=10)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--peer", default="loop_pfllib_style.py", choices=["loop_pfllib_style.py", "flower_sim.py"])
    run.add_argument("--set", action="append", default=[], help="extra fedfew overrides")
    run.add_argument("--json", type=Path, default=None, help="write every measurement here")
    run.add_argument("--variant", action="append", default=[],
                     help="LABEL:key=value,key=value: a fedfew setting to time beside the others (repeatable)")
    run.add_argument("--peer-device", default=None, help="the loop's --device (cpu, cuda)")
    args = parser.parse_args()
    if args.command == "tasks":
        out = args.out or REPO / "benchmarks" / f"peers_tasks_seed{args.seed}.json"
        out.write_text(json.dumps(peers_tasks(args.seed)) + "\n")
        print(f"wrote {out}")
        return 0

    if args.command == "peak":
        for dtype in ("float32", "bfloat16"):
            for threads in (1, 2):
                print(f"{dtype} matmul 2048^3, {threads} thread(s): {matmul_peak(threads, dtype):.0f} GFLOP/s")
        return 0
    venv = Path(os.environ.get("PEERS_VENV", Path(os.environ.get("TMPDIR", "/tmp")) / "peers-venv"))
    if not (venv / "bin" / "python").exists():
        raise SystemExit(f"no peers venv at {venv}: run `bash ../shared/peers/setup.sh` first")
    data_root = Path(os.environ.get("FEDFEW_SHARED_DATA", SHARED / "data"))
    tasks_file = REPO / "benchmarks" / f"peers_tasks_seed{args.seed}.json"
    if not tasks_file.exists():
        tasks_file.write_text(json.dumps(peers_tasks(args.seed)) + "\n")
    extra = list(args.set)
    if args.seed != 0:
        extra.append(f"episodes.test_tasks={tasks_file}")
    variants = {"fedfew": []}
    if args.variant:
        variants = {}
        for spec in args.variant:
            label, _, sets = spec.partition(":")
            variants[label] = [item for item in sets.split(",") if item]
    labels = ["peer", *variants]
    rows = []
    for pair in range(args.pairs):
        shift = pair % len(labels)
        order = labels[shift:] + labels[:shift]
        if len(labels) == 2 and pair % 2 == 1:
            order = order[::-1]
        result = {}
        for who in order:
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory() as tmp:
                if who == "peer":
                    result[who] = run_peer(args.peer, Path(tmp), args.seed, args.rounds, venv, args.peer_device)
                else:
                    result[who] = run_fedfew(Path(tmp), args.seed, args.rounds, extra + variants[who], data_root)
            result[who]["load_before"] = load
            r = result[who]
            if args.json:  # after every run, so a benchmark cut short keeps what it measured
                args.json.write_text(json.dumps({"rows": rows + [result], "variants": variants}, indent=2))
            print(f"pair {pair + 1} {who:10s} wall {r['wall']:6.2f} s  round {r['round']:5.2f} s  "
                  f"acc {100 * r['acc']:5.2f} +- {100 * r['ci95']:4.2f}  (load {load:.2f})", flush=True)
        rows.append(result)
    print()
    for label in variants:
        ratios = [r[label]["wall"] / r["peer"]["wall"] for r in rows]
        print(f"{label}/{args.peer} wall-time ratio: median {statistics.median(ratios):.2f} "
              f"(min {min(ratios):.2f}, max {max(ratios):.2f}) over {len(ratios)} pairs; "
              f"{label} steady round {statistics.median(r[label]['round'] for r in rows):.2f} s, "
              f"peer {statistics.median(r['peer']['round'] for r in rows):.2f} s")
    ratios = [r[labels[1]]["wall"] / r["peer"]["wall"] for r in rows]

    peak = matmul_peak(2)
    flop = episode_gflop()
    f = rows[-1][labels[1]]
    client_rate = f["episodes_per_round"] / f["round"]
    print(f"{labels[1]} steady round {statistics.median(r[labels[1]]['round'] for r in rows):.2f} s, "
          f"{client_rate:.1f} episodes/s; one episode = {flop:.2f} GFLOP; measured fp32 matmul peak "
          f"{peak:.0f} GFLOP/s (2 threads): client compute reaches {100 * client_rate * flop / peak:.0f}% of it")

    if args.json:
        args.json.write_text(json.dumps({"ratios": ratios, "rows": rows, "variants": variants, "peak_gflops": peak,
                                         "episode_gflop": flop, "extra": extra}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
