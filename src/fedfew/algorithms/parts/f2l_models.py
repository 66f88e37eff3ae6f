"""F2L's client-model psi (a set Transformer over server-model features and a linear head) and the
fine-tuning of its head (eq. 3), batched over tasks; :mod:`fedfew.algorithms.f2l` trains them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from fedfew.models.set_encoder import SetTransformerEncoder

__all__ = ["F2LClientModel", "Params", "batched_linear", "finetune_head", "twice_differentiable"]

#: A client-model's parameters by name, as :func:`torch.func.functional_call` takes them.
Params = dict[str, torch.Tensor]

# ---------------------------------------------------------------------------------------------
# The client-model
# ---------------------------------------------------------------------------------------------
class F2LClientModel(nn.Module):
    """psi = (q_psi, f_psi): a permutation-equivariant Transformer over server-model features of the
    whole support set (eq. 22) and a linear N-way classifier (appendix C.1.3).

    ``encode(support_features, query_features)`` gives (h_psi of the support set, query
    representations); each query q is encoded in the set S u {q}. Inputs are one task ([D, k] and
    [Q, k]) or a batch of E tasks of equal shape ([E, D, k] and [E, Q, k]).
    ``forward`` adds the classifier: (h_psi [.., D, k], support logits, query logits or None)."""

    def __init__(self, dim: int, n_way: int, heads: int = 4, layers: int = 1, dropout: float = 0.1,
                 feedforward: int | None = None) -> None:
        super().__init__()
        self.encoder = SetTransformerEncoder(dim, heads, layers, dropout, feedforward)
        self.head = nn.Linear(dim, n_way)

    def encode_queries(self, support_features: torch.Tensor, query_features: torch.Tensor) -> torch.Tensor:
        batched = support_features.dim() == 3
        s = support_features if batched else support_features.unsqueeze(0)
        q = query_features if batched else query_features.unsqueeze(0)
        (e, d, k), n_query = s.shape, q.shape[1]
        sets = torch.cat([s.unsqueeze(1).expand(e, n_query, d, k), q.unsqueeze(2)], dim=2)  # [E, Q, D + 1, k]
        encoded = self.encoder(sets.reshape(e * n_query, d + 1, k))[:, -1].reshape(e, n_query, k)
        return encoded if batched else encoded.squeeze(0)

    def encode(self, support_features: torch.Tensor,
               query_features: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        support_repr = self.encoder(support_features)
        if query_features is None or query_features.shape[-2] == 0:
            return support_repr, None
        return support_repr, self.encode_queries(support_features, query_features)

    def forward(
        self, support_features: torch.Tensor, query_features: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        support_repr, query_repr = self.encode(support_features, query_features)
        return support_repr, self.head(support_repr), None if query_repr is None else self.head(query_repr)


@contextlib.contextmanager
def twice_differentiable(enabled: bool = True) -> Iterator[None]:
    """Attention by the plain (math) kernel, whose backward is itself differentiable: the second-order
    meta-gradient (eq. 4 through eq. 3) differentiates the fine-tuning step's backward, and the fused
    CPU kernel PyTorch picks without dropout (``client_dropout: 0``, eval mode) has no double backward."""
    if not enabled:
        yield
        return
    with sdpa_kernel(SDPBackend.MATH):
        yield


def batched_linear(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """features [.., n, k] times weight [.., N, k] (one classifier per leading index) plus bias [.., N]."""
    return torch.einsum("...nk,...ck->...nc", features, weight) + bias.unsqueeze(-2)


def finetune_head(weight: torch.Tensor, bias: torch.Tensor, support_repr: torch.Tensor, support_labels: torch.Tensor,
                  n_way: int, lr: float, steps: int, create_graph: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 3 restricted to the classifier f_psi: ``steps`` gradient steps of size ``lr`` on the mean
    support cross-entropy over the first ``n_way`` outputs. Batched over leading task dimensions
    (each task's classifier gets its own task's gradient: the loss is a sum of per-task means)."""
    for _ in range(steps):
        logits = batched_linear(support_repr, weight, bias)[..., :n_way]
        loss = F.cross_entropy(logits.reshape(-1, n_way), support_labels.expand(logits.shape[:-1]).reshape(-1),
                               reduction="sum") / (support_labels.shape[-1])
        grad_w, grad_b = torch.autograd.grad(loss, (weight, bias), create_graph=create_graph)
        weight, bias = weight - lr * grad_w, bias - lr * grad_b
    return weight, bias
