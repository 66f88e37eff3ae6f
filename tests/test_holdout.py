"""``splits.test: {classes, holdout}``: few-shot test episodes from held-out *samples* of chosen classes,
which the clients may train on (FedFSL section 5.3's centralised ceiling). The held-out samples never
reach a client, every test sample is one of them, and each class loses round(holdout x its samples)."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_config

from fedfew.config.validation import ConfigError, load_config
from fedfew.run.experiment import build_experiment

HELD = {"classes": ["5", "6", 7], "holdout": 0.25}  # names or ids


def _experiment(test: object = HELD, **sections: object):
    config = tiny_config("fl-maml", splits={"train": "base", "val": None, "test": test},
                         dataset={"name": "digits", "options": {"class_split": {"base": "rest"}}}, **sections)
    return build_experiment(load_config(config))


def test_held_out_samples_are_tested_on_and_never_trained_on() -> None:
    experiment = _experiment()
    labels = experiment.dataset.labels
    counts = torch.bincount(labels, minlength=10)
    trained = torch.cat([c.train.positions for c in experiment.clients])
    assert len(set(trained.tolist())) == len(trained)  # the partition gives each sample to one client
    tested = {p for ep in experiment.test.episodes for p in torch.cat([ep.support_index, ep.query_index]).tolist()}
    assert tested and not tested & set(trained.tolist())  # no test sample is a training sample
    assert {int(labels[p]) for p in tested} <= {5, 6, 7}
    for c in range(10):  # classes 5, 6, 7: all but round(0.25 n) samples train; the others train whole
        in_training = int((labels[trained] == c).sum())
        held = round(0.25 * int(counts[c])) if c in (5, 6, 7) else 0
        assert in_training == int(counts[c]) - held, c
    # the same seed holds out the same samples; another seed others
    assert [ep.query_index.tolist() for ep in _experiment().test.episodes] == \
        [ep.query_index.tolist() for ep in experiment.test.episodes]
    other = _experiment(seed=1)
    assert set(torch.cat([c.train.positions for c in other.clients]).tolist()) != set(trained.tolist())


def test_a_named_split_is_unchanged_and_bad_holdouts_are_one_line_errors() -> None:
    assert load_config(tiny_config("fl-maml")).splits.model_dump()["test"] == "novel"  # old configs' keys stay
    with pytest.raises(ConfigError, match=r"splits\.test\.classes: unknown class 'five'"):
        _experiment({"classes": ["five", "6"], "holdout": 0.5})
    with pytest.raises(ConfigError, match=r"splits\.test\.holdout"):
        load_config(tiny_config("fl-maml", splits={"test": {"classes": [5, 6], "holdout": 1.0}}))
    with pytest.raises(ConfigError, match=r"episodes: .*3-way"):  # too few held-out samples for the episodes
        _experiment({"classes": [5, 6, 7], "holdout": 0.005})
    with pytest.raises(ConfigError, match=r"splits\.test\.holdot: unknown key.*holdout"):
        load_config(tiny_config("fl-maml", splits={"test": {"classes": [5, 6], "holdot": 0.5}}))
