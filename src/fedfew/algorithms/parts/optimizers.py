"""The clients' local optimisers: SGD and Adam as PyTorch computes them, without ``torch.optim``'s class.

``torch.optim.Optimizer`` imports ``torch._dynamo`` on its first use (its methods are wrapped to keep
``torch.compile`` out), and that import costs about 1.2 s of one core per process (sympy, the
distributed packages; measured with ``cProfile`` in a worker). Every worker process paid it inside its
first client update, which made round 1 of a run about 1 s slower than the others. These classes keep
the per-parameter state themselves and call the same update kernels ``torch.optim.SGD`` and
``torch.optim.Adam`` call (``torch.optim.sgd.sgd`` and ``torch.optim.adam.adam``, with the same defaults
and the same device-dependent choice of the single-tensor or foreach kernel), so a step is the same
arithmetic, bit for bit (``tests/algorithms/parts/test_optimizers.py`` checks it against ``torch.optim``), and
``torch._dynamo`` is never imported. Only what the algorithms use is here: ``zero_grad`` and ``step``;
F2L keeps ``torch.optim.Adam`` where it carries the optimiser's ``state_dict`` in a client's state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch
from torch import Tensor
from torch.optim.adam import adam
from torch.optim.sgd import sgd


class LocalOptimizer(Protocol):
    """What an algorithm's training loop asks of an optimiser."""

    #: the step size, which a schedule may change between steps (``lr_halving_episodes``)
    lr: float

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> None: ...


class _Optimizer:
    def __init__(self, params: Iterable[Tensor]) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("an optimiser got an empty parameter list")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As ``torch.optim.Optimizer.zero_grad``: drop the gradients, or zero them in place."""
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    def _with_grad(self) -> tuple[list[Tensor], list[Tensor]]:
        """The parameters that have a gradient, and those gradients (dense only)."""
        params: list[Tensor] = []
        grads: list[Tensor] = []
        for p in self.params:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("fedfew's local optimisers take dense gradients only")
            params.append(p)
            grads.append(p.grad)
        return params, grads


class SGD(_Optimizer):
    """``torch.optim.SGD(params, lr, momentum, weight_decay)`` (no dampening, no Nesterov)."""

    def __init__(self, params: Iterable[Tensor], lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        super().__init__(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.momentum_buffer: dict[Tensor, Tensor | None] = {}

    @torch.no_grad()
    def step(self) -> None:
        params, grads = self._with_grad()
        buffers = [self.momentum_buffer.get(p) for p in params] if self.momentum != 0 else []
        sgd(params, grads, buffers, weight_decay=self.weight_decay, momentum=self.momentum, lr=self.lr,
            dampening=0.0, nesterov=False, maximize=False, has_sparse_grad=False, foreach=None, fused=None)
        if self.momentum != 0:  # sgd() fills a parameter's first buffer in the list it was given
            self.momentum_buffer.update(zip(params, buffers, strict=True))


class Adam(_Optimizer):
    """``torch.optim.Adam(params, lr, weight_decay)`` with its default betas (0.9, 0.999) and eps 1e-8."""

    def __init__(self, params: Iterable[Tensor], lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params)
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        #: per parameter: the step count (a CPU scalar of torch.optim.Adam's dtype), the first and the
        #: second moment
        self.moments: dict[Tensor, tuple[Tensor, Tensor, Tensor]] = {}

    def state(self) -> dict[str, list[Tensor]]:
        """The moments as a state (copies), in parameter order: ``{"step", "first", "second"}``, each a list
        with one entry per parameter that has taken a step (the others are absent: a parameter that never
        had a gradient has no moments, as in torch.optim). Empty before the first step."""
        stepped = [p for p in self.params if p in self.moments]
        if len(stepped) not in (0, len(self.params)):
            raise ValueError("Adam.state: some parameters have moments and some do not; it keeps all or none")
        return {name: [self.moments[p][i].clone() for p in stepped] for i, name in enumerate(("step", "first", "second"))}

    def load_state(self, state: dict[str, list[Tensor]]) -> None:
        """Continue from :meth:`state`'s moments (copied in: ``state`` is left as it was)."""
        steps, first, second = state["step"], state["first"], state["second"]
        if not steps:
            return
        if not len(steps) == len(first) == len(second) == len(self.params):
            raise ValueError(f"Adam.load_state: moments for {len(steps)} parameters, the model has {len(self.params)}")
        for p, step, m, v in zip(self.params, steps, first, second):
            if m.shape != p.shape:
                raise ValueError(f"Adam.load_state: moments of shape {tuple(m.shape)} for a parameter of {tuple(p.shape)}")
            self.moments[p] = (step.clone(), m.clone(), v.clone())

    def _moments_of(self, p: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if p not in self.moments:
            scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            self.moments[p] = (torch.tensor(0.0, dtype=scalar, device="cpu"),
                               torch.zeros_like(p, memory_format=torch.preserve_format),
                               torch.zeros_like(p, memory_format=torch.preserve_format))
        return self.moments[p]

    @torch.no_grad()
    def step(self) -> None:
        params, grads = self._with_grad()
        moments = [self._moments_of(p) for p in params]
        steps, first, second = [m[0] for m in moments], [m[1] for m in moments], [m[2] for m in moments]
        adam(params, grads, first, second, [], steps, amsgrad=False, has_complex=any(torch.is_complex(p) for p in params),
             beta1=self.betas[0], beta2=self.betas[1], lr=self.lr, weight_decay=self.weight_decay, eps=self.eps,
             maximize=False, foreach=None, capturable=False, differentiable=False, fused=None, grad_scale=None,
             found_inf=None, decoupled_weight_decay=False)
