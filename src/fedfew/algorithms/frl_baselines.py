"""The baselines of FRL (Park et al. 2021, section 4), scored by the same deployment protocol.

Each method prepares an initial model in its own way; at deployment (section 2.3,
:mod:`fedfew.deployment`) every group of K clients holding tau classes runs R rounds of FedAvg from
it with the last layer replaced by a Xavier-initialised tau-way layer, and its global model
classifies the pooled query set. The preparation-stage budget is matched in rounds: an FRL episode
costs R + 1 rounds, so T episodes of FRL compare with T (R + 1) rounds of FedAvg.

* ``frl-scratch``: "FedAvg" - no preparation; R rounds of FedAvg from a random initialisation.
* ``frl-finetune``: "fine-tuning via FedAvg" - pretrain a |C_b|-way classifier over the preparation
  classes with FedAvg (the participants' own labels), then fine-tune as above.
* ``frl-oneshot``: "fine-tuning via one-shot FL" (Guha et al. 2019) - one round: each of the
  round's participants (20 in the paper) trains the |C_b|-way classifier on its own data and reports
  a K-fold cross-validation accuracy; the server keeps the ``keep`` (10) best and averages them
  (sample-weighted), then fine-tunes as above. The paper's "20 clients, 10 selected" is read as the
  preparation round (one-shot FL is a pretraining method); deployment is R rounds of FedAvg as for
  every baseline.

Per-FedAvg (Fallah et al. 2020) is in :mod:`fedfew.algorithms.per_fedavg`.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from fedfew.algorithms.common import TrainOptions, train_epochs
from fedfew.algorithms.fedavg import FedAvg, FedAvgOptions
from fedfew.algorithms.oneshot import cross_validation_score, top_n
from fedfew.data.dataset import LabelledDataset
from fedfew.deployment import DeploymentOptions, LinearDeployment, evaluate_deployment
from fedfew.engine.aggregation import weighted_average
from fedfew.engine.algorithm import Algorithm, ClientData, ClientResult, Context, EvalData, Options, register
from fedfew.engine.simulator import RoundOutcome
from fedfew.engine.state import get_state, load_state_
from fedfew.seeding import seed_torch_init

#: R of the baselines' deployment when ``deployment.rounds`` is not set (the paper's R).
DEFAULT_ROUNDS = 3


class DeployFedAvgOptions(Options):
    """The R rounds of FedAvg a deployment group runs (a fresh tau-way head, SGD)."""

    deploy_lr: float = Field(0.05, gt=0)
    deploy_epochs: int = Field(1, ge=1)
    deploy_batch_size: int = Field(60, ge=1)
    deploy_momentum: float = Field(0.0, ge=0)
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)

    def deploy_train_options(self) -> TrainOptions:
        return TrainOptions(local_epochs=self.deploy_epochs, batch_size=self.deploy_batch_size, optimizer="sgd",
                            lr=self.deploy_lr, momentum=self.deploy_momentum)


class FineTuneOptions(FedAvgOptions, DeployFedAvgOptions):
    """FedAvg pretraining over the preparation classes, then FedAvg fine-tuning at deployment."""


class OneShotFineTuneOptions(FineTuneOptions):
    local_epochs: int = Field(10, ge=1)
    #: K of each client's K-fold cross-validation (Guha et al.: 5).
    cv_folds: int = Field(5, ge=2)
    #: Models kept by the server, the best by cross-validation score (the paper: 10 of 20).
    keep: int = Field(10, ge=1)


def evaluate_fine_tuning(options: DeployFedAvgOptions, deployment: LinearDeployment, server: dict[str, Any],
                         data: EvalData, context: Context, clients: list[ClientData]) -> dict[str, float]:
    tau = options.deployment.classes
    return evaluate_deployment(deployment(tau), server["model"], options.deployment, DEFAULT_ROUNDS, data, context,
                               clients)


@register("frl-scratch", help="FRL baseline: R rounds of FedAvg at deployment from a random initialisation")
class FRLScratch(Algorithm):
    """No preparation: one simulator round that exchanges nothing, then deployment from the random
    initialisation."""

    trains = False  # all its learning happens at deployment

    Options = DeployFedAvgOptions

    def __init__(self, options: DeployFedAvgOptions, context: Context) -> None:
        super().__init__(options, context)
        self.deployment = LinearDeployment(options.deploy_train_options(), context)

    def init_server(self, generator: torch.Generator) -> dict[str, Any]:
        seed_torch_init(generator)
        return {"model": get_state(self.context.make_model(None))}

    def play_round(self, server: dict[str, Any], engine: Any, selected: Any, round_index: int) -> RoundOutcome:
        return RoundOutcome(server, {}, 0, 0)

    def evaluate(self, server: dict[str, Any], client_states: dict[int, Any], clients: list[ClientData],
                 data: EvalData, generator: torch.Generator) -> dict[str, float]:
        return evaluate_fine_tuning(self.options, self.deployment, server, data, self.context, clients)


@register("frl-finetune", help="FRL baseline: FedAvg-pretrained |C_b|-way classifier, fine-tuned R rounds")
class FRLFineTune(FedAvg):
    """Preparation is :class:`~fedfew.algorithms.fedavg.FedAvg` over the base classes."""

    Options = FineTuneOptions

    def __init__(self, options: FineTuneOptions, context: Context) -> None:
        if context.task != "fewshot":
            raise ValueError(f"{type(self).__name__} deploys on unseen classes: set task: fewshot")
        super().__init__(options, context)
        self.deployment = LinearDeployment(options.deploy_train_options(), context)

    def evaluate(self, server: dict[str, Any], client_states: dict[int, Any], clients: list[ClientData],
                 data: EvalData, generator: torch.Generator) -> dict[str, float]:
        return evaluate_fine_tuning(self.options, self.deployment, server, data, self.context, clients)


@register("frl-oneshot", help="FRL baseline: one-shot FL (Guha et al., CV selection, averaging), fine-tuned")
class FRLOneShot(FRLFineTune):
    """One round: local training to completion, cross-validation scores, the best ``keep`` averaged."""

    Options = OneShotFineTuneOptions

    def base_labelled(self, data: LabelledDataset) -> LabelledDataset:
        """The client's data with labels as indices of the preparation classes (the head's outputs)."""
        names = [str(c) for c in self.context.train_classes]
        return LabelledDataset(inputs=data.inputs, labels=self.targets(data.labels), class_names=names,
                               name=data.name, lengths=data.lengths)

    def client_update(self, payload: dict[str, Any], state: Any, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        local = self.base_labelled(data.train)
        model = load_state_(self.model, payload["model"])
        metrics = train_epochs(model, local, local.labels, self.options, generator)
        upload: dict[str, Any] = {"model": get_state(model)}
        # The folds use their own generator so that the returned model does not depend on them.
        folds_generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator,
                                                                                   device=generator.device)))
        score = cross_validation_score(self.model, payload["model"], local, self.options, self.options.cv_folds,
                                       folds_generator)
        upload["cv_score"] = torch.tensor(score, dtype=torch.float32)
        metrics["cv_score"] = score
        return ClientResult(upload=upload, state=state, metrics=metrics, num_samples=data.num_samples)

    def aggregate(self, server: dict[str, Any], results: dict[int, ClientResult],
                  generator: torch.Generator) -> dict[str, Any]:
        ids = sorted(results)
        if self.options.keep > len(ids):
            raise ValueError(f"algorithm.options.keep={self.options.keep} exceeds the {len(ids)} clients of the "
                             "round; raise federation.clients_per_round")
        scores = torch.tensor([float(results[i].upload["cv_score"]) for i in ids], dtype=torch.float64)
        chosen = [ids[j] for j in top_n(scores, self.options.keep, generator)]
        model = weighted_average([results[i].upload["model"] for i in chosen], [results[i].num_samples for i in chosen])
        return {**server, "model": model, "kept": chosen}
