"""F2L's losses (Wang et al., KDD'23): the mutual-information transfer L_MI, InfoNCE, the adaptive
temperature and partial distillation. Pure functions of tensors, tested against hand-computed values;
the algorithm that combines them is :mod:`fedfew.algorithms.f2l`."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

__all__ = ["adaptive_temperature", "infonce_loss", "mutual_information_loss", "partial_distillation_loss"]

# ---------------------------------------------------------------------------------------------
# The losses (pure functions of tensors, tested against hand-computed values)
# ---------------------------------------------------------------------------------------------
def mutual_information_loss(
    server_features: torch.Tensor, client_features: torch.Tensor, client_probs: torch.Tensor, labels: torch.Tensor,
    normaliser: Literal["support", "class"] = "support",
) -> torch.Tensor:
    """L_MI of eq. 13 over a support set of D samples (see the module docstring for the formula).

    server_features h_phi [D, k] (gradients flow), client_features h_psi [D, k] and client_probs
    p_psi [D, N] (the client-model's class probabilities; treated as constants by the caller),
    labels y [D] in 0..N-1. ``normaliser``: the softmax of p(h_psi^j | h_phi^i) (eq. 10) runs over
    all D support samples ("support", ours) or over k in C(i) as eq. 10 and 13 write it ("class";
    identically 0 with one shot)."""
    d = len(labels)
    h_phi = F.normalize(server_features, dim=1)
    h_psi = F.normalize(client_features, dim=1)
    same_class = labels.unsqueeze(1) == labels.unsqueeze(0)  # [i, j]: i in C(j), symmetric
    # log p(h_psi^j | h_phi^i): row i is a softmax over j of the dot products (eq. 10-11).
    similarity = h_phi @ h_psi.T
    if normaliser == "class":
        similarity = similarity.masked_fill(~same_class, float("-inf"))
    log_p = torch.log_softmax(similarity, dim=1)
    # w_i = p_psi^i(y_i) / sum_{k in C(i)} p_psi^k(y_i): eq. 9, zero outside C(j).
    confidence = client_probs[torch.arange(d), labels]
    class_total = torch.zeros(client_probs.shape[1], dtype=confidence.dtype).index_add_(0, labels, confidence)
    weight = confidence / class_total[labels]
    terms = torch.where(same_class, weight.unsqueeze(1) * log_p, torch.zeros((), dtype=log_p.dtype))
    return -terms.sum() / d


def infonce_loss(
    server_features: torch.Tensor, client_features: torch.Tensor, labels: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The authors' code in place of L_MI: for each shot s, a cosine InfoNCE at ``temperature`` whose
    anchors are the client-model features of shot s of every class and whose candidates are the
    server-model features of shot (s + 1) mod K of every class (positive: the same class).
    Needs a support set with the same number of shots in every class."""
    n_way = int(labels.max()) + 1
    order = torch.argsort(labels, stable=True)
    k_shot = len(labels) // n_way
    if k_shot * n_way != len(labels) or not torch.equal(torch.bincount(labels), torch.full((n_way,), k_shot)):
        raise ValueError("infonce_loss needs the same number of shots in every class")
    anchors = F.normalize(client_features[order].reshape(n_way, k_shot, -1), dim=2)
    candidates = F.normalize(server_features[order].reshape(n_way, k_shot, -1), dim=2)
    targets = torch.arange(n_way)
    total = torch.zeros(())
    for s in range(k_shot):
        similarity = anchors[:, s] @ candidates[:, (s + 1) % k_shot].T / temperature
        total = total + F.cross_entropy(similarity, targets)
    return total / k_shot


def adaptive_temperature(teacher_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """T_i = sigmoid( max_{c != y_i} exp(z^i(c)) / exp(z^i(y_i)) ) (eq. 19) for logits z [n, N] over the
    task's N classes; the ratio is computed as exp(max_c z(c) - z(y)) (the same number, no overflow
    of exp(z) itself; an infinite ratio gives T = 1)."""
    true_logit = teacher_logits.gather(1, labels.unsqueeze(1)).squeeze(1)
    negatives = teacher_logits.masked_fill(F.one_hot(labels, teacher_logits.shape[1]).bool(), float("-inf"))
    return torch.sigmoid(torch.exp(negatives.max(dim=1).values - true_logit))


def partial_distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: torch.Tensor | float
) -> torch.Tensor:
    """L_KD of eq. 16-18: -1/|Q| sum_i sum_j q_teacher^i(c_j) log q_student^i(c_j), with
    q^i = softmax(z^i / T_i) over the task's N classes only. ``temperature`` is one number or [n]."""
    t = torch.as_tensor(temperature, dtype=student_logits.dtype)
    t = t.unsqueeze(1) if t.dim() == 1 else t
    soft_targets = torch.softmax(teacher_logits / t, dim=1)
    return -(soft_targets * torch.log_softmax(student_logits / t, dim=1)).sum(dim=1).mean()
