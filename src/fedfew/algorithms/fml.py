"""FML: Federated Mutual Learning (Shen et al., 2020, arXiv:2006.16765).

Every client k keeps a *local* model of its own design that never leaves it, and each round forks the
global model into a *meme* model; the two teach each other by deep mutual learning (DML) on the
client's private data, and only the meme goes back to the server.

Algorithm (sections 3.2-3.3)::

    server: global model w^0 (the configured ``model.name``)
    client k: local model theta_k^0 (``local_models``; fresh, seeded per client)
    for t = 0 .. T-1:
        for every selected client k:
            meme_k <- w^t                                                   (fork)
            for E epochs, for every minibatch (x, y) of the private training set:
                p_l = softmax(local_k(x)),  p_m = softmax(meme_k(x))
                L_local = alpha * CE(p_l, y) + (1 - alpha) * KL(p_m || p_l)  (eq. 3)
                L_meme  = beta  * CE(p_m, y) + (1 - beta)  * KL(p_l || p_m)  (eq. 3)
                one SGD step on each model; the other model's probabilities are constants
            upload meme_k; keep local_k
        w^{t+1} = (1 / |S_t|) * sum_k meme_k          (plain average, sections 3.3 and 6)

Choices where the paper is silent or our framework needs one (each an option or documented here):

* The KL is averaged over samples (``batchmean``, the textbook KL), not over samples x classes; the
  latter (one public implementation's ``nn.KLDivLoss()`` default) makes the KL weight 1/C of the
  paper's. See :func:`kl_batchmean`.
* Both models see the same minibatches in the same order, drawn from the client's generator exactly
  as FedAvg draws them, and each model has its own SGD optimizer, fresh every round: with ``beta = 1``
  the meme's update is then FedAvg's, bit for bit (tests/algorithms/test_fml.py).
* The paper states no hyperparameter: alpha = beta = 0.5, SGD with momentum 0.9 and lr 0.01 are ours.
* A weight of exactly 1 drops the KL term from the graph (it would contribute 0 * KL) so that the
  reduction to FedAvg does not depend on the KL being finite.
* ``dynamic`` (section 6): alpha and beta each move linearly from a first to a second value over
  ``rounds`` rounds, then stay at the second; our defaults (alpha 0.9 -> 0.5, beta 0.5 -> 0.9) start and end at
  our fixed 0.5 so that alpha is larger early and beta larger late, as section 6 asks.
* ``newcomers`` (Fig. 4): clients that sit out every round (nothing sent either way). After training,
  :meth:`FML.adapt_newcomer` lets one join: its local model starts fresh or from the global model and
  adapts by DML with a fork of the global model for a few epochs, recording its accuracy per epoch.
  ``adapt_newcomers: {epochs, init: [fresh, global], by: [dml, ce]}`` makes that a phase of the run:
  the evaluation of the last round's global model sends it to each newcomer (the only time a newcomer
  receives anything), which adapts once per start x way (``ce``: alpha = 1, cross-entropy alone)
  from its own generator (seed, "newcomer", client, start), leaving the run's generators alone.

Evaluation: the global model on the held-out test set (``accuracy``), and every trained client's
local model on its private validation set (``local_accuracy`` = mean over clients, with
``local_ci95`` over clients, ``local_min``, ``local_max``, and each client's own in
``local_by_client``); with ``adapt_newcomers`` also ``newcomer_{init}_{by}_accuracy`` (after the last
epoch, mean over newcomers) and ``newcomer_{init}_{by}_by_epoch`` ({"0": on joining, "1": ...}).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypedDict, get_args

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from fedfew.algorithms.parts.common import TrainOptions, local_scores, make_optimizer, minibatches
from fedfew.core.jsontypes import JSONObject
from fedfew.core.seeding import seed_torch_init, torch_generator
from fedfew.data.dataset import LabelledDataset
from fedfew.fewshot.evaluation import dataset_accuracy
from fedfew.interface.aggregation import weighted_average
from fedfew.interface.algorithm import (
    Algorithm,
    ClientData,
    ClientResult,
    ClientScores,
    Context,
    EvalData,
    Options,
    Parts,
    Payload,
)
from fedfew.interface.registration import register
from fedfew.interface.state import StateDict, get_state, load_state_
from fedfew.models import MODELS, FewShotModel

# -- the losses (eq. 3) -------------------------------------------------------------------------


def kl_batchmean(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(p_teacher || p_student) = (1/B) sum_i sum_c p_t[i,c] (log p_t[i,c] - log p_s[i,c]).

    The teacher is detached: it is the target and receives no gradient. Both sides go through
    log_softmax (``log_target=True``), so a teacher probability that underflows to 0 contributes
    0, never 0 * log 0 = NaN.
    """
    return F.kl_div(
        F.log_softmax(student_logits, dim=-1),
        F.log_softmax(teacher_logits.detach(), dim=-1),
        reduction="batchmean",
        log_target=True,
    )


def dml_losses(
    local_logits: torch.Tensor, meme_logits: torch.Tensor, targets: torch.Tensor, alpha: float, beta: float
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Eq. 3: (L_local, L_meme, parts) with
    L_local = alpha CE(local) + (1 - alpha) KL(p_meme || p_local),
    L_meme  = beta  CE(meme)  + (1 - beta)  KL(p_local || p_meme).
    A weight of exactly 1 leaves the KL term out of the graph (see the module docstring)."""
    ce_local = F.cross_entropy(local_logits, targets)
    ce_meme = F.cross_entropy(meme_logits, targets)
    parts = {"ce_local": float(ce_local.detach()), "ce_meme": float(ce_meme.detach())}
    loss_local = alpha * ce_local
    if alpha < 1.0:
        kl_local = kl_batchmean(local_logits, meme_logits)
        loss_local = loss_local + (1.0 - alpha) * kl_local
        parts["kl_local"] = float(kl_local.detach())
    loss_meme = beta * ce_meme
    if beta < 1.0:
        kl_meme = kl_batchmean(meme_logits, local_logits)
        loss_meme = loss_meme + (1.0 - beta) * kl_meme
        parts["kl_meme"] = float(kl_meme.detach())
    return loss_local, loss_meme, parts


def _forward(model: nn.Module, data: LabelledDataset, batch: torch.Tensor) -> torch.Tensor:
    if data.lengths is None:
        return model(data.inputs[batch])
    return model(data.inputs[batch], data.lengths[batch])


def deep_mutual_learning(
    local: nn.Module,
    meme: nn.Module,
    data: LabelledDataset,
    alpha: float,
    beta: float,
    options: TrainOptions,
    generator: torch.Generator,
    epochs: int | None = None,
    on_epoch: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """``epochs`` (default ``options.local_epochs``) of DML between ``local`` and ``meme`` on
    ``data`` (eq. 3), in place. Minibatches are drawn exactly as :func:`train_epochs` draws them,
    one permutation per epoch; both models see the same batch and step on their own optimizer.
    ``on_epoch(e)`` is called after epoch e (1-based). Returns mean losses and training accuracies."""
    local.train()
    meme.train()
    opt_local = make_optimizer(options.optimizer, local.parameters(), options.lr, options.momentum, options.weight_decay)
    opt_meme = make_optimizer(options.optimizer, meme.parameters(), options.lr, options.momentum, options.weight_decay)
    sums: dict[str, float] = {}
    correct_local = correct_meme = seen = 0
    for epoch in range(epochs if epochs is not None else options.local_epochs):
        for batch in minibatches(len(data), options.batch_size, generator):
            targets = data.labels[batch]
            # Both forward passes use the parameters from before this step, as in DML.
            local_logits = _forward(local, data, batch)
            meme_logits = _forward(meme, data, batch)
            loss_local, loss_meme, parts = dml_losses(local_logits, meme_logits, targets, alpha, beta)
            opt_local.zero_grad(set_to_none=True)
            opt_meme.zero_grad(set_to_none=True)
            # The two losses share no parameters (each detaches the other's logits), so one backward
            # of their sum gives each model exactly the gradient of its own loss.
            (loss_local + loss_meme).backward()
            opt_local.step()
            opt_meme.step()
            parts.update(loss_local=float(loss_local.detach()), loss_meme=float(loss_meme.detach()))
            for key, value in parts.items():
                sums[key] = sums.get(key, 0.0) + value * len(batch)
            correct_local += int((local_logits.argmax(-1) == targets).sum())
            correct_meme += int((meme_logits.argmax(-1) == targets).sum())
            seen += len(batch)
        if on_epoch is not None:
            on_epoch(epoch + 1)
    seen = max(seen, 1)
    metrics = {key: value / seen for key, value in sums.items()}
    metrics.update(accuracy_local=correct_local / seen, accuracy_meme=correct_meme / seen)
    return metrics


def newcomer_scores(curves: list[dict[str, list[float]]]) -> JSONObject:
    """Test metrics of the newcomer phase from each newcomer's curves (``{"{init}_{by}": [accuracy per
    epoch]}``): per start and way, the mean over newcomers after the last epoch
    (``newcomer_{init}_{by}_accuracy``) and at every epoch (``newcomer_{init}_{by}_by_epoch``, keys
    the epochs as strings, "0" = on joining)."""
    metrics: JSONObject = {}
    for key in curves[0] if curves else []:
        per_epoch = [sum(c[key][e] for c in curves) / len(curves) for e in range(len(curves[0][key]))]
        metrics[f"newcomer_{key}_accuracy"] = per_epoch[-1]
        metrics[f"newcomer_{key}_by_epoch"] = {str(e): v for e, v in enumerate(per_epoch)}
    return metrics


# -- options ------------------------------------------------------------------------------------


class DynamicWeights(Options):
    """Section 6's dynamic alpha and beta: each moves linearly from its first value (round 0) to its
    second (round ``rounds``, 0-based) and stays there."""

    alpha: tuple[float, float] = Field((0.9, 0.5), description="alpha at round 0 and from round `rounds` on")
    beta: tuple[float, float] = Field((0.5, 0.9), description="beta at round 0 and from round `rounds` on")
    rounds: int = Field(ge=1, description="the rounds over which alpha and beta move linearly")


    @model_validator(mode="after")
    def _in_unit_interval(self) -> DynamicWeights:
        for name in ("alpha", "beta"):
            values = getattr(self, name)
            if not all(0.0 <= v <= 1.0 for v in values):
                raise ValueError(f"dynamic.{name} values must lie in [0, 1], got {list(values)}")
        return self

    def at(self, round_index: int) -> tuple[float, float]:
        """(alpha, beta) for 0-based ``round_index``."""
        fraction = min(round_index / self.rounds, 1.0)
        a0, a1 = self.alpha
        b0, b1 = self.beta
        return a0 + (a1 - a0) * fraction, b0 + (b1 - b0) * fraction


NewcomerStart = Literal["fresh", "global"]
NewcomerWay = Literal["dml", "ce"]


class NewcomerPhase(Options):
    """Fig. 4 as a phase of the run (``adapt_newcomers``): once the last round is done, every newcomer
    joins the final global model and adapts for ``epochs`` epochs, once per start in ``init`` and way
    of adapting in ``by`` (each from the same seeded generator per start, so the ways are paired)."""

    epochs: int = Field(5, ge=1, description="epochs each newcomer adapts for")
    init: list[NewcomerStart] = Field(default_factory=lambda: list(get_args(NewcomerStart)), min_length=1,
                                      description="how the newcomer's private model starts: fresh (seeded) or "
                                                  "a copy of the global model (each listed start is run)")
    by: list[NewcomerWay] = Field(default_factory=lambda: list(get_args(NewcomerWay)), min_length=1,
                                  description="how it adapts: dml (eq. 3 with the last round's alpha and beta) "
                                              "or ce (alpha = 1: the private model by cross-entropy alone, the "
                                              "baseline); each listed way is run")


class FMLOptions(TrainOptions):
    """FML's options: the minibatch training options (momentum 0.9 and lr 0.01 are ours: the paper
    states no optimiser setting) and the DML weights (0.5 each, ours), the private architectures and
    the newcomers."""

    momentum: float = Field(0.9, ge=0, description="SGD momentum of both models (ours: the paper states none)")
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="alpha of eq. 3: the local model's loss is alpha CE + "
                         "(1 - alpha) KL(meme || local)")
    beta: float = Field(0.5, ge=0.0, le=1.0, description="beta of eq. 3: the meme's loss is beta CE + "
                        "(1 - beta) KL(local || meme); 1 gives FedAvg's update")
    dynamic: DynamicWeights | None = Field(None, description="section 6's schedule of alpha and beta instead of "
                                           "fixed values: {alpha: [first, last], beta: [first, last], rounds}")
    local_models: list[str] | dict[int, str] | None = Field(None, description=(
        "private architecture per client: a list (entry k for client k) or a mapping {client: name} (clients "
        "not named use the global architecture); None: every client uses the global one"))
    local_model_options: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "model options per zoo name for the local models, e.g. {mlp: {hidden: 32}}"))
    newcomers: list[int] = Field(default_factory=list, description="clients that take no part in training "
                                 "(Fig. 4's new participants)")
    adapt_newcomers: NewcomerPhase | None = Field(None, description=(
        "after training, let the newcomers join and adapt; their accuracy per epoch goes into the test metrics "
        "(None: no such phase; FML.adapt_newcomer can still be called from Python)"))


    @model_validator(mode="after")
    def _check(self) -> FMLOptions:
        if self.dynamic is not None and {"alpha", "beta"} & self.model_fields_set:
            raise ValueError("fml: set either alpha/beta (fixed weights) or dynamic (a schedule), not both")
        names = self.local_model_names()
        unknown = sorted({n for n in names if n not in MODELS})
        if unknown:
            raise ValueError(f"fml: local_models names unknown models {unknown}; known: {', '.join(MODELS.names())}")
        if isinstance(self.local_models, dict) and any(k < 0 for k in self.local_models):
            raise ValueError("fml: local_models keys are client ids and must be >= 0")
        stray = sorted(set(self.local_model_options) - set(names))
        if stray:
            raise ValueError(f"fml: local_model_options names {stray}, which no client uses in local_models")
        if any(k < 0 for k in self.newcomers):
            raise ValueError("fml: newcomers are client ids and must be >= 0")
        if self.adapt_newcomers is not None and not self.newcomers:
            raise ValueError("fml: adapt_newcomers needs newcomers (the clients that sit out training and join after)")
        return self

    def local_model_names(self) -> list[str]:
        if self.local_models is None:
            return []
        return list(self.local_models) if isinstance(self.local_models, list) else list(self.local_models.values())

    def weights_at(self, round_index: int) -> tuple[float, float]:
        return self.dynamic.at(round_index) if self.dynamic is not None else (self.alpha, self.beta)


# -- the algorithm ------------------------------------------------------------------------------


class FMLServer(TypedDict):
    """The server state: the global model (the average of the memes) and the rounds done (the clock of
    the dynamic weights and of the newcomer phase)."""

    model: StateDict
    round: int


class FMLClientState(TypedDict):
    """A client's private state, which never leaves it: its local model, the zoo name of its
    architecture (None: the global one) and the rounds it trained."""

    model: StateDict
    architecture: str | None
    rounds: int


@register("fml", help="FML: deep mutual learning between a private local model and a meme of the global model")
class FML(Algorithm[FMLOptions]):
    secure_sum = None
    secure_sum_refused = ("its evaluation scores the private local models on the clients, and its server "
                          "counts rounds (not covered yet)")

    def __init__(self, options: FMLOptions, context: Context) -> None:
        super().__init__(options, context)
        if context.task != "classification":
            raise ValueError("fml is a classification method: set task: classification in the config")
        chosen = options.local_models
        if isinstance(chosen, list) and len(chosen) < context.num_clients:
            raise ValueError(
                f"fml: local_models lists {len(chosen)} models but client {len(chosen)} exists "
                f"({context.num_clients} clients); give one per client or use a mapping {{client: model}}"
            )
        if options.adapt_newcomers is not None and context.num_rounds is None:
            raise ValueError("fml: adapt_newcomers needs the run's number of rounds (Context.num_rounds)")
        self.model = self.new_global_model()  # workspace for memes and the global model
        self._local_workspaces: dict[str, FewShotModel] = {}

    # -- models ---------------------------------------------------------------------------------
    def new_global_model(self) -> FewShotModel:
        return self.context.make_model(self.context.num_classes)

    def local_architecture(self, client_id: int) -> str | None:
        """The zoo name of client ``client_id``'s private model; None means the global architecture."""
        chosen = self.options.local_models
        if chosen is None:
            return None
        if isinstance(chosen, list):
            if client_id >= len(chosen):
                raise ValueError(
                    f"fml: local_models lists {len(chosen)} models but client {client_id} exists; "
                    "give one per client or use a mapping {client: model}"
                )
            return chosen[client_id]
        return chosen.get(client_id)

    def new_local_model(self, architecture: str | None) -> FewShotModel:
        if architecture is None:
            return self.new_global_model()
        options = self.options.local_model_options.get(architecture, {})
        return self.context.make_model_named(architecture, self.context.num_classes, **options)

    def local_workspace(self, architecture: str | None) -> FewShotModel:
        """One reusable model per private architecture (a speed cache, overwritten at each use)."""
        key = architecture or ""
        if key not in self._local_workspaces:
            self._local_workspaces[key] = self.new_local_model(architecture)
        return self._local_workspaces[key]

    # -- server ---------------------------------------------------------------------------------
    def init_server(self, generator: torch.Generator) -> FMLServer:
        # Same construction as fedavg's init_server: identical global initialisation for one seed.
        return {"model": get_state(self.new_global_model()), "round": 0}

    def broadcast(self, server: FMLServer, client_id: int) -> Payload:
        if client_id in self.options.newcomers:
            # Nothing while the others train; the final global model when the newcomer joins (only
            # an evaluation of the last round's model asks for it: training rounds are 0 .. R-1).
            return {"model": server["model"], "round": server["round"]} if self.newcomers_join(server) else {}
        alpha, beta = self.options.weights_at(server["round"])
        return {"model": server["model"], "alpha": alpha, "beta": beta}

    #: Differential privacy clips the meme's update; the private local models never leave the clients, and
    #: their scores (evaluate_client) are reported outside the guarantee (fedfew.privacy.coverage).
    dp_upload = "meme-model-delta"

    def dp_advance(self, server: FMLServer) -> FMLServer:
        """Under DP the noised average replaces :meth:`aggregate`: the round counter still moves."""
        return {**server, "round": server["round"] + 1}

    def aggregate(self, server: FMLServer, results: dict[int, ClientResult],
                  generator: torch.Generator) -> FMLServer:
        memes = [r.upload["model"] for r in results.values() if "model" in r.upload]
        # Plain average, no n_k weights (sections 3.3 and 6).
        model = weighted_average(memes, [1.0] * len(memes)) if memes else server["model"]
        return {**server, "model": model, "round": server["round"] + 1}

    # -- client ---------------------------------------------------------------------------------
    seeds_init_client_state = True  # each client's private model from its own seed (the framework seeds it)

    def init_client_state(self, client: ClientData, generator: torch.Generator) -> FMLClientState:
        architecture = self.local_architecture(client.client_id)
        return {"model": get_state(self.new_local_model(architecture)), "architecture": architecture, "rounds": 0}

    def client_update(self, payload: Payload, state: FMLClientState, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        if data.client_id in self.options.newcomers:
            return ClientResult.sat_out(state)
        meme = load_state_(self.model, payload["model"])
        local = load_state_(self.local_workspace(state["architecture"]), state["model"])
        metrics = deep_mutual_learning(local, meme, data.train, payload["alpha"], payload["beta"],
                                       self.options, generator)
        metrics.update(alpha=payload["alpha"], beta=payload["beta"])
        new_state = {**state, "model": get_state(local), "rounds": state["rounds"] + 1}
        # Only the meme goes up; the local model stays in new_state, which never leaves the client.
        return ClientResult(upload={"model": get_state(meme)}, state=new_state, metrics=metrics,
                            num_samples=data.num_samples)

    # -- evaluation -----------------------------------------------------------------------------
    def local_accuracy(self, state: FMLClientState | None, client: ClientData) -> float | None:
        """A trained client's local model on its own private validation set (None: nothing to score)."""
        if client.val is None or len(client.val) == 0 or state is None or state["rounds"] == 0:
            return None
        model = load_state_(self.local_workspace(state["architecture"]), state["model"])
        return dataset_accuracy(model, client.val.inputs, client.val.labels, client.val.lengths)

    def local_accuracies(self, client_states: Mapping[int, FMLClientState], clients: list[ClientData]) -> dict[int, float]:
        """Each trained client's local model on its own private validation set."""
        scores = {c.client_id: self.local_accuracy(client_states.get(c.client_id), c) for c in clients}
        return {cid: score for cid, score in scores.items() if score is not None}

    evaluates_clients = True

    def newcomers_join(self, server: FMLServer) -> bool:
        """True for the server state after the last round when the run has the newcomer phase."""
        return self.options.adapt_newcomers is not None and server["round"] == self.context.num_rounds

    def evaluate_client(self, payload: Payload, state: FMLClientState, client: ClientData, data: EvalData,
                        generator: torch.Generator) -> ClientScores:
        if client.client_id in self.options.newcomers:
            return {"newcomer": self.newcomer_curves(payload, client)} if "model" in payload else {}
        return {"local_accuracy": self.local_accuracy(state, client)}

    def newcomer_curves(self, server: Parts, client: ClientData) -> dict[str, list[float]]:
        """``adapt_newcomers``: the newcomer's private-model accuracy on its validation set per epoch
        (0 = on joining), for each start x way of adapting, keyed ``"{init}_{by}"``. Each start has its
        own generator (seed, "newcomer", client, init), shared by the ways, so they are paired; the
        run's generators are not touched."""
        phase = self.options.adapt_newcomers
        assert phase is not None
        curves = {}
        for init in phase.init:
            for by in phase.by:
                generator = torch_generator(self.context.seed, "newcomer", client.client_id, init)
                curve = self.adapt_newcomer(server, client, generator, init=init, epochs=phase.epochs,
                                            alpha=1.0 if by == "ce" else None)
                curves[f"{init}_{by}"] = [row["local_accuracy"] for row in curve]
        return curves

    def combine_evaluations(self, server: FMLServer, scores: dict[int, ClientScores], data: EvalData,
                            generator: torch.Generator) -> dict[str, Any]:
        """The global model on the labelled test set (on the server), and the clients' local models on
        their private validation sets (each on its client)."""
        if data.dataset is None:
            raise ValueError(f"fml evaluates on a labelled {data.split} set (task: classification)")
        d = data.dataset
        metrics: dict[str, Any] = {
            "accuracy": dataset_accuracy(load_state_(self.model, server["model"]), d.inputs, d.labels, d.lengths)}
        local = {cid: s["local_accuracy"] for cid, s in scores.items() if s.get("local_accuracy") is not None}
        metrics.update(local_scores(local))
        metrics.update(newcomer_scores([s["newcomer"] for cid, s in sorted(scores.items()) if "newcomer" in s]))
        return metrics

    # -- a new participant (Fig. 4) -------------------------------------------------------------
    def adapt_newcomer(
        self,
        server: Parts,
        client: ClientData,
        generator: torch.Generator,
        init: Literal["fresh", "global"] = "fresh",
        epochs: int = 5,
        alpha: float | None = None,
        beta: float | None = None,
        test: LabelledDataset | None = None,
    ) -> list[dict[str, float]]:
        """A client that took no part joins after training: its meme is a fork of the global model,
        its local model starts ``fresh`` (seeded from ``generator``) or from the ``global`` model, and
        the two run DML on its private training set for ``epochs`` epochs (alpha, beta default to
        the last round's). Returns one record per epoch (0 = before adapting) with the local and
        meme accuracy on the client's private validation set (and the meme's on ``test`` if given).
        Nothing here changes ``server`` or any stored state."""
        if client.val is None or len(client.val) == 0:
            raise ValueError(f"fml: newcomer {client.client_id} has no private validation set "
                             "(set classification.client_val_fraction > 0)")
        last_alpha, last_beta = self.options.weights_at(max(server["round"] - 1, 0))
        alpha = last_alpha if alpha is None else alpha
        beta = last_beta if beta is None else beta
        architecture = self.local_architecture(client.client_id)
        if init == "global":
            local = self.new_local_model(architecture)
            shapes = {k: tuple(v.shape) for k, v in local.state_dict().items()}
            if shapes != {k: tuple(v.shape) for k, v in server["model"].items()}:
                raise ValueError(f"fml: newcomer {client.client_id}'s local model ({architecture!r}) is not of the "
                                 "global architecture, so it cannot start from the global weights; use init='fresh'")
            load_state_(local, server["model"])
        elif init == "fresh":
            seed_torch_init(generator)
            local = self.new_local_model(architecture)
        else:
            raise ValueError(f"fml: newcomer init must be 'fresh' or 'global', not {init!r}")
        meme = self.new_global_model()
        load_state_(meme, server["model"])
        val = client.val

        def record(epoch: int) -> dict[str, float]:
            row = {
                "epoch": epoch,
                "local_accuracy": dataset_accuracy(local, val.inputs, val.labels, val.lengths),
                "meme_accuracy": dataset_accuracy(meme, val.inputs, val.labels, val.lengths),
            }
            if test is not None:
                row["meme_test_accuracy"] = dataset_accuracy(meme, test.inputs, test.labels, test.lengths)
            return row

        curve = [record(0)]
        deep_mutual_learning(local, meme, client.train, alpha, beta, self.options, generator, epochs=epochs,
                             on_epoch=lambda e: curve.append(record(e)))
        return curve

