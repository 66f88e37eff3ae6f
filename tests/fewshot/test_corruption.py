"""``partition.options.corrupt``: the named clients' data are spoiled as the kind says, every other
client's data (and the test set) are byte-identical to the run without it, and bad input is one
line naming the key (exit 2)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fedfew.cli.main import main
from fedfew.config.validation import ConfigError, load_config
from fedfew.core.seeding import torch_generator
from fedfew.data import LabelledDataset
from fedfew.fewshot.corruption import CORRUPTIONS, flip
from fedfew.run.experiment import Experiment, build_experiment

BASE: dict[str, Any] = {
    "seed": 3, "task": "classification", "dataset": {"name": "digits"},
    "classification": {"test_fraction": 0.2, "client_val_fraction": 0.25},
    "partition": {"name": "iid", "num_clients": 5},
    "model": {"name": "mlp", "options": {"hidden": 8}},
    "algorithm": {"name": "adfl", "options": {"local_epochs": 1, "ensemble_size": 2, "attack_steps": 2}},
    "federation": {"rounds": 1, "clients_per_round": 5}, "runtime": {"threads": 1, "progress": False},
}


def built(corrupt: dict[str, Any] | None = None, **partition: Any) -> Experiment:
    config = copy.deepcopy(BASE)
    config["partition"].update(partition)
    if corrupt is not None:
        config["partition"].setdefault("options", {})["corrupt"] = corrupt
    return build_experiment(load_config(config))


def same(a: LabelledDataset, b: LabelledDataset) -> bool:
    return torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels) and torch.equal(a.positions, b.positions)


@pytest.mark.parametrize("kind", ["flip", "noise"])
def test_only_the_named_clients_change_and_the_rest_is_byte_identical(kind: str) -> None:
    clean, bad = built(), built({"clients": [1, 3], "kind": kind})
    assert bad.context.corrupt_clients == [1, 3] and clean.context.corrupt_clients == []
    assert same(clean.test.dataset, bad.test.dataset)
    for a, b in zip(clean.clients, bad.clients):
        if a.client_id not in (1, 3):
            assert same(a.train, b.train) and same(a.val, b.val)
            continue
        for part, x, y in (("train", a.train, b.train), ("val", a.val, b.val)):
            assert torch.equal(x.positions, y.positions)  # the same samples, in the same order
            if kind == "flip":  # digits: all 10 classes train, so y -> 9 - y, inputs kept
                assert torch.equal(y.labels, 9 - x.labels) and torch.equal(x.inputs, y.inputs)
            else:  # uniform noise from the client's own generator, labels kept
                want = torch.rand(tuple(x.inputs.shape), generator=torch_generator(3, "corrupt", a.client_id, part))
                assert torch.equal(y.inputs, want) and torch.equal(x.labels, y.labels)
                assert not torch.equal(x.inputs, y.inputs)


def test_flip_mirrors_the_training_classes_in_their_sorted_order() -> None:
    # training classes 2, 5, 7, 8: 2 <-> 8 and 5 <-> 7 (a few-shot split's classes, not 0..K-1)
    data = LabelledDataset(torch.zeros(5, 1), torch.tensor([2, 5, 7, 8, 5]), [str(c) for c in range(10)])
    out = flip(data, [2, 5, 7, 8], torch.Generator())
    assert out.labels.tolist() == [8, 7, 5, 2, 7] and torch.equal(out.inputs, data.inputs)
    assert sorted(CORRUPTIONS.names()) == ["flip", "noise"]


def test_corruption_is_generic_and_kept_when_the_partition_changes() -> None:
    # another partitioner takes it too (it is not one partitioner's option) ...
    bad = built({"clients": [0], "kind": "flip"}, name="dirichlet", options={"alpha": 0.5})
    assert bad.context.corrupt_clients == [0]
    # ... and changing partition.name keeps it (the options the new partitioner lacks are dropped, not it)
    config = copy.deepcopy(BASE)
    config["partition"] = {"name": "dirichlet", "num_clients": 5, "options": {"alpha": 0.5,
                                                                               "corrupt": {"clients": [2], "kind": "noise"}}}
    loaded = load_config(config, ["partition.name=iid"])
    assert loaded.partition.options == {"corrupt": {"clients": [2], "kind": "noise"}}


@pytest.mark.parametrize("corrupt, expected", [
    ({"clients": [0, 5], "kind": "flip"}, "partition.options.corrupt.clients: [5] name no client"),
    ({"clients": [0], "kind": "flop"}, "partition.options.corrupt.kind: unknown corruption 'flop'"),
    ({"clients": [0], "kind": "flip", "amount": 1}, "partition.options.corrupt.amount: unknown key"),
    ({"kind": "flip"}, "partition.options.corrupt.clients: required key missing"),
    ({"clients": [1, 1], "kind": "flip"}, "partition.options.corrupt.clients: client ids must be distinct"),
    ([0, 1], "partition.options.corrupt: must be a mapping"),
])
def test_bad_corruption_is_one_line_naming_the_key_and_exits_2(corrupt: Any, expected: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = copy.deepcopy(BASE)
    config["partition"]["options"] = {"corrupt": corrupt}
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        load_config(config)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    code = main(["run", str(path), "--out", str(tmp_path / "runs")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and expected in err[0], err
