"""The episodic learners (fedfew.fewshot.learners): MAML's inner step against a hand-computed update, and
its second-order meta-gradient (FedFSL eq. 7) proved by finite differences (``torch.autograd.gradcheck``,
float64) where "differs from first order" alone would also pass with a wrong second-order term."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import gradcheck
from torch.func import functional_call

from fedfew.fewshot.episodes import Episode, fixed_episodes
from fedfew.fewshot.learners import MAML
from fedfew.models import FewShotModel
from tests.helpers import blob_dataset, context_for


def test_maml_inner_step_matches_hand_computed_update() -> None:
    # A linear model on 2-d inputs: logits = x W^T + b.
    head = nn.Linear(2, 2)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.5, -0.2], [0.1, 0.3]]))
        head.bias.copy_(torch.tensor([0.0, 0.1]))
    model = FewShotModel(nn.Identity(), 2, head)
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5]])
    y = torch.tensor([0, 1])
    episode = Episode(x, y, x, y, torch.tensor([0, 1]), torch.arange(2), torch.arange(2))
    alpha = 0.1
    learner = MAML(inner_lr=alpha, inner_steps=1)
    params = dict(model.named_parameters())
    adapted = learner.adapt(model, params, episode, steps=1, create_graph=False)
    # Hand computation: dL/dz = (softmax(z) - onehot(y)) / n; dW = dz^T x; db = sum dz.
    z = x @ head.weight.detach().T + head.bias.detach()
    dz = (torch.softmax(z, 1) - F.one_hot(y, 2).float()) / 2
    expected_w = head.weight.detach() - alpha * dz.T @ x
    expected_b = head.bias.detach() - alpha * dz.sum(0)
    assert torch.allclose(adapted["head.weight"], expected_w, atol=1e-6)
    assert torch.allclose(adapted["head.bias"], expected_b, atol=1e-6)


def test_second_order_maml_differs_from_first_order() -> None:
    data = blob_dataset()
    ctx = context_for(data)
    episode = fixed_episodes(data, data.splits["base"], 3, 1, 5, num=1, seed=0)[0]
    grads = []
    for first_order in (False, True):
        torch.manual_seed(0)
        model = ctx.make_model(3)
        loss, _ = MAML(inner_lr=0.5, inner_steps=2, first_order=first_order).loss(model, episode)
        grads.append(torch.autograd.grad(loss, list(model.parameters())))
    assert any(not torch.allclose(a, b) for a, b in zip(*grads))


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
