"""The options that configure another tool's workload identically (benchmarks/peers.yaml): the
whole-class Dirichlet partition drawn with given generator entropy, test tasks from a file, and the
initial model of torch.manual_seed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfew.config.validation import load_config
from fedfew.fewshot.episodes import EpisodeError, load_tasks
from fedfew.fewshot.partition import partition
from fedfew.models import build_model
from fedfew.run.experiment import build_experiment
from tests.helpers import blob_dataset
from tests.tiny import tiny_config


def test_dirichlet_classes_reproduces_the_peers_partition() -> None:
    labels = np.repeat(np.arange(964), 20)  # Omniglot's background characters, 20 drawings each
    parts = partition("dirichlet_classes", labels, 10, np.random.default_rng([0, 0]), alpha=1.0)
    classes = [len(np.unique(labels[p])) for p in parts]
    assert classes == [46, 69, 1, 0, 38, 110, 46, 51, 191, 412]  # ../shared/peers/README.md, seed 0
    assert all(len(p) == 20 * c for p, c in zip(parts, classes))  # whole classes
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))


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


def test_init_seed_builds_the_model_of_torch_manual_seed() -> None:
    config = tiny_config("fl-maml")
    config["model"]["init_seed"] = 7
    experiment = build_experiment(load_config(config))
    server = experiment.simulator().server["model"]
    torch.manual_seed(7)
    reference = build_model("conv4", experiment.context.input_shape, 3, hidden=8)
    assert all(torch.equal(server[k], v) for k, v in reference.state_dict().items())
    other = build_experiment(load_config(tiny_config("fl-maml"))).simulator().server["model"]
    assert not all(torch.equal(server[k], other[k]) for k in server)
