"""Scale: seconds per round and peak memory with 10, 100 and 1,000 clients of private state.

    python benchmarks/bench_scale.py --algorithms f2l fml --clients 10 100 1000

A synthetic 8x8 image set (20 classes, 60 samples per client, written once as an ``arrays`` .npz)
is split IID over N clients; every round asks 10 of them (seeded), so a round's work is the same
whatever N is. Each (algorithm, N) runs in its own process (peak RSS is per process), with
``runtime.client_states: auto`` (private states spill to disk above 100 clients). It prints, per run,
the median seconds of rounds 2..R, the peak resident memory, and the bytes of client state on disk.
One thread per process; the machine is shared, so compare within one invocation.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FEWSHOT = {"n_way": 5, "k_shot": 1, "q_query": 3, "test_episodes": 20, "val_episodes": 5}


def write_data(folder: Path, clients: int) -> Path:
    rng = np.random.default_rng(0)
    classes, per_client = 20, 60
    n = clients * per_client + 20 * classes  # the test classes' own samples too
    labels = np.arange(n) % classes
    centres = rng.normal(0, 1, (classes, 1, 8, 8)).astype(np.float32)
    x = centres[labels] + rng.normal(0, 0.7, (n, 1, 8, 8)).astype(np.float32)
    path = folder / f"synthetic-{clients}.npz"
    np.savez(path, x=x, y=labels)
    return path


def config(algorithm: str, clients: int, data: Path, rounds: int) -> dict:
    base = {
        "name": f"scale-{algorithm}-{clients}", "seed": 0,
        "dataset": {"name": "arrays", "root": str(data.parent),
                    "options": {"path": data.name, "class_split": {"base": 0.75, "val": 0.0, "novel": 0.25}}},
        "partition": {"name": "iid", "num_clients": clients},
        "model": {"name": "conv4", "options": {"hidden": 16}},
        "federation": {"rounds": rounds, "clients_per_round": 10},
        "eval": {"every": rounds},
        "runtime": {"threads": 1, "progress": False, "client_states": "auto", "checkpoint_every": 1},
    }
    if algorithm == "fml":
        base.update(task="classification", model={"name": "mlp", "options": {"hidden": 64}},
                    algorithm={"name": "fml", "options": {"local_epochs": 1}},
                    classification={"test_fraction": 0.1, "client_val_fraction": 0.2})
        base["dataset"]["options"].pop("class_split")
    else:
        base.update(task="fewshot", splits={"train": "base", "val": None, "test": "novel"}, episodes=FEWSHOT,
                    algorithm={"name": algorithm, "options": {"local_steps": 2, "client_heads": 2}})
    return base


def one(args: argparse.Namespace) -> None:
    """Run one (algorithm, clients) in this process and print a JSON line."""
    from fedfew.config.validation import load_config
    from fedfew.run.runner import run_experiment

    cfg = json.loads(args.config)
    started = time.perf_counter()
    summary = run_experiment(load_config(cfg), args.out, progress=False)
    seconds = [h["seconds"] for h in summary["history"]]
    rounds = [b - a for a, b in zip([0.0] + seconds[:-1], seconds)][1:-1] or seconds
    states = Path(summary["folder"]) / "states"
    disk = sum(p.stat().st_size for p in states.glob("*")) if states.is_dir() else 0
    print(json.dumps({"round_s": statistics.median(rounds), "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                      / 1024, "state_disk_mb": disk / 1e6, "total_s": time.perf_counter() - started,
                      "test": summary["test"]}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithms", nargs="+", default=["f2l", "fml"])
    parser.add_argument("--clients", nargs="+", type=int, default=[10, 100, 1000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("| algorithm | clients | seconds per round (median of rounds 2..R-1) | peak memory MB | client states on disk MB |")
        print("|---|---|---|---|---|")
        for algorithm in args.algorithms:
            for clients in args.clients:
                data = write_data(folder, clients)
                cfg = json.dumps(config(algorithm, clients, data, args.rounds))
                done = subprocess.run([sys.executable, __file__, "--one", "--config", cfg, "--out", str(folder / "runs")],
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    print(f"| {algorithm} | {clients} | failed: {done.stderr.strip().splitlines()[-1:]} | | |")
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"| {algorithm} | {clients} | {r['round_s']:.2f} | {r['peak_mb']:.0f} | {r['state_disk_mb']:.1f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
