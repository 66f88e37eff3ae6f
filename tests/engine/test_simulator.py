"""A run's loop of rounds (fedfew.engine.simulator): the same seed gives the same metrics; the selected
round (``eval.selection``: "best" is the first round of the best validation accuracy, never chosen on
test, "last" the last round); round 0 as a selection candidate (``eval.initial``), and a run below
the untrained model warned about; a run in which nothing trained fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedfew.algorithms.f2l import F2L, F2LOptions
from fedfew.algorithms.fl_maml import FLMAML
from fedfew.algorithms.fl_proto import FLProto
from fedfew.algorithms.parts.episodic import EpisodicOptions, MAMLOptions
from fedfew.cli.main import demo_config_path, main
from fedfew.config.validation import load_config
from fedfew.engine.simulator import Simulator
from fedfew.fewshot.episodes import fixed_episodes
from fedfew.interface.algorithm import EvalData
from fedfew.run.runner import run_experiment
from tests.helpers import blob_dataset, clients_from, context_for
from tests.run.common import metrics, only_run, status
from tests.tiny import tiny_config


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


def _run(tmp_path: Path, overrides: list[str], **sections: object) -> dict:
    config = load_config(tiny_config("fl-proto", federation={"rounds": 2}, **sections), overrides)
    summary = run_experiment(config, out_base=tmp_path / "_".join(overrides or ["default"]), progress=False)
    for row in summary["history"]:
        row.pop("seconds")
    return summary


def test_auto_skips_round_zero_without_validation_and_changes_nothing_else(tmp_path: Path) -> None:
    always = _run(tmp_path, [])
    auto = _run(tmp_path, ["eval.initial=auto"])
    assert "initial_score" in always and "initial_scored" not in always  # today's summary
    assert "initial_score" not in auto and auto["initial_scored"] is False
    assert auto["history"] == always["history"]
    assert auto["test"] == always["test"] and auto["selected_round"] == always["selected_round"]


def test_auto_still_scores_round_zero_where_the_selection_reads_it(tmp_path: Path) -> None:
    splits = {"train": "base", "val": "val", "test": "novel"}
    dataset = {"name": "digits", "options": {"class_split": {"base": [0, 1, 2, 3], "val": [4, 5, 6],
                                                             "novel": [7, 8, 9]}}}
    always = _run(tmp_path, [], splits=splits, dataset=dataset)
    auto = _run(tmp_path, ["eval.initial=auto"], splits=splits, dataset=dataset)
    assert auto["initial_score"] == always["initial_score"] and "initial_scored" not in auto
    control = _run(tmp_path, ["eval.initial=auto", "federation.rounds=0"])  # the untrained control
    assert "initial_score" in control


# -- runs that must not report an accuracy ---------------------------------------------------------
def test_a_run_in_which_nothing_trained_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", str(demo_config_path()), "--out", str(tmp_path), "--quiet",
            "--set", "partition.name=shards",
            "--set", "partition.options={shards_per_client: 1, single_class_shards: true, shard_size: 40}",
            "--set", "federation.rounds=2", "--set", "episodes.test_episodes=5"]
    assert main(args) == 1  # a run that failed (not a usage error): exit 1
    err = capsys.readouterr().err
    assert "no client trained" in err
    folder = only_run(tmp_path)
    assert status(folder) == "failed" and not (folder / "summary.json").exists()
    assert all(row["no_training"] for row in metrics(folder))


# -- round 0 is a selection candidate; below-untrained warns -----------------------------------
WITH_VAL = {
    "dataset": {"name": "digits", "options": {"class_split": {"base": [0, 1, 2, 3], "val": [4, 5, 6],
                                                              "novel": [7, 8, 9]}}},
    "splits": {"train": "base", "val": "val", "test": "novel"},
    "episodes": {"n_way": 3, "k_shot": 1, "q_query": 3, "test_episodes": 20, "val_episodes": 20},
}


def wrecking(rounds: int = 3, **sections) -> dict:
    """fl-proto whose SGD step (lr 3) wrecks the encoder in every round, yet stays finite."""
    config = tiny_config("fl-proto", federation={"rounds": rounds}, **sections)
    config["algorithm"]["options"].update(optimizer="sgd", lr=3.0)
    return config


def test_round_0_is_selected_when_training_only_hurts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        summary = run_experiment(load_config(wrecking(**WITH_VAL)), tmp_path / "a", progress=False)
    history = summary["history"]
    assert all(h["train_loss"] < float("inf") for h in history)  # wrecked, not diverged to inf/nan
    initial = summary["initial_score"]
    assert initial["split"] == "val"
    assert all(h["val_accuracy"] < initial["accuracy"] for h in history)
    assert summary["selected_round"] == 0 and summary["below_initial"] is True
    assert summary["final_score"] == history[-1]["val_accuracy"] < initial["accuracy"]
    # The selected model is the untrained one: the control run's test score exactly.
    control = run_experiment(load_config(wrecking(0, **WITH_VAL)), tmp_path / "b",
                             progress=False)
    assert summary["test"] == control["test"]
    lines = [r.getMessage() for r in caplog.records if "below the untrained" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and "round 0" in lines[0]
    written = json.loads((Path(summary["folder"]) / "summary.json").read_text())
    assert written["below_initial"] is True and written["initial_score"]["accuracy"] == initial["accuracy"]


def test_without_validation_the_final_model_is_compared_on_test(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        summary = run_experiment(load_config(wrecking()), tmp_path, progress=False)
    assert summary["initial_score"]["split"] == "test" and summary["selected_round"] == 3
    assert summary["final_score"] == summary["test"]["accuracy"] < summary["initial_score"]["accuracy"]
    assert summary["below_initial"] is True
    assert any("below the untrained" in r.getMessage() and "on test" in r.getMessage() for r in caplog.records)


def test_a_run_that_beats_round_0_does_not_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tiny_config("fl-proto", federation={"rounds": 3}, **WITH_VAL)
    config["algorithm"]["options"].update(lr=0.01)
    with caplog.at_level("WARNING"):
        summary = run_experiment(load_config(config), tmp_path, progress=False)
    assert summary["selected_round"] > 0 and summary["selected_score"] > summary["initial_score"]["accuracy"]
    assert summary["below_initial"] is (summary["final_score"] < summary["initial_score"]["accuracy"])
    if not summary["below_initial"]:
        assert not any("below the untrained" in r.getMessage() for r in caplog.records)


def fewshot_run(algorithm_cls, options, seed: int = 3):
    data = blob_dataset(classes=6, per_class=20)
    ctx = context_for(data)
    pool = data.split("base")
    parts = list(torch.randperm(len(pool), generator=torch.Generator().manual_seed(0)).chunk(3))
    clients = clients_from(pool, parts)
    test = EvalData("test", episodes=fixed_episodes(data, data.splits["novel"], 3, 1, 5, num=20, seed=seed))
    sim = Simulator(algorithm_cls(options, ctx), clients, seed=seed, test=test)
    return sim.run(rounds=3, clients_per_round=2, eval_every=1)


@pytest.mark.parametrize("cls, options", [(FLMAML, MAMLOptions(local_steps=2, inner_lr=0.1)),
                                          (FLProto, EpisodicOptions(local_steps=2))])
def test_same_seed_same_metrics(cls, options) -> None:
    a, b = fewshot_run(cls, options), fewshot_run(cls, options)
    strip = lambda history: [{k: v for k, v in h.items() if k != "seconds"} for h in history]  # noqa: E731
    assert strip(a["history"]) == strip(b["history"])
    assert a["test"] == b["test"]
    assert 0.0 <= a["test"]["accuracy"] <= 1.0 and a["test"]["ci95"] >= 0


def test_validation_selects_the_round_never_test() -> None:
    data = blob_dataset(classes=9, per_class=20)
    data.splits = {"base": [0, 1, 2], "val": [3, 4, 5], "novel": [6, 7, 8]}
    ctx = context_for(data)
    pool = data.split("base")
    clients = clients_from(pool, list(torch.arange(len(pool)).chunk(2)))
    val = EvalData("val", episodes=fixed_episodes(data, [3, 4, 5], 3, 1, 5, num=10, seed=0, tag="val"))
    test = EvalData("test", episodes=fixed_episodes(data, [6, 7, 8], 3, 1, 5, num=10, seed=0, tag="test"))
    sim = Simulator(FLProto(EpisodicOptions(local_steps=1), ctx), clients, seed=0, val=val, test=test)
    out = sim.run(rounds=4, clients_per_round=2, eval_every=1)
    # Round 0 (the initial model) is a candidate too: the first best wins ties.
    val_curve = [out["initial"]["accuracy"]] + [h["val_accuracy"] for h in out["history"]]
    assert out["selected_round"] == val_curve.index(max(val_curve))
    assert all("test_accuracy" not in h for h in out["history"])
