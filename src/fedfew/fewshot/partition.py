"""Client partitions: which samples each client holds.

Every partitioner takes the labels (and group ids where natural), a number of clients and its own
seeded ``numpy.random.Generator``, and returns one sorted int64 index array per client. Every sample
goes to at most one client. Impossible requests raise :class:`PartitionError` at once; randomised
ones retry a bounded number of times and then raise, never loop forever.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from fedfew.core.errors import UsageError
from fedfew.core.registry import Registry

if TYPE_CHECKING:
    import torch


class PartitionError(UsageError):
    """A partition cannot be made as asked; the message says why and what would work."""


Partitioner = Callable[..., list[np.ndarray]]
PARTITIONS: Registry[Partitioner] = Registry("partition")


def _check_clients(num_clients: int, num_samples: int) -> None:
    if num_clients < 1:
        raise PartitionError(f"num_clients must be at least 1, got {num_clients}")
    if num_clients > num_samples:
        raise PartitionError(f"cannot give {num_clients} clients a sample each from {num_samples} samples")


def _finish(parts: Sequence[np.ndarray | list[int]]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


@PARTITIONS.register("iid", help="shuffle and deal out equal shares")
def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator, **_: object) -> list[np.ndarray]:
    """Shuffle all samples and split them into ``num_clients`` near-equal shares."""
    _check_clients(num_clients, len(labels))
    return _finish(np.array_split(rng.permutation(len(labels)), num_clients))


@PARTITIONS.register("dirichlet", help="per-class shares ~ Dir(alpha); alpha=1.0 in FedFSL and F2L")
def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float = 1.0,
    min_size: int = 1,
    max_tries: int = 100,
    **_: object,
) -> list[np.ndarray]:
    """For each class, split its samples among clients in proportions drawn from Dir(alpha).

    Small ``alpha`` gives each client one or two dominant classes; large ``alpha`` approaches IID.
    A draw leaving some client with fewer than ``min_size`` samples is redrawn, at most ``max_tries``
    times, after which a :class:`PartitionError` says how to relax the request.
    """
    if alpha <= 0:
        raise PartitionError(f"dirichlet alpha must be positive, got {alpha}")
    _check_clients(num_clients, len(labels))
    if min_size * num_clients > len(labels):
        raise PartitionError(
            f"min_size={min_size} for {num_clients} clients needs {min_size * num_clients} samples, "
            f"only {len(labels)} exist"
        )
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _attempt in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            idx = rng.permutation(idx)
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for client, piece in enumerate(np.split(idx, cuts)):
                parts[client].extend(piece.tolist())
        if min(len(p) for p in parts) >= min_size:
            return _finish(parts)
    raise PartitionError(
        f"dirichlet(alpha={alpha}) left some client with fewer than min_size={min_size} samples in "
        f"{max_tries} draws; raise alpha, lower min_size or use fewer clients"
    )


@PARTITIONS.register("shards", help="sort by class, cut shards, give each client s shards (FML, FRL)")
def shards(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    shards_per_client: int = 2,
    shard_size: int | None = None,
    distinct_classes: bool = False,
    single_class_shards: bool = False,
    max_tries: int = 100,
    **_: object,
) -> list[np.ndarray]:
    """The pathological non-IID split of McMahan et al.: sort samples by label, cut them into
    shards of ``shard_size`` (default: all samples / (clients x shards)), deal ``shards_per_client``
    random shards to each client.

    ``single_class_shards`` cuts shards within each class, so a shard never spans two classes (FML's
    "two single-class shards"); ``distinct_classes`` redraws (bounded) until no client holds two
    shards of the same class.
    """
    _check_clients(num_clients, len(labels))
    total = num_clients * shards_per_client
    if shards_per_client < 1:
        raise PartitionError(f"shards_per_client must be at least 1, got {shards_per_client}")
    size = shard_size or len(labels) // total
    if size < 1 or size * total > len(labels):
        raise PartitionError(
            f"{num_clients} clients x {shards_per_client} shards of {size} samples need "
            f"{total * max(size, 1)} samples, only {len(labels)} exist"
        )
    order = np.argsort(labels, kind="stable")
    if single_class_shards:
        pieces: list[np.ndarray] = []
        for c in np.unique(labels):
            idx = order[labels[order] == c]
            pieces.extend(idx[i : i + size] for i in range(0, len(idx) - size + 1, size))
        if len(pieces) < total:
            raise PartitionError(
                f"only {len(pieces)} single-class shards of {size} samples exist, {total} are needed; "
                "lower shard_size or the number of clients"
            )
        pieces = [pieces[i] for i in rng.choice(len(pieces), total, replace=False)]
    else:
        pieces = [order[i * size : (i + 1) * size] for i in range(total)]
    shard_class = np.array([np.bincount(labels[p]).argmax() for p in pieces])
    for _attempt in range(max_tries):
        deal = rng.permutation(total).reshape(num_clients, shards_per_client)
        if not distinct_classes or all(len(set(shard_class[row])) == shards_per_client for row in deal):
            return _finish([np.concatenate([pieces[s] for s in row]) for row in deal])
    raise PartitionError(
        f"could not deal {shards_per_client} shards of distinct classes to each of {num_clients} clients "
        f"in {max_tries} tries; there may be too few classes ({len(set(shard_class.tolist()))})"
    )


@PARTITIONS.register("dirichlet_classes", help="whole classes dealt out with Dirichlet(alpha) quantity skew")
def dirichlet_classes(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float = 1.0,
) -> list[np.ndarray]:
    """Quantity skew over disjoint whole classes (the FL-MAML peer workload, ../shared/peers): one
    draw q ~ Dir(alpha 1_K), a permutation of the C classes present (ascending ids), and client k
    gets every sample of the classes perm[cut_{k-1}:cut_k], cuts = floor(cumsum(q)[:-1] C). Clients
    can end up with no class (they hold no data and sit out every round)."""
    if alpha <= 0:
        raise PartitionError(f"dirichlet_classes: alpha must be positive, got {alpha}")
    classes = np.unique(labels)
    q = rng.dirichlet(np.full(num_clients, alpha))
    perm = rng.permutation(len(classes))
    cuts = (np.cumsum(q)[:-1] * len(classes)).astype(int)
    parts = [np.flatnonzero(np.isin(labels, classes[np.sort(chunk)])) for chunk in np.split(perm, cuts)]
    return _finish(parts)


@PARTITIONS.register("label_skew", help="k classes per client, shares from a normal distribution (AdFL)")
def label_skew(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    classes_per_client: int = 4,
    samples_per_client: int = 400,
    std: float = 1.0,
    reading: Literal["proportions", "paper"] = "proportions",
    **_: object,
) -> list[np.ndarray]:
    """AdFL's label skew (Fig. 1): each client holds ``classes_per_client`` distinct classes and
    ``samples_per_client`` samples, without replacement and disjoint from all other clients. The paper
    says only that each class has "a probability of its occurrence [...] drawn from a normal
    distribution" and that "all classes inside the local dataset had the same number of instances";
    we use |N(1, std)| so that probabilities stay positive (std=0: all equal). Two readings:

    * ``reading: paper``: one occurrence probability per *class*, drawn once (the first draw from
      ``rng``) and normalised; each client picks its classes with those probabilities (without
      replacement), so some classes are rarer across clients, and takes the same number of samples
      of each (locally balanced; a remainder of samples_per_client / classes_per_client goes one
      sample each to its first classes). A class with too few samples left for a client's share is
      not offered to that client (the probabilities are renormalised over the classes that are).
    * ``reading: proportions`` (our earlier reading): classes picked uniformly, one probability per
      class *inside each client*, so the proportions are uneven inside a client.
    """
    _check_clients(num_clients, len(labels))
    classes = np.unique(labels)
    if not 1 <= classes_per_client <= len(classes):
        raise PartitionError(f"classes_per_client must be in 1..{len(classes)}, got {classes_per_client}")
    if samples_per_client * num_clients > len(labels):
        raise PartitionError(
            f"{num_clients} clients x {samples_per_client} samples = {num_clients * samples_per_client} "
            f"exceeds the {len(labels)} samples available; lower samples_per_client"
        )
    if reading == "paper":
        return _label_skew_balanced(labels, classes, num_clients, rng, classes_per_client, samples_per_client, std)
    pools = {int(c): list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    parts: list[list[int]] = []
    for client in range(num_clients):
        available = [c for c in pools if pools[c]]
        if len(available) < classes_per_client:
            raise PartitionError(f"client {client}: fewer than {classes_per_client} classes have samples left")
        chosen = rng.choice(available, classes_per_client, replace=False)
        probs = np.abs(rng.normal(1.0, std, classes_per_client)) + 1e-6
        wanted = np.floor(probs / probs.sum() * samples_per_client).astype(int)
        wanted[np.argmax(wanted)] += samples_per_client - wanted.sum()
        picked: list[int] = []
        shortfall = 0
        for c, n in zip(chosen, wanted):
            take = min(n, len(pools[int(c)]))
            shortfall += n - take
            picked.extend(pools[int(c)][:take])
            del pools[int(c)][:take]
        for c in chosen:  # a class that ran short is topped up from the client's other classes
            if shortfall == 0:
                break
            take = min(shortfall, len(pools[int(c)]))
            picked.extend(pools[int(c)][:take])
            del pools[int(c)][:take]
            shortfall -= take
        parts.append(picked)
    return _finish(parts)


def class_occurrence_probabilities(num_classes: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """AdFL's per-class occurrence probabilities (``label_skew`` with ``reading: paper``): |N(1, std)|
    per class, normalised to sum to one."""
    probs = np.abs(rng.normal(1.0, std, num_classes)) + 1e-6
    return probs / probs.sum()


def _label_skew_balanced(labels: np.ndarray, classes: np.ndarray, num_clients: int, rng: np.random.Generator,
                         classes_per_client: int, samples_per_client: int, std: float) -> list[np.ndarray]:
    occurrence = class_occurrence_probabilities(len(classes), std, rng)
    share = np.full(classes_per_client, samples_per_client // classes_per_client)
    share[: samples_per_client % classes_per_client] += 1
    pools = {i: list(rng.permutation(np.flatnonzero(labels == c))) for i, c in enumerate(classes)}
    parts: list[list[int]] = []
    for client in range(num_clients):
        picked: list[int] = []
        chosen: list[int] = []
        for k in range(classes_per_client):  # one class at a time, as rng.choice without replacement does
            open_ = [i for i in pools if i not in chosen and len(pools[i]) >= share[k]]
            if not open_:
                raise PartitionError(f"client {client}: no class has {share[k]} samples left for an equal share; "
                                     "lower samples_per_client or num_clients")
            p = occurrence[open_] / occurrence[open_].sum()
            i = int(rng.choice(open_, p=p))
            chosen.append(i)
            picked.extend(pools[i][: share[k]])
            del pools[i][: share[k]]
        parts.append(picked)
    return _finish(parts)


@PARTITIONS.register("natural", help="one client per writer/user group (FEMNIST, Sent140)")
def natural(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    groups: np.ndarray | None = None,
    **_: object,
) -> list[np.ndarray]:
    """One client per group (writer or user); with fewer clients than groups, a seeded choice of
    groups, and with more, an error."""
    if groups is None:
        raise PartitionError("the natural partition needs group ids (writers or users); this dataset has none")
    ids = np.unique(groups)
    if num_clients > len(ids):
        raise PartitionError(f"{num_clients} clients asked for, but the data has only {len(ids)} groups")
    chosen = np.sort(rng.choice(ids, num_clients, replace=False))
    return _finish([np.flatnonzero(groups == g) for g in chosen])


def partition(
    name: str,
    labels: np.ndarray | torch.Tensor,
    num_clients: int,
    rng: np.random.Generator,
    **options: object,
) -> list[np.ndarray]:
    """Run partitioner ``name``; labels may be a tensor or an array."""
    labels = np.asarray(labels)
    if "groups" in options and options["groups"] is not None:
        options["groups"] = np.asarray(options["groups"])
    return PARTITIONS.get(name)(labels, num_clients, rng, **options)


def count_matrix(parts: list[np.ndarray], labels: np.ndarray | torch.Tensor, num_classes: int | None = None) -> np.ndarray:
    """[clients, classes] sample counts."""
    labels = np.asarray(labels)
    width = num_classes or int(labels.max()) + 1
    return np.stack([np.bincount(labels[p], minlength=width) for p in parts])


def summary(parts: list[np.ndarray], labels: np.ndarray | torch.Tensor) -> str:
    """A printable table of client sizes and their class counts."""
    counts = count_matrix(parts, labels)
    lines = [f"{len(parts)} clients, sizes min {counts.sum(1).min()} / median {int(np.median(counts.sum(1)))} "
             f"/ max {counts.sum(1).max()}, classes per client median {int(np.median((counts > 0).sum(1)))}"]
    for client, row in enumerate(counts):
        nz = ", ".join(f"{c}:{n}" for c, n in enumerate(row) if n)
        lines.append(f"  client {client:3d} ({row.sum():5d}) {nz}")
    return "\n".join(lines)


def plot_counts(parts: list[np.ndarray], labels: np.ndarray | torch.Tensor, path: str) -> None:
    """Save a clients x classes heat map of sample counts to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = count_matrix(parts, labels)
    fig, ax = plt.subplots(figsize=(max(4, counts.shape[1] * 0.3), max(3, counts.shape[0] * 0.25)))
    image = ax.imshow(counts, aspect="auto", cmap="viridis")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    fig.colorbar(image, ax=ax, label="samples")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
