"""Seconds per federated round for the baseline algorithms on the bundled digits.

    .venv/bin/python benchmarks/bench_round.py [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

from fedfew.cli.main import demo_config_path
from fedfew.config.validation import load_config
from fedfew.run.experiment import build_experiment


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    options = {"fl-maml": "{local_steps: 5, inner_lr: 0.1, test_inner_steps: 5}",
               "fl-proto": "{local_steps: 5}", "fedavg": "{local_epochs: 1}"}
    for name, opts in options.items():
        config = load_config(demo_config_path(), [f"algorithm.name={name}", f"algorithm.options={opts}",
                                                  f"runtime.threads={args.threads}"])
        simulator = build_experiment(config).simulator()
        simulator.test = None
        start = time.perf_counter()
        simulator.run(args.rounds, 1.0, eval_every=10**6)
        print(f"{name:9s} {(time.perf_counter() - start) / args.rounds:6.2f} s/round (10 clients, no evaluation)")


if __name__ == "__main__":
    main()
