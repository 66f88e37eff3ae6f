"""FedAvg over episodes (fedfew.algorithms.parts.episodic) as a centralised learner needs it: training
episodes wider than the evaluation's, the outer Adam's moments kept from round to round
(``keep_optimizer``) and Prototypical Networks' halving learning rate (``lr_halving_episodes``),
both in the client's state and resumed exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.algorithms.parts.episodic import EpisodicFedAvg
from fedfew.config.validation import ConfigError, load_config
from fedfew.run.runner import run_experiment
from tests.helpers import cut_and_resumed
from tests.tiny import tiny_config


def proto(**options: object) -> dict:
    config = tiny_config("fl-proto", partition={"name": "iid", "num_clients": 1, "options": {}},
                         federation={"rounds": 3, "clients_per_round": 1})
    config["algorithm"]["options"].update(options)
    return config


def test_training_on_wider_episodes_trains_on_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []
    original = EpisodicFedAvg.local_objective

    def record(self, payload, episode):  # type: ignore[no-untyped-def]
        seen.append((int(episode.support_labels.max()) + 1, len(episode.query_labels)))
        return original(self, payload, episode)

    monkeypatch.setattr(EpisodicFedAvg, "local_objective", record)
    config = proto()
    config["episodes"] = {**config["episodes"], "train_way": 4, "train_query": 2}
    run_experiment(load_config(config), tmp_path, progress=False)
    assert seen and set(seen) == {(4, 8)}


def test_kept_moments_and_the_halving_rate_change_training_and_are_in_the_clients_state(tmp_path: Path) -> None:
    plain = run_experiment(load_config(proto()), tmp_path / "plain", progress=False)
    kept = run_experiment(load_config(proto(keep_optimizer=True)), tmp_path / "kept", progress=False)
    # round 1 is the same (no moments yet); later rounds continue the moments and differ
    assert plain["history"][0]["train_loss"] == kept["history"][0]["train_loss"]
    assert plain["history"][2]["train_loss"] != kept["history"][2]["train_loss"]
    halving = run_experiment(load_config(proto(lr_halving_episodes=1)), tmp_path / "halving", progress=False)
    # round 1 scores its two episodes before and after a step at lr; round 2 trains at lr / 2, then lr / 4
    assert halving["history"][0]["train_loss"] == plain["history"][0]["train_loss"]
    assert halving["history"][1]["train_loss"] != plain["history"][1]["train_loss"]


def test_an_optimiser_state_that_is_not_adam_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="keep_optimizer keeps Adam's moments"):
        run_experiment(load_config(proto(keep_optimizer=True, optimizer="sgd")), tmp_path, progress=False)


@pytest.mark.parametrize("options", [{"keep_optimizer": True, "lr_halving_episodes": 3}])
def test_resume_with_kept_moments_equals_uninterrupted(options: dict, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from fedfew.algorithms.fl_proto import FLProto

    config = load_config(proto(**options))
    whole, resumed, cut_rows, whole_rows = cut_and_resumed(config, FLProto, tmp_path, monkeypatch, cut_at_call=2)
    assert cut_rows == whole_rows and resumed["test"] == whole["test"]
