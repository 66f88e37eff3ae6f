"""The evaluation protocol: mean accuracy over fixed tasks with a 95% confidence interval.

Every method is scored on the same fixed episodes of novel classes for a given seed
(:class:`fedfew.fewshot.episodes.FixedEpisodes`); model selection uses validation classes only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from fedfew.core import stats
from fedfew.fewshot.episodes import Episode


@dataclass(frozen=True)
class Score:
    """Mean accuracy and the half-width of its 95% confidence interval, 1.96 std / sqrt(T)."""

    mean: float
    ci95: float
    n: int

    def __str__(self) -> str:
        return f"{100 * self.mean:.2f} ± {100 * self.ci95:.2f}"


def mean_ci95(values: Iterable[float]) -> Score:
    """Mean and 1.96 * std / sqrt(T) (population std, as few-shot papers report); T=1 gives 0."""
    v = torch.as_tensor(list(values), dtype=torch.float64)
    if len(v) == 0:
        raise ValueError("no values to summarise")
    std = float(v.std(unbiased=False)) if len(v) > 1 else 0.0
    # The interval's formula is fedfew.core.stats's (one statistics module); mean and std stay torch's, as
    # every stored run computed them (numpy's sums could differ in the last bit).
    return Score(float(v.mean()), stats.normal_half_width(std, len(v)), len(v))


#: Wilson's score interval (fedfew.core.stats), here where the run's scores use it.
wilson = stats.wilson


def with_interval(scores: dict[str, float], episodes: int | None = None, samples: int | None = None) -> dict[str, float | str]:
    """``scores`` with a 95% interval on its accuracy and a note of how it was computed: over the
    ``episodes`` fixed tasks (1.96 std / sqrt(T), already in ``ci95``), or, for an accuracy over
    ``samples`` labelled test samples, the Wilson interval (``ci_low``, ``ci_high``; ``ci95`` is its
    half-width)."""
    out: dict[str, float | str] = dict(scores)
    if "accuracy" not in scores or "ci_method" in scores:
        return out
    if "ci95" in scores:
        if episodes:
            out["ci_method"] = f"normal, {episodes} episodes"
        return out
    if samples:
        low, high = wilson(round(scores["accuracy"] * samples), samples)
        out.update(ci95=(high - low) / 2, ci_low=low, ci_high=high, ci_method=f"Wilson, {samples} samples")
    return out


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits.argmax(dim=-1) == labels).float().mean())


def episode_scores(
    episodes: Iterable[Episode], predict: Callable[[Episode], torch.Tensor]
) -> list[float]:
    """Query accuracy of ``predict(episode) -> query logits`` on each episode."""
    return [accuracy(predict(ep), ep.query_labels) for ep in episodes]


@torch.no_grad()
def dataset_accuracy(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                     lengths: torch.Tensor | None = None, batch_size: int = 1000) -> float:
    """Plain classification accuracy of ``model`` on a labelled set, in eval mode, batched."""
    was_training = model.training
    model.eval()
    correct = 0
    for start in range(0, len(labels), batch_size):
        args: tuple[torch.Tensor, ...] = (inputs[start : start + batch_size],)
        if lengths is not None:
            args += (lengths[start : start + batch_size],)
        correct += int((model(*args).argmax(-1) == labels[start : start + batch_size]).sum())
    model.train(was_training)
    return correct / max(len(labels), 1)


def confusion(predictions: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[true, predicted] counts."""
    index = labels * num_classes + predictions
    return torch.bincount(index, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def per_class_accuracy(episodes: Iterable[Episode], predictions: Iterable[torch.Tensor],
                       class_names: list[str]) -> dict[str, float]:
    """The accuracy over every query item of each true class, pooled over ``episodes``:
    {class name: correct / queries of that class}. ``predictions`` are each episode's predicted
    query labels (0..N-1, in the episode's order of ``classes``), mapped back to class ids here.
    With equal queries per class in every episode, the mean over classes weighted by their query
    counts is the mean episode accuracy."""
    correct: dict[int, int] = {}
    seen: dict[int, int] = {}
    for episode, predicted in zip(episodes, predictions, strict=True):
        true_class = episode.classes[episode.query_labels].tolist()
        hits = (predicted.to(episode.query_labels.device) == episode.query_labels).tolist()
        for c, hit in zip(true_class, hits, strict=True):
            seen[c] = seen.get(c, 0) + 1
            correct[c] = correct.get(c, 0) + int(hit)
    return {class_names[c]: correct[c] / seen[c] for c in sorted(seen)}
