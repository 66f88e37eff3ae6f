"""``eval.per_class``: the accuracy per true class of the test episodes' queries (FedFSL Fig. 6's
per-digit accuracies). Checked against a hand-computed case, against the run's own accuracy (the
query-weighted mean over classes is the mean episode accuracy), for leaving every other number of a
run as it was, and for leaving every stored study cell's key as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny import simulate, tiny_config

from fedfew.config.validation import ConfigError, load_config
from fedfew.fewshot.episodes import Episode
from fedfew.fewshot.evaluation import per_class_accuracy
from fedfew.run.experiment import build_experiment
from fedfew.study.grid import config_hash

REPO = Path(__file__).resolve().parents[1]


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


def test_per_class_is_refused_where_the_score_is_not_the_servers_episodes() -> None:
    for algorithm in ("local", "fml"):  # clients' own models; a classification task
        with pytest.raises(ConfigError, match=r"eval\.per_class"):
            build_experiment(load_config(tiny_config(algorithm, eval={"every": 1, "per_class": True})))


def test_stored_cells_keep_their_keys_and_per_class_makes_a_new_one() -> None:
    records = sorted((REPO / "studies" / "store").glob("*/*.json"))
    assert records, "no stored records to check"
    for path in records[:: max(1, len(records) // 60)]:  # a spread of studies, a few seconds in all
        record = json.loads(path.read_text())
        if record["config"].get("privacy", {}).get("mechanism", "none") != "none":
            continue  # issue 51 moved a DP cell's key with its guarantee (tests/test_privacy.py checks those)
        config = load_config(record["config"])
        assert config_hash(config) == record["config_hash"], path
    config = load_config(json.loads(records[0].read_text())["config"])
    on = config.model_copy(update={"eval": config.eval.model_copy(update={"per_class": True})})
    assert config_hash(on) != config_hash(config)
