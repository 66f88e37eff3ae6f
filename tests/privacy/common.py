"""The private configs the privacy tests share: central DP (and its seeded research mode), local DP,
adaptive clipping, the tiny config of an algorithm with DP on, and a DP aggregation of a bare
algorithm."""

from __future__ import annotations

from typing import Any

from fedfew.config.validation import PrivacyConfig, load_config
from fedfew.interface.algorithm import Algorithm
from fedfew.privacy import (
    PrivateAggregation,
)
from fedfew.run.experiment import build_experiment
from tests.tiny import simulate, tiny_config

CENTRAL = {"mechanism": "central-dp", "clip": 0.5, "noise_multiplier": 0.8, "delta": 1e-3}


#: Research mode: the noise and the clients of each round from the seed, so runs can be compared exactly.
SEEDED = {**CENTRAL, "noise": "seeded"}


def private(name: str, privacy: dict[str, Any] | None = None, **sections: Any) -> dict[str, Any]:
    """The tiny config of ``name`` with DP on (2 of 4 clients a round, so sampling amplifies)."""
    sections.setdefault("federation", {"rounds": 2, "clients_per_round": 2})
    return tiny_config(name, privacy=privacy or CENTRAL, **sections)


class Averaged(Algorithm):
    """The least an algorithm needs for PrivateAggregation: a model the server averages."""

    name = "averaged"
    dp_upload = "model-delta"


def aggregation(per_round: int = 4, num_clients: int = 8, rounds: int = 10, **privacy: Any) -> PrivateAggregation:
    config = PrivacyConfig.model_validate({**CENTRAL, **privacy})
    return PrivateAggregation(config, Averaged(None, None), num_clients, per_round, rounds)  # type: ignore[arg-type]


def numbers(out: dict[str, Any]) -> dict[str, Any]:
    return {"history": out["history"], "test": out["test"], "selected": out["selected_round"],
            "privacy": out.get("privacy")}


def simulated(config: dict[str, Any], overrides: list[str] | None = None) -> dict[str, Any]:
    cfg = load_config(config, overrides)
    return numbers(simulate(build_experiment(cfg).simulator(), cfg))


ADAPTIVE = {**SEEDED, "adaptive_clip": {"count_noise": 1.0}}
LOCAL = {"mechanism": "local-dp", "clip": 0.5, "noise_multiplier": 0.8, "delta": 1e-3, "noise": "seeded"}
