"""F2L (Wang et al., "Federated Few-shot Learning", KDD'23): decoupled meta-learning with a shared
server-model phi and a private client-model psi_i per client.

* Server-model phi = (q_phi, f_phi): the configured encoder and a linear classifier over all |C_b|
  base classes. Sent down every round, updated locally, averaged uniformly (eq. 2):
  phi^{t+1} = 1/I sum_i phi_i^t.
* Client-model psi_i = (q_psi, f_psi): a Transformer over the support set's server-model features
  (appendix C.1.2, eq. 22; :class:`F2LClientModel`) and an N-way linear classifier. It lives in the
  client's private state, is never uploaded and persists across rounds (with its Adam moments).

Algorithm 1, one local step s of client i on a meta-task T = {S, Q} sampled from its base data::

    h_phi = q_phi(S u Q)                                       one server forward (dropout on)
    psi'  = psi - alpha_ft grad_psi CE(f_psi(q_psi(h_phi_S)), y_S)               (eq. 3)
    L_phi = (1 - lambda_MI) CE_{|C_b|}(f_phi(h_phi_S), y_S) + lambda_MI L_MI     (eq. 13-15)
    L_psi = (1 - lambda_KD) CE(psi'(Q), y_Q)            + lambda_KD L_KD         (eq. 16-21)
    phi  <- Adam(phi, grad_phi L_phi, alpha_phi);  psi <- Adam(psi, grad_psi L_psi, alpha_psi)  (eq. 4-5)

Choices where the paper is silent or needs interpretation (each is an option where it matters):

* Both updates of a step use the parameters (psi^{t,s}, phi^{t,s}) of that step, as eq. 4 and 5 are
  written, so the server forward is shared; Algorithm 1 lists the updates one after the other but
  every symbol in them carries the same index s.
* Eq. 4 is a MAML meta-update: the gradient of the query loss at psi' is taken with respect to psi
  through the fine-tuning step (second order; ``first_order`` drops the second derivatives).
  ``finetune: head`` restricts eq. 3 to the classifier f_psi (as the authors' code does): q_psi then
  runs once per task and the meta-gradient reaches it through h_psi; meta-test can then fine-tune the
  classifiers of all tasks in one batched computation, which the paper's ``all`` cannot.
* Gradients: L_phi reaches phi only through h_phi_S (and f_phi). The client-model's representations
  h_psi and its class probabilities p_psi enter L_MI as fixed targets (stop-gradient): section 3.2
  transfers the client-model's knowledge *into* the server-model, and p_psi is an estimate of
  p(h_phi | h_psi) (eq. 9), not a quantity phi should move. L_psi reaches psi only: the server
  features fed to the client-model and the teacher logits are detached (eq. 4 differentiates w.r.t.
  psi only).
* The client-model classifies a query q as a member of its support set: q_psi runs over the set
  S u {q} and the output at q is used, so each query is classified from the whole support set (eq. 22)
  but never sees the other queries (no transduction). Support representations come from q_psi over S.
* L_MI (eq. 13), with l2-normalised rows h_phi^i, h_psi^j of the support set (D = N*K) and
  C(j) = {k : y_k = y_j}::

      L_MI = -1/D sum_j sum_{i in C(j)} w_i log( exp(h_phi^i . h_psi^j) / sum_{k=1}^{D} exp(h_phi^i . h_psi^k) )
      w_i  = p_psi^i(y_i) / sum_{k in C(i)} p_psi^k(y_i)

  i.e. p(h_phi^i | h_psi^j) of eq. 9 (the client-model's confidence in sample i's class, normalised
  within the class) times log p(h_psi^j | h_phi^i) of eq. 10-11 (a softmax over j of the dot
  products; -||a - b||^2 / 2 = a.b - 1 for unit vectors), with p(h_psi^j) = 1/D (eq. 8) giving the
  1/D and the constant log D dropped (eq. 12). With K = 1 it is an InfoNCE at temperature 1.
  The softmax runs over all D support samples (``mi_normaliser: support``, ours). Eq. 10 and 13
  write it over k in C(i), the samples of i's class (``mi_normaliser: class``): with one shot
  C(i) = {i}, the softmax is 1 and L_MI is identically 0 (no transfer: L_phi is (1 - lambda_MI) CE(S)), and
  with K shots it only asks h_phi^i to pick its class-mates' client features among themselves. We
  read the C(i) as a typo for the support set, which gives the mutual information of eq. 6-8 a
  non-degenerate estimate; the literal form is the option.
* L_CE(S) (eq. 15) and L_CE(Q) (eq. 21) are means over the samples.
* L_KD (eq. 16-18), the partial distillation restricted to the task's N classes C_m, from the
  server-model's logits z_phi (teacher) to the client-model's z_psi, as a cross-entropy with soft
  targets (the KL divergence differs by the teacher's entropy, a constant for psi)::

      L_KD = -1/|Q| sum_i sum_{c in C_m} q_phi^i(c) log q_psi^i(c),   q^i(c) = softmax_{C_m}(z^i / T_i)(c)

  and no T^2 factor (the paper has none).
* The adaptive temperature (eq. 19) uses the server-model's logits of query i with label y_i:
  T_i = sigmoid( max_{c in C_m, c != y_i} exp(z_phi^i(c)) / exp(z_phi^i(y_i)) ), in (0.5, 1).
  ``kd_temperature`` set to a number replaces it by a fixed temperature (1.0 = no temperature).
* Non-IID clients that cannot form N-way tasks train on fewer ways (see ``local_sampler``): the
  client head has N outputs and only the first n are used.
* Meta-test (section 3.4): the best server-model on validation classes encodes S and Q; the
  client-model is fine-tuned on S exactly as in training (eq. 3, ``finetune_steps`` steps of
  alpha_ft, or ``test_finetune_steps``) without the meta-update, and classifies Q. The paper samples
  meta-test tasks from the clients' novel data, so a task is solved by the client that holds it;
  our fixed tasks are global, so by default (``test_client_model: each``) *every* client solves
  every task with its own psi_i and the accuracy is the mean over clients (as ``local`` reports).
  ``average`` uses the parameter average of the psi_i, ``fresh`` a newly initialised psi (the same
  for every task). Under F2L\\M (``decoupled: false``) the aggregated client-model is used.

Ablations (Fig. 4): ``decoupled: false`` is F2L\\M (the client-model is uploaded and averaged too),
``transfer: false`` is F2L\\T (L_phi = CE(S), no L_MI), ``distill: false`` is F2L\\A
(L_psi = CE(Q), no L_KD).

The authors' public code differs from the paper; ``configs/f2l/authors_code_preset.yaml`` sets the
options that reproduce its main differences: ``mi_loss: infonce`` (cosine InfoNCE at temperature 0.5
between the client-model's and the server-model's support features, pairing each sample with the
next shot of its class), ``kd_temperature: 1.0``, ``train_n_way``/``train_k_shot`` (20-way 2-shot
training tasks), ``server_ce: support_query`` (the server-model's cross-entropy over support and
query, not eq. 15's support only) and ``test_classifier: logreg`` (logistic regression on
l2-normalised server-model features at meta-test).
"""

from __future__ import annotations

import copy
from typing import Any, Literal, TypedDict

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch.func import functional_call

from fedfew.algorithms.parts.common import label_map, local_sampler, per_client_table
from fedfew.algorithms.parts.f2l_eval import logistic_regression_accuracy
from fedfew.algorithms.parts.f2l_losses import (
    adaptive_temperature,
    infonce_loss,
    mutual_information_loss,
    partial_distillation_loss,
)
from fedfew.algorithms.parts.f2l_models import (
    F2LClientModel,
    Params,
    batched_linear,
    finetune_head,
    twice_differentiable,
)
from fedfew.core.seeding import seed_torch_init
from fedfew.fewshot.episodes import Episode
from fedfew.fewshot.evaluation import accuracy, mean_ci95
from fedfew.interface.aggregation import weighted_average, weights_for
from fedfew.interface.algorithm import (
    Algorithm,
    ClientData,
    ClientResult,
    ClientScores,
    Context,
    EpisodeShape,
    EvalData,
    Options,
    Payload,
)
from fedfew.interface.registration import register
from fedfew.interface.state import StateDict, get_state, load_state_
from fedfew.models.base import FewShotModel

# The losses, the client-model and the evaluation live in modules of their own; their names stay
# importable from here, where tests and older code import them.
__all__ = ["F2L", "F2LClientModel", "F2LOptions", "Params", "adaptive_temperature", "batched_linear",
           "finetune_head", "infonce_loss", "logistic_regression_accuracy", "mutual_information_loss",
           "partial_distillation_loss", "twice_differentiable"]


# ---------------------------------------------------------------------------------------------
# The algorithm
# ---------------------------------------------------------------------------------------------
class F2LOptions(Options):
    """Defaults are the paper's (appendix C.3) unless noted."""

    local_steps: int = Field(10, ge=1, description="tau: local steps per round, one meta-task each")
    lr_server: float = Field(1e-3, gt=0, description="alpha_phi: Adam's learning rate for the server-model (eq. 5)")
    lr_client: float = Field(1e-3, gt=0, description="alpha_psi: Adam's learning rate for the client-model (eq. 4)")
    weight_decay: float = Field(1e-4, ge=0, description="Adam's weight decay, for both models")
    finetune_lr: float = Field(0.01, gt=0, description="alpha_ft: step size of the client-model's fine-tuning "
                               "on the support set (eq. 3)")
    finetune_steps: int = Field(1, ge=1, description="fine-tuning steps of eq. 3 (the paper: one)")
    finetune: Literal["all", "head"] = Field("all", description=(
        "what eq. 3 adapts: all of psi (\"all\", the paper) or the classifier f_psi only (\"head\", the "
        "authors' code; faster meta-test)"))
    test_finetune_steps: int | None = Field(None, ge=1, description="fine-tuning steps at meta-test (None: "
                                            "finetune_steps, as in training, section 3.4)")
    first_order: bool = Field(False, description="drop the second derivatives of the meta-update through the "
                              "fine-tuning step (eq. 4)")
    lambda_mi: float = Field(0.5, ge=0, le=1, description="lambda_MI: L_phi = (1 - lambda_MI) CE(S) + lambda_MI "
                             "L_MI (eq. 14)")
    lambda_kd: float = Field(0.5, ge=0, le=1, description="lambda_KD: L_psi = (1 - lambda_KD) CE(Q) + lambda_KD "
                             "L_KD (eq. 20)")
    decoupled: bool = Field(True, description="false: F2L\\M (the client-model is uploaded and averaged too)")
    transfer: bool = Field(True, description="false: F2L\\T (no L_MI: L_phi = CE(S))")
    distill: bool = Field(True, description="false: F2L\\A (no L_KD: L_psi = CE(Q))")
    kd_temperature: Literal["adaptive"] | float = Field("adaptive", description=(
        "the distillation temperature: \"adaptive\" (eq. 19, per query) or a fixed T > 0 (1.0: none)"))
    server_ce: Literal["support", "support_query"] = Field("support", description=(
        "the samples of the server-model's cross-entropy in L_phi: \"support\" (eq. 15) or \"support_query\" "
        "(the authors' code; six times the samples of a 1-shot task with 5 queries)"))
    mi_loss: Literal["paper", "infonce"] = Field("paper", description=(
        "the transfer loss: L_MI of eq. 13 (\"paper\") or the authors' code's cosine InfoNCE (\"infonce\")"))
    mi_normaliser: Literal["support", "class"] = Field("support", description=(
        "the softmax of eq. 10 over all D support samples (\"support\", ours) or over C(i) as eq. 10/13 write "
        "it (\"class\": identically 0 at one shot)"))
    mi_client_model: Literal["finetuned", "initial"] = Field("finetuned", description=(
        "the client-model whose h_psi and p_psi enter L_MI: \"finetuned\" (psi' of eq. 3; section 3.2.2: "
        "\"since the client-model is finetuned on the support set\") or \"initial\" (psi^{t,s}, as eq. 5's "
        "arguments {phi^{t,s}, psi^{t,s}} are written)"))
    infonce_temperature: float = Field(0.5, gt=0, description="temperature of mi_loss: infonce")
    client_heads: int = Field(4, ge=1, description="attention heads of q_psi's Transformer (the paper does not "
                              "say; must divide the feature dimension)")
    client_layers: int = Field(1, ge=1, description="Transformer layers of q_psi")
    client_dropout: float = Field(0.1, ge=0, lt=1, description="dropout in q_psi's Transformer (the paper's "
                                  "dropout rate)")
    client_feedforward: int | None = Field(None, ge=1, description="feed-forward width of q_psi's Transformer "
                                           "(None: 2 x the feature dimension)")
    persist_client_optimizer: bool = Field(True, description=(
        "keep psi's Adam moments in the client's state from round to round (ours: the paper is silent)"))
    test_client_model: Literal["each", "average", "fresh"] = Field("each", description=(
        "the client-model that solves a meta-test task: every client's own (\"each\", mean over clients), "
        "their parameter average (\"average\") or a fresh one (\"fresh\"); ours: the paper is silent"))
    test_classifier: Literal["client", "logreg"] = Field("client", description=(
        "meta-test classifier: the fine-tuned client-model (\"client\") or logistic regression on "
        "l2-normalised server-model features (\"logreg\", the authors' code)"))
    train_n_way: int | None = Field(None, ge=2, description="N of the training tasks (None: the configured "
                                    "episodes; the authors' code: 20)")
    train_k_shot: int | None = Field(None, ge=1, description="K of the training tasks (None: the configured "
                                     "episodes; the authors' code: 2)")


    @model_validator(mode="after")
    def _positive_temperature(self) -> F2LOptions:
        if self.kd_temperature != "adaptive" and float(self.kd_temperature) <= 0:
            raise ValueError(f"algorithm.options.kd_temperature must be 'adaptive' or > 0, got {self.kd_temperature}")
        return self


class _ServerModel(TypedDict):
    server: StateDict  # phi, the shared server-model


class F2LServer(_ServerModel, total=False):
    """The server state: the shared server-model phi and, in F2L\\M only, the one shared client-model
    (a base class carries the required key: ``NotRequired`` needs Python 3.11)."""

    client: StateDict


class _ClientModel(TypedDict):
    client: StateDict  # psi, the private client-model


class F2LClientState(_ClientModel, total=False):
    """A client's private state (F2L, decoupled): its client-model psi and, with
    ``persist_client_optimizer``, its Adam moments. It never leaves the client."""

    client_optimizer: dict[str, Any]  # torch's optimizer state_dict, as torch types it


@register("f2l", help="F2L: shared server-model + private client-models, L_MI transfer and partial KD")
class F2L(Algorithm[F2LOptions]):
    secure_sum = None
    secure_sum_refused = ("the server aggregates the shared server-model phi (and, in F2L\\M, the client-"
                          "model) and its scores come from the private client-models: not a weighted sum of"
                          " one upload (not covered yet)")
    dp_refused = ("F2L is covered with decoupled: true (its upload is then the shared server-model phi "
                  "alone) unless test_client_model: average, which sends every private client-model to "
                  "the server to be averaged for evaluation; decoupled: false (F2L\\M) uploads the "
                  "client-model too under its own aggregation")

    def __init__(self, options: F2LOptions, context: Context) -> None:
        super().__init__(options, context)
        if context.task != "fewshot":
            raise ValueError("f2l is a few-shot method: set task: fewshot")
        shape = context.episode
        self.train_shape = EpisodeShape(options.train_n_way or shape.n_way, options.train_k_shot or shape.k_shot,
                                        shape.q_query)
        if options.test_classifier == "client" and self.train_shape.n_way < shape.n_way:
            raise ValueError(
                f"algorithm.options.train_n_way={self.train_shape.n_way} is below the meta-test episodes' "
                f"n_way={shape.n_way}: the client-model's classifier would have too few outputs "
                "(raise train_n_way or use test_classifier: logreg)"
            )
        self.label_index = label_map(list(context.train_classes), context.num_classes)
        # Workspace models (speed caches, reloaded in place at every use).
        self.server_model: FewShotModel = context.make_model(len(context.train_classes))
        self.feature_dim = self.server_model.feature_dim
        if self.feature_dim % options.client_heads != 0:
            raise ValueError(
                f"algorithm.options.client_heads={options.client_heads} must divide the server-model's "
                f"feature dimension {self.feature_dim}"
            )
        self.client_model = self.new_client_model()

    def new_client_model(self) -> F2LClientModel:
        o = self.options
        with torch.device("cpu"):  # initialised from the CPU RNG, as make_model does: the same numbers on any device
            model = F2LClientModel(self.feature_dim, self.train_shape.n_way, o.client_heads, o.client_layers,
                                   o.client_dropout, o.client_feedforward)
        return model.to(next(self.server_model.parameters()).device)  # where make_model puts models

    # -- server ---------------------------------------------------------------------------
    def init_server(self, generator: torch.Generator) -> F2LServer:
        server: F2LServer = {"server": get_state(self.context.make_model(len(self.context.train_classes)))}
        if not self.options.decoupled:  # F2L\M: one client-model, aggregated like phi
            server["client"] = get_state(self.new_client_model())
        return server

    def broadcast(self, server: F2LServer, client_id: int) -> Payload:
        payload: Payload = {"server": server["server"]}
        if "client" in server:
            payload["client"] = server["client"]
        return payload

    def aggregate(self, server: F2LServer, results: dict[int, ClientResult],
                  generator: torch.Generator) -> F2LServer:
        sent = [r for r in results.values() if "server" in r.upload]
        if not sent:
            return server
        weights = weights_for("uniform", [r.num_samples for r in sent], [r.num_episodes for r in sent])  # eq. 2
        new: F2LServer = {**server, "server": weighted_average([r.upload["server"] for r in sent], weights)}
        if not self.options.decoupled:
            new["client"] = weighted_average([r.upload["client"] for r in sent], weights)
        return new

    # -- client ---------------------------------------------------------------------------
    @property
    def seeds_init_client_state(self) -> bool:
        """Decoupled (F2L): each client builds its own client-model, from its own seed."""
        return self.options.decoupled

    def init_client_state(self, client: ClientData, generator: torch.Generator) -> F2LClientState | None:
        if not self.options.decoupled:
            return None
        return {"client": get_state(self.new_client_model())}

    def finetune(self, params: Params, support_features: torch.Tensor, support_labels: torch.Tensor,
                 steps: int, create_graph: bool) -> Params:
        """psi' = psi - alpha_ft grad_psi CE on the support set, ``steps`` times (eq. 3)."""
        n = int(support_labels.max()) + 1
        for _ in range(steps):
            _, logits, _ = functional_call(self.client_model, params, (support_features,))
            loss = F.cross_entropy(logits[:, :n], support_labels)
            grads = torch.autograd.grad(loss, list(params.values()), create_graph=create_graph)
            params = {name: p - self.options.finetune_lr * g for (name, p), g in zip(params.items(), grads)}
        return params

    def local_step(self, episode: Episode) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(L_phi, L_psi, metrics) of one meta-task (eq. 3, 13-21) with the workspace models."""
        o = self.options
        server, client = self.server_model, self.client_model
        n, d = episode.n_way, len(episode.support_labels)
        inputs = torch.cat([episode.support, episode.query])
        args = (inputs,) if episode.support_lengths is None or episode.query_lengths is None else (
            inputs, torch.cat([episode.support_lengths, episode.query_lengths]))
        features = server.features(*args)  # h_phi of S u Q, one forward for both updates
        logits_all = server.head(features)
        task_classes = self.label_index[episode.classes]  # C_m as indices among the base classes
        if o.server_ce == "support":  # eq. 15: the server-model's CE over the support set
            ce_support = F.cross_entropy(logits_all[:d], task_classes[episode.support_labels])
        else:  # the authors' code: over support and query (the query labels are the client's own)
            ce_support = F.cross_entropy(
                logits_all, task_classes[torch.cat([episode.support_labels, episode.query_labels])])

        support_features, query_features = features[:d].detach(), features[d:].detach()
        if o.finetune == "all":
            adapted = self.finetune(dict(client.named_parameters()), support_features, episode.support_labels,
                                    o.finetune_steps, create_graph=not o.first_order)
            support_repr, support_logits, query_logits = functional_call(
                client, adapted, (support_features, query_features))
        else:  # only f_psi adapts: q_psi runs once, the meta-gradient reaches it through h_psi
            support_repr, query_repr = client.encode(support_features, query_features)
            weight, bias = finetune_head(client.head.weight, client.head.bias, support_repr, episode.support_labels,
                                         n, o.finetune_lr, o.finetune_steps, create_graph=not o.first_order)
            assert query_repr is not None  # an episode has queries: encode gives their representations
            support_logits = batched_linear(support_repr, weight, bias)
            query_logits = batched_linear(query_repr, weight, bias)
        support_logits, query_logits = support_logits[:, :n], query_logits[:, :n]

        loss_phi = ce_support  # F2L\T: CE only
        metrics: dict[str, float] = {"ce_support": float(ce_support.detach())}
        if o.transfer:
            mi_repr, mi_logits = support_repr, support_logits
            if o.mi_client_model == "initial":  # eq. 5 as written: psi^{t,s}, before the fine-tuning step
                with torch.no_grad():
                    mi_repr, mi_logits, _ = client(support_features)
                mi_logits = mi_logits[:, :n]
            if o.mi_loss == "paper":
                l_mi = mutual_information_loss(features[:d], mi_repr.detach(),
                                               torch.softmax(mi_logits, dim=1).detach(), episode.support_labels,
                                               o.mi_normaliser)
            else:
                l_mi = infonce_loss(features[:d], mi_repr.detach(), episode.support_labels, o.infonce_temperature)
            loss_phi = (1 - o.lambda_mi) * ce_support + o.lambda_mi * l_mi  # eq. 14
            metrics["l_mi"] = float(l_mi.detach())

        ce_query = F.cross_entropy(query_logits, episode.query_labels)  # eq. 21
        loss_psi = ce_query  # F2L\A: CE only
        metrics["ce_query"] = float(ce_query.detach())
        if o.distill:
            teacher = logits_all[d:, task_classes].detach()  # z_phi on the N classes only (partial KD)
            if o.kd_temperature == "adaptive":
                adaptive = adaptive_temperature(teacher, episode.query_labels)
                metrics["kd_temperature"] = float(adaptive.mean())
                temperature: torch.Tensor | float = adaptive
            else:
                temperature = float(o.kd_temperature)
            l_kd = partial_distillation_loss(query_logits, teacher, temperature)
            loss_psi = (1 - o.lambda_kd) * ce_query + o.lambda_kd * l_kd  # eq. 20
            metrics["l_kd"] = float(l_kd.detach())
        metrics["accuracy"] = accuracy(query_logits.detach(), episode.query_labels)
        metrics["server_accuracy"] = accuracy(logits_all[:d].detach(), task_classes[episode.support_labels])
        return loss_phi, loss_psi, metrics

    def client_update(self, payload: Payload, state: F2LClientState | None, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        o = self.options
        sampler = local_sampler(data.train, self.train_shape)
        if sampler is None:  # too little data for any task: sit this round out, psi unchanged
            return ClientResult.sat_out(state, data.num_samples)
        seed_torch_init(generator)  # dropout reads torch's global RNG: seed it from this update's generator
        server = load_state_(self.server_model, payload["server"])
        private = state if o.decoupled else None  # F2L keeps psi on the client; F2L\M receives it
        client = load_state_(self.client_model, private["client"] if private is not None else payload["client"])
        server.train()
        client.train()
        opt_phi = torch.optim.Adam(server.parameters(), lr=o.lr_server, weight_decay=o.weight_decay)
        opt_psi = torch.optim.Adam(client.parameters(), lr=o.lr_client, weight_decay=o.weight_decay)
        if private is not None and o.persist_client_optimizer and private.get("client_optimizer") is not None:
            # deep copy: the optimizer updates its moments in place; the incoming state stays untouched
            opt_psi.load_state_dict(copy.deepcopy(private["client_optimizer"]))
        sums: dict[str, float] = {}
        for _ in range(o.local_steps):
            with twice_differentiable(not o.first_order):
                loss_phi, loss_psi, metrics = self.local_step(sampler.sample(generator))
            opt_phi.zero_grad(set_to_none=True)
            opt_psi.zero_grad(set_to_none=True)
            # The two losses touch disjoint parameters (all cross terms are detached): one backward.
            (loss_phi + loss_psi).backward()
            opt_phi.step()
            opt_psi.step()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
        upload: Payload = {"server": get_state(server)}
        new_state: F2LClientState | None = state
        if o.decoupled:
            new_state = {"client": get_state(client)}
            if o.persist_client_optimizer:
                new_state["client_optimizer"] = copy.deepcopy(opt_psi.state_dict())
        else:
            upload["client"] = get_state(client)
        return ClientResult(upload=upload, state=new_state, metrics={k: v / o.local_steps for k, v in sums.items()},
                            num_samples=data.num_samples, num_episodes=o.local_steps)

    # -- meta-test ------------------------------------------------------------------------
    @torch.no_grad()
    def encode_episodes(self, episodes: list[Episode]) -> tuple[torch.Tensor, torch.Tensor]:
        """Server-model features (eval mode) of every task's support and query sets, stacked:
        ([E, D, k], [E, Q, k]); fixed meta-test tasks all have the same shape."""
        supports, queries = [], []
        for episode in episodes:
            d = len(episode.support_labels)
            inputs = torch.cat([episode.support, episode.query])
            args = (inputs,) if episode.support_lengths is None or episode.query_lengths is None else (
                inputs, torch.cat([episode.support_lengths, episode.query_lengths]))
            features = self.server_model.features(*args)
            supports.append(features[:d])
            queries.append(features[d:])
        return torch.stack(supports), torch.stack(queries)

    def client_accuracies(self, client_state: dict[str, torch.Tensor], support: torch.Tensor,
                          support_labels: torch.Tensor, query: torch.Tensor, query_labels: torch.Tensor) -> list[float]:
        """Per-task query accuracy of the client-model ``client_state`` fine-tuned on each task's
        support set (eq. 3, no meta-update; eval mode), for stacked tasks [E, ...]."""
        o = self.options
        client = load_state_(self.client_model, client_state).eval()
        n = int(support_labels.max()) + 1
        steps = o.test_finetune_steps or o.finetune_steps
        if o.finetune == "head":  # the encoder is shared by all tasks: one batched pass, batched heads
            with torch.no_grad():
                support_repr, query_repr = client.encode(support, query)
            e = len(support)
            weight = client.head.weight.detach().expand(e, -1, -1).clone().requires_grad_()
            bias = client.head.bias.detach().expand(e, -1).clone().requires_grad_()
            with torch.enable_grad():
                weight, bias = finetune_head(weight, bias, support_repr, support_labels, n, o.finetune_lr, steps,
                                             create_graph=False)
            assert query_repr is not None  # meta-test tasks have queries
            with torch.no_grad():
                logits = batched_linear(query_repr, weight, bias)[..., :n]
            return (logits.argmax(-1) == query_labels).float().mean(-1).tolist()
        scores = []
        for e in range(len(support)):
            params = {name: p.detach().requires_grad_() for name, p in client.named_parameters()}
            with torch.enable_grad():
                adapted = self.finetune(params, support[e], support_labels[e], steps, create_graph=False)
            with torch.no_grad():
                _, _, logits = functional_call(client, adapted, (support[e], query[e]))
            scores.append(accuracy(logits[:, :n], query_labels[e]))
        return scores

    def stacked_tasks(self, server_state: dict[str, torch.Tensor], data: EvalData) -> tuple[torch.Tensor, ...]:
        """(support features, support labels, query features, query labels) of every evaluation task
        under ``server_state``, computed once per server state and split (every client scores the
        same features)."""
        if data.episodes is None:
            raise ValueError(f"f2l is a few-shot method: it needs {data.split} episodes")
        memo = getattr(self, "_stacked", None)
        if memo is not None and memo[0] is server_state and memo[1] is data:
            return memo[2]
        episodes = list(data.episodes)
        load_state_(self.server_model, server_state).eval()
        support, query = self.encode_episodes(episodes)
        tasks = (support, torch.stack([ep.support_labels for ep in episodes]), query,
                 torch.stack([ep.query_labels for ep in episodes]))
        self._stacked = (server_state, data, tasks)
        return tasks

    @property
    def evaluates_clients(self) -> bool:  # type: ignore[override]
        """The clients take part in evaluation when their client-models are scored: each its own
        (``test_client_model: each``) or their average (``average``: each sends its client-model for
        the evaluation; the server never reads a private state)."""
        o = self.options
        return o.test_classifier == "client" and o.decoupled and o.test_client_model in ("each", "average")

    @property
    def dp_upload(self) -> str | None:  # type: ignore[override]
        """What differential privacy clips: the update of the shared server-model phi, F2L's only upload when
        decoupled (the private client-models never leave the clients). Refused for F2L\\M (the client-model is
        uploaded too) and ``test_client_model: average`` (every client-model goes to the server for evaluation)."""
        o = self.options
        if not o.decoupled or (o.test_classifier == "client" and o.test_client_model == "average"):
            return None
        return "server-model-delta"

    def evaluate_client(self, payload: Payload, state: F2LClientState, client: ClientData, data: EvalData,
                        generator: torch.Generator) -> ClientScores:
        if self.options.test_client_model == "average":
            return {"client": state["client"]}
        support, support_labels, query, query_labels = self.stacked_tasks(payload["server"], data)
        return {"scores": self.client_accuracies(state["client"], support, support_labels, query, query_labels)}

    def combine_evaluations(self, server: F2LServer, scores: dict[int, ClientScores], data: EvalData,
                            generator: torch.Generator) -> dict[str, float]:
        if self.options.test_client_model == "average":
            states = [s["client"] for s in scores.values()]
            single = weighted_average(states, [1.0] * len(states))
            support, support_labels, query, query_labels = self.stacked_tasks(server["server"], data)
            score = mean_ci95(self.client_accuracies(single, support, support_labels, query, query_labels))
            return {"accuracy": score.mean, "ci95": score.ci95}
        return per_client_table({cid: s["scores"] for cid, s in scores.items()})

    def evaluate(self, server: F2LServer, data: EvalData, generator: torch.Generator) -> dict[str, float]:
        """Meta-test with one client-model (``fresh``, F2L\\M) or the authors' logistic regression;
        ``each`` and ``average`` go through :meth:`evaluate_client` on the clients."""
        o = self.options
        support, support_labels, query, query_labels = self.stacked_tasks(server["server"], data)
        if o.test_classifier == "logreg":
            score = mean_ci95(logistic_regression_accuracy(support[e], support_labels[e], query[e], query_labels[e])
                              for e in range(len(support)))
            return {"accuracy": score.mean, "ci95": score.ci95}
        if o.test_client_model == "fresh":
            seed_torch_init(generator)
            single: dict[str, torch.Tensor] = get_state(self.new_client_model())
        elif not o.decoupled:
            single = server["client"]
        else:
            raise ValueError(f"f2l: test_client_model={o.test_client_model} evaluates on the clients (evaluate_client)")
        score = mean_ci95(self.client_accuracies(single, support, support_labels, query, query_labels))
        return {"accuracy": score.mean, "ci95": score.ci95}
