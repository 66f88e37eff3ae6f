"""Stacked parameters (fedfew.fewshot.stacked): the stacked forward is each client's own model, the
gradient of the summed losses each client's own, and a model that cannot be stacked is named."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedfew.config.validation import load_config
from fedfew.engine.batched import BatchingUnsupportedError
from fedfew.fewshot.episodes import Episode
from fedfew.fewshot.learners import MAML, ProtoNet
from fedfew.fewshot.stacked import StackedEpisodes, stack_states, stacked_forward, why_not_stackable
from fedfew.models import build_model
from fedfew.run.experiment import build_experiment
from tests.tiny import tiny_config


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("head", [5, None, "mlp"])
def test_stacked_forward_is_each_clients_own_model(channels_last: bool, head: int | str | None) -> None:
    torch.manual_seed(0)
    models = [build_model("conv4", (1, 28, 28), None if head == "mlp" else head, hidden=8,
                          channels_last=channels_last) for _ in range(3)]
    if head == "mlp":
        for m in models:
            m.head = torch.nn.Sequential(torch.nn.Linear(m.feature_dim, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    names = [k for k, _ in models[0].named_parameters()]
    params = stack_states([dict(m.named_parameters()) for m in models], names)
    x = torch.rand(3, 7, 1, 28, 28)
    with torch.no_grad():
        out = stacked_forward(models[0], params, x)
        features = stacked_forward(models[0], params, x, features=True)
        for c, model in enumerate(models):
            torch.testing.assert_close(out[c], model(x[c]), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(features[c], model.features(x[c]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("learner", [MAML(0.1, 2, 2, first_order=False), MAML(0.4, 1, 3, first_order=True),
                                     ProtoNet()], ids=["maml", "fomaml", "proto"])
def test_the_gradient_of_the_summed_losses_is_each_clients_own(learner: Any) -> None:
    torch.manual_seed(1)
    models = [build_model("conv4", (1, 28, 28), 3 if isinstance(learner, MAML) else None, hidden=8)
              for _ in range(3)]
    episodes = [Episode(torch.rand(3, 1, 28, 28), torch.arange(3), torch.rand(6, 1, 28, 28),
                        torch.arange(3).repeat_interleave(2), torch.arange(3), torch.arange(3), torch.arange(6))
                for _ in models]
    names = [k for k, _ in models[0].named_parameters()]
    params = {k: v.requires_grad_() for k, v in stack_states([dict(m.named_parameters()) for m in models],
                                                            names).items()}
    losses, logits = learner.stacked_loss(models[0], params, StackedEpisodes(episodes))
    losses.sum().backward()
    for c, (model, episode) in enumerate(zip(models, episodes)):
        loss, own_logits = learner.loss(model, episode)
        loss.backward()
        torch.testing.assert_close(losses[c], loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(logits[c], own_logits, rtol=1e-4, atol=1e-5)
        # one scale for the whole model: the gradients of the convolution biases BatchNorm cancels are
        # zero up to rounding, so no relative bound holds for them alone
        scale = max(float(p.grad.abs().max()) for p in model.parameters())
        for name, p in model.named_parameters():
            assert float((params[name].grad[c] - p.grad).abs().max()) <= 1e-4 * scale, name


def test_a_model_that_cannot_be_stacked_is_named() -> None:
    model = build_model("conv4", (1, 28, 28), 5, hidden=8, track_running_stats=True)
    assert "running statistics" in (why_not_stackable(model) or "")
    config = tiny_config("fl-maml")
    config["model"]["options"]["track_running_stats"] = True
    experiment = build_experiment(load_config(config, ["runtime.batch_clients=true"]))
    with pytest.raises(BatchingUnsupportedError, match="runtime.batch_clients: fl-maml's model"):
        experiment.simulator()
