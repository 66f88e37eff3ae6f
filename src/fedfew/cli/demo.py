"""``fedfew demo``: untrained vs local vs federated few-shot on the bundled Omniglot, one table; and the
paths of the bundled demo configs."""

from __future__ import annotations

import argparse
import time
from importlib import resources
from pathlib import Path

from fedfew.config.validation import ExperimentConfig, load_config
from fedfew.core.errors import UsageError


def demo_config_path() -> Path:
    """A quick config on the bundled 8x8 digits (the README's and the tests' small example)."""
    return Path(str(resources.files("fedfew") / "configs" / "demo.yaml"))


def showcase_config_path() -> Path:
    """The config ``fedfew demo`` runs: federated few-shot on the bundled Omniglot."""
    return Path(str(resources.files("fedfew") / "configs" / "omniglot-demo.yaml"))


DEMO_DATA = ("federated 5-way 1-shot on Omniglot's handwritten characters (the bundled omniglot-mini, 28x28, "
             "MIT licence): 10 clients hold 10 characters each from the 30 background alphabets; the round is "
             "selected on, and the test tasks drawn from, characters of the 20 evaluation alphabets that no "
             "client has seen")

#: label -> overrides of the demo config. Every method uses the config's rounds, clients, episodes and
#: Adam lr; "untrained" is the same network at round 0 scored the same way (prototypes on its features).
DEMO_RUNS: dict[str, list[str]] = {
    "untrained": ["algorithm.name=fl-proto", "federation.rounds=0"],
    "local": ["algorithm.name=local", "algorithm.options={learner: proto, local_steps: 5, lr: 0.001}"],
    "fl-proto": ["algorithm.name=fl-proto"],
    # FedAvg's own optimiser (McMahan et al.: SGD); with the episodic methods' Adam lr 0.001 it scored
    # 45.6% here, with SGD lr 0.05 65.3% (README, The demo).
    "fedavg": ["algorithm.name=fedavg", "algorithm.options={local_epochs: 1, batch_size: 32, lr: 0.05}"],
}


def _demo_configs(assignments: list[str], out: Path) -> dict[str, ExperimentConfig]:
    """The demo's rows with the user's ``--set``, each checked before any run. A ``--set`` that every row
    refuses is the user's error as it is; one that only some rows cannot take names those rows (they are
    the demo's, not the user's) and the way out: ``fedfew run`` of the demo's config."""
    from fedfew.run.runner import preflight

    configs: dict[str, ExperimentConfig] = {}
    refused: dict[str, UsageError] = {}
    for label, overrides in DEMO_RUNS.items():
        try:
            configs[label] = load_config(showcase_config_path(), [
                *overrides, f"name=demo-{label}", *assignments, *(["federation.rounds=0"] if label == "untrained" else [])])
            preflight(configs[label], out)
        except UsageError as err:
            refused[label] = err
    if refused and (not configs or not assignments):
        raise next(iter(refused.values()))
    if refused:
        given = " ".join(f"--set {a}" for a in assignments)
        first = next(iter(refused.values()))
        raise UsageError(f"fedfew demo: {given} cannot apply to the demo's {', '.join(map(repr, refused))} row(s), which "
                         f"the demo always runs ({', '.join(DEMO_RUNS)}): {first}; to run one method with these "
                         f"settings, use `fedfew run {showcase_config_path()} --set algorithm.name=... {given}`")
    return configs


def cmd_demo(args: argparse.Namespace) -> int:
    from fedfew.run.experiment import dataset_cache
    from fedfew.run.runner import run_experiment
    from fedfew.run.sweep import write_comparison

    start = time.perf_counter()
    print(f"fedfew demo: {DEMO_DATA}.")
    # The control stays at round 0 whatever --set says about rounds.
    with dataset_cache():
        configs = _demo_configs(args.set, Path(args.out) / "runs")
        summaries = []
        for label, config in configs.items():
            summaries.append(run_experiment(config, Path(args.out) / "runs", progress=not args.quiet, label=label))
    table = write_comparison(summaries, Path(args.out), "fedfew demo")
    print()
    print(table)
    print(f"chance is 20%. {len(summaries)} runs in {time.perf_counter() - start:.0f} s; "
          f"results in {args.out}/results.md, run folders in {args.out}/runs/")
    return 0
