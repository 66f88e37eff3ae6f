"""fedfew: federated learning when data or rounds are few.

The entry points (each also a ``fedfew`` command)::

    import fedfew

    config = fedfew.load_config("my.yaml", ["federation.rounds=20"])   # validated; ConfigError if not
    summary = fedfew.run_experiment(config, "runs")       # a run folder under runs/, the summary back
    fedfew.resume_run(summary["folder"])                  # continue an interrupted run
    fedfew.evaluate_run(summary["folder"], ["episodes.test_episodes=1000"])  # re-score, no training

    experiment = fedfew.build_experiment(config)          # data, clients, algorithm; no run folder
    outcome = experiment.simulator().run(rounds=5, clients_per_round=4)

Extending: subclass :class:`Algorithm` and decorate it with :func:`register` (``Algorithm``'s
docstring holds a complete example, docs/writing-an-algorithm.md a worked one). What an algorithm
needs is here too: its :class:`Options` base, the :class:`Context`, :class:`ClientData`,
:class:`ClientResult` and :class:`EvalData` its hooks receive and return, states from models
(:func:`get_state`, :func:`load_state_`, :func:`seed_torch_init`), aggregation
(:func:`weighted_average`, :func:`weights_for`), episodes (:class:`Episode`, :func:`local_sampler`,
the learners :class:`MAML` and :class:`ProtoNet`, :class:`EpisodicFedAvg` to build on) and
:func:`evaluate_model`. Datasets, models, partitions and engines register in :data:`DATASETS`,
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
    "ClientData": "fedfew.engine.algorithm",
    "ClientResult": "fedfew.engine.algorithm",
    "ConfigError": "fedfew.errors",
    "Context": "fedfew.engine.algorithm",
    "DATASETS": "fedfew.data.registry",
    "ENGINES": "fedfew.engines",
    "Engine": "fedfew.engine.engines",
    "Episode": "fedfew.episodes",
    "EpisodicFedAvg": "fedfew.algorithms.episodic",
    "EvalData": "fedfew.engine.algorithm",
    "Experiment": "fedfew.experiment",
    "ExperimentConfig": "fedfew.config",
    "FedfewError": "fedfew.errors",
    "MAML": "fedfew.meta.learners",
    "MODELS": "fedfew.models",
    "Options": "fedfew.engine.algorithm",
    "PARTITIONS": "fedfew.partition",
    "ProtoNet": "fedfew.meta.learners",
    "RunFailedError": "fedfew.errors",
    "RunInterrupted": "fedfew.errors",
    "UsageError": "fedfew.errors",
    "build_experiment": "fedfew.experiment",
    "evaluate_model": "fedfew.algorithms.common",
    "evaluate_run": "fedfew.rescore",
    "get_state": "fedfew.engine.state",
    "load_config": "fedfew.config",
    "load_state_": "fedfew.engine.state",
    "local_sampler": "fedfew.algorithms.common",
    "register": "fedfew.engine.algorithm",
    "resume_run": "fedfew.runner",
    "run_experiment": "fedfew.runner",
    "seed_torch_init": "fedfew.seeding",
    "weighted_average": "fedfew.engine.aggregation",
    "weights_for": "fedfew.engine.aggregation",
}

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ClientData",
    "ClientResult",
    "ConfigError",
    "Context",
    "DATASETS",
    "ENGINES",
    "Engine",
    "Episode",
    "EpisodicFedAvg",
    "EvalData",
    "Experiment",
    "ExperimentConfig",
    "FedfewError",
    "MAML",
    "MODELS",
    "Options",
    "PARTITIONS",
    "ProtoNet",
    "RunFailedError",
    "RunInterrupted",
    "UsageError",
    "__version__",
    "build_experiment",
    "evaluate_model",
    "evaluate_run",
    "get_state",
    "load_config",
    "load_state_",
    "local_sampler",
    "register",
    "resume_run",
    "run_experiment",
    "seed_torch_init",
    "weighted_average",
    "weights_for",
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
    from fedfew.algorithms.common import evaluate_model, local_sampler
    from fedfew.algorithms.episodic import EpisodicFedAvg
    from fedfew.config import ExperimentConfig, load_config
    from fedfew.data.registry import DATASETS
    from fedfew.engine.aggregation import weighted_average, weights_for
    from fedfew.engine.algorithm import (
        ALGORITHMS,
        Algorithm,
        ClientData,
        ClientResult,
        Context,
        EvalData,
        Options,
        register,
    )
    from fedfew.engine.engines import Engine
    from fedfew.engine.state import get_state, load_state_
    from fedfew.engines import ENGINES
    from fedfew.episodes import Episode
    from fedfew.errors import ConfigError, FedfewError, RunFailedError, RunInterrupted, UsageError
    from fedfew.experiment import Experiment, build_experiment
    from fedfew.meta.learners import MAML, ProtoNet
    from fedfew.models import MODELS
    from fedfew.partition import PARTITIONS
    from fedfew.rescore import evaluate_run
    from fedfew.runner import resume_run, run_experiment
    from fedfew.seeding import seed_torch_init
