"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020) as a baseline of FRL (Park et al. 2021).

Per-FedAvg trains w so that one local gradient step personalises it: each local step of client k
draws independent batches D, D', D'' of its data and sets

    w_tmp = w - alpha grad f(w; D)
    FO (first-order):  w <- w - beta grad f(w_tmp; D')
    HF (Hessian-free): w <- w - beta (I - alpha H(w; D'')) grad f(w_tmp; D'),
        H(w; D'') v ~= [grad f(w + delta v; D'') - grad f(w - delta v; D'')] / (2 delta)

and the server averages the local models by sample count. Defaults alpha = 0.01, beta = 1e-3,
delta = 1e-3 (the FRL paper's settings for this baseline).

As an FRL baseline it prepares a |C_b|-way classifier over the preparation classes; at deployment
the head is replaced by a Xavier-initialised tau-way layer and the group trains the "forced" global
model with R rounds of the same Per-FedAvg updates from that initialisation; the global model (no
personalisation step) classifies the pooled query set, as for every method.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call

from fedfew.algorithms.fedavg import FedAvg
from fedfew.algorithms.frl_baselines import DEFAULT_ROUNDS
from fedfew.data.dataset import LabelledDataset
from fedfew.deployment import DeploymentOptions, LinearDeployment, LinearFL, evaluate_deployment
from fedfew.engine.algorithm import ClientData, ClientResult, Context, EvalData, Options, register
from fedfew.engine.state import get_state, load_state_
from fedfew.meta.learners import strided_like

Params = dict[str, torch.Tensor]


class PerFedAvgOptions(Options):
    variant: Literal["fo", "hf"] = "fo"
    alpha: float = Field(0.01, gt=0)
    beta: float = Field(1e-3, gt=0)
    delta: float = Field(1e-3, gt=0)
    batch_size: int = Field(60, ge=1)
    #: Local steps per round (each uses two batches, three for HF); Fallah et al. use 10.
    local_steps: int = Field(10, ge=1)
    aggregation: Literal["samples", "uniform"] = "samples"
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)


def batch_loss(model: nn.Module, params: Params, data: LabelledDataset, targets: torch.Tensor,
               batch: torch.Tensor) -> torch.Tensor:
    args = (data.inputs[batch],) if data.lengths is None else (data.inputs[batch], data.lengths[batch])
    return F.cross_entropy(functional_call(model, params, args), targets[batch])


def gradient(model: nn.Module, params: Params, data: LabelledDataset, targets: torch.Tensor,
             batch: torch.Tensor) -> Params:
    live = {name: p.detach().requires_grad_() for name, p in params.items()}
    grads = torch.autograd.grad(batch_loss(model, live, data, targets, batch), list(live.values()))
    return dict(zip(live, grads))


def per_fedavg_step(model: nn.Module, params: Params, data: LabelledDataset, targets: torch.Tensor,
                    batches: tuple[torch.Tensor, ...], options: PerFedAvgOptions) -> Params:
    """One Per-FedAvg local step from ``params`` on batches (D, D'[, D''])."""
    a, b = options.alpha, options.beta
    g = gradient(model, params, data, targets, batches[0])
    temporary = moved(params, g, -a)
    outer = gradient(model, temporary, data, targets, batches[1])
    if options.variant == "fo":
        return moved(params, outer, -b)
    d = options.delta
    plus = gradient(model, moved(params, outer, d), data, targets, batches[2])
    minus = gradient(model, moved(params, outer, -d), data, targets, batches[2])
    hessian_vector = {n: (plus[n] - minus[n]) / (2 * d) for n in params}
    return moved(params, {n: outer[n] - a * hessian_vector[n] for n in params}, -b)


def moved(params: Params, direction: Params, scale: float) -> Params:
    """params + scale * direction, each tensor in its parameter's memory layout (channels_last)."""
    return {n: strided_like(params[n], params[n] + scale * direction[n]) for n in params}


def per_fedavg_local(model: nn.Module, data: LabelledDataset, targets: torch.Tensor, options: PerFedAvgOptions,
                     generator: torch.Generator) -> dict[str, float]:
    """``local_steps`` Per-FedAvg steps on ``model`` in place; each batch is drawn independently."""
    model.train()
    params: Params = {name: p.detach().clone() for name, p in model.named_parameters()}
    size = min(options.batch_size, len(data))
    draws = 2 if options.variant == "fo" else 3
    for _ in range(options.local_steps):
        batches = tuple(torch.randperm(len(data), generator=generator, device=generator.device)[:size]
                        for _ in range(draws))
        params = per_fedavg_step(model, params, data, targets, batches, options)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
        loss = batch_loss(model, dict(model.named_parameters()), data, targets, torch.arange(len(data)))
    return {"loss": float(loss)}


class PerFedAvgFL(LinearFL):
    """Deployment: R rounds of Per-FedAvg training the group's global model (fresh tau-way head)."""

    def client_update(self, payload: dict[str, Any], state: Any, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        model = load_state_(self.model, payload["model"])
        metrics = per_fedavg_local(model, data.train, data.train.labels, self.options, generator)
        return ClientResult(upload={"model": get_state(model)}, state=state, metrics=metrics,
                            num_samples=data.num_samples)


@register("frl-per-fedavg", help="FRL baseline: Per-FedAvg (FO or HF), forced global model at deployment")
class FRLPerFedAvg(FedAvg):
    """Per-FedAvg preparation of a |C_b|-way classifier (FedAvg's model, targets and aggregation)."""

    Options = PerFedAvgOptions

    def __init__(self, options: PerFedAvgOptions, context: Context) -> None:
        if context.task != "fewshot":
            raise ValueError("frl-per-fedavg deploys on unseen classes: set task: fewshot")
        super().__init__(options, context)  # type: ignore[arg-type]
        self.deployment = LinearDeployment(options, context, PerFedAvgFL)  # type: ignore[arg-type]

    def client_update(self, payload: dict[str, Any], state: Any, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        model = load_state_(self.model, payload["model"])
        metrics = per_fedavg_local(model, data.train, self.targets(data.train.labels), self.options, generator)
        return ClientResult(upload={"model": get_state(model)}, state=state, metrics=metrics,
                            num_samples=data.num_samples)

    def evaluate(self, server: dict[str, Any], client_states: dict[int, Any], clients: list[ClientData],
                 data: EvalData, generator: torch.Generator) -> dict[str, float]:
        tau = self.options.deployment.classes
        return evaluate_deployment(self.deployment(tau), server["model"], self.options.deployment, DEFAULT_ROUNDS,
                                   data, self.context, clients)
