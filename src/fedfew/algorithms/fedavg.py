"""FedAvg (McMahan et al. 2017) and FedProx (Li et al. 2020) on plain minibatch classification.

Client k sets w = w^t, trains for E epochs with batch size B on its own samples (FedProx adds
mu/2 ||w - w^t||^2 to each batch loss), and sends w back; the server averages by sample count n_k.

On a few-shot task the model classifies over the training (base) classes, and meta-test episodes
are solved with a prototype classifier on the encoder's features (the usual "pre-train, then
nearest class mean" baseline). On a classification task the global model is scored on the test set.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from fedfew.algorithms.common import TrainOptions, evaluate_model, label_map, train_epochs
from fedfew.engine.aggregation import weighted_average, weights_for
from fedfew.engine.algorithm import Algorithm, ClientData, ClientResult, Context, EvalData, register
from fedfew.engine.state import get_state, load_state_
from fedfew.meta.learners import proximal_term
from fedfew.models.base import FewShotModel
from fedfew.seeding import seed_torch_init


class FedAvgOptions(TrainOptions):
    mu: float = Field(0.0, ge=0)
    aggregation: Literal["samples", "uniform"] = "samples"


class FedProxOptions(FedAvgOptions):
    mu: float = Field(0.01, ge=0)


@register("fedavg", help="FedAvg: local minibatch SGD, sample-weighted model averaging")
class FedAvg(Algorithm):
    Options = FedAvgOptions
    options: FedAvgOptions

    def __init__(self, options: FedAvgOptions, context: Context) -> None:
        super().__init__(options, context)
        fewshot = context.task == "fewshot"
        self.num_outputs = len(context.train_classes) if fewshot else context.num_classes
        # Few-shot tasks train over the base classes only; targets are their indices.
        self.targets_of = label_map(context.train_classes, context.num_classes) if fewshot else None
        self.model = self.new_model()

    def new_model(self) -> FewShotModel:
        return self.context.make_model(self.num_outputs)

    def init_server(self, generator: torch.Generator) -> dict[str, Any]:
        seed_torch_init(generator)
        return {"model": get_state(self.new_model())}

    def targets(self, labels: torch.Tensor) -> torch.Tensor:
        return labels if self.targets_of is None else self.targets_of[labels]

    def client_update(self, payload: dict[str, Any], state: Any, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        model = load_state_(self.model, payload["model"])
        mu = self.options.mu
        anchor = {k: v.clone() for k, v in payload["model"].items()} if mu > 0 else None
        extra = (lambda m: proximal_term(m, anchor, mu)) if anchor is not None else None
        metrics = train_epochs(model, data.train, self.targets(data.train.labels), self.options, generator, extra)
        return ClientResult(upload={"model": get_state(model)}, state=state, metrics=metrics,
                            num_samples=data.num_samples, num_episodes=0)

    def aggregate(self, server: dict[str, Any], results: dict[int, ClientResult],
                  generator: torch.Generator) -> dict[str, Any]:
        sent = list(results.values())
        weights = weights_for(self.options.aggregation, [r.num_samples for r in sent], [0] * len(sent))
        return {**server, "model": weighted_average([r.upload["model"] for r in sent], weights)}

    def evaluate(self, server: dict[str, Any], data: EvalData, generator: torch.Generator) -> dict[str, float]:
        return evaluate_model(load_state_(self.model, server["model"]), data)


@register("fedprox", help="FedProx: FedAvg with a proximal term mu/2 ||w - w_global||^2")
class FedProx(FedAvg):
    Options = FedProxOptions
    options: FedProxOptions
