"""What a one-shot server's selection did, as test metrics (docs/adfl.md: the bad clients and the
coherence-score correlations).

Always, where the server scored the returned models (AdFL's coherence, the CV or data-size score):

* ``client_scores``: {client id: its score};
* with corrupted clients (``partition.options.corrupt``): ``corrupt_ranks`` {id: rank}, their mean
  ``corrupt_rank_mean`` and best ``corrupt_rank_best`` (1 = the highest score of those returned;
  equal scores share the mean of their ranks), and, for every selection, ``corrupt_selected``: how
  many corrupted clients' models are in the combination.

With ``algorithm.options.report_clients: true`` (the server then keeps every returned model):
``client_accuracy`` {id: that client's own model's accuracy on the test set}, ``client_accuracy_mean``,
``all_clients_ensemble`` (the mean-softmax ensemble of every returned model), the correlation of the
score with the clients' own accuracies across clients (``score_accuracy_pearson``,
``score_accuracy_spearman``; absent when either is constant) and ``member_classes`` (how many
classes the combined models' training data hold between them).
"""

from __future__ import annotations

import torch

from fedfew.core.jsontypes import JSONObject


def descending_ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based ranks of ``values``, 1 = the largest; equal values share the mean of their ranks
    (two tied for first both get 1.5)."""
    v = values.double()
    larger = (v[None, :] > v[:, None]).sum(1)  # [i]: how many values exceed v[i]
    equal = (v[None, :] == v[:, None]).sum(1)  # [i]: how many equal v[i], itself included
    return larger + (equal + 1) / 2


def pearson(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Pearson's correlation of two equally long series; None when either is constant."""
    dx, dy = x.double() - x.double().mean(), y.double() - y.double().mean()
    norm = float(dx.norm() * dy.norm())
    return None if norm == 0.0 else float((dx * dy).sum()) / norm


def spearman(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Spearman's rank correlation: Pearson's of the ranks, ties sharing their mean rank."""
    return pearson(descending_ranks(x), descending_ranks(y))


def corruption_metrics(ids: list[int], scores: dict[int, float] | None, corrupt: list[int],
                       members: list[int]) -> JSONObject:
    """Where the corrupted clients among the returned ``ids`` rank by ``scores`` (when the selection
    scored them) and how many of them are among the combined ``members``."""
    bad = [c for c in corrupt if c in set(ids)]
    if not bad:
        return {}
    out: JSONObject = {"corrupt_selected": sum(c in set(members) for c in bad)}
    if scores is not None:
        ranks = descending_ranks(torch.tensor([scores[i] for i in ids], dtype=torch.float64))
        by_id = {i: float(r) for i, r in zip(ids, ranks)}
        out["corrupt_ranks"] = {str(c): by_id[c] for c in bad}
        out["corrupt_rank_mean"] = sum(by_id[c] for c in bad) / len(bad)
        out["corrupt_rank_best"] = min(by_id[c] for c in bad)
    return out


def client_metrics(ids: list[int], scores: dict[int, float] | None, probabilities: torch.Tensor,
                   labels: torch.Tensor, label_counts: dict[int, torch.Tensor], members: list[int]) -> JSONObject:
    """From every returned model's [clients, samples, classes] softmax outputs on the test set (in
    the order of ``ids``): each one's accuracy, their mean, the all-client ensemble, the score's
    correlations with the accuracies, and the classes the ``members`` hold between them."""
    correct = (probabilities.argmax(-1) == labels).double().mean(1)
    out: JSONObject = {
        "client_accuracy": {str(i): float(a) for i, a in zip(ids, correct)},
        "client_accuracy_mean": float(correct.mean()),
        "all_clients_ensemble": float((probabilities.mean(0).argmax(-1) == labels).double().mean()),
    }
    if scores is not None:
        score = torch.tensor([scores[i] for i in ids], dtype=torch.float64)
        for name, statistic in (("pearson", pearson), ("spearman", spearman)):
            value = statistic(score, correct)
            if value is not None:
                out[f"score_accuracy_{name}"] = value
    held = [label_counts[m] for m in members if m in label_counts]
    if held:
        out["member_classes"] = int((torch.stack(held).sum(0) > 0).sum())
    return out
