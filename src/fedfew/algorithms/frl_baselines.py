"""The baselines of FRL (Park et al. 2021, section 4), scored by the same deployment protocol.

Each method prepares an initial model in its own way; at deployment (section 2.3,
:mod:`fedfew.algorithms.parts.frl_deployment`) every group of K clients holding tau classes runs R rounds of FedAvg from
it with the last layer replaced by a Xavier-initialised tau-way layer, and its global model
classifies the pooled query set. The preparation-stage budget is matched in rounds: an FRL episode
costs R + 1 rounds, so T episodes of FRL compare with T (R + 1) rounds of FedAvg.

* ``frl-scratch``: "FedAvg" - no preparation; R rounds of FedAvg from a random initialisation.
* ``frl-finetune``: "fine-tuning via FedAvg" - pretrain a |C_b|-way classifier over the preparation
  classes with FedAvg (the participants' own labels), then fine-tune as above.
* ``frl-oneshot``: "fine-tuning via one-shot FL" (Guha et al. 2019). The paper (section 4): "The
  model is first pretrained via FedAvg during preparation, and then fine-tuned based on the scheme
  of [6] for R rounds at deployment", with 20 clients per deployment group of which the server
  samples K = 10 to aggregate. ``stage: deployment`` (default, the paper): preparation is
  ``frl-finetune``'s FedAvg; in each of the R deployment rounds every client of the group (set
  ``deployment.clients: 20``) trains the model with a fresh tau-way head on its support set and
  reports a ``cv_folds``-fold cross-validation accuracy, and the server averages the ``keep`` (10)
  best (sample-weighted). At the last round the kept models form Guha et al.'s cross-validated
  ensemble (``combine: ensemble``, default: the query is classified by the argmax of their mean
  softmax); the earlier rounds average them (sample-weighted), since the next round needs one model to
  train from (ours: the paper does not say how R rounds of a one-shot scheme chain).
  ``combine: average`` (our earlier reading, kept as an option) classifies with the average at the
  last round too. ``stage: preparation`` (the earlier reading, kept as an option): one
  preparation round in which the participants (``federation.clients_per_round``, 20) train the
  |C_b|-way classifier for ``local_epochs`` and the server averages the ``keep`` best by
  cross-validation; deployment is R rounds of FedAvg as for the other baselines.

Per-FedAvg (Fallah et al. 2020) is in :mod:`fedfew.algorithms.per_fedavg`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeVar

import torch
from pydantic import Field

from fedfew.algorithms.fedavg import FedAvg, FedAvgOptions
from fedfew.algorithms.oneshot import cross_validation_score, top_n
from fedfew.algorithms.parts.common import TrainOptions, train_epochs
from fedfew.algorithms.parts.frl_deployment import (
    DeploymentOptions,
    LinearDeployment,
    LinearFL,
    evaluate_deployment,
)
from fedfew.data.dataset import LabelledDataset
from fedfew.engine.base import Engine
from fedfew.engine.round import RoundOutcome
from fedfew.interface.aggregation import weighted_average
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
from fedfew.interface.state import StateDict, get_state, load_state_

#: R of the baselines' deployment when ``deployment.rounds`` is not set (the paper's R).
DEFAULT_ROUNDS = 3


class DeployFedAvgOptions(Options):
    """The R rounds of FedAvg a deployment group runs (a fresh tau-way head, SGD)."""

    deploy_lr: float = Field(0.05, gt=0, description="SGD learning rate of a deployment group's FedAvg")
    deploy_epochs: int = Field(1, ge=1, description="local epochs per deployment round")
    deploy_batch_size: int = Field(60, ge=1, description="minibatch size at deployment")
    deploy_momentum: float = Field(0.0, ge=0, description="SGD momentum at deployment")
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions, description=(
        "the deployment protocol of section 2.3 (groups of new clients scored from the prepared model)"))

    def deploy_train_options(self) -> TrainOptions:
        return TrainOptions(local_epochs=self.deploy_epochs, batch_size=self.deploy_batch_size, optimizer="sgd",
                            lr=self.deploy_lr, momentum=self.deploy_momentum)


class FineTuneOptions(FedAvgOptions, DeployFedAvgOptions):
    """FedAvg pretraining over the preparation classes, then FedAvg fine-tuning at deployment."""


class OneShotFineTuneOptions(FineTuneOptions):
    stage: Literal["deployment", "preparation"] = Field("deployment", description=(
        "where the one-shot scheme runs: at deployment (the paper), after FedAvg pretraining, or as the one "
        "preparation round (the earlier reading)"))
    local_epochs: int = Field(1, ge=1, description="E: local epochs of the preparation rounds")
    cv_folds: int = Field(5, ge=2, description="K of each client's K-fold cross-validation (Guha et al.: 5)")
    keep: int = Field(10, ge=1, description="models kept by the server, the best by cross-validation score "
                      "(the paper: 10 of 20)")
    combine: Literal["ensemble", "average"] = Field("ensemble", description=(
        "how the kept models of the last deployment round classify: \"ensemble\" (Guha et al.'s cross-validated "
        "ensemble, the mean of their softmax outputs: the paper's [6]) or \"average\" (one model, their "
        "sample-weighted average: our earlier reading). Earlier rounds always average"))

    def one_shot_train_options(self) -> OneShotTrainOptions:
        return OneShotTrainOptions(**self.deploy_train_options().model_dump(), cv_folds=self.cv_folds, keep=self.keep,
                                   combine=self.combine)


class OneShotTrainOptions(TrainOptions):
    """A deployment round of one-shot FL: local training, cross-validation, the best ``keep`` kept:
    averaged into the next round's model, and (``combine: ensemble``) kept as the ensemble that
    classifies after the last round."""

    cv_folds: int = Field(5, ge=2, description="K of each client's K-fold cross-validation")
    keep: int = Field(10, ge=1, description="models kept, the best by cross-validation score")
    combine: Literal["ensemble", "average"] = Field("ensemble", description=(
        "after the last round: the kept models' ensemble or their sample-weighted average"))



def keep_best(results: dict[int, ClientResult], keep: int, generator: torch.Generator) -> tuple[list[int], StateDict]:
    """Guha et al.'s CV selection: the ``keep`` clients with the best cross-validation score (ties at
    random) and the sample-weighted average of their models."""
    ids = sorted(results)
    if keep > len(ids):
        raise ValueError(f"algorithm.options.keep={keep} exceeds the {len(ids)} clients of the round; raise "
                         "federation.clients_per_round (preparation) or deployment.clients (deployment)")
    scores = torch.tensor([float(results[i].upload["cv_score"]) for i in ids], dtype=torch.float64)
    chosen = [ids[j] for j in top_n(scores, keep, generator)]
    return chosen, weighted_average([results[i].upload["model"] for i in chosen], [results[i].num_samples for i in chosen])


class OneShotFL(LinearFL[OneShotTrainOptions]):
    """One deployment round of fine-tuning via one-shot FL: each client trains the group's model (a
    fresh tau-way head at the start) on its support set and reports a cross-validation accuracy;
    the server averages the ``keep`` best."""

    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        model = load_state_(self.model, payload["model"])
        metrics = train_epochs(model, data.train, data.train.labels, self.options, generator)
        upload: Payload = {"model": get_state(model)}
        folds = min(self.options.cv_folds, len(data.train))  # fewer samples than folds: leave-one-out
        folds_generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator,
                                                                           device=generator.device)))
        score = 0.0  # a client with a single sample cannot be cross-validated: ranked last
        if folds >= 2:
            score = cross_validation_score(self.model, payload["model"], data.train, self.options, folds,
                                           folds_generator)
        upload["cv_score"] = torch.tensor(score, dtype=torch.float32)
        metrics["cv_score"] = score
        return ClientResult(upload=upload, state=state, metrics=metrics, num_samples=data.num_samples)

    def aggregate(self, server: Parts, results: dict[int, ClientResult],
                  generator: torch.Generator) -> Parts:
        chosen, model = keep_best(results, self.options.keep, generator)
        updated = {**server, "model": model, "kept": chosen}
        if self.options.combine == "ensemble":  # the server keeps the members; only the average goes down
            updated["members"] = [results[i].upload["model"] for i in chosen]
        return updated

    @torch.no_grad()
    def classify(self, server: Parts, data: LabelledDataset) -> torch.Tensor:
        """``combine: ensemble``: the log of the kept models' mean softmax (its argmax is the ensemble's
        prediction); otherwise the averaged model's logits."""
        members = server.get("members")
        if self.options.combine != "ensemble" or not members:
            return super().classify(server, data)
        probabilities = [torch.softmax(super(OneShotFL, self).classify({"model": m}, data), dim=-1) for m in members]
        return torch.stack(probabilities).mean(0).log()


def evaluate_fine_tuning(options: DeployFedAvgOptions, deployment: LinearDeployment, server: Parts,
                         data: EvalData, context: Context) -> dict[str, float]:
    tau = options.deployment.classes
    return evaluate_deployment(deployment(tau), server["model"], options.deployment, DEFAULT_ROUNDS, data, context)


@register("frl-scratch", help="FRL baseline: R rounds of FedAvg at deployment from a random initialisation")
class FRLScratch(Algorithm[DeployFedAvgOptions]):
    """No preparation: one simulator round that exchanges nothing, then deployment from the random
    initialisation."""
    secure_sum = None
    secure_sum_refused = "it uploads nothing during its rounds: nothing to sum"
    dp_refused = "frl-scratch trains nothing in its rounds (it learns only at deployment): nothing to protect"

    trains = False  # all its learning happens at deployment

    def __init__(self, options: DeployFedAvgOptions, context: Context) -> None:
        super().__init__(options, context)
        self.deployment = LinearDeployment(options.deploy_train_options(), context)

    def init_server(self, generator: torch.Generator) -> Parts:
        return {"model": get_state(self.context.make_model(None))}

    def play_round(self, server: Parts, engine: Engine, selected: Sequence[int], round_index: int) -> RoundOutcome:
        return RoundOutcome(server, {}, 0, 0)

    def evaluate(self, server: Parts, data: EvalData, generator: torch.Generator) -> dict[str, float]:
        return evaluate_fine_tuning(self.options, self.deployment, server, data, self.context)


#: The options of a :class:`FRLFineTune` subclass.
FineTuneOptionsT = TypeVar("FineTuneOptionsT", bound=FineTuneOptions)


@register("frl-finetune", help="FRL baseline: FedAvg-pretrained |C_b|-way classifier, fine-tuned R rounds")
class FRLFineTune(FedAvg[FineTuneOptionsT]):
    """Preparation is :class:`~fedfew.algorithms.fedavg.FedAvg` over the base classes."""
    secure_sum = ""

    def __init__(self, options: FineTuneOptionsT, context: Context) -> None:
        if context.task != "fewshot":
            raise ValueError(f"{type(self).__name__} deploys on unseen classes: set task: fewshot")
        super().__init__(options, context)
        self.deployment = LinearDeployment(options.deploy_train_options(), context)

    def evaluate(self, server: Parts, data: EvalData, generator: torch.Generator) -> dict[str, float]:
        return evaluate_fine_tuning(self.options, self.deployment, server, data, self.context)


@register("frl-oneshot", help="FRL baseline: FedAvg pretraining, one-shot FL (Guha et al., CV selection) at deployment")
class FRLOneShot(FRLFineTune[OneShotFineTuneOptions]):
    """``stage: deployment``: FedAvg preparation, R rounds of :class:`OneShotFL` at deployment.
    ``stage: preparation``: one round of local training, cross-validation scores and the best
    ``keep`` averaged, then FedAvg fine-tuning at deployment."""
    secure_sum = "with stage: deployment"
    secure_sum_requires = {"stage": "deployment"}
    secure_sum_refused = "stage: preparation keeps the best individual uploads by their cross-validation scores"
    dp_refused = ("frl-oneshot with stage: preparation keeps the best individual uploads by their "
                  "cross-validation scores (stage: deployment is covered)")

    def __init__(self, options: OneShotFineTuneOptions, context: Context) -> None:
        super().__init__(options, context)
        if options.stage == "deployment":
            self.deployment = LinearDeployment(options.one_shot_train_options(), context, OneShotFL)

    @property
    def dp_upload(self) -> str | None:  # type: ignore[override]
        """Preparation is FedAvg with ``stage: deployment``; ``preparation`` keeps the best raw uploads."""
        return "model-delta" if self.options.stage == "deployment" else None

    def base_labelled(self, data: LabelledDataset) -> LabelledDataset:
        """The client's data with labels as indices of the preparation classes (the head's outputs)."""
        names = [str(c) for c in self.context.train_classes]
        return LabelledDataset(inputs=data.inputs, labels=self.targets(data.labels), class_names=names,
                               name=data.name, lengths=data.lengths)

    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        if self.options.stage == "deployment":  # preparation is FedAvg
            return super().client_update(payload, state, data, generator)
        local = self.base_labelled(data.train)
        model = load_state_(self.model, payload["model"])
        metrics = train_epochs(model, local, local.labels, self.options, generator)
        upload: Payload = {"model": get_state(model)}
        # The folds use their own generator so that the returned model does not depend on them.
        folds_generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator,
                                                                                   device=generator.device)))
        score = cross_validation_score(self.model, payload["model"], local, self.options, self.options.cv_folds,
                                       folds_generator)
        upload["cv_score"] = torch.tensor(score, dtype=torch.float32)
        metrics["cv_score"] = score
        return ClientResult(upload=upload, state=state, metrics=metrics, num_samples=data.num_samples)

    def aggregate(self, server: Parts, results: dict[int, ClientResult],
                  generator: torch.Generator) -> Parts:
        if self.options.stage == "deployment":
            return super().aggregate(server, results, generator)
        chosen, model = keep_best(results, self.options.keep, generator)
        return {**server, "model": model, "kept": chosen}
