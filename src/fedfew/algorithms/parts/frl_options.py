"""FRL's options (Park et al. 2021): the rounds, the learning rates, GPAL's gamma and the variants."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedfew.algorithms.parts.common import TrainOptions
from fedfew.algorithms.parts.frl_deployment import DeploymentOptions
from fedfew.interface.algorithm import Options

__all__ = ["FRLOptions"]


class FRLOptions(Options):
    rounds: int = Field(3, ge=1, description="R, rounds of FL per episode (and at deployment unless "
                        "deployment.rounds says otherwise)")
    local_epochs: int = Field(1, ge=1, description="E, local epochs per round")
    batch_size: int = Field(60, ge=1, description="minibatch size of the local SGD")
    lr: float = Field(1e-4, gt=0, description="alpha, the learner's (local SGD) learning rate")
    meta_lr: float = Field(1e-3, gt=0, description="beta, the meta learning rate of line 19")
    gamma: float = Field(0.8, ge=0, le=1, description=(
        "gamma of eq. 3, the weight of the local prototype loss; 1 - gamma weighs GPAL's L_aux, so gamma = 1 "
        "turns GPAL off. The paper states no value: 0.8 is ours (L_aux weighted 0.2 as in the authors' code)"))
    gpal_form: Literal["convex", "additive"] = Field("convex", description=(
        "how eq. 3 combines the two losses from round 1 on: \"convex\" (the paper: gamma L_local + (1 - gamma) "
        "L_aux) or \"additive\" (the authors' code: L_local + (1 - gamma) L_aux)"))
    eq2_classes: Literal["all", "others"] = Field("all", description=(
        "the log-sum of eq. 2 (and L_aux): over all classes c' (\"all\", ours: ProtoNet's cross-entropy) or "
        "over c' != c as eq. 2 is printed (\"others\", unbounded below)"))
    momentum: float = Field(0.0, ge=0, description="SGD momentum of the local steps")
    weight_decay: float = Field(0.0, ge=0, description="SGD weight decay of the local steps and of the meta "
                                "step (the authors' code: 5e-4)")
    support_fraction: float = Field(0.5, gt=0, lt=1, description="the share of each class of a client's data "
                                    "in its support set S_k (the rest is the query set Q_k)")
    classifier: Literal["distance", "linear"] = Field("distance", description=(
        "\"distance\" (prototypes; FRL) or \"linear\" (a linear head trained with cross-entropy)"))
    head_init: Literal["meta", "xavier"] = Field("meta", description=(
        "the linear head's initialisation in an episode and a deployment group: \"meta\" (part of phi, "
        "meta-learned; labels mapped per episode, MAML-style) or \"xavier\" (fresh every episode and group)"))
    local_prototypes: Literal["downloaded", "batch"] = Field("downloaded", description=(
        "\"downloaded\" (the paper: prototypes of S_k with the downloaded model, fixed during the local epochs) "
        "or \"batch\" (the authors' code: each minibatch's prototypes with the current model)"))
    query_prototypes: Literal["query", "support"] = Field("query", description=(
        "where the local prototypes of the meta-update's query loss come from: Q_k (\"query\") or S_k "
        "(\"support\"), at theta^R"))
    aggregation: Literal["samples", "uniform"] = Field("samples", description=(
        "the server's weights: support / data sizes (\"samples\", the paper) or uniform (the authors' code)"))
    extra_query_steps: bool = Field(False, description=(
        "the authors' code: the meta-gradient on the first query minibatch only, then more SGD steps (lr "
        "beta) on phi_k over the remaining query minibatches"))
    deployment: DeploymentOptions = Field(default_factory=lambda: DeploymentOptions.model_validate({}), description=(
        "the deployment protocol of section 2.3 (groups of new clients scored from the prepared model)"))


    @model_validator(mode="after")
    def _check(self) -> FRLOptions:
        if self.classifier == "linear" and self.gamma < 1:
            raise ValueError("algorithm.options.gamma < 1 (GPAL) needs classifier: distance; "
                             "set gamma: 1 (no GPAL) with classifier: linear")
        if self.classifier == "linear" and self.extra_query_steps:
            raise ValueError("algorithm.options.extra_query_steps applies to classifier: distance only")
        if self.deployment.rounds == 0 and self.classifier == "distance":
            raise ValueError("algorithm.options.deployment.rounds=0 leaves no global prototypes to classify "
                             "with; use at least one round")
        return self

    def train_options(self) -> TrainOptions:
        """The local SGD of the linear variant."""
        return TrainOptions(local_epochs=self.local_epochs, batch_size=self.batch_size, optimizer="sgd",
                            lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
