"""The divergence guard: a round whose loss or parameters are not finite, or whose loss exploded
(:class:`LossGuard`), stops the run (status failed) rather than report the accuracy of a broken model."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedfew.core.errors import RunFailedError
from fedfew.engine.round import RoundOutcome, mean_metrics


class DivergedError(RunFailedError):
    """A round produced a non-finite loss or parameter: the model diverged, so the run stops (status
    failed) rather than report the accuracy of a broken model. ``record`` is that round's metrics."""

    def __init__(self, message: str, record: dict[str, object]) -> None:
        super().__init__(message)
        self.record = record


@dataclass(frozen=True)
class LossGuard:
    """Divergence that stays finite (config ``runtime.divergence``): a client's training loss above
    ``max_loss``, or the round's mean training loss above ``loss_factor`` times the first round's (and
    above 1.0, so that a near-zero first loss is no yardstick) in ``patience`` rounds in a row. Only
    metrics named ``*loss`` count: accuracies and other metrics may grow freely."""

    max_loss: float = 1e6
    loss_factor: float = 100.0
    patience: int = 3

    def exploded(self, outcome: RoundOutcome, history: Sequence[dict[str, Any]]) -> str | None:
        """Why this round (after the rounds of ``history``) counts as diverged; None when it does not."""
        for cid, result in sorted(outcome.results.items()):
            for key, value in sorted(result.metrics.items()):
                if key.endswith("loss") and isinstance(value, (int, float)) and value > self.max_loss:
                    return (f"client {cid}'s training {key} is {value:.3g}, above runtime.divergence.max_loss="
                            f"{self.max_loss:g}")
        if not self.loss_factor or not history:
            return None
        means = mean_metrics(outcome.results)
        first = history[0]
        for key, value in sorted(means.items()):
            if not key.endswith("loss") or not isinstance(first.get(key), (int, float)):
                continue
            limit = self.loss_factor * max(float(first[key]), 1.0)
            recent = [h.get(key) for h in history[len(history) - self.patience + 1:]] if self.patience > 1 else []
            if value > limit and len(recent) == self.patience - 1 and \
                    all(isinstance(v, (int, float)) and v > limit for v in recent):
                worst = max(outcome.results, key=lambda c: outcome.results[c].metrics.get(key[len("train_"):], 0.0))
                return (f"the mean training {key[len('train_'):]} ({value:.3g}; client {worst} the largest) has been "
                        f"above {self.loss_factor:g}x round {first.get('round', 1)}'s ({first[key]:.3g}) for "
                        f"{self.patience} rounds (runtime.divergence.loss_factor, patience)")
        return None


def non_finite(outcome: RoundOutcome) -> str | None:
    """What in a round is not a finite number, first by client (its training metrics, its upload, its
    new private state, in client order), then the aggregated server state; None when all is finite."""
    for cid, result in sorted(outcome.results.items()):
        for key, value in sorted(result.metrics.items()):
            if isinstance(value, (int, float)) and not math.isfinite(value):
                return f"client {cid}'s training {key} is {value}"
        for what, obj in (("upload", result.upload), ("model (private state)", result.state)):
            where = _first_non_finite(obj)
            if where is not None:
                return f"client {cid}'s {what} holds non-finite values ({where})"
    where = _first_non_finite(outcome.server)
    if where is not None:
        return f"the aggregated server model holds non-finite values ({where})"
    return None


def _first_non_finite(obj: object, path: str = "") -> str | None:
    """The path of the first floating-point tensor or number in ``obj`` (nested dicts, lists,
    tuples) that is not finite."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            return None if bool(torch.isfinite(obj).all()) else (path or "tensor")
        return None
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (path or "value")
    if isinstance(obj, Mapping):
        items: Iterable[tuple[object, object]] = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for key, value in items:
        found = _first_non_finite(value, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None
