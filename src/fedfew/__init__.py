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
from typing import TYPE_CHECKING, Any

from fedfew.core.codeversion import package_version

__version__ = package_version()

#: Public name -> the module it lives in.
_EXPORTS = {
    "ALGORITHMS": "fedfew.interface.registration",
    "Algorithm": "fedfew.interface.algorithm",
    "ClientData": "fedfew.interface.records",
    "ClientResult": "fedfew.interface.records",
    "ConfigError": "fedfew.core.errors",
    "Context": "fedfew.interface.algorithm",
    "DATASETS": "fedfew.data.registry",
    "ENGINES": "fedfew.config.engines",
    "Engine": "fedfew.engine.base",
    "Episode": "fedfew.fewshot.episodes",
    "EpisodicFedAvg": "fedfew.algorithms.parts.episodic",
    "EvalData": "fedfew.interface.records",
    "Experiment": "fedfew.run.experiment",
    "ExperimentConfig": "fedfew.config.validation",
    "FedfewError": "fedfew.core.errors",
    "MAML": "fedfew.fewshot.learners",
    "MODELS": "fedfew.models",
    "Options": "fedfew.interface.records",
    "PARTITIONS": "fedfew.fewshot.partition",
    "ProtoNet": "fedfew.fewshot.learners",
    "RunFailedError": "fedfew.core.errors",
    "RunInterrupted": "fedfew.core.errors",
    "UsageError": "fedfew.core.errors",
    "build_experiment": "fedfew.run.experiment",
    "evaluate_model": "fedfew.algorithms.parts.common",
    "evaluate_run": "fedfew.run.rescore",
    "get_state": "fedfew.interface.state",
    "load_config": "fedfew.config.validation",
    "load_state_": "fedfew.interface.state",
    "local_sampler": "fedfew.algorithms.parts.common",
    "register": "fedfew.interface.registration",
    "resume_run": "fedfew.run.runner",
    "run_experiment": "fedfew.run.runner",
    "seed_torch_init": "fedfew.core.seeding",
    "weighted_average": "fedfew.interface.aggregation",
    "weights_for": "fedfew.interface.aggregation",
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
        importlib.import_module("fedfew.algorithms").register_all()  # the built-in algorithms, registered
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from fedfew.algorithms.parts.common import evaluate_model, local_sampler
    from fedfew.algorithms.parts.episodic import EpisodicFedAvg
    from fedfew.config.engines import ENGINES
    from fedfew.config.validation import ExperimentConfig, load_config
    from fedfew.core.errors import ConfigError, FedfewError, RunFailedError, RunInterrupted, UsageError
    from fedfew.core.seeding import seed_torch_init
    from fedfew.data.registry import DATASETS
    from fedfew.engine.base import Engine
    from fedfew.fewshot.episodes import Episode
    from fedfew.fewshot.learners import MAML, ProtoNet
    from fedfew.fewshot.partition import PARTITIONS
    from fedfew.interface.aggregation import weighted_average, weights_for
    from fedfew.interface.algorithm import Algorithm, ClientData, ClientResult, Context, EvalData, Options
    from fedfew.interface.registration import ALGORITHMS, register
    from fedfew.interface.state import get_state, load_state_
    from fedfew.models import MODELS
    from fedfew.run.experiment import Experiment, build_experiment
    from fedfew.run.rescore import evaluate_run
    from fedfew.run.runner import resume_run, run_experiment
