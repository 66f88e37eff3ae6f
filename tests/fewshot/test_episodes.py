"""Episodes (fedfew.fewshot.episodes): disjoint support/query, remapped labels, reproducibility, test
tasks from a file, and clear errors (a class with too few samples names its file and class)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedfew.data import LabelledDataset
from fedfew.fewshot.episodes import EpisodeError, EpisodeSampler, fixed_episodes, load_tasks
from tests.data.common import run_with_dataset, write_jsonl
from tests.helpers import blob_dataset


def toy_dataset(classes: int = 8, per_class: int = 20) -> LabelledDataset:
    labels = torch.arange(classes).repeat_interleave(per_class)
    inputs = torch.arange(len(labels), dtype=torch.float32).unsqueeze(1)  # input = its own index
    return LabelledDataset(inputs, labels, [str(c) for c in range(classes)], name="toy",
                           splits={"base": list(range(5)), "val": [], "novel": list(range(5, classes))})


def test_episode_shapes_labels_and_disjointness() -> None:
    data = toy_dataset()
    sampler = EpisodeSampler(data, n_way=3, k_shot=2, q_query=4, classes=data.splits["base"])
    episode = sampler.sample(torch.Generator().manual_seed(0))
    assert episode.support.shape == (6, 1) and episode.query.shape == (12, 1)
    assert episode.n_way == 3 and episode.k_shot == 2
    assert not set(episode.support_index.tolist()) & set(episode.query_index.tolist())
    # labels 0..N-1 follow ``classes``; inputs are the sample's own index, so we can check provenance
    assert torch.equal(data.labels[episode.support_index], episode.classes[episode.support_labels])
    assert torch.equal(data.labels[episode.query_index], episode.classes[episode.query_labels])
    assert torch.equal(episode.support.squeeze(1).long(), episode.support_index)
    assert set(episode.classes.tolist()) <= set(data.splits["base"])


def test_only_eligible_classes_are_drawn() -> None:
    labels = torch.tensor([0] * 10 + [1] * 10 + [2] * 3 + [3] * 10)
    data = LabelledDataset(torch.zeros(len(labels), 1), labels, ["a", "b", "c", "d"], name="skewed")
    sampler = EpisodeSampler(data, n_way=3, k_shot=1, q_query=4)
    assert sorted(sampler.classes.tolist()) == [0, 1, 3]
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        assert 2 not in sampler.sample(g).classes.tolist()


def test_impossible_request_is_a_clear_error() -> None:
    data = toy_dataset(per_class=5)
    with pytest.raises(EpisodeError, match="at least 6 samples"):
        EpisodeSampler(data, n_way=3, k_shot=1, q_query=5)
    with pytest.raises(EpisodeError, match="5 such classes"):
        EpisodeSampler(data, n_way=6, k_shot=1, q_query=1, classes=data.splits["base"])


def test_fixed_episodes_are_reproducible_and_differ_by_seed() -> None:
    data = toy_dataset()
    a = fixed_episodes(data, data.splits["novel"], 3, 1, 5, num=10, seed=3)
    b = fixed_episodes(data, data.splits["novel"], 3, 1, 5, num=10, seed=3)
    c = fixed_episodes(data, data.splits["novel"], 3, 1, 5, num=10, seed=4)
    assert all(torch.equal(x.query_index, y.query_index) for x, y in zip(a, b))
    assert any(not torch.equal(x.query_index, y.query_index) for x, y in zip(a, c))
    assert len(a) == 10 and a[0].query.shape == (15, 1)


def test_sampling_within_a_pool_of_indices() -> None:
    data = toy_dataset()
    pool = torch.arange(0, 60)  # classes 0, 1, 2 only
    sampler = EpisodeSampler(data, 3, 1, 2, indices=pool)
    episode = sampler.sample(torch.Generator().manual_seed(0))
    assert set(episode.support_index.tolist() + episode.query_index.tolist()) <= set(pool.tolist())


def test_tasks_file_is_used_and_checked(tmp_path: Path) -> None:
    data = blob_dataset(classes=8, per_class=6)
    novel = data.splits["novel"]
    pos = {c: torch.nonzero(data.labels == c).flatten().tolist() for c in novel}
    task = {"classes": novel[:2], "support": [pos[novel[0]][:1], pos[novel[1]][:1]],
            "query": [pos[novel[0]][1:3], pos[novel[1]][1:3]]}
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps({"tasks": [task]}))
    episodes = load_tasks(path, data, novel, 2, 1, 2)
    (episode,) = list(episodes)
    assert episode.query_labels.tolist() == [0, 0, 1, 1]
    assert torch.equal(episode.support, data.inputs[[pos[novel[0]][0], pos[novel[1]][0]]])
    bad = {**task, "query": [pos[novel[1]][1:3], pos[novel[0]][1:3]]}  # rows swapped: wrong labels
    path.write_text(json.dumps({"tasks": [bad]}))
    with pytest.raises(EpisodeError, match="tasks.json task 0 has a position whose label"):
        load_tasks(path, data, novel, 2, 1, 2)
    with pytest.raises(EpisodeError, match="shape"):
        load_tasks(path, data, novel, 3, 1, 2)
    path.write_text("{not json")
    with pytest.raises(EpisodeError, match="tasks.json"):
        load_tasks(path, data, novel, 2, 1, 2)


def test_class_with_too_few_samples_is_an_error_naming_file_and_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"text": f"t{i}", "label": f"c{i % 4}"} for i in range(16)] + [{"text": "x", "label": "c4"}]
    write_jsonl(tmp_path / "few.jsonl", rows)
    dataset = {"name": "text-jsonl", "root": str(tmp_path),
               "options": {"path": "few.jsonl", "class_split": {"base": ["c0", "c1"], "novel": ["c2", "c3", "c4"]}}}
    code, _, _ = run_with_dataset(tmp_path, dataset, splits={"val": None}, model={"name": "gru", "options": {"hidden": 4}})
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert str(tmp_path / "few.jsonl") in err and "class 'c4'" in err and "1 samples" in err
    assert "k_shot + q_query = 3" in err
