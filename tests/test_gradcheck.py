"""Derivatives proved by finite differences (``torch.autograd.gradcheck``, float64): second-order MAML's
meta-gradient (FedFSL eq. 7) through the inner adaptation steps, F2L's L_MI (eq. 13) and F2L's
meta-update of the client-model through its fine-tuning step (eq. 4 through eq. 3).

"Differs from first order" (tests/test_engine.py) would also pass with a wrong second-order term;
these would not: the first-order form of the same function is shown to fail the same check."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import gradcheck
from torch.func import functional_call

from fedfew.algorithms.f2l import (
    F2L,
    F2LOptions,
    batched_linear,
    finetune_head,
    mutual_information_loss,
    twice_differentiable,
)
from fedfew.fewshot.episodes import Episode
from fedfew.fewshot.learners import MAML
from fedfew.models.base import FewShotModel
from tests.helpers import blob_dataset, context_for


def tiny_model() -> FewShotModel:
    """A 3-d input, a tanh layer of 4 features and a 2-way head, in float64: small enough for finite
    differences, and non-linear in every parameter (a linear encoder would leave some second
    derivatives zero and hide a missing term)."""
    torch.manual_seed(0)
    return FewShotModel(nn.Sequential(nn.Linear(3, 4), nn.Tanh()), 4, nn.Linear(4, 2)).double()


def tiny_episode(k_shot: int = 2, q_query: int = 3) -> Episode:
    """A 2-way episode of random float64 inputs (labels 0, 1 in turn)."""
    g = torch.Generator().manual_seed(1)
    support_labels = torch.arange(2).repeat(k_shot)
    query_labels = torch.arange(2).repeat(q_query)
    return Episode(torch.randn(2 * k_shot, 3, generator=g, dtype=torch.float64), support_labels,
                   torch.randn(2 * q_query, 3, generator=g, dtype=torch.float64), query_labels,
                   torch.tensor([0, 1]), torch.arange(2 * k_shot), torch.arange(2 * q_query))


def maml_query_loss(learner: MAML, model: nn.Module, episode: Episode, names: list[str],
                    create_graph: bool) -> Callable[..., torch.Tensor]:
    """The query loss at the adapted parameters (eq. 6) as a function of the initial parameters theta:
    what :meth:`MAML.loss` computes from the model's own parameters."""

    def loss(*theta: torch.Tensor) -> torch.Tensor:
        adapted = learner.adapt(model, dict(zip(names, theta)), episode, learner.inner_steps, create_graph)
        return F.cross_entropy(functional_call(model, adapted, episode.query_args()), episode.query_labels)

    return loss


@pytest.mark.parametrize("inner_steps", [1, 2])
def test_second_order_maml_meta_gradient_passes_gradcheck(inner_steps: int) -> None:
    model, episode = tiny_model(), tiny_episode()
    learner = MAML(inner_lr=0.5, inner_steps=inner_steps)
    names = [name for name, _ in model.named_parameters()]
    theta = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    assert gradcheck(maml_query_loss(learner, model, episode, names, create_graph=True), theta)
    # First order drops d(grad L_support)/d theta: the same check must catch it, or it proves nothing.
    assert not gradcheck(maml_query_loss(learner, model, episode, names, create_graph=False), theta,
                         raise_exception=False)


def test_maml_loss_gives_the_gradchecked_meta_gradient() -> None:
    """``MAML.loss`` (what clients back-propagate) differentiates exactly the function checked above."""
    model, episode = tiny_model(), tiny_episode()
    learner = MAML(inner_lr=0.5, inner_steps=2)
    names = [name for name, _ in model.named_parameters()]
    loss, _ = learner.loss(model, episode)
    from_loss = torch.autograd.grad(loss, list(model.parameters()))
    theta = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    checked = torch.autograd.grad(maml_query_loss(learner, model, episode, names, create_graph=True)(*theta), theta)
    for name, a, b in zip(names, from_loss, checked):
        assert torch.allclose(a, b, rtol=0, atol=1e-12), name
    first_order, _ = MAML(inner_lr=0.5, inner_steps=2, first_order=True).loss(model, episode)
    assert any(not torch.allclose(a, b) for a, b in
               zip(torch.autograd.grad(first_order, list(model.parameters())), from_loss))


@pytest.mark.parametrize("normaliser", ["support", "class"])
def test_f2l_mutual_information_loss_passes_gradcheck(normaliser: str) -> None:
    """L_MI with respect to every input it is differentiable in: the server features h_phi (the ones
    F2L back-propagates into) and the client features h_psi; 3-way 2-shot, so that the weights w_i of
    eq. 9 are not all one and, with ``class``, the masked softmax is not trivially 1."""
    g = torch.Generator().manual_seed(2)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    server = torch.randn(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    client = torch.randn(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(torch.randn(6, 3, generator=g, dtype=torch.float64), dim=1)

    def loss(h_phi: torch.Tensor, h_psi: torch.Tensor) -> torch.Tensor:
        return mutual_information_loss(h_phi, h_psi, probs, labels, normaliser)  # type: ignore[arg-type]

    assert float(loss(server, client).detach()) != 0.0  # a constant would pass any gradient check
    assert gradcheck(loss, (server, client))
    assert gradcheck(lambda p: mutual_information_loss(server, client, p, labels, "support"),
                     (probs.clone().requires_grad_(),))


def test_f2l_head_meta_update_through_finetuning_passes_gradcheck() -> None:
    """``finetune: head``: the query loss at f_psi' = f_psi - alpha grad CE(S) (eq. 3) as a function of
    (W, b) and of the support representations h_psi (through which the meta-gradient reaches q_psi)."""
    g = torch.Generator().manual_seed(3)
    support_labels, query_labels = torch.tensor([0, 1, 2, 0, 1, 2]), torch.tensor([0, 1, 2])
    support = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    query = torch.randn(3, 4, generator=g, dtype=torch.float64)
    weight = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)

    def query_loss(create_graph: bool) -> Callable[..., torch.Tensor]:
        def loss(w: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            w2, b2 = finetune_head(w, b, s, support_labels, 3, lr=0.5, steps=2, create_graph=create_graph)
            return F.cross_entropy(batched_linear(query, w2, b2), query_labels)
        return loss

    assert gradcheck(query_loss(True), (weight, bias, support))
    assert not gradcheck(query_loss(False), (weight, bias, support), raise_exception=False)


def test_f2l_meta_update_through_finetuning_all_of_psi_passes_gradcheck() -> None:
    """``finetune: all`` (the paper): F2L's own :meth:`F2L.finetune` of the whole client-model (its
    set Transformer and classifier) inside the query loss, as a function of every parameter of psi;
    a client-model of 4 features, one head, no dropout, in float64."""
    data = blob_dataset(classes=6, per_class=6)
    algorithm = F2L(F2LOptions(finetune_lr=0.5, finetune_steps=2, client_heads=1, client_dropout=0.0),
                    context_for(data, n_way=3, k_shot=2, q_query=1, hidden=4))
    client = algorithm.client_model.double().eval()
    names = [name for name, _ in client.named_parameters()]
    g = torch.Generator().manual_seed(4)
    support, query = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g, dtype=torch.float64)
    support_labels, query_labels = torch.tensor([0, 1, 2, 0, 1, 2]), torch.tensor([0, 1, 2])

    def query_loss(create_graph: bool) -> Callable[..., torch.Tensor]:
        def loss(*psi: torch.Tensor) -> torch.Tensor:
            adapted = algorithm.finetune(dict(zip(names, psi)), support, support_labels, 2, create_graph)
            _, _, logits = functional_call(client, adapted, (support, query))
            return F.cross_entropy(logits[:, :3], query_labels)
        return loss

    psi = tuple(p.detach().clone().requires_grad_() for p in client.parameters())
    with twice_differentiable():
        assert gradcheck(query_loss(True), psi, fast_mode=True)
        assert not gradcheck(query_loss(False), psi, fast_mode=True, raise_exception=False)
