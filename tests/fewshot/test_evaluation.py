"""The evaluation protocol (fedfew.fewshot.evaluation): Wilson intervals for classification accuracies
(by hand) and the stated interval of episodic ones; ``eval.per_class``, the accuracy per true class
of the test queries (FedFSL Fig. 6's per-digit accuracies), by hand, consistent with the run's
accuracy, and leaving every other number as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedfew.config.validation import load_config
from fedfew.fewshot.episodes import Episode
from fedfew.fewshot.evaluation import per_class_accuracy
from fedfew.run.experiment import build_experiment
from fedfew.run.runner import run_experiment
from tests.tiny import simulate, tiny_config


def _episode(classes: list[int], query_labels: list[int]) -> Episode:
    q = torch.tensor(query_labels)
    empty = torch.zeros(0, dtype=torch.long)
    return Episode(support=torch.zeros(0, 1), support_labels=empty, query=torch.zeros(len(q), 1), query_labels=q,
                   classes=torch.tensor(classes), support_index=empty, query_index=empty)


def test_per_class_accuracy_by_hand() -> None:
    names = [f"digit-{i}" for i in range(10)]
    # episode 1: classes (7, 3); queries of 7, 7, 3, 3 predicted 7, 3, 3, 3 -> 7: 1/2, 3: 2/2
    # episode 2: classes (3, 9); queries of 3, 3, 9, 9 predicted 9, 3, 9, 9 -> 3: 1/2, 9: 2/2
    # pooled: 7: 1/2, 3: (2 + 1)/4, 9: 2/2 (episode labels are positions in `classes`, not digits)
    episodes = [_episode([7, 3], [0, 0, 1, 1]), _episode([3, 9], [0, 0, 1, 1])]
    predictions = [torch.tensor([0, 1, 1, 1]), torch.tensor([1, 0, 1, 1])]
    got = per_class_accuracy(episodes, predictions, names)
    assert got == {"digit-3": 0.75, "digit-7": 0.5, "digit-9": 1.0}
    assert list(got) == ["digit-3", "digit-7", "digit-9"]  # by class id


def test_per_class_needs_one_prediction_list_per_episode() -> None:
    with pytest.raises(ValueError):
        per_class_accuracy([_episode([0, 1], [0, 1])], [], ["a", "b"])


def _run(per_class: bool, algorithm: str = "fedfsl-mi") -> dict:
    config = load_config(tiny_config(algorithm, eval={"every": 1, "per_class": per_class}))
    experiment = build_experiment(config)
    return simulate(experiment.simulator(), config) | {"experiment": experiment}


def test_per_class_is_consistent_with_the_accuracy_and_changes_nothing_else() -> None:
    plain, with_classes = _run(False), _run(True)
    assert "per_class" not in plain["test"]
    per_class = with_classes["test"].pop("per_class")
    # the same run otherwise, number for number: per_class draws nothing the default path draws
    assert with_classes["test"] == plain["test"]
    assert with_classes["history"] == plain["history"]
    episodes = with_classes["experiment"].test.episodes
    names = episodes.sampler.dataset.class_names
    novel = {names[c] for c in with_classes["experiment"].dataset.splits["novel"]}
    assert set(per_class) <= novel and all(0.0 <= v <= 1.0 for v in per_class.values())
    # every episode has q queries per class: the query-weighted mean over classes is the mean episode accuracy
    queries: dict[str, int] = {}
    for ep in episodes:
        for c in ep.classes[ep.query_labels].tolist():
            queries[names[c]] = queries.get(names[c], 0) + 1
    pooled = sum(per_class[k] * n for k, n in queries.items()) / sum(queries.values())
    assert pooled == pytest.approx(plain["test"]["accuracy"], abs=1e-6)  # episode scores are float32


# -- intervals for every accuracy -----------------------------------------------------------------
def test_wilson_interval_by_hand() -> None:
    from fedfew.fewshot.evaluation import wilson

    # 8 of 10, z = 1.96: centre (0.8 + 1.96^2/20) / (1 + 1.96^2/10) = 0.99208 / 1.38416 = 0.716738,
    # half-width 1.96 sqrt(0.8 * 0.2 / 10 + 1.96^2 / 400) / 1.38416 = 1.96 * 0.160012 / 1.38416 = 0.226579.
    low, high = wilson(8, 10)
    assert low == pytest.approx(0.490160, abs=1e-5) and high == pytest.approx(0.943317, abs=1e-5)
    # 0 of 20 does not collapse to a point: [0, 1.96^2 / (20 + 1.96^2)] = [0, 3.8416 / 23.8416] = [0, 0.161130].
    assert wilson(0, 20) == pytest.approx((0.0, 0.161130), abs=1e-6)
    assert wilson(20, 20)[1] == 1.0 and wilson(20, 20)[0] == pytest.approx(1 - 0.161130, abs=1e-6)
    with pytest.raises(ValueError):
        wilson(3, 2)


@pytest.mark.parametrize("algorithm", ["fml", "fedavg", "adfl"])
def test_classification_accuracies_get_a_wilson_interval(algorithm: str, tmp_path: Path) -> None:
    from fedfew.fewshot.evaluation import wilson
    from fedfew.run.results import markdown_table

    config = tiny_config(algorithm)
    if algorithm == "fedavg":
        config = {**config, "task": "classification", "partition": {"name": "iid", "num_clients": 4},
                  "model": {"name": "mlp", "options": {"hidden": 16}}}
    summary = run_experiment(load_config(config), tmp_path, progress=False)
    test = summary["test"]
    n = len(build_experiment(load_config(config)).test.dataset)
    assert test["ci_method"] == f"Wilson, {n} samples"
    assert (test["ci_low"], test["ci_high"]) == pytest.approx(wilson(round(test["accuracy"] * n), n))
    assert test["ci_low"] <= test["accuracy"] <= test["ci_high"]
    row = markdown_table([summary]).splitlines()[2]
    assert f"[{100 * test['ci_low']:.2f}, {100 * test['ci_high']:.2f}]" in row and f"Wilson, {n} samples" in row


def test_episodic_accuracies_say_how_their_interval_was_computed(tmp_path: Path) -> None:
    summary = run_experiment(load_config(tiny_config("fl-proto", federation={"rounds": 1})), tmp_path, progress=False)
    assert summary["test"]["ci_method"] == "normal, 6 episodes" and summary["test"]["ci95"] >= 0
    assert "normal, 6 episodes" in (Path(summary["folder"]) / "results.md").read_text()
