"""Round selection (``eval.selection``): "best" tests the round with the best validation accuracy
(the first of equal ones), "last" the last round whatever validation says; both score validation
every ``eval.every`` rounds. Tiny F2L on Gaussian blobs (tests/helpers.py)."""

from __future__ import annotations

import pytest
import torch

from fedfew.algorithms.f2l import F2L, F2LOptions
from fedfew.config.validation import ConfigError, load_config
from fedfew.engine.simulator import Simulator
from fedfew.fewshot.episodes import fixed_episodes
from fedfew.interface.algorithm import EvalData
from tests.helpers import blob_dataset, clients_from, context_for


def run(selection: str) -> tuple[dict, Simulator]:
    data = blob_dataset(classes=8, per_class=30)
    ctx = context_for(data, n_way=3, k_shot=2, q_query=3)
    pool = data.split("base")
    clients = clients_from(pool, list(torch.randperm(len(pool), generator=torch.Generator().manual_seed(0)).chunk(2)))
    novel = data.splits["novel"]
    val = EvalData("val", episodes=fixed_episodes(data, novel, 3, 2, 3, num=3, seed=0, tag="val"))
    test = EvalData("test", episodes=fixed_episodes(data, novel, 3, 2, 3, num=3, seed=0, tag="test"))
    options = F2LOptions(local_steps=1, finetune="head", finetune_lr=0.5, finetune_steps=1, lr_server=0.05,
                         lr_client=0.05)
    simulator = Simulator(F2L(options, ctx), clients, seed=0, val=val, test=test)
    return simulator.run(rounds=4, clients_per_round=2, eval_every=1, selection=selection), simulator


def test_best_selects_the_first_round_of_highest_validation_accuracy() -> None:
    outcome, _ = run("best")
    val = [r["val_accuracy"] for r in outcome["history"]]
    assert len(val) == 4
    # Round 0 (the initial model) is the first candidate: a round must beat it, and the earlier of equals wins.
    candidates = [outcome["initial"]["accuracy"], *val]
    assert outcome["selected_round"] == candidates.index(max(candidates))


def test_last_selects_the_last_round_and_scores_it_on_test() -> None:
    outcome, simulator = run("last")
    assert outcome["selected_round"] == 4
    assert run("best")[0]["selected_round"] != 4  # on this run the two rules disagree
    assert all("val_accuracy" in r for r in outcome["history"])  # validation is still reported
    again = simulator.evaluate(simulator.test, simulator.server)
    assert outcome["test"]["accuracy"] == pytest.approx(again["accuracy"])


def test_selection_is_a_validated_config_key() -> None:
    assert load_config({"eval": {"selection": "last"}}).eval.selection == "last"
    with pytest.raises(ConfigError, match="selection"):
        load_config({"eval": {"selection": "median"}})
