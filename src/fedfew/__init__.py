"""fedfew: federated learning when data or rounds are few.

The entry points (each also a ``fedfew`` command)::

    import fedfew

    config = fedfew.load_config("my.yaml", ["federation.rounds=20"])   # validated; ConfigError if not
    summary = fedfew.run_experiment(config, "runs")       # a run folder under runs/, the summary back
    fedfew.resume_run(summary["folder"])                  # continue an interrupted run
    fedfew.evaluate_run(summary["folder"], ["episodes.test_episodes=1000"])  # re-score, no training

    experiment = fedfew.build_experiment(config)          # data, clients, algorithm; no run folder
    outcome = experiment.simulator().run(rounds=5, clients_per_round=4)

Extending: subclass :class:`Algorithm` and decorate it with :func:`register` (its docstring holds a
complete example); datasets, models, partitions and engines register in :data:`DATASETS`,
:data:`MODELS`, :data:`PARTITIONS` and :data:`ENGINES`. Errors a user can fix are :class:`UsageError`
(:class:`ConfigError` among them), a run that failed is :class:`RunFailedError`; each carries the
command line's ``exit_code``. docs/architecture.md maps the layers.

The names here are loaded on first use, so ``import fedfew`` stays cheap.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("fedfew")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

#: Public name -> the module it lives in.
_EXPORTS = {
    "ALGORITHMS": "fedfew.engine.algorithm",
    "Algorithm": "fedfew.engine.algorithm",
    "ConfigError": "fedfew.errors",
    "DATASETS": "fedfew.data.registry",
    "ENGINES": "fedfew.engines",
    "Engine": "fedfew.engine.engines",
    "Experiment": "fedfew.experiment",
    "ExperimentConfig": "fedfew.config",
    "FedfewError": "fedfew.errors",
    "MODELS": "fedfew.models",
    "PARTITIONS": "fedfew.partition",
    "RunFailedError": "fedfew.errors",
    "RunInterrupted": "fedfew.errors",
    "UsageError": "fedfew.errors",
    "build_experiment": "fedfew.experiment",
    "evaluate_run": "fedfew.rescore",
    "load_config": "fedfew.config",
    "register": "fedfew.engine.algorithm",
    "resume_run": "fedfew.runner",
    "run_experiment": "fedfew.runner",
}

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ConfigError",
    "DATASETS",
    "ENGINES",
    "Engine",
    "Experiment",
    "ExperimentConfig",
    "FedfewError",
    "MODELS",
    "PARTITIONS",
    "RunFailedError",
    "RunInterrupted",
    "UsageError",
    "__version__",
    "build_experiment",
    "evaluate_run",
    "load_config",
    "register",
    "resume_run",
    "run_experiment",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fedfew' has no attribute {name!r}")
    if name in ("ALGORITHMS", "register"):
        importlib.import_module("fedfew.algorithms")  # the built-in algorithms, registered
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from fedfew.config import ExperimentConfig, load_config
    from fedfew.data.registry import DATASETS
    from fedfew.engine.algorithm import ALGORITHMS, Algorithm, register
    from fedfew.engine.engines import Engine
    from fedfew.engines import ENGINES
    from fedfew.errors import ConfigError, FedfewError, RunFailedError, RunInterrupted, UsageError
    from fedfew.experiment import Experiment, build_experiment
    from fedfew.models import MODELS
    from fedfew.partition import PARTITIONS
    from fedfew.rescore import evaluate_run
    from fedfew.runner import resume_run, run_experiment
