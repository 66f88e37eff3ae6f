"""Client partitions (fedfew.fewshot.partition): coverage, disjointness, the shapes each paper's split
promises, errors, and the peers' whole-class Dirichlet partition drawn with given generator entropy."""

from __future__ import annotations

import numpy as np
import pytest

from fedfew.fewshot.partition import PARTITIONS, PartitionError, count_matrix, partition, summary


def labels_balanced(classes: int = 10, per_class: int = 100) -> np.ndarray:
    return np.repeat(np.arange(classes), per_class)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def assert_disjoint(parts: list[np.ndarray], n: int, cover: bool) -> None:
    joined = np.concatenate(parts)
    assert len(joined) == len(np.unique(joined)), "a sample went to two clients"
    assert joined.min() >= 0 and joined.max() < n
    if cover:
        assert len(joined) == n, "some samples were not assigned"


@pytest.mark.parametrize(
    "name, options, cover",
    [
        ("iid", {}, True),
        ("dirichlet", {"alpha": 0.5}, True),
        ("shards", {"shards_per_client": 2}, True),
        ("shards", {"shards_per_client": 2, "single_class_shards": True, "shard_size": 50}, True),
        ("label_skew", {"classes_per_client": 4, "samples_per_client": 90}, False),
    ],
)
def test_partitions_are_disjoint(name: str, options: dict, cover: bool) -> None:
    labels = labels_balanced()
    parts = partition(name, labels, 10, rng(), **options)
    assert len(parts) == 10
    assert_disjoint(parts, len(labels), cover)


def test_iid_sizes_are_equal_and_classes_mixed() -> None:
    parts = partition("iid", labels_balanced(), 10, rng())
    assert {len(p) for p in parts} == {100}
    assert (count_matrix(parts, labels_balanced()) > 0).sum(1).min() >= 8


def test_dirichlet_large_alpha_is_near_uniform() -> None:
    labels = labels_balanced(5, 1000)
    counts = count_matrix(partition("dirichlet", labels, 5, rng(), alpha=1e4), labels)
    shares = counts / counts.sum(1, keepdims=True)
    assert np.abs(shares - 0.2).max() < 0.03


def test_dirichlet_tiny_alpha_gives_dominant_classes() -> None:
    labels = labels_balanced(10, 200)
    counts = count_matrix(partition("dirichlet", labels, 10, rng(1), alpha=0.01, min_size=0), labels)
    counts = counts[counts.sum(1) > 0]
    top2 = np.sort(counts, axis=1)[:, -2:].sum(1) / counts.sum(1)
    assert np.median(top2) > 0.95


def test_dirichlet_min_size_fails_cleanly() -> None:
    labels = labels_balanced(2, 10)
    with pytest.raises(PartitionError, match="min_size"):
        partition("dirichlet", labels, 10, rng(), alpha=0.001, min_size=2, max_tries=5)
    with pytest.raises(PartitionError, match="needs"):
        partition("dirichlet", labels, 10, rng(), min_size=3)


def test_shards_give_exactly_s_shards_per_client() -> None:
    labels = labels_balanced(10, 100)
    parts = partition("shards", labels, 5, rng(), shards_per_client=2, shard_size=50, single_class_shards=True)
    for p in parts:
        assert len(p) == 100
        per_class = np.bincount(labels[p], minlength=10)
        assert sorted(per_class[per_class > 0].tolist()) in ([50, 50], [100])


def test_shards_distinct_classes_option() -> None:
    labels = labels_balanced(10, 100)
    parts = partition("shards", labels, 10, rng(3), shards_per_client=2, shard_size=50,
                      single_class_shards=True, distinct_classes=True)
    assert all((np.bincount(labels[p], minlength=10) > 0).sum() == 2 for p in parts)


def test_shards_impossible_request() -> None:
    with pytest.raises(PartitionError, match="shards"):
        partition("shards", labels_balanced(2, 10), 10, rng(), shards_per_client=3)


def test_label_skew_has_k_classes_and_target_size() -> None:
    labels = labels_balanced(10, 500)
    parts = partition("label_skew", labels, 10, rng(), classes_per_client=4, samples_per_client=200)
    counts = count_matrix(parts, labels)
    assert (counts.sum(1) == 200).all()
    assert ((counts > 0).sum(1) <= 4).all()
    with pytest.raises(PartitionError, match="exceeds"):
        partition("label_skew", labels, 30, rng(), samples_per_client=200)


def test_natural_one_client_per_group() -> None:
    labels = labels_balanced(2, 10)
    groups = np.repeat(np.arange(4), 5)
    parts = partition("natural", labels, 3, rng(), groups=groups)
    for p in parts:
        assert len(np.unique(groups[p])) == 1 and len(p) == 5
    with pytest.raises(PartitionError, match="only 4 groups"):
        partition("natural", labels, 5, rng(), groups=groups)
    with pytest.raises(PartitionError, match="group ids"):
        partition("natural", labels, 2, rng())


@pytest.mark.parametrize("name", PARTITIONS.names())
def test_same_seed_same_partition(name: str) -> None:
    labels = labels_balanced()
    options = {"groups": np.repeat(np.arange(20), 50)} if name == "natural" else {}
    if name == "label_skew":
        options = {"samples_per_client": 50}
    a = partition(name, labels, 10, rng(7), **options)
    b = partition(name, labels, 10, rng(7), **options)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_too_many_clients_and_summary() -> None:
    with pytest.raises(PartitionError):
        partition("iid", np.arange(3), 4, rng())
    text = summary(partition("iid", labels_balanced(), 4, rng()), labels_balanced())
    assert "4 clients" in text and "client   0" in text


def test_label_skew_paper_reading_is_locally_balanced_with_rarer_classes() -> None:
    """AdFL's reading: every client holds exactly k classes in equal numbers, clients are
    disjoint, and how many clients hold a class follows the per-class occurrence probabilities (the
    first draw of the generator): rank correlation with the probabilities, and std=0 spreads the
    classes evenly."""
    from scipy.stats import spearmanr

    from fedfew.fewshot.partition import class_occurrence_probabilities

    labels = labels_balanced(10, 3000)
    parts = partition("label_skew", labels, 1000, rng(5), classes_per_client=4, samples_per_client=20,
                      std=0.5, reading="paper")
    counts = count_matrix(parts, labels)
    held = counts > 0
    assert (held.sum(1) == 4).all() and (counts[held] == 5).all()  # 4 classes x 5 samples, every client
    everything = np.concatenate(parts)
    assert len(np.unique(everything)) == len(everything) == 20_000
    probs = class_occurrence_probabilities(10, 0.5, rng(5))
    assert spearmanr(probs, held.sum(0)).statistic > 0.9
    assert held.sum(0).min() < 0.6 * held.sum(0).max()  # some classes are rarer across clients
    even = count_matrix(partition("label_skew", labels, 1000, rng(5), classes_per_client=4, samples_per_client=20,
                                  std=0.0, reading="paper"), labels) > 0
    assert even.sum(0).min() > 0.85 * even.sum(0).max()
    odd = count_matrix(partition("label_skew", labels, 10, rng(1), classes_per_client=3, samples_per_client=10,
                                 reading="paper"), labels)
    assert all(sorted(row[row > 0].tolist()) == [3, 3, 4] for row in odd)  # 10 = 4 + 3 + 3


def test_label_skew_paper_reading_raises_when_no_class_can_give_a_share() -> None:
    with pytest.raises(PartitionError, match="equal share"):
        partition("label_skew", np.array([0] * 15 + [1] * 5), 2, rng(), classes_per_client=1, samples_per_client=10,
                  reading="paper")


def test_dirichlet_classes_reproduces_the_peers_partition() -> None:
    labels = np.repeat(np.arange(964), 20)  # Omniglot's background characters, 20 drawings each
    parts = partition("dirichlet_classes", labels, 10, np.random.default_rng([0, 0]), alpha=1.0)
    classes = [len(np.unique(labels[p])) for p in parts]
    assert classes == [46, 69, 1, 0, 38, 110, 46, 51, 191, 412]  # ../shared/peers/README.md, seed 0
    assert all(len(p) == 20 * c for p, c in zip(parts, classes))  # whole classes
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
