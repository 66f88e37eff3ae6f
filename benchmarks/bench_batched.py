"""Seconds per round of the peers' workload (benchmarks/peers.yaml: FO-MAML, Conv4-64, 10 clients of
which 8 train, 5 episodes each), client updates only, for the ways fedfew can run a round's clients:
one after the other in this process, in worker processes, or batched (``runtime.batch_clients``).

    .venv/bin/python benchmarks/bench_batched.py [--repeats 3] [--precision fp32 bf16] [--threads 1 2]

Every setting trains the same rounds (the server state is reset before each timing, so each timing is
round 2 of the same run), timed in turn, ``--repeats`` times in rotating order, in one process;
prints the median and min-max seconds per round and the load average before each timing. Whole
processes against the peers' loop: benchmarks/bench_peers.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from fedfew.config.validation import load_config
from fedfew.engine.round import run_round

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--threads", nargs="+", type=int, default=[2])
    parser.add_argument("--settings", nargs="+", default=["sequential", "workers2", "batched"])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    from fedfew.run.experiment import build_experiment

    data_root = Path(os.environ.get("FEDFEW_SHARED_DATA", REPO.parent / "shared" / "data"))
    overrides = {"sequential": ["runtime.workers=0"], "workers2": ["runtime.workers=2"],
                 "batched": ["runtime.workers=0", "runtime.batch_clients=true"]}
    for precision in args.precision:
        for threads in args.threads:
            sims = {}
            for name in args.settings:
                config = load_config(REPO / "benchmarks" / "peers.yaml", [
                    f"dataset.root={data_root}", f"runtime.precision={precision}", f"runtime.threads={threads}",
                    f"runtime.device={args.device}", "episodes.test_tasks=null", "episodes.test_episodes=5",
                    *overrides[name]])
                simulator = build_experiment(config).simulator()
                sims[name] = (simulator, simulator.server)
            times: dict[str, list[float]] = {name: [] for name in sims}
            loads: dict[str, list[float]] = {name: [] for name in sims}
            names = list(sims)
            for repeat in range(args.repeats + 1):  # the first pass warms up and is not counted
                order = names[repeat % len(names):] + names[:repeat % len(names)]
                for name in order:
                    simulator, initial = sims[name]
                    torch.set_num_threads(threads)
                    load = os.getloadavg()[0]
                    if args.device != "cpu":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    with simulator.engine.compute.device_scope():
                        outcome = run_round(simulator.engine, simulator.algorithm, initial, list(range(10)), 1, 1)
                    if args.device != "cpu":
                        torch.cuda.synchronize()
                    seconds = time.perf_counter() - start
                    simulator.engine.discard_round()
                    assert len(outcome.trained) == 8, outcome.trained
                    print(f"  {precision} threads {threads} pass {repeat} {name:10s} {seconds:6.2f} s (load {load:.1f})"
                          + (" warm-up" if repeat == 0 else ""), flush=True)
                    if repeat > 0:
                        times[name].append(seconds)
                        loads[name].append(load)
            for name in names:
                t = times[name]
                print(f"{precision} threads {threads} {name:10s} median {statistics.median(t):6.2f} s/round "
                      f"(min {min(t):.2f}, max {max(t):.2f}; {len(t)} rounds; load {min(loads[name]):.1f}-"
                      f"{max(loads[name]):.1f})", flush=True)
            base = statistics.median(times[names[0]])
            for name in names[1:]:
                print(f"  {name} / {names[0]}: {statistics.median(times[name]) / base:.2f}")
            for simulator, _ in sims.values():
                simulator.engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
