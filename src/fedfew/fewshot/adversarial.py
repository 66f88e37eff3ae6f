"""Targeted MI-FGSM (Dong et al., 2018, "Boosting adversarial attacks with momentum", Algorithm 1).

From a starting input x_0 and a zero momentum g_0 = 0, each of T iterations computes the gradient of
the cross-entropy J(x_t, y*) of the *target* class y*, accumulates it with a decay mu after
normalising it by its L1 norm, and takes a signed step that *descends* J (towards y*):

    g_{t+1} = mu * g_t + grad_x J(x_t, y*) / ||grad_x J(x_t, y*)||_1
    x_{t+1} = clip_[lo, hi](x_t - alpha * sign(g_{t+1}))

Writing the momentum of the negative gradient instead gives the form x_{t+1} = clip(x_t + alpha *
sign(g_{t+1})) used in AdFL's description; the two are the same update. The L1 norm is taken per
sample (Dong et al.'s Algorithm 1 is stated for one image; a batch is a batch of independent attacks).

Dong et al. bound the perturbation by an L-infinity ball of radius eps around a real image; AdFL
starts from random noise and only clips to the valid input range, which is what ``clip`` does here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def mi_fgsm(
    model: nn.Module,
    start: torch.Tensor,
    targets: torch.Tensor,
    steps: int,
    step_size: float,
    decay: float = 1.0,
    clip: tuple[float, float] = (0.0, 1.0),
) -> torch.Tensor:
    """Run ``steps`` targeted MI-FGSM iterations on ``model`` from ``start`` ([B, ...]) towards
    ``targets`` ([B] class ids) and return the final inputs (detached).

    The model is put in eval mode for the attack (no dropout, batch-norm running statistics) and
    restored afterwards; its parameters receive no gradients.
    """
    if steps < 0:
        raise ValueError(f"steps must be non-negative, got {steps}")
    if step_size <= 0:
        raise ValueError(f"step_size must be positive, got {step_size}")
    if decay < 0:
        raise ValueError(f"decay must be non-negative, got {decay}")
    low, high = clip
    if not low < high:
        raise ValueError(f"clip must be (low, high) with low < high, got {clip}")
    was_training = model.training
    model.eval()
    requires = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        x = start.detach().clone().clamp_(low, high)
        momentum = torch.zeros_like(x)
        reduce_dims = tuple(range(1, x.dim()))
        for _ in range(steps):
            x.requires_grad_(True)
            # A sum, not a mean, so each sample's gradient is its own loss's gradient.
            loss = F.cross_entropy(model(x), targets, reduction="sum")
            (grad,) = torch.autograd.grad(loss, x)
            l1 = grad.abs().sum(dim=reduce_dims, keepdim=True).clamp_min(1e-12)
            momentum = decay * momentum + grad / l1
            x = (x.detach() - step_size * momentum.sign()).clamp_(low, high)
        return x.detach()
    finally:
        for p, flag in zip(model.parameters(), requires):
            p.requires_grad_(flag)
        model.train(was_training)
