"""A small bundled config for every registered algorithm (the digits, a tiny model, two rounds): the
runs that engine, fault and reliability tests repeat for each algorithm."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

FEWSHOT: dict[str, Any] = {
    "seed": 0,
    "task": "fewshot",
    "dataset": {"name": "digits"},
    "splits": {"train": "base", "val": None, "test": "novel"},
    "partition": {"name": "dirichlet", "num_clients": 4, "options": {"alpha": 1.0}},
    "model": {"name": "conv4", "options": {"hidden": 8}},
    "federation": {"rounds": 2, "clients_per_round": 4},
    "episodes": {"n_way": 3, "k_shot": 1, "q_query": 3, "test_episodes": 6},
    "eval": {"every": 1},
    "runtime": {"threads": 1, "progress": False},
}

CLASSIFICATION: dict[str, Any] = {
    **FEWSHOT,
    "task": "classification",
    "partition": {"name": "iid", "num_clients": 4},
    "model": {"name": "mlp", "options": {"hidden": 16}},
}

DEPLOY = {"groups": 2, "clients": 2, "classes": 3, "samples_per_class": 8}

#: algorithm -> (base config, algorithm options)
ALGORITHM_SETUPS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "fl-maml": (FEWSHOT, {"local_steps": 2, "inner_lr": 0.1, "test_inner_steps": 2}),
    "fl-proto": (FEWSHOT, {"local_steps": 2}),
    "fedfsl-prox": (FEWSHOT, {"local_steps": 2, "test_inner_steps": 2}),
    "fedfsl-mi": (FEWSHOT, {"local_steps": 2, "test_inner_steps": 2}),
    "fedfsl-mi-adv": (FEWSHOT, {"local_steps": 2, "test_inner_steps": 2}),
    "local": (FEWSHOT, {"local_steps": 2, "test_inner_steps": 2}),
    "f2l": (FEWSHOT, {"local_steps": 2, "client_heads": 2}),
    "fedavg": (FEWSHOT, {"local_epochs": 1, "batch_size": 32}),
    "fedprox": (FEWSHOT, {"local_epochs": 1, "batch_size": 32}),
    "frl": (FEWSHOT, {"rounds": 2, "lr": 0.01, "meta_lr": 0.01, "deployment": DEPLOY}),
    "frl-finetune": (FEWSHOT, {"local_epochs": 1, "deployment": DEPLOY}),
    "frl-oneshot": (FEWSHOT, {"local_epochs": 1, "cv_folds": 2, "keep": 2, "deployment": DEPLOY}),
    "frl-per-fedavg": (FEWSHOT, {"local_steps": 2, "deployment": DEPLOY}),
    "frl-per-fedavg-distance": (FEWSHOT, {"local_steps": 2, "deployment": DEPLOY}),
    "frl-scratch": (FEWSHOT, {"deployment": DEPLOY}),
    "fml": (CLASSIFICATION, {"local_epochs": 1}),
    "oneshot": (CLASSIFICATION, {"local_epochs": 1, "ensemble_size": 2}),
    "adfl": (CLASSIFICATION, {"local_epochs": 1, "ensemble_size": 2, "attack_steps": 2}),
}


def tiny_config(algorithm: str, **sections: Any) -> dict[str, Any]:
    """The small config of ``algorithm``; keyword arguments replace or extend whole sections
    (``federation={"rounds": 3}`` merges into the federation section)."""
    base, options = ALGORITHM_SETUPS[algorithm]
    config = copy.deepcopy(base)
    config["name"] = f"tiny-{algorithm}"
    config["algorithm"] = {"name": algorithm, "options": copy.deepcopy(options)}
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def simulate(simulator: Any, config: Any) -> dict[str, Any]:
    """Run ``simulator`` for ``config``'s rounds (every round evaluated), close its engine, and drop the
    wall-clock seconds from the history (the one field two equal runs never share)."""
    try:
        out = simulator.run(config.federation.rounds, config.federation.clients_per_round, 1)
    finally:
        simulator.engine.close()
    for row in out["history"]:
        row.pop("seconds")
    return out


def wait_for_logged_round(process: Any, out: Path, timeout: float) -> None:
    """Wait (at most ``timeout`` seconds, while ``process`` lives) until the run folder under ``out`` has
    logged its first round to metrics.jsonl: the moment an interrupt test sends its signal."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        logged = list(out.glob("*/metrics.jsonl"))
        if logged and logged[0].read_text().strip():
            return
        time.sleep(0.5)
