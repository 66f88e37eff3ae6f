"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020) as a baseline of FRL (Park et al. 2021).

Per-FedAvg trains w so that one local gradient step personalises it: each local step of client k
draws independent batches D, D', D'' of its data and sets

    w_tmp = w - alpha grad f(w; D)
    FO (first-order):  w <- w - beta grad f(w_tmp; D')
    HF (Hessian-free): w <- w - beta (I - alpha H(w; D'')) grad f(w_tmp; D'),
        H(w; D'') v ~= [grad f(w + delta v; D'') - grad f(w - delta v; D'')] / (2 delta)

and the server averages the local models by sample count. Defaults alpha = 0.01, beta = 1e-3,
delta = 1e-3 are ours (the FRL paper states no setting for this baseline; Fallah et al. tune them
per dataset).

As an FRL baseline it prepares a linear classifier with |C_b| outputs; at deployment the group
trains the "forced" global model with R rounds of the same Per-FedAvg updates, and the global model
(no personalisation step) classifies the pooled query set, as for every method. The head
(``head_init``):

* "meta" (default): the head is meta-learned with the rest of the model, as in Fallah et al. (the
  whole w is personalised) and MAML. Labels are mapped per task, MAML-style: at every local step a
  client's n classes get distinct rows drawn at random among the first max(n, tau) (tau =
  ``deployment.classes``), and the cross-entropy runs over those max(n, tau) outputs, as a group's
  client trains a tau-way head on its own few classes. A group starts from the prepared model with
  the first tau rows of its head ("starting from the initialized model", FRL section 4).
* "xavier": global labels (the base classes' indices) in preparation; at deployment the head is
  replaced by a Xavier-initialised tau-way layer (our reading before; the paper describes that
  replacement for the fine-tuning baseline).

``frl-per-fedavg-distance`` is the "Personalized FL: Distance-based classifier" row of the FRL
paper's Tables 1-3, which the paper names but does not describe beyond "a global model can still be
trained by repeating local updates and aggregations for R FL rounds starting from the initialized
model geared to client personalization" and, for FRL's own variants, "the distance-based classifier
utilizes prototypes instead of using the linear layer". Ours: the same Per-FedAvg steps with the
linear head replaced by prototypes, f(w; D) being the prototype loss (FRL's eq. 2, cross-entropy over
negative squared distances) of batch D against the class means of D's own features (a batch with one
class contributes no gradient); the server averages the encoders. At deployment the group runs R
rounds of the same Per-FedAvg steps on its support sets, uploads each client's support prototypes
with the model, and classifies the pooled query set by distance to the count-weighted global
prototypes, exactly as FRL's deployment does (without GPAL).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call

from fedfew.algorithms.fedavg import FedAvg
from fedfew.algorithms.frl import (
    FRLOptions,
    MetaHeadStart,
    PrototypeFL,
    class_means,
    local_prototypes,
    prototype_loss,
    task_label_rows,
)
from fedfew.algorithms.frl_baselines import DEFAULT_ROUNDS
from fedfew.algorithms.parts.common import model_update
from fedfew.algorithms.parts.frl_deployment import (
    DeploymentOptions,
    LinearDeployment,
    LinearFL,
    evaluate_deployment,
)
from fedfew.data.dataset import LabelledDataset
from fedfew.fewshot.learners import strided_like
from fedfew.interface.aggregation import weighted_average, weights_for
from fedfew.interface.algorithm import (
    Algorithm,
    ClientData,
    ClientResult,
    Context,
    EvalData,
    Options,
    Parts,
    Payload,
)
from fedfew.interface.registration import register
from fedfew.interface.state import get_state

Params = dict[str, torch.Tensor]


class PerFedAvgOptions(Options):
    variant: Literal["fo", "hf"] = Field("fo", description="first-order (\"fo\") or Hessian-free (\"hf\") "
                                         "Per-FedAvg")
    alpha: float = Field(0.01, gt=0, description="alpha: step size of the personalisation step w_tmp = w - "
                         "alpha grad f(w; D)")
    beta: float = Field(1e-3, gt=0, description="beta: step size of the meta step on w")
    delta: float = Field(1e-3, gt=0, description="delta of HF's finite-difference Hessian-vector product")
    batch_size: int = Field(60, ge=1, description="size of each of the batches D, D', D''")
    local_steps: int = Field(10, ge=1, description="local steps per round (each uses two batches, three for "
                             "HF); Fallah et al. use 10")
    aggregation: Literal["samples", "uniform"] = Field("samples", description=(
        "the server's weights: each client's sample count or uniform"))
    head_init: Literal["meta", "xavier"] = Field("meta", description=(
        "the linear head: \"meta\" (meta-learned, MAML-style labels per local step) or \"xavier\" (global "
        "labels in preparation, a fresh Xavier head at deployment); the module docstring says more"))
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions, description=(
        "the deployment protocol of section 2.3 (groups of new clients scored from the prepared model)"))



def batch_loss(model: nn.Module, params: Params, data: LabelledDataset, targets: torch.Tensor,
               batch: torch.Tensor) -> torch.Tensor:
    args = (data.inputs[batch],) if data.lengths is None else (data.inputs[batch], data.lengths[batch])
    return F.cross_entropy(functional_call(model, params, args), targets[batch])


def prototype_batch_loss(model: nn.Module, params: Params, data: LabelledDataset, targets: torch.Tensor,
                         batch: torch.Tensor) -> torch.Tensor:
    """The distance-based f(w; D): FRL's prototype loss (eq. 2) of batch D against the class means of
    D's own features (``model`` is a head-less encoder)."""
    args = (data.inputs[batch],) if data.lengths is None else (data.inputs[batch], data.lengths[batch])
    features = functional_call(model, params, args)
    classes, rows = torch.unique(targets[batch], return_inverse=True)
    return prototype_loss(features, rows, class_means(features, rows, len(classes)))


LossFn = Callable[[nn.Module, Params, LabelledDataset, torch.Tensor, torch.Tensor], torch.Tensor]


def first_outputs_loss(width: int) -> LossFn:
    """f(w; D): the cross-entropy over the first ``width`` outputs of the head (a task's rows)."""

    def loss(model: nn.Module, params: Params, data: LabelledDataset, targets: torch.Tensor,
             batch: torch.Tensor) -> torch.Tensor:
        args = (data.inputs[batch],) if data.lengths is None else (data.inputs[batch], data.lengths[batch])
        return F.cross_entropy(functional_call(model, params, args)[:, :width], targets[batch])

    return loss


def task_targets(labels: torch.Tensor, min_rows: int) -> tuple[Callable[[torch.Generator], torch.Tensor], int]:
    """MAML-style targets for a client's data: a function drawing, for each local step, the head row
    of each sample (its class's row, :func:`~fedfew.algorithms.frl.task_label_rows`), and the number
    of outputs the task uses."""
    classes, index = torch.unique(labels, return_inverse=True)

    def draw(generator: torch.Generator) -> torch.Tensor:
        return task_label_rows(len(classes), min_rows, generator).to(index.device)[index]

    return draw, max(len(classes), min_rows)


def gradient(model: nn.Module, params: Params, data: LabelledDataset, targets: torch.Tensor,
             batch: torch.Tensor, loss_fn: LossFn = batch_loss) -> Params:
    live = {name: p.detach().requires_grad_() for name, p in params.items()}
    grads = torch.autograd.grad(loss_fn(model, live, data, targets, batch), list(live.values()))
    return dict(zip(live, grads))


def per_fedavg_step(model: nn.Module, params: Params, data: LabelledDataset, targets: torch.Tensor,
                    batches: tuple[torch.Tensor, ...], options: PerFedAvgOptions,
                    loss_fn: LossFn = batch_loss) -> Params:
    """One Per-FedAvg local step from ``params`` on batches (D, D'[, D''])."""
    a, b = options.alpha, options.beta
    g = gradient(model, params, data, targets, batches[0], loss_fn)
    temporary = moved(params, g, -a)
    outer = gradient(model, temporary, data, targets, batches[1], loss_fn)
    if options.variant == "fo":
        return moved(params, outer, -b)
    d = options.delta
    plus = gradient(model, moved(params, outer, d), data, targets, batches[2], loss_fn)
    minus = gradient(model, moved(params, outer, -d), data, targets, batches[2], loss_fn)
    hessian_vector = {n: (plus[n] - minus[n]) / (2 * d) for n in params}
    return moved(params, {n: outer[n] - a * hessian_vector[n] for n in params}, -b)


def moved(params: Params, direction: Params, scale: float) -> Params:
    """params + scale * direction, each tensor in its parameter's memory layout (channels_last)."""
    return {n: strided_like(params[n], params[n] + scale * direction[n]) for n in params}


def per_fedavg_local(model: nn.Module, data: LabelledDataset, targets: torch.Tensor, options: PerFedAvgOptions,
                     generator: torch.Generator, loss_fn: LossFn = batch_loss,
                     relabel: Callable[[torch.Generator], torch.Tensor] | None = None) -> dict[str, float]:
    """``local_steps`` Per-FedAvg steps on ``model`` in place; each batch is drawn independently.
    ``relabel`` draws new targets for each step (one MAML task: the same labels for D, D', D'')."""
    model.train()
    # Frozen parameters (a frozen word-vector table) are not Per-FedAvg's to move: functional_call takes
    # them from the model.
    params: Params = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    size = min(options.batch_size, len(data))
    draws = 2 if options.variant == "fo" else 3
    for _ in range(options.local_steps):
        if relabel is not None:
            targets = relabel(generator)
        batches = tuple(torch.randperm(len(data), generator=generator, device=generator.device)[:size]
                        for _ in range(draws))
        params = per_fedavg_step(model, params, data, targets, batches, options, loss_fn)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in params:
                p.copy_(params[name])
        loss = loss_fn(model, dict(model.named_parameters()), data, targets, torch.arange(len(data)))
    return {"loss": float(loss)}


class PerFedAvgFL(LinearFL):
    """Deployment: R rounds of Per-FedAvg training the group's global model (fresh tau-way head)."""

    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        # LinearDeployment hands this group model FRLPerFedAvg's PerFedAvgOptions, not the TrainOptions
        # that bound LinearFL's options: so the class names no options class (LinearFL's stand for any).
        return model_update(self.model, payload, state, data.num_samples,
                            lambda model: per_fedavg_local(model, data.train, data.train.labels,
                                                           self.options, generator))


# MetaHeadStart (algorithms/frl.py) types its model nn.Module, LinearFL a FewShotModel: the same object.
class PerFedAvgMetaHeadFL(MetaHeadStart, PerFedAvgFL):  # type: ignore[misc]
    """Deployment from the meta-learned head (``head_init: meta``): the prepared model, head cut to tau rows."""


@register("frl-per-fedavg", help="FRL baseline: Per-FedAvg (FO or HF), forced global model at deployment")
class FRLPerFedAvg(FedAvg):
    """Per-FedAvg preparation of a |C_b|-way classifier (FedAvg's model, targets and aggregation)."""
    secure_sum = ""

    # FedAvg's model, targets and aggregation with Per-FedAvg's own options: not a FedAvgOptions, so
    # FedAvg[...] cannot name them (its options are bound to FedAvgOptions) and the class assigns them.
    Options = PerFedAvgOptions
    options: PerFedAvgOptions

    def __init__(self, options: PerFedAvgOptions, context: Context) -> None:
        if context.task != "fewshot":
            raise ValueError("frl-per-fedavg deploys on unseen classes: set task: fewshot")
        super().__init__(options, context)
        meta = options.head_init == "meta"
        if meta and options.deployment.classes > self.num_outputs:
            raise ValueError(
                f"algorithm.options.deployment.classes={options.deployment.classes} exceeds the {self.num_outputs} "
                "preparation classes, the rows of the meta-learned head (head_init: meta); use head_init: xavier"
            )
        fl_class = PerFedAvgMetaHeadFL if meta else PerFedAvgFL
        self.deployment = LinearDeployment(options, context, fl_class)  # type: ignore[arg-type]

    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        def train(model: nn.Module) -> dict[str, float]:
            if self.options.head_init == "meta":  # MAML-style labels, new for every local step
                relabel, width = task_targets(data.train.labels, self.options.deployment.classes)
                return per_fedavg_local(model, data.train, relabel(generator), self.options, generator,
                                        first_outputs_loss(width), relabel)
            return per_fedavg_local(model, data.train, self.targets(data.train.labels), self.options, generator)

        return model_update(self.model, payload, state, data.num_samples, train)

    def evaluate(self, server: Parts, data: EvalData, generator: torch.Generator) -> dict[str, float]:
        tau = self.options.deployment.classes
        return evaluate_deployment(self.deployment(tau), server["model"], self.options.deployment, DEFAULT_ROUNDS,
                                   data, self.context)


class PerFedAvgPrototypeFL(PrototypeFL):
    """Deployment of the distance-based Per-FedAvg: R rounds of Per-FedAvg steps with the prototype
    loss on the clients' support sets; models and support prototypes averaged (FRL's deployment,
    without GPAL); the pooled query set is classified by distance to the global prototypes."""

    def __init__(self, options: PerFedAvgOptions, context: Context) -> None:
        super().__init__(FRLOptions(gamma=1.0, aggregation=options.aggregation, deployment=options.deployment),
                         context)
        self.per_options = options

    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        result = model_update(self.model, payload, state, len(data.train),
                              lambda model: per_fedavg_local(model, data.train, data.train.labels, self.per_options,
                                                             generator, prototype_batch_loss))
        result.upload["prototypes"] = local_prototypes(self.model, data.train)
        return result


@register("frl-per-fedavg-distance",
          help="FRL baseline: Per-FedAvg with a distance-based (prototype) classifier, forced global model")
class FRLPerFedAvgDistance(Algorithm[PerFedAvgOptions]):
    """Per-FedAvg preparation of a head-less encoder with the prototype loss (module docstring)."""
    secure_sum = ""

    dp_upload = "model-delta"  # the encoder is averaged: differential privacy clips its change

    def __init__(self, options: PerFedAvgOptions, context: Context) -> None:
        if context.task != "fewshot":
            raise ValueError("frl-per-fedavg-distance deploys on unseen classes: set task: fewshot")
        super().__init__(options, context)
        self.model = context.make_model(None)
        self.deployment = PerFedAvgPrototypeFL(options, context)

    def init_server(self, generator: torch.Generator) -> Parts:
        return {"model": get_state(self.context.make_model(None))}

    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        return model_update(self.model, payload, state, data.num_samples,
                            lambda model: per_fedavg_local(model, data.train, data.train.labels, self.options,
                                                           generator, prototype_batch_loss))

    def aggregate(self, server: Parts, results: dict[int, ClientResult],
                  generator: torch.Generator) -> Parts:
        sent = [results[c] for c in sorted(results)]
        weights = weights_for(self.options.aggregation, [r.num_samples for r in sent], [0] * len(sent))
        return {**server, "model": weighted_average([r.upload["model"] for r in sent], weights)}

    def evaluate(self, server: Parts, data: EvalData, generator: torch.Generator) -> dict[str, float]:
        return evaluate_deployment(self.deployment, server["model"], self.options.deployment, DEFAULT_ROUNDS,
                                   data, self.context)
