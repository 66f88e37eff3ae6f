"""The evaluation protocol: mean accuracy over fixed tasks with a 95% confidence interval.

Every method is scored on the same fixed episodes of novel classes for a given seed
(:class:`fedfew.episodes.FixedEpisodes`); model selection uses validation classes only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from fedfew.episodes import Episode


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
    return Score(float(v.mean()), 1.96 * std / math.sqrt(len(v)), len(v))


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
        args = (inputs[start : start + batch_size],)
        if lengths is not None:
            args += (lengths[start : start + batch_size],)
        correct += int((model(*args).argmax(-1) == labels[start : start + batch_size]).sum())
    model.train(was_training)
    return correct / max(len(labels), 1)


def confusion(predictions: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[true, predicted] counts."""
    index = labels * num_classes + predictions
    return torch.bincount(index, minlength=num_classes * num_classes).reshape(num_classes, num_classes)
