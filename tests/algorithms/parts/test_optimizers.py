"""fedfew's local optimisers (fedfew.algorithms.parts.optimizers) take the same steps as torch.optim's,
bit for bit, Adam continues from its saved state as if never stopped, and they never import
torch._dynamo (the 1.2 s per process they exist to avoid)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from fedfew.algorithms.parts.common import make_optimizer
from fedfew.algorithms.parts.optimizers import SGD, Adam


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    return model.to(memory_format=torch.channels_last)


def _train(model: nn.Module, optimizer, steps: int, seed: int, freeze_last_at: int | None = None) -> None:
    generator = torch.Generator().manual_seed(seed)
    for step in range(steps):
        optimizer.zero_grad()
        x = torch.randn(5, 1, 8, 8, generator=generator)
        y = torch.randint(0, 3, (5,), generator=generator)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if freeze_last_at is not None and step >= freeze_last_at:  # a parameter without a gradient is skipped
            model[-1].bias.grad = None
        optimizer.step()


@pytest.mark.parametrize(("name", "momentum", "weight_decay"),
                         [("sgd", 0.0, 0.0), ("sgd", 0.9, 0.0), ("sgd", 0.9, 5e-4), ("sgd", 0.0, 1e-3),
                          ("adam", 0.0, 0.0), ("adam", 0.0, 5e-4)])
def test_a_step_is_torch_optims_step_bit_for_bit(name: str, momentum: float, weight_decay: float) -> None:
    ours, theirs = _model(0), _model(0)
    lr = 0.05 if name == "sgd" else 1e-3
    reference = (torch.optim.SGD(theirs.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
                 if name == "sgd" else torch.optim.Adam(theirs.parameters(), lr=lr, weight_decay=weight_decay))
    _train(ours, make_optimizer(name, ours.parameters(), lr, momentum, weight_decay), 7, seed=1, freeze_last_at=4)
    _train(theirs, reference, 7, seed=1, freeze_last_at=4)
    for (key, mine), (_, reference_tensor) in zip(ours.state_dict().items(), theirs.state_dict().items(), strict=True):
        assert torch.equal(mine, reference_tensor), key
    assert any(not torch.equal(a, b) for a, b in zip(ours.state_dict().values(), _model(0).state_dict().values()))


def test_zero_grad_without_set_to_none_zeroes_in_place() -> None:
    model = _model(0)
    optimizer = SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 1, 8, 8)).sum().backward()
    grads = [p.grad for p in model.parameters()]
    optimizer.zero_grad(set_to_none=False)
    assert all(p.grad is g and not g.any() for p, g in zip(model.parameters(), grads))
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_an_empty_parameter_list_is_refused() -> None:
    with pytest.raises(ValueError, match="empty parameter list"):
        Adam([], lr=0.1)


def test_training_with_them_does_not_import_torch_dynamo() -> None:
    code = ("import sys, torch\n"
            "from fedfew.algorithms.parts.optimizers import SGD, Adam\n"
            "m = torch.nn.Linear(3, 2)\n"
            "for opt in (SGD(m.parameters(), lr=0.1, momentum=0.9), Adam(m.parameters(), lr=0.1)):\n"
            "    opt.zero_grad(); m(torch.randn(4, 3)).sum().backward(); opt.step()\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def steps(optimizer: Adam, model: torch.nn.Linear, inputs: torch.Tensor, count: int) -> None:
    for _ in range(count):
        optimizer.zero_grad()
        model(inputs).pow(2).sum().backward()
        optimizer.step()


def test_adam_continued_from_its_state_equals_adam_never_stopped() -> None:
    torch.manual_seed(0)
    inputs = torch.randn(8, 4)
    whole, halves = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    halves.load_state_dict(whole.state_dict())
    steps(Adam(whole.parameters(), lr=0.01), whole, inputs, 6)
    first = Adam(halves.parameters(), lr=0.01)
    steps(first, halves, inputs, 3)
    saved = first.state()
    second = Adam(halves.parameters(), lr=0.01)
    second.load_state(saved)
    steps(second, halves, inputs, 3)
    assert torch.equal(whole.weight, halves.weight) and torch.equal(whole.bias, halves.bias)
    assert float(saved["step"][0]) == 3.0  # loading copied: the later steps left the saved state alone
    fresh = Adam(halves.parameters(), lr=0.01)
    assert fresh.state() == {"step": [], "first": [], "second": []}


def test_adam_load_state_refuses_moments_of_another_model() -> None:
    small, large = torch.nn.Linear(2, 2), torch.nn.Linear(3, 2)
    optimizer = Adam(small.parameters(), lr=0.1)
    steps(optimizer, small, torch.ones(1, 2), 1)
    with pytest.raises(ValueError, match="moments of shape"):
        Adam(large.parameters(), lr=0.1).load_state(optimizer.state())
