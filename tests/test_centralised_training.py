"""The settings a centralised learner needs as an ordinary fedfew run (studies/calibration.yaml): training
episodes of their own way and queries (``episodes.train_way``/``train_query``), the outer Adam's moments
kept from round to round (``keep_optimizer``) and Prototypical Networks' halving learning rate
(``lr_halving_episodes``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedfew.algorithms.parts.episodic import EpisodicFedAvg
from fedfew.algorithms.parts.optimizers import Adam
from fedfew.config.validation import ConfigError, load_config
from fedfew.run.experiment import training_episode
from fedfew.run.runner import run_experiment
from fedfew.study.grid import config_hash
from tests.helpers import cut_and_resumed
from tests.tiny import tiny_config


def steps(optimizer: Adam, model: torch.nn.Linear, inputs: torch.Tensor, count: int) -> None:
    for _ in range(count):
        optimizer.zero_grad()
        model(inputs).pow(2).sum().backward()
        optimizer.step()


def test_adam_continued_from_its_state_equals_adam_never_stopped() -> None:
    torch.manual_seed(0)
    inputs = torch.randn(8, 4)
    whole, halves = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    halves.load_state_dict(whole.state_dict())
    steps(Adam(whole.parameters(), lr=0.01), whole, inputs, 6)
    first = Adam(halves.parameters(), lr=0.01)
    steps(first, halves, inputs, 3)
    saved = first.state()
    second = Adam(halves.parameters(), lr=0.01)
    second.load_state(saved)
    steps(second, halves, inputs, 3)
    assert torch.equal(whole.weight, halves.weight) and torch.equal(whole.bias, halves.bias)
    assert float(saved["step"][0]) == 3.0  # loading copied: the later steps left the saved state alone
    fresh = Adam(halves.parameters(), lr=0.01)
    assert fresh.state() == {"step": [], "first": [], "second": []}


def test_adam_load_state_refuses_moments_of_another_model() -> None:
    small, large = torch.nn.Linear(2, 2), torch.nn.Linear(3, 2)
    optimizer = Adam(small.parameters(), lr=0.1)
    steps(optimizer, small, torch.ones(1, 2), 1)
    with pytest.raises(ValueError, match="moments of shape"):
        Adam(large.parameters(), lr=0.1).load_state(optimizer.state())


def proto(**options: object) -> dict:
    config = tiny_config("fl-proto", partition={"name": "iid", "num_clients": 1, "options": {}},
                         federation={"rounds": 3, "clients_per_round": 1})
    config["algorithm"]["options"].update(options)
    return config


def test_the_training_shape_is_the_evaluations_unless_given() -> None:
    config = load_config(proto())
    assert (training_episode(config).n_way, training_episode(config).q_query) == (3, 3)
    wide = load_config({**proto(), "episodes": {**proto()["episodes"], "train_way": 5, "train_query": 2}})
    assert (training_episode(wide).n_way, training_episode(wide).k_shot, training_episode(wide).q_query) == (5, 1, 2)
    assert config_hash(config) == config_hash(load_config({**proto(), "episodes": {
        **proto()["episodes"], "train_way": None, "train_query": None}}))  # a stored cell keeps its key


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


def test_a_training_way_is_refused_for_an_algorithm_with_an_n_way_head(tmp_path: Path) -> None:
    config = tiny_config("fl-maml")
    config["episodes"] = {**config["episodes"], "train_way": 5}
    with pytest.raises(ConfigError, match=r"episodes.train_way: fl-maml .*only a head-less learner \(fl-proto\)"):
        run_experiment(load_config(config), tmp_path, progress=False)


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


def test_the_allocator_setting_applies_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes.util

    from fedfew.core.allocator import ENVIRONMENT, keep_large_blocks

    if ctypes.util.find_library("c") is None or not hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallopt"):
        pytest.skip("not glibc")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert keep_large_blocks() is True
    monkeypatch.setenv(ENVIRONMENT, "0")
    assert keep_large_blocks() is False
    monkeypatch.delenv(ENVIRONMENT)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")  # the user's own setting wins
    assert keep_large_blocks() is False


def test_a_training_query_count_is_taken_by_the_episodic_family_only(tmp_path: Path) -> None:
    config = tiny_config("fl-maml")
    config["episodes"] = {**config["episodes"], "train_query": 1}
    run_experiment(load_config(config), tmp_path / "maml", progress=False)
    f2l = tiny_config("f2l")
    f2l["episodes"] = {**f2l["episodes"], "train_query": 1}
    with pytest.raises(ConfigError, match=r"episodes.train_query: f2l .*episodic FedAvg family"):
        run_experiment(load_config(f2l), tmp_path / "f2l", progress=False)
