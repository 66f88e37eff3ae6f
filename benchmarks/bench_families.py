"""Seconds per round before and after, one config per algorithm family, the same seeds.

    python benchmarks/bench_families.py --before 5a1ebdd --pairs 2
    python benchmarks/bench_families.py --families episodic f2l --after-set runtime.workers=2

"Before" is fedfew at a git commit (checked out into a temporary worktree; default: the main this
work started from), "after" is this checkout. Each (family, version) runs as its own process with
PYTHONPATH pointing at that version's source, one after the other, the order alternating between
pairs. A run builds the experiment, then trains for the given rounds and scores the test tasks; the
table gives the median seconds per round (rounds 2..R; round 1 includes warm-up, the last one the
test) and the test accuracy. ``--after-set`` adds overrides to the "after" runs only (new options such
as runtime.workers or runtime.precision).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("FEDFEW_DATA", REPO.parent / "shared" / "data"))

#: family -> (config, overrides): a few rounds of a committed config.
FAMILIES = {
    "episodic": ("configs/fedfsl/omniglot.yaml",
                 ["federation.rounds=4", "eval.every=4", "episodes.test_episodes=100"]),
    "f2l": ("configs/f2l/femnist.yaml", ["federation.rounds=4", "eval.every=4", "episodes.test_episodes=50"]),
    "fml": ("configs/fml/mnist_noniid.yaml", ["federation.rounds=4", "eval.every=4"]),
    "frl": ("configs/frl/femnist_frl.yaml",
            ["federation.rounds=5", "eval.every=5", "algorithm.options.deployment.groups=10"]),
    "adfl": ("configs/adfl/mnist_iid.yaml", ["algorithm.options.local_epochs=3"]),
}

DRIVER = """
import json, sys, time
from fedfew.config.validation import load_config
from fedfew.run.experiment import build_experiment
config = load_config(sys.argv[1], json.loads(sys.argv[2]))
start = time.perf_counter()
experiment = build_experiment(config)
built = time.perf_counter() - start
simulator = experiment.simulator()
out = simulator.run(config.federation.rounds, config.federation.clients_per_round, config.eval.every)
close = getattr(getattr(simulator, "engine", None), "close", None)
if close:
    close()
print(json.dumps({"seconds": [h["seconds"] for h in out["history"]], "test": out["test"], "build": built}))
"""


def run(source: Path, config: Path, overrides: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(source / "src"), "FEDFEW_DATA": str(DATA)}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(config), json.dumps(overrides)], env=env,
                          capture_output=True, text=True, cwd=source)
    if done.returncode != 0:
        raise SystemExit(f"{config} failed in {source}:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    seconds = result["seconds"]
    rounds = [b - a for a, b in zip([0.0] + seconds[:-1], seconds)]
    result["round"] = statistics.median(rounds[1:-1] or rounds)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="5a1ebdd", help="git commit of the 'before' version")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--after-set", action="append", default=[])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], cwd=REPO, check=True,
                       capture_output=True)
        try:
            print(f"| family | config | seconds per round before ({args.before}) | after | speed-up | "
                  "test accuracy before / after (%) |")
            print("|---|---|---|---|---|---|")
            for family in args.families:
                config, overrides = FAMILIES[family]
                old_overrides = overrides + [f"dataset.root={DATA}"]
                times: dict[str, list[float]] = {"before": [], "after": []}
                accuracy: dict[str, float] = {}
                for pair in range(args.pairs):
                    order = ("before", "after") if pair % 2 == 0 else ("after", "before")
                    for version in order:
                        if version == "before":
                            r = run(before, before / config, old_overrides)
                        else:
                            r = run(REPO, REPO / config, overrides + args.after_set)
                        times[version].append(r["round"])
                        accuracy[version] = 100 * r["test"]["accuracy"]
                b, a = statistics.median(times["before"]), statistics.median(times["after"])
                print(f"| {family} | {config} | {b:.2f} ({min(times['before']):.2f}-{max(times['before']):.2f}) | "
                      f"{a:.2f} ({min(times['after']):.2f}-{max(times['after']):.2f}) | {b / a:.2f}x | "
                      f"{accuracy['before']:.2f} / {accuracy['after']:.2f} |", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
