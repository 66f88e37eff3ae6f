"""Episodic learners: how a model learns from, and predicts on, one N-way K-shot episode.

* :class:`MAML` (Finn et al. 2017; FedFSL eq. 4-7): adapt all parameters with a few gradient steps on
  the support set (inner step size alpha), score the query set with the adapted parameters.
  ``first_order`` drops second derivatives (FOMAML).
* :class:`ProtoNet` (Snell et al. 2017): classify the query set by squared Euclidean distance to the
  support prototypes; no head.
"""

from __future__ import annotations

from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedfew.fewshot.episodes import Episode
from fedfew.fewshot.stacked import StackedEpisodes, per_client_cross_entropy, stacked_forward
from fedfew.models.base import FewShotModel
from fedfew.models.heads import class_prototypes, prototype_logits

Params = dict[str, torch.Tensor]


class EpisodicLearner:
    """``loss(model, episode)`` returns (query loss, query logits) with gradients to the model's
    parameters; ``predict(model, episode)`` returns query logits for evaluation."""

    #: number of outputs the model's head needs (None: head-less encoder).
    head: ClassVar[str] = "n_way"

    def loss(self, model: nn.Module, episode: Episode) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def predict(self, model: nn.Module, episode: Episode) -> torch.Tensor:
        raise NotImplementedError

    def stacked_loss(self, model: FewShotModel, params: Params,
                     episodes: StackedEpisodes) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`loss` of many clients at once (``runtime.batch_clients``): client ``c`` with its
        parameters ``params[name][c]`` on its episode; returns (query losses ``[C]``, query logits
        ``[C, N*Q, N]``). Only learners that define it can batch clients."""
        raise NotImplementedError(f"{type(self).__name__} has no stacked form")


def strided_like(reference: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` laid out in memory as ``reference`` (differentiably). An updated conv weight must keep
    the channels_last strides of the model's own weight: for a one-channel input layer both layouts
    pass as contiguous, ``p - lr * g`` falls back to NCHW, and every later layer then pays a layout
    conversion (measured 1.6x slower per FOMAML episode on the Conv4 benchmark)."""
    if value.stride() == reference.stride():
        return value
    return torch.empty_like(reference).copy_(value)


class MAML(EpisodicLearner):
    """Model-agnostic meta-learning over the full model (encoder and N-way linear head)."""

    head = "n_way"

    def __init__(self, inner_lr: float = 0.01, inner_steps: int = 1, test_inner_steps: int = 10,
                 first_order: bool = False) -> None:
        self.inner_lr, self.inner_steps = inner_lr, inner_steps
        self.test_inner_steps, self.first_order = test_inner_steps, first_order

    def adapt(self, model: nn.Module, params: Params, episode: Episode, steps: int, create_graph: bool) -> Params:
        """theta' = theta - alpha * grad L_support(theta), ``steps`` times (eq. 5)."""
        for _ in range(steps):
            logits = functional_call(model, params, episode.support_args())
            loss = F.cross_entropy(logits, episode.support_labels)
            grads = torch.autograd.grad(loss, list(params.values()), create_graph=create_graph)
            params = {name: strided_like(p, p - self.inner_lr * g) for (name, p), g in zip(params.items(), grads)}
        return params

    def loss(self, model: nn.Module, episode: Episode) -> tuple[torch.Tensor, torch.Tensor]:
        """Query loss at the adapted parameters (eq. 6); its gradient is the meta-gradient (eq. 7)."""
        # Frozen parameters (e.g. fixed word vectors) are not adapted: functional_call takes them from the model.
        params: Params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        adapted = self.adapt(model, params, episode, self.inner_steps, create_graph=not self.first_order)
        logits = functional_call(model, adapted, episode.query_args())
        return F.cross_entropy(logits, episode.query_labels), logits

    def stacked_loss(self, model: FewShotModel, params: Params,
                     episodes: StackedEpisodes) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`loss` for every client at once. The support losses of the clients are summed
        before differentiating: client ``c``'s loss depends on its own parameters alone, so the
        gradient of the sum holds each client's own gradient (eq. 5 per client)."""
        for _ in range(self.inner_steps):
            logits = stacked_forward(model, params, episodes.support)
            loss = per_client_cross_entropy(logits, episodes.support_labels).sum()
            grads = torch.autograd.grad(loss, list(params.values()), create_graph=not self.first_order)
            params = {name: p - self.inner_lr * g for (name, p), g in zip(params.items(), grads)}
        logits = stacked_forward(model, params, episodes.query)
        return per_client_cross_entropy(logits, episodes.query_labels), logits

    def predict(self, model: nn.Module, episode: Episode) -> torch.Tensor:
        params = {name: p.detach().requires_grad_() for name, p in model.named_parameters() if p.requires_grad}
        with torch.enable_grad():
            adapted = self.adapt(model, params, episode, self.test_inner_steps, create_graph=False)
        with torch.no_grad():
            return functional_call(model, adapted, episode.query_args())


class ProtoNet(EpisodicLearner):
    """Prototypical networks: a head-less encoder and a distance classifier."""

    head = "none"

    def logits(self, model: nn.Module, episode: Episode) -> torch.Tensor:
        """Support and query go through the encoder in one batch, as in Snell et al.'s code: with
        batch-statistics BatchNorm, separate passes would normalise 5 support images and 75 queries
        differently and put the prototypes off the queries' scale."""
        n_support = len(episode.support_labels)
        inputs = torch.cat([episode.support, episode.query])
        # The learners' interface takes an nn.Module; ProtoNet's is always a FewShotModel (an encoder with
        # ``features``), which nn.Module's attribute typing (Tensor | Module) cannot say.
        encoder = cast(FewShotModel, model)
        if episode.support_lengths is None or episode.query_lengths is None:
            features = encoder.features(inputs)
        else:
            features = encoder.features(inputs, torch.cat([episode.support_lengths, episode.query_lengths]))
        support, query = features[:n_support], features[n_support:]
        prototypes = class_prototypes(support, episode.support_labels, episode.n_way)
        return prototype_logits(query, prototypes)

    def loss(self, model: nn.Module, episode: Episode) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.logits(model, episode)
        return F.cross_entropy(logits, episode.query_labels), logits

    def predict(self, model: nn.Module, episode: Episode) -> torch.Tensor:
        with torch.no_grad():
            return self.logits(model, episode)

    def stacked_loss(self, model: FewShotModel, params: Params,
                     episodes: StackedEpisodes) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`loss` for every client at once: support and query through the encoder in one batch
        per client (as :meth:`logits`), prototypes as the mean of each class's support features."""
        n_support = episodes.support_labels.shape[1]
        features = stacked_forward(model, params, torch.cat([episodes.support, episodes.query], dim=1), features=True)
        support, query = features[:, :n_support], features[:, n_support:]
        one_hot = F.one_hot(episodes.support_labels, episodes.n_way).to(support.dtype)  # [C, N*K, N]
        counts = one_hot.sum(1).clamp_min(1).unsqueeze(-1)  # [C, N, 1]
        prototypes = torch.bmm(one_hot.transpose(1, 2), support) / counts
        logits = -torch.cdist(query, prototypes).pow(2)
        return per_client_cross_entropy(logits, episodes.query_labels), logits


def proximal_term(model: nn.Module, anchor: dict[str, torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx's mu/2 * ||w - w_global||^2 over the model's parameters (Li et al. 2020, eq. 2)."""
    total = torch.zeros(())
    for name, p in model.named_parameters():
        total = total + (p - anchor[name]).pow(2).sum()
    return 0.5 * mu * total
