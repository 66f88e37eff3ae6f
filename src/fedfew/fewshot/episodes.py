"""N-way K-shot Q-query episodes.

An :class:`EpisodeSampler` draws tasks from a pool (one client's local data, or a global class
split): N classes among those with at least K + Q samples, then K support and Q query samples of
each, disjoint. Sampling is one ``randperm`` and one ``argsort`` over an index table, no Python loop
per sample. :func:`fixed_episodes` gives the evaluation tasks every method is scored on: they depend
only on the dataset, the split and the seed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import torch

from fedfew.core.errors import UsageError
from fedfew.core.seeding import torch_generator
from fedfew.data.dataset import LabelledDataset


class EpisodeError(UsageError):
    """An episode cannot be sampled as asked; the message says what the data allows."""


#: The rows every episode drawn in this context used, while :func:`recording_rows` is active.
_ROWS_DRAWN: ContextVar[set[int] | None] = ContextVar("rows_drawn", default=None)


@contextlib.contextmanager
def recording_rows() -> Iterator[set[int]]:
    """Collect the rows of the loaded dataset (``LabelledDataset.positions``, or the positions in the
    sampler's dataset where it has none) that every episode drawn inside the block uses as support or
    query: the examples a training update actually saw (the membership check's members)."""
    rows: set[int] = set()
    token = _ROWS_DRAWN.set(rows)
    try:
        yield rows
    finally:
        _ROWS_DRAWN.reset(token)


def _note_rows(dataset: LabelledDataset, *picks: torch.Tensor) -> None:
    rows = _ROWS_DRAWN.get()
    if rows is None:
        return
    for pick in picks:
        pick = pick.cpu()
        rows.update((pick if dataset.positions is None else dataset.positions[pick]).tolist())


@dataclass
class Episode:
    """One few-shot task. Labels are remapped to 0..N-1 in the order of ``classes`` (the original
    class ids, which F2L's server model needs to classify over all base classes)."""

    support: torch.Tensor
    support_labels: torch.Tensor
    query: torch.Tensor
    query_labels: torch.Tensor
    classes: torch.Tensor
    support_index: torch.Tensor
    query_index: torch.Tensor
    support_lengths: torch.Tensor | None = None
    query_lengths: torch.Tensor | None = None

    @property
    def n_way(self) -> int:
        return len(self.classes)

    @property
    def k_shot(self) -> int:
        return len(self.support_labels) // self.n_way

    def support_args(self) -> tuple[torch.Tensor, ...]:
        """Model arguments for the support set: ``(inputs,)`` or ``(token_ids, lengths)``."""
        return (self.support,) if self.support_lengths is None else (self.support, self.support_lengths)

    def query_args(self) -> tuple[torch.Tensor, ...]:
        return (self.query,) if self.query_lengths is None else (self.query, self.query_lengths)


class EpisodeSampler:
    """Samples N-way K-shot Q-query episodes from ``dataset`` restricted to ``classes`` and/or
    ``indices`` (positions in ``dataset``)."""

    def __init__(
        self,
        dataset: LabelledDataset,
        n_way: int,
        k_shot: int,
        q_query: int,
        classes: list[int] | torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
    ) -> None:
        if n_way < 1 or k_shot < 1 or q_query < 0:
            raise EpisodeError(f"need n_way >= 1, k_shot >= 1, q_query >= 0; got {n_way}, {k_shot}, {q_query}")
        self.dataset, self.n_way, self.k_shot, self.q_query = dataset, n_way, k_shot, q_query
        pool = torch.arange(len(dataset)) if indices is None else torch.as_tensor(indices, dtype=torch.long)
        if classes is not None:
            pool = pool[torch.isin(dataset.labels[pool], torch.as_tensor(list(classes), dtype=torch.long))]
        labels = dataset.labels[pool]
        present, counts = torch.unique(labels, return_counts=True)
        need = k_shot + q_query
        self.classes = present[counts >= need]
        if len(self.classes) < n_way:
            best = sorted(counts.tolist(), reverse=True)[:n_way]
            raise EpisodeError(
                f"{dataset.name}: a {n_way}-way {k_shot}-shot {q_query}-query episode needs {n_way} classes "
                f"with at least {need} samples each; this pool has {len(self.classes)} such classes "
                f"(of {len(present)}; the {n_way} largest hold {best} samples). "
                "Lower n_way, k_shot or q_query, or give the pool more data."
            )
        # Index table [classes, max_count] of dataset positions, padded with -1.
        order = torch.argsort(labels, stable=True)
        sorted_pool, sorted_labels = pool[order], labels[order]
        keep = torch.isin(sorted_labels, self.classes)
        sorted_pool, sorted_labels = sorted_pool[keep], sorted_labels[keep]
        class_counts = counts[counts >= need]
        width = int(class_counts.max())
        starts = torch.cumsum(class_counts, 0) - class_counts
        rank = torch.arange(len(sorted_pool)) - torch.repeat_interleave(starts, class_counts)
        row = torch.repeat_interleave(torch.arange(len(self.classes)), class_counts)
        self.table = torch.full((len(self.classes), width), -1, dtype=torch.long)
        self.table[row, rank] = sorted_pool
        self.counts = class_counts

    def sample_indices(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(classes [N], support positions [N*K], query positions [N*Q]) grouped by class."""
        rows = torch.randperm(len(self.classes), generator=generator, device=generator.device)[: self.n_way]
        table = self.table[rows]
        scores = torch.rand(table.shape, generator=generator, device=generator.device).to(table.device)
        scores = scores.masked_fill(table < 0, 2.0)
        picks = table.gather(1, scores.argsort(dim=1)[:, : self.k_shot + self.q_query])
        support, query = picks[:, : self.k_shot].reshape(-1), picks[:, self.k_shot :].reshape(-1)
        _note_rows(self.dataset, support, query)
        return self.classes[rows], support, query

    def sample(self, generator: torch.Generator) -> Episode:
        return self.materialise(*self.sample_indices(generator))

    def materialise(self, classes: torch.Tensor, support: torch.Tensor, query: torch.Tensor) -> Episode:
        data = self.dataset
        n = len(classes)
        lengths = data.lengths
        return Episode(
            support=data.inputs[support],
            support_labels=torch.arange(n).repeat_interleave(len(support) // n),
            query=data.inputs[query],
            query_labels=torch.arange(n).repeat_interleave(len(query) // n) if len(query) else query.clone(),
            classes=classes,
            support_index=support,
            query_index=query,
            support_lengths=None if lengths is None else lengths[support],
            query_lengths=None if lengths is None else lengths[query],
        )


class FixedEpisodes:
    """A reproducible list of evaluation episodes, stored as indices and materialised on access."""

    def __init__(self, sampler: EpisodeSampler, num: int, seed: int, tag: str = "eval",
                 draws: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None) -> None:
        self.sampler = sampler
        if draws is None:
            generator = torch_generator(seed, "episodes", tag)
            draws = [sampler.sample_indices(generator) for _ in range(num)]
        self.draws = draws

    def __len__(self) -> int:
        return len(self.draws)

    def __getitem__(self, i: int) -> Episode:
        return self.sampler.materialise(*self.draws[i])

    def __iter__(self):  # type: ignore[no-untyped-def]
        for draw in self.draws:
            yield self.sampler.materialise(*draw)


def check_eval_classes(
    dataset: LabelledDataset, classes: list[int], n_way: int, k_shot: int, q_query: int, split: str
) -> None:
    """An :class:`EpisodeError` when an evaluation split has fewer than N classes, or naming its
    first class with fewer than K + Q samples: the sampler would skip that class silently, scoring
    the split on fewer classes than it names. (Training pools may lack classes; non-IID clients do.)"""
    path = dataset.extras.get("path")
    where = f"{dataset.name} ({path})" if path else dataset.name
    if len(classes) < n_way:
        raise EpisodeError(
            f"{where}: split {split!r} has {len(classes)} class{'' if len(classes) == 1 else 'es'}, fewer than n_way = {n_way}; lower "
            "n_way, or give the split more classes with dataset.options.class_split"
        )
    need = k_shot + q_query
    counts = torch.bincount(dataset.labels, minlength=dataset.num_classes)
    short = [c for c in classes if int(counts[c]) < need]
    if not short:
        return
    first = short[0]
    more = f" ({len(short) - 1} more classes of the split too)" if len(short) > 1 else ""
    raise EpisodeError(
        f"{where}: class {dataset.class_names[first]!r} (id {first}) of split {split!r} has "
        f"{int(counts[first])} samples, fewer than k_shot + q_query = {need}{more}; lower k_shot or "
        "q_query, or move such classes out of the split with dataset.options.class_split"
    )


def fixed_episodes(
    dataset: LabelledDataset,
    classes: list[int],
    n_way: int,
    k_shot: int,
    q_query: int,
    num: int,
    seed: int,
    tag: str = "eval",
) -> FixedEpisodes:
    """``num`` episodes over ``classes`` that depend only on the data, the split, the shape and ``seed``."""
    return FixedEpisodes(EpisodeSampler(dataset, n_way, k_shot, q_query, classes=classes), num, seed, tag)


def load_tasks(path: str | Path, dataset: LabelledDataset, classes: list[int], n_way: int, k_shot: int,
               q_query: int) -> FixedEpisodes:
    """Fixed tasks from a JSON file: ``{"tasks": [{"classes": [c_1..c_N], "support": [[pos]*K]*N,
    "query": [[pos]*Q]*N}, ...]}``, class ids and dataset positions (row j of support and query holds
    class c_j). Every task must have the configured shape and draw from ``classes`` (the test split),
    and each position must hold its row's class; anything else is an :class:`EpisodeError` naming the
    file and the task."""
    path = Path(path)
    try:
        tasks = json.loads(path.read_text())["tasks"]
        if not isinstance(tasks, list) or not tasks:
            raise TypeError("'tasks' must be a non-empty list")
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise EpisodeError(f"episodes.test_tasks: cannot read tasks from {path} ({err})") from None
    allowed = set(int(c) for c in classes)
    draws = []
    for t, task in enumerate(tasks):
        where = f"episodes.test_tasks: {path} task {t}"
        try:
            task_classes = torch.as_tensor(task["classes"], dtype=torch.long)
            support = torch.as_tensor(task["support"], dtype=torch.long)
            query = torch.as_tensor(task["query"], dtype=torch.long)
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise EpisodeError(f"{where} is malformed ({err})") from None
        if task_classes.shape != (n_way,) or support.shape != (n_way, k_shot) or query.shape != (n_way, q_query):
            raise EpisodeError(f"{where} has shape classes {tuple(task_classes.shape)}, support "
                               f"{tuple(support.shape)}, query {tuple(query.shape)}; expected ({n_way},), "
                               f"({n_way}, {k_shot}), ({n_way}, {q_query})")
        if not set(task_classes.tolist()) <= allowed or len(set(task_classes.tolist())) != n_way:
            raise EpisodeError(f"{where} names classes outside the test split, or a class twice")
        positions = torch.cat([support, query], dim=1)
        if int(positions.min()) < 0 or int(positions.max()) >= len(dataset):
            raise EpisodeError(f"{where} has positions outside 0..{len(dataset) - 1}")
        if not bool((dataset.labels[positions] == task_classes.unsqueeze(1)).all()):
            raise EpisodeError(f"{where} has a position whose label is not its row's class")
        if len(set(positions.flatten().tolist())) != positions.numel():
            raise EpisodeError(f"{where} uses a sample twice")
        draws.append((task_classes, support.reshape(-1), query.reshape(-1)))
    sampler = EpisodeSampler(dataset, n_way, k_shot, q_query, classes=classes)
    return FixedEpisodes(sampler, len(draws), seed=0, draws=draws)
