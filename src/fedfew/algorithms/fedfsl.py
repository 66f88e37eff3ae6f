"""FedFSL (Fan & Huang, "Federated Few-Shot Learning with Adversarial Learning", 2021): FedFSL-prox
and FedFSL-MI. FedFSL-naive is ``fl-maml``; FedFSL-MI-Adv is in :mod:`fedfew.algorithms.fedfsl_adv`.

All of them are Algorithm 1 of the paper: in round t the server sends w^t, client k sets w_k = w^t
and takes ``local_steps`` Adam steps, each on ``meta_batch`` N-way K-shot episodes of its own data,
on its local objective; the server averages the returned models weighted by |B_k| (eq. 10). They
differ only in the local objective:

* ``fedfsl-prox``: the MAML loss L_k(w_k) (eq. 6-8) plus FedProx's mu/2 ||w_k - w^t||^2.
* ``fedfsl-mi`` (section 4.1, eq. 11-13): L_k(w_k) + gamma * KL(p(w_g) || p(w_k)). p(w) are the
  N-way softmax predictions on the episode's query set of the model w *after* its inner-loop
  adaptation on the support set (the same predictions the FSL loss scores), and w_g is the reference
  ("global") model, held fixed: the aggregated w^t (the paper's default, ``reference: global``) or the
  k-exclusive model w_{-k} of eq. 11 (``reference: exclusive``), the average of the other clients'
  last uploaded models, computed by the server for each client. Minimising the KL maximises the
  mutual information between the client's and the global model's predictions (eq. 12-13), which keeps
  the clients' decision boundaries aligned.

Where the paper is silent (options, each documented below): the reference model is adapted with the
same ``inner_steps`` as the client model; w_{-k} weights the other clients as the aggregation does
(by episodes unless ``aggregation`` says otherwise) and falls back to w^t while no other client has
uploaded yet (round 1, or a single-client federation).

The network (section 5.1): the paper's base model for every method is a feature extractor plus "two
fully-connected layers with a ReLU nonlinearity as the classifier", so ``classifier: mlp`` (that
two-layer classifier on the encoder's features, FedFSL-MI-Adv's theta) is the default here;
``classifier: linear`` keeps the zoo model's linear head, as ``fl-maml`` has. FedFSL-naive on the
paper's network is ``fedfsl-prox`` with ``mu: 0`` (bit for bit ``fl-maml`` on the same network).
"""

from __future__ import annotations

from typing import Literal, TypeVar

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call

from fedfew.algorithms.parts.episodic import EpisodicClientState, EpisodicFedAvg, MAMLOptions
from fedfew.fewshot.episodes import Episode
from fedfew.fewshot.learners import MAML
from fedfew.interface.aggregation import weighted_average
from fedfew.interface.algorithm import ClientData, ClientResult, Context, Parts, Payload
from fedfew.interface.registration import register
from fedfew.interface.state import StateDict, load_state_
from fedfew.models.base import FewShotModel


class FedFSLOptions(MAMLOptions):
    """Options shared by the FedFSL methods (on top of fl-maml's)."""

    mu: float = Field(0.0, ge=0.0, description="FedProx's weight: adds mu/2 ||w_k - w^t||^2 to the local "
                      "objective (0: off)")
    classifier: Literal["linear", "mlp"] = Field("mlp", description=(
        "\"mlp\": the two-layer classifier (Linear -> ReLU -> Linear) on the encoder's features, the paper's "
        "base model for every method (section 5.1); \"linear\": the zoo model's linear N-way head (as fl-maml)"))
    classifier_hidden: int = Field(64, ge=1, description="hidden width of the two-layer classifier (the paper "
                                   "does not give it)")


class FedFSLProxOptions(FedFSLOptions):
    mu: float = Field(0.01, ge=0.0, description="FedProx's mu (the paper does not report its value); 0 gives "
                      "exactly FedFSL-naive (fl-maml)")


class FedFSLMIOptions(FedFSLOptions):
    gamma: float = Field(0.2, ge=0.0, description="weight of the KL (mutual-information) term, eq. 13 "
                         "(paper: 0.2)")
    reference: Literal["global", "exclusive"] = Field("global", description=(
        "the fixed model the client's predictions are pulled towards: \"global\" = w^t, \"exclusive\" = "
        "w_{-k} (eq. 11, the average of the other clients' last uploads)"))



def two_layer_classifier(feature_dim: int, hidden: int, n_way: int) -> nn.Sequential:
    """The classifier theta of section 4.2: two fully connected layers with a ReLU between."""
    return nn.Sequential(nn.Linear(feature_dim, hidden), nn.ReLU(), nn.Linear(hidden, n_way))


def prediction_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum_c p_c (log p_c - log q_c) between the softmax predictions of two models,
    averaged over the rows (query samples). Gradients flow into whichever argument has them."""
    log_p = F.log_softmax(p_logits, dim=-1)
    log_q = F.log_softmax(q_logits, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1).mean()


def adapted_query_logits(learner: MAML, model: nn.Module, episode: Episode, steps: int) -> torch.Tensor:
    """Query logits of ``model`` after ``steps`` inner steps on the support set, with no gradient to
    ``model`` (the reference model w_g is fixed in eq. 13). Frozen parameters are not adapted, as in
    :meth:`MAML.loss`, so that w_k = w_g gives identical predictions."""
    params = {name: p.detach().requires_grad_() for name, p in model.named_parameters() if p.requires_grad}
    with torch.enable_grad():
        adapted = learner.adapt(model, params, episode, steps, create_graph=False)
    with torch.no_grad():
        return functional_call(model, {k: v.detach() for k, v in adapted.items()}, episode.query_args())


def exclusive_average(models: dict[int, StateDict], weights: dict[int, float], client_id: int) -> StateDict | None:
    """w_{-k} of eq. 11: the weighted average of every stored client model except ``client_id``'s;
    None when no other client has a model."""
    others = [cid for cid in sorted(models) if cid != client_id]
    if not others:
        return None
    return weighted_average([models[cid] for cid in others], [weights[cid] for cid in others])


#: The options of a :class:`FedFSLBase` subclass.
FedFSLOptionsT = TypeVar("FedFSLOptionsT", bound=FedFSLOptions)
#: The options of a :class:`FedFSLMI` subclass.
FedFSLMIOptionsT = TypeVar("FedFSLMIOptionsT", bound=FedFSLMIOptions)


class FedFSLBase(EpisodicFedAvg[FedFSLOptionsT]):
    """fl-maml with the FedFSL model options (the two-layer classifier)."""

    def new_model(self) -> FewShotModel:
        opts = self.options
        n_way = self.context.episode.n_way
        if opts.classifier == "linear":
            return self.context.make_model(n_way)
        model = self.context.make_model(None)
        with torch.device("cpu"):  # initialised from the CPU RNG, as make_model does: the same numbers on any device
            head = two_layer_classifier(model.feature_dim, opts.classifier_hidden, n_way)
        model.head = head.to(next(model.parameters()).device)  # where make_model put the encoder
        return model


@register("fedfsl-prox", help="FedFSL-prox: FedFSL-naive (fl-maml) plus FedProx's mu/2 ||w - w^t||^2")
class FedFSLProx(FedFSLBase[FedFSLProxOptions]):
    """FedFSL-naive with a FedProx term; the proximal term itself is EpisodicFedAvg's ``mu``."""
    secure_sum = ""


@register("fedfsl-mi", help="FedFSL-MI: MAML loss + gamma KL(p(w_global) || p(w_k)) (eq. 11-13)")
class FedFSLMI(FedFSLBase[FedFSLMIOptionsT]):
    """FedFSL-MI (section 4.1)."""
    secure_sum = "with reference: global"
    secure_sum_requires = {"reference": "global"}
    secure_sum_refused = "reference: exclusive broadcasts w_{-k}, an average of the other clients' individual uploads"
    dp_refused = ("fedfsl-mi with reference: exclusive broadcasts w_{-k}, an average of the other "
                  "clients' un-noised uploads (reference: global is covered)")

    def __init__(self, options: FedFSLMIOptionsT, context: Context) -> None:
        super().__init__(options, context)
        self.reference_model = self.new_model()  # workspace for w_g, reloaded every client update

    @property
    def dp_upload(self) -> str | None:  # type: ignore[override]
        """Covered with the global reference; ``exclusive`` broadcasts averages of raw uploads."""
        return "model-delta" if self.options.reference == "global" else None

    # -- server ---------------------------------------------------------------------------
    def init_server(self, generator: torch.Generator) -> Parts:
        server = super().init_server(generator)
        if self.options.reference == "exclusive":
            # The last model each client uploaded, and its aggregation weight, for w_{-k}.
            server.update(client_models={}, client_weights={})
        return server

    def broadcast(self, server: Parts, client_id: int) -> Payload:
        payload = {"model": server["model"]}
        if self.options.reference == "exclusive":
            reference = exclusive_average(server["client_models"], server["client_weights"], client_id)
            if reference is not None:  # otherwise the client falls back to w^t
                payload["reference"] = reference
        return payload

    def upload_weight(self, result: ClientResult) -> float:
        """The weight a client's model gets in w_{-k}: the same kind as in the aggregation."""
        kind = self.options.aggregation
        return float(result.num_episodes if kind == "episodes" else result.num_samples if kind == "samples" else 1)

    def aggregate(self, server: Parts, results: dict[int, ClientResult],
                  generator: torch.Generator) -> Parts:
        new = super().aggregate(server, results, generator)
        if self.options.reference == "exclusive":
            models, weights = dict(server["client_models"]), dict(server["client_weights"])
            for cid, result in results.items():
                if "model" in result.upload:
                    models[cid], weights[cid] = result.upload["model"], self.upload_weight(result)
            new = {**new, "client_models": models, "client_weights": weights}
        return new

    # -- client ---------------------------------------------------------------------------
    def reference_state(self, payload: Payload) -> StateDict:
        # (not ``payload.get(...)``: through a type alias mypy types that ``Any | None``)
        model = payload["model"]
        return payload["reference"] if "reference" in payload else model

    def client_update(self, payload: Payload, state: EpisodicClientState | None, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        load_state_(self.reference_model, self.reference_state(payload)).train()
        return super().client_update(payload, state, data, generator)

    def reference_logits(self, episode: Episode) -> torch.Tensor:
        """p(w_g) on the episode's query set, after adapting w_g on its support set."""
        assert isinstance(self.learner, MAML)
        return adapted_query_logits(self.learner, self.reference_model, episode, self.learner.inner_steps)

    def local_objective(self, payload: Payload, episode: Episode) -> tuple[torch.Tensor, dict[str, float]]:
        """L_k(w_k) + gamma * KL(p(w_g) || p(w_k)) on one episode (eq. 13)."""
        loss, logits = self.learner.loss(self.model, episode)
        acc = float((logits.argmax(-1) == episode.query_labels).float().mean())
        metrics = {"loss": float(loss.detach()), "accuracy": acc}
        if self.options.gamma > 0:
            mi = prediction_kl(self.reference_logits(episode), logits)
            loss = loss + self.options.gamma * mi
            metrics["mi_kl"] = float(mi.detach())
        return loss, metrics
