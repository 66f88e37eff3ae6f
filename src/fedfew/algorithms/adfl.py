"""AdFL: one-shot federated learning with self-adversarial data (FedCSIS 2023,
doi:10.15439/2023F1102).

Algorithm 1 of the paper:

1. The server initialises a global model and sends it to all M clients; each trains it on all its
   local data for E epochs (Adam, lr 1e-3, E = 15) and returns it (:class:`OneShot`'s client step).
2. For every returned model m and every class c the server generates one targeted adversarial
   sample x_{m,c}, starting from random noise, with MI-FGSM (Dong et al.; :func:`mi_fgsm`): 30
   iterations, step alpha, decay mu = 1.0, descending the cross-entropy towards c. No client data
   is used; C x M samples in all.
3. Every model judges every other model's samples. With p_k(x) model k's softmax output and
   s_k(x, c) = [argmax p_k(x) = c] * p_k(x)_c (model k's probability for c where it predicts c):

   * eq. (3)  "was predicted"    WP_m = sum_{k != m} sum_c s_k(x_{m,c}, c)
   * eq. (4)  "predicted others" PO_m = sum_{k != m} sum_c s_m(x_{k,c}, c)
   * eq. (5)  coherence score    CS_m = WP_m + PO_m

   A model's own samples are excluded (k != m). A model whose notion of each class agrees with the
   others' scores high on both; one trained on wrong labels or on noise scores low (docs/adfl.md).
4. The models are combined in one of two ways (``combine``):

   * ``ensemble``: the top-n models by CS (n = ``ensemble_size``, paper: 5 = 10% of 50 clients);
     the prediction is the argmax of their mean softmax output (``vote``: a majority vote of their
     predictions; ours: the paper does not say how the ensemble combines its models);
   * ``weighted``: one global model, the average of all models' parameters weighted by CS.

Input and clip range (the paper's alpha = 1 is in an input scale that it does not state):
images here are scaled to [0, 1] (the MNIST and CIFAR-10 loaders divide the 0..255 pixels by
255), the noise is uniform on ``input_range`` = [0, 1] and every iterate is clipped to it, so the
samples stay valid images of the scale the models were trained on. ``step_size`` defaults to the
paper's alpha = 1 taken literally on this [0, 1] scale (the usual scale of Keras-style
pipelines): the first step then pushes every pixel to 0 or 1 and later steps flip pixels where the
accumulated gradient changes sign. The other reading, alpha = 1 grey level of the 0..255 scale
(``step_size: 0.00392``), moves a sample at most 30/255 from its noise; on IID MNIST LeNet-5
clients only about 60% of such samples are classified as their target by their own source model
(against 100% at alpha = 1), so the samples would not carry what the method needs. docs/adfl.md
compares both on the same client models.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from fedfew.algorithms.oneshot import OneShot, OneShotOptions, OneShotServer, member_probabilities, top_n
from fedfew.core.jsontypes import JSONObject
from fedfew.fewshot.adversarial import mi_fgsm
from fedfew.interface.aggregation import weighted_average
from fedfew.interface.algorithm import ClientResult, EvalData
from fedfew.interface.registration import register
from fedfew.interface.state import StateDict, load_state_


class AdFLOptions(OneShotOptions):
    """AdFL's options: the client step of :class:`OneShotOptions`, MI-FGSM and the combination."""

    # A pydantic subclass may redeclare a field with its own values; AdFL's selection and combine differ
    # from the one-shot baselines' (mypy reads the narrower Literal as an incompatible override).
    selection: Literal["coherence"] = Field("coherence", description=(  # type: ignore[assignment]
        "the models kept: the top ensemble_size by coherence score CS = WP + PO (eq. 3-5)"))
    combine: Literal["ensemble", "vote", "weighted"] = Field("ensemble", description=(  # type: ignore[assignment]
        "ensemble (argmax of the kept models' mean softmax), vote (majority of their argmaxes) or weighted "
        "(one model: every model's parameters averaged with weights CS)"))
    attack_steps: int = Field(30, ge=0, description="MI-FGSM iterations per adversarial sample (paper: 30)")
    step_size: float = Field(1.0, gt=0, description="alpha, in the units of the model's inputs (paper: 1; "
                             "see the module docstring)")
    decay: float = Field(1.0, ge=0, description="mu, MI-FGSM's momentum decay (ours: 1.0, MI-FGSM's usual value; "
                         "the paper names mu but gives no value)")
    input_range: tuple[float, float] = Field((0.0, 1.0), description=(
        "range of the starting noise and of the clip after every step (images here are in [0, 1])"))


    @model_validator(mode="after")
    def _check_range(self) -> AdFLOptions:
        low, high = self.input_range
        if not low < high:
            raise ValueError(f"algorithm.options.input_range must be [low, high] with low < high, got {self.input_range}")
        return self


def adversarial_samples(model: nn.Module, states: list[StateDict], num_classes: int, input_shape: tuple[int, ...],
                        options: AdFLOptions, generator: torch.Generator) -> torch.Tensor:
    """[models, classes, *input_shape]: for each model state, one targeted MI-FGSM sample per class,
    each from its own uniform noise on ``options.input_range`` (step 2 of Algorithm 1)."""
    low, high = options.input_range
    targets = torch.arange(num_classes)
    samples = []
    for state in states:
        load_state_(model, state)
        noise = torch.rand((num_classes, *input_shape), generator=generator, device=generator.device)
        noise = noise.to(targets.device) * (high - low) + low
        samples.append(mi_fgsm(model, noise, targets, options.attack_steps, options.step_size,
                               options.decay, (low, high)))
    return torch.stack(samples)


def judgement_matrix(model: nn.Module, states: list[StateDict], samples: torch.Tensor) -> torch.Tensor:
    """[judges K, sources M, classes C]: entry (k, m, c) is s_k(x_{m,c}, c), model k's probability
    for class c on model m's sample for c if model k predicts c, else 0."""
    num_sources, num_classes = samples.shape[:2]
    flat = samples.reshape(num_sources * num_classes, *samples.shape[2:])
    probabilities = member_probabilities(model, states, flat).reshape(len(states), num_sources, num_classes, -1)
    target = torch.arange(num_classes)
    on_target = probabilities[..., target, target]  # [K, M, C]: p_k(x_{m,c})_c
    predicted = probabilities.argmax(-1) == target  # [K, M, C]
    return on_target * predicted


def coherence_scores(judgements: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eqs. (3)-(5) from a [M, M, C] judgement matrix: ("was predicted", "predicted others",
    coherence score), each [M]. The diagonal (a model judging its own samples) is left out."""
    if judgements.dim() != 3 or judgements.shape[0] != judgements.shape[1]:
        raise ValueError(f"judgements must be [M, M, C], got {tuple(judgements.shape)}")
    others = 1.0 - torch.eye(judgements.shape[0], dtype=judgements.dtype)
    off_diagonal = judgements * others[:, :, None]
    was_predicted = off_diagonal.sum(dim=(0, 2))  # eq. (3): the others k judging m's samples
    predicted_others = off_diagonal.sum(dim=(1, 2))  # eq. (4): m judging the others' samples
    return was_predicted, predicted_others, was_predicted + predicted_others  # eq. (5)


@register("adfl", help="AdFL: one-shot FL, ensemble of the top models by adversarial coherence score")
class AdFL(OneShot[AdFLOptions]):
    """Algorithm 1 of AdFL (module docstring)."""
    secure_sum = None
    secure_sum_refused = ("the server scores and ensembles individual uploads: it needs each client's "
                          "model, not their sum")
    dp_refused = ("AdFL's one round uploads whole models and the server ranks and ensembles individual "
                  "models: DP-FedAvg's noised average does not apply")

    def aggregate(self, server: OneShotServer, results: dict[int, ClientResult],
                  generator: torch.Generator) -> OneShotServer:
        ids = sorted(results)
        states = [results[i].upload["model"] for i in ids]
        scores = self.score(states, generator)
        return self.with_clients(self.combine_scored(server, ids, states, scores, generator), ids, results)

    def client_scores(self, server: OneShotServer) -> dict[int, float] | None:
        """The coherence scores (eq. 5) the selection ranks by."""
        return server.get("coherence") or None

    def returned_ids(self, server: OneShotServer) -> list[int]:
        return sorted(server.get("coherence", {}))

    def selection_report(self, server: OneShotServer, data: EvalData) -> JSONObject:
        """:meth:`OneShot.selection_report`, plus the fraction of adversarial samples their own model
        classifies as their target (``own_success``: the method needs it high; docs/adfl.md's alpha)."""
        out = super().selection_report(server, data)
        if "own_success" in server:
            out["own_success"] = float(server["own_success"])
        return out

    def score(self, states: list[StateDict], generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Steps 2-3: the C x M adversarial samples and eqs. (3)-(5) for ``states``."""
        samples = adversarial_samples(self.model, states, self.context.num_classes, self.context.input_shape,
                                      self.options, generator)
        judgements = judgement_matrix(self.model, states, samples)
        was_predicted, predicted_others, coherence = coherence_scores(judgements)
        own_success = torch.stack([judgements[m, m] > 0 for m in range(len(states))]).double().mean()
        return {"coherence": coherence, "was_predicted": was_predicted, "predicted_others": predicted_others,
                "own_success": own_success}

    def combine_scored(self, server: OneShotServer, ids: list[int], states: list[StateDict],
                       scores: dict[str, torch.Tensor], generator: torch.Generator) -> OneShotServer:
        """Step 4: the top-n ensemble by coherence, or the coherence-weighted average."""
        coherence = scores["coherence"]
        record: OneShotServer = {"coherence": dict(zip(ids, scores["coherence"].tolist())),
                                 "was_predicted": dict(zip(ids, scores["was_predicted"].tolist())),
                                 "predicted_others": dict(zip(ids, scores["predicted_others"].tolist()))}
        # The fraction of samples their own source model classifies as their target.
        record["own_success"] = float(scores["own_success"])
        if self.options.combine == "weighted":
            if float(coherence.sum()) <= 0:
                raise ValueError("every coherence score is 0 (no model recognised another's samples): "
                                 "combine=weighted has no weights; raise algorithm.options.attack_steps")
            return {**server, **record, "model": weighted_average(states, coherence), "members": [],
                    "member_ids": list(ids)}
        if self.options.ensemble_size > len(ids):
            raise ValueError(f"algorithm.options.ensemble_size={self.options.ensemble_size} exceeds the "
                             f"{len(ids)} clients that returned a model")
        chosen = top_n(coherence.double(), self.options.ensemble_size, generator)
        return {**server, **record, "members": [states[j] for j in chosen], "member_ids": [ids[j] for j in chosen]}
