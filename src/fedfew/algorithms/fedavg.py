"""FedAvg (McMahan et al. 2017) and FedProx (Li et al. 2020) on plain minibatch classification.

Client k sets w = w^t, trains for E epochs with batch size B on its own samples (FedProx adds
mu/2 ||w - w^t||^2 to each batch loss), and sends w back; the server averages by sample count n_k.

On a few-shot task the model classifies over the training (base) classes, and meta-test episodes
are solved with a prototype classifier on the encoder's features (the usual "pre-train, then
nearest class mean" baseline). On a classification task the global model is scored on the test set;
with ``score_uploads`` each client also scores its last upload on its private validation set (FedAvg's
"local model" in FML's Fig. 5), from a copy it keeps as its state: nothing in training changes.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import torch
from pydantic import Field
from torch import nn

from fedfew.algorithms.parts.common import (
    TrainOptions,
    evaluate_model,
    label_map,
    local_scores,
    model_update,
    train_epochs,
)
from fedfew.fewshot.evaluation import dataset_accuracy
from fedfew.fewshot.learners import proximal_term
from fedfew.interface.aggregation import weighted_average, weights_for
from fedfew.interface.algorithm import (
    Algorithm,
    ClientData,
    ClientResult,
    ClientScores,
    Context,
    EvalData,
    Parts,
    Payload,
)
from fedfew.interface.registration import register
from fedfew.interface.state import get_state, load_state_
from fedfew.models.base import FewShotModel


class FedAvgOptions(TrainOptions):
    mu: float = Field(0.0, ge=0, description="FedProx's weight: adds mu/2 ||w - w^t||^2 to every minibatch "
                      "loss (0: plain FedAvg)")
    aggregation: Literal["samples", "uniform"] = Field(
        "samples", description="the server's weights: each client's sample count n_k (FedAvg) or uniform")
    score_uploads: bool = Field(False, description=(
        "score each client's \"local model\", its last upload (the global model it received after its local "
        "epochs), on its private validation set, as FML scores its private models (FML's Fig. 5): test "
        "metrics local_accuracy, local_ci95, local_min, local_max, local_by_client. The client keeps a "
        "copy of its upload as its state for that; training is unchanged"))


class FedProxOptions(FedAvgOptions):
    mu: float = Field(0.01, ge=0, description="FedProx's mu: adds mu/2 ||w - w^t||^2 to every minibatch loss "
                      "(0: FedAvg)")


#: The options of a :class:`FedAvg` subclass.
FedAvgOptionsT = TypeVar("FedAvgOptionsT", bound=FedAvgOptions)


@register("fedavg", help="FedAvg: local minibatch SGD, sample-weighted model averaging")
class FedAvg(Algorithm[FedAvgOptionsT]):
    secure_sum = "with score_uploads: false"
    secure_sum_requires = {"score_uploads": False}
    secure_sum_refused = "with score_uploads each client's own model is scored on its own data"
    dp_refused = ("fedavg with score_uploads scores each client's own model on its private validation "
                  "set and reports the scores (score_uploads: false is covered)")

    def __init__(self, options: FedAvgOptionsT, context: Context) -> None:
        super().__init__(options, context)
        fewshot = context.task == "fewshot"
        self.num_outputs = len(context.train_classes) if fewshot else context.num_classes
        # Few-shot tasks train over the base classes only; targets are their indices.
        self.targets_of = label_map(context.train_classes, context.num_classes) if fewshot else None
        # Subclasses with options of their own (FRL's Per-FedAvg) do not take score_uploads.
        self.scores_uploads = bool(getattr(options, "score_uploads", False))
        if self.scores_uploads and fewshot:
            raise ValueError(f"{self.name}: score_uploads scores the uploads on the clients' validation sets "
                             "(task: classification), not on few-shot episodes")
        self.model = self.new_model()

    @property
    def evaluates_clients(self) -> bool:  # type: ignore[override]
        """With ``score_uploads`` each client scores its last upload where it is (its state)."""
        return self.scores_uploads

    @property
    def dp_upload(self) -> str | None:  # type: ignore[override]
        """The model is averaged: DP clips its change (not with ``score_uploads``, whose scores of the
        clients' own models on their own data the guarantee would not cover)."""
        return None if self.scores_uploads else "model-delta"

    def new_model(self) -> FewShotModel:
        return self.context.make_model(self.num_outputs)

    def init_server(self, generator: torch.Generator) -> Parts:
        return {"model": get_state(self.new_model())}

    def targets(self, labels: torch.Tensor) -> torch.Tensor:
        return labels if self.targets_of is None else self.targets_of[labels]

    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        mu = self.options.mu

        def train(model: nn.Module) -> dict[str, float]:
            anchor = {k: v.clone() for k, v in payload["model"].items()} if mu > 0 else None
            extra = (lambda m: proximal_term(m, anchor, mu)) if anchor is not None else None
            return train_epochs(model, data.train, self.targets(data.train.labels), self.options, generator, extra)

        result = model_update(self.model, payload, state, data.num_samples, train)
        if self.scores_uploads:  # a copy of the upload stays with the client, to be scored
            result.state = {"upload": get_state(self.model)}
        return result

    def aggregate(self, server: Parts, results: dict[int, ClientResult],
                  generator: torch.Generator) -> Parts:
        sent = list(results.values())
        weights = weights_for(self.options.aggregation, [r.num_samples for r in sent], [0] * len(sent))
        return {**server, "model": weighted_average([r.upload["model"] for r in sent], weights)}

    def evaluate(self, server: Parts, data: EvalData, generator: torch.Generator) -> dict[str, float]:
        return evaluate_model(load_state_(self.model, server["model"]), data)

    # -- score_uploads: each client's last upload on its private validation set -------------------
    def evaluate_client(self, payload: Payload, state: object, client: ClientData, data: EvalData,
                        generator: torch.Generator) -> ClientScores:
        if not isinstance(state, dict) or "upload" not in state or client.val is None or len(client.val) == 0:
            return {}  # not yet trained (round 0), or nothing to score on
        model = load_state_(self.model, state["upload"])
        return {"local_accuracy": dataset_accuracy(model, client.val.inputs, client.val.labels, client.val.lengths)}

    def combine_evaluations(self, server: Parts, scores: dict[int, ClientScores], data: EvalData,
                            generator: torch.Generator) -> dict[str, Any]:
        """The global model exactly as :meth:`evaluate` scores it, and the uploads' scores."""
        metrics: dict[str, Any] = dict(self.evaluate(server, data, generator))
        metrics.update(local_scores({cid: s["local_accuracy"] for cid, s in scores.items() if "local_accuracy" in s}))
        return metrics


@register("fedprox", help="FedProx: FedAvg with a proximal term mu/2 ||w - w_global||^2")
class FedProx(FedAvg[FedProxOptions]):
    secure_sum = "with score_uploads: false"
    secure_sum_refused = "with score_uploads each client's own model is scored on its own data"
    dp_refused = ("fedprox with score_uploads scores each client's own model on its private validation "
                  "set and reports the scores (score_uploads: false is covered)")

