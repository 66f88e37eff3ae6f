"""FRL's mathematics: prototypes (eq. 1), the distance loss (eq. 2), GPAL's L_aux and objective (eq. 3)
and the server's prototype average. Pure functions of tensors and a model's features."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from fedfew.data.dataset import LabelledDataset
from fedfew.models.base import FewShotModel

__all__ = ["Prototypes", "aggregate_prototypes", "class_means", "distance_loss", "features_of", "gpal_loss",
           "gpal_objective", "local_prototypes", "prototype_loss", "rows_of", "squared_distances"]

#: One client's (or the server's) prototypes: {"classes": [c] class ids, "prototypes": [c, d], "counts": [c]}.
Prototypes = dict[str, torch.Tensor]


# -- the mathematics ------------------------------------------------------------------------------
def squared_distances(features: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """||f_i - p_j||^2: [n, c]. Written out rather than with cdist, whose gradient is NaN at zero
    distance (a one-sample class in a minibatch is its own prototype)."""
    return (features.unsqueeze(1) - prototypes.unsqueeze(0)).pow(2).sum(-1)


def class_means(features: torch.Tensor, targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Eq. 1: the mean feature of each class 0..num_classes-1 (every class must occur)."""
    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype).index_add(0, targets, features)
    counts = torch.bincount(targets, minlength=num_classes)
    if bool((counts == 0).any()):
        raise ValueError("a class has no sample to make a prototype of")
    return sums / counts.unsqueeze(1).to(features.dtype)


def distance_loss(logits: torch.Tensor, targets: torch.Tensor, classes: Literal["all", "others"] = "all") -> torch.Tensor:
    """Eq. 2's loss from logits = -d(g(x), prototypes), averaged over the rows:
    ``all`` (ours, ProtoNet's): d_y + log sum_{c'} exp(-d_c'), the cross-entropy of the softmax;
    ``others`` (eq. 2 as printed): d_y + log sum_{c' != y} exp(-d_c'), unbounded below (scaling the
    features up drives it to -inf once a sample is nearer its own prototype than any other); with
    a single prototype the log-sum term is empty and dropped."""
    if classes == "all":
        return F.cross_entropy(logits, targets)
    own = logits.gather(1, targets.unsqueeze(1)).squeeze(1)
    if logits.shape[1] < 2:
        return (-own).mean()
    others = logits.masked_fill(F.one_hot(targets, logits.shape[1]).bool(), float("-inf"))
    return (torch.logsumexp(others, dim=1) - own).mean()


def prototype_loss(features: torch.Tensor, targets: torch.Tensor, prototypes: torch.Tensor,
                   classes: Literal["all", "others"] = "all") -> torch.Tensor:
    """Eq. 2 (and, with the global prototypes, L_aux of eq. 3) over negative squared distances to the
    prototypes (see :func:`distance_loss`); ``targets`` index rows of ``prototypes``."""
    return distance_loss(-squared_distances(features, prototypes), targets, classes)


def rows_of(classes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Position of each label in the sorted ``classes`` (an error if some label is absent)."""
    rows = torch.searchsorted(classes, labels).clamp_max(len(classes) - 1)
    if not bool((classes[rows] == labels).all()):
        raise ValueError("a sample's class has no global prototype")
    return rows


def gpal_loss(features: torch.Tensor, labels: torch.Tensor, global_prototypes: Prototypes,
              classes: Literal["all", "others"] = "all") -> torch.Tensor:
    """L_aux of eq. 3: the prototype loss against the previous round's global prototypes of all classes."""
    rows = rows_of(global_prototypes["classes"], labels)
    return prototype_loss(features, rows, global_prototypes["prototypes"], classes)


def gpal_objective(local: torch.Tensor, aux: torch.Tensor | None, gamma: float,
                   form: Literal["convex", "additive"] = "convex") -> torch.Tensor:
    """Eq. 3: f = gamma L_local + (1 - gamma) L_aux (``convex``, the paper) or L_local + (1 - gamma)
    L_aux (``additive``, the authors' code); f = L_local where there is no L_aux (round 0) or gamma = 1."""
    if aux is None or gamma >= 1:
        return local
    return (gamma if form == "convex" else 1.0) * local + (1.0 - gamma) * aux


def features_of(model: FewShotModel, data: LabelledDataset, index: torch.Tensor | None = None) -> torch.Tensor:
    if index is None:
        return model.features(data.inputs) if data.lengths is None else model.features(data.inputs, data.lengths)
    if data.lengths is None:
        return model.features(data.inputs[index])
    return model.features(data.inputs[index], data.lengths[index])


def local_prototypes(model: FewShotModel, data: LabelledDataset) -> Prototypes:
    """A client's prototypes of each class it holds (eq. 1), with the class counts |S_{k,n}|."""
    classes, targets = torch.unique(data.labels, return_inverse=True)
    with torch.no_grad():
        prototypes = class_means(features_of(model, data), targets, len(classes))
    return {"classes": classes, "prototypes": prototypes, "counts": torch.bincount(targets).to(prototypes.dtype)}


def aggregate_prototypes(uploads: list[Prototypes], client_weights: torch.Tensor | None = None) -> Prototypes:
    """Global prototypes: for each class, the mean of the clients' prototypes weighted by their class
    counts |S_{k,n}| (``client_weights`` None), or by one weight per client (uniform: all ones)."""
    classes = torch.cat([u["classes"] for u in uploads])
    rows = torch.cat([u["prototypes"] for u in uploads]).to(torch.float64)
    if client_weights is None:
        weights = torch.cat([u["counts"] for u in uploads]).to(torch.float64)
    else:
        weights = torch.cat([w.expand(len(u["classes"])) for u, w in zip(uploads, client_weights.to(torch.float64))])
    merged, position = torch.unique(classes, return_inverse=True)
    sums = torch.zeros(len(merged), rows.shape[1], dtype=torch.float64).index_add(0, position, rows * weights.unsqueeze(1))
    totals = torch.zeros(len(merged), dtype=torch.float64).index_add(0, position, weights)
    dtype = uploads[0]["prototypes"].dtype
    return {"classes": merged, "prototypes": (sums / totals.unsqueeze(1)).to(dtype), "counts": totals.to(dtype)}
