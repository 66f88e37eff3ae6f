"""FRL: few-round learning (Park, Han, Kim, Seo and Moon, "Few-Round Learning for Federated
Learning", NeurIPS 2021), with prototype aggregation (GPAL).

FRL prepares an initial model phi such that any new group of clients, possibly holding classes never
seen, reaches a good global model within R rounds of FL. Preparation (Algorithm 1) is meta-learning
by FL over N participants; one simulator round is one meta-training episode t:

1. the server draws K participants (the simulator's client schedule);
2. each splits its local data D_k into a support set S_k and a query set Q_k (half of each class);
3. theta^0 = phi^t, then R rounds of FL on the support sets (:class:`PrototypeFL`, one
   :func:`~fedfew.engine.round.run_round` each). In round r client k

   * downloads theta^r and, from round 1 on, the global prototypes G^{r-1};
   * computes its local prototypes c_{k,n} = mean of f_theta(x) over x in S_{k,n} (eq. 1), with the
     downloaded model theta^r;
   * takes E epochs of minibatch SGD (learner lr alpha) on the prototype loss (eq. 2)

         L_P = -1/|B| sum_{(x,y)} log softmax_n(-||f_theta(x) - c_{k,n}||^2)[y]   (n: k's classes)

     and, from round 1 on, the global prototype-assisted loss (GPAL) L_aux: the same loss against
     the previous round's global prototypes of all classes

         L_aux = -1/|B| sum_{(x,y)} log softmax_n(-||f_theta(x) - G^{r-1}_n||^2)[y]  (n: all classes),

     combined as eq. 3 writes it, a convex combination f = gamma L_P + (1 - gamma) L_aux
     (``gpal_form: convex``; round 0 has f = L_P);

   * uploads theta_k^{r+1} and its prototypes of S_k (computed with theta_k^{r+1}, so that
     G^r describes the model the next round starts from) with their class counts;

   the server sets theta^{r+1} = sum_k |S_k|/|S| theta_k^{r+1} and G^r_n = the class-count weighted
   mean of the c_{k,n} (the mean of f over all of class n's support samples when the models agree);
4. meta-update (lines 15-20): client k computes the query loss at theta^R, the prototype loss on
   Q_k with Q_k's own class prototypes combined with L_aux to G^{R-1} as in eq. 3, and takes one SGD step from the
   episode's initial model, phi_k = phi^t - beta grad_theta L_Q(theta^R) (the first-order update of
   line 19); the server sets phi^{t+1} = sum_k |D_k|/|D| phi_k.

Communication: an episode is R + 1 rounds (R of FL, one for the meta-update). :meth:`FRL.play_round`
runs them through the simulator's ``play_round`` hook and reports the bytes of all R + 1.

Deployment (section 2.3, :mod:`fedfew.algorithms.parts.frl_deployment`): from phi^T a new group of K clients holding tau
classes runs R rounds of :class:`PrototypeFL` and classifies its pooled query set by distance to the
global prototypes G^{R-1}.

Classifier variants (``classifier``, ``gamma``): "distance" with gamma < 1 is FRL (distance-based
with GPAL); "distance" with gamma = 1 drops GPAL; "linear" replaces prototypes by a linear head
trained with cross-entropy (its query loss is cross-entropy too). Where the head's initial weights
come from is ``head_init``:

* "meta" (default): the head is part of phi, meta-learned with the encoder, as MAML learns its
  classifier's initialisation. phi's head has |C_b| rows; an episode whose participants hold n
  classes maps them, MAML-style, to distinct rows drawn at random among the first max(n, tau) rows
  (labels 0..n-1 in a random order when n >= tau, tau = ``deployment.classes``), runs its R rounds
  with those max(n, tau) rows of phi's head, and the meta-update moves exactly those rows (the others
  keep their values). A deployment group starts from the encoder and the first tau rows.
* "xavier": a Xavier head over the episode's (the group's) classes, re-initialised at the start of
  every episode and group; the meta-update changes the encoder only (phi has no head). This was our
  only reading before; the paper describes the Xavier replacement for the fine-tuning baseline.

Where the paper leaves room (each an option, paper-first defaults):

* ``local_prototypes``: "downloaded" (the paper: prototypes of S_k with the downloaded theta^r, fixed
  during the local epochs) or "batch" (the authors' code: prototypes of each minibatch with the
  current local model, gradients through them);
* ``query_prototypes``: "query" (the local prototypes of the query loss come from Q_k at theta^R) or
  "support" (from S_k at theta^R);
* ``aggregation``: "samples" (support / data sizes, the paper) or "uniform" (the authors' code);
* ``extra_query_steps``: the authors' code takes the meta-gradient on the first query minibatch
  only and then keeps stepping phi_k with SGD (lr beta) on the remaining query minibatches;
* ``gamma`` is eq. 3's weight of the local loss; the paper states no value. The default 0.8 is ours:
  it gives L_aux the weight 0.2 of the authors' code;
* ``eq2_classes``: eq. 2 is printed as d(g(x), c) + log sum_{c' != c} exp(-d(g(x), c')); we use
  ProtoNet's cross-entropy, whose log-sum includes c' = c ("all", ours): the printed form is
  unbounded below (scaling the embedding up drives it to -inf for every sample nearer its own
  prototype than to any other). "others" is the printed form;
* ``gpal_form``: "convex" (eq. 3 as the paper writes it, f = gamma L_P + (1 - gamma) L_aux) or
  "additive" (the authors' code, ``Lloss + 0.2 * Gloss``: f = L_P + (1 - gamma) L_aux). The two
  differ only in the weight of L_P from round 1 on (gamma or 1); with gamma = 0.8 "additive" is the
  authors' code exactly, and gamma = 1 turns GPAL off in both;
* all forward passes run in training mode (batch statistics), as the authors' code does.

The authors' code also feeds unnormalised pixels; inputs here are as the dataset loader gives them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import torch
import torch.nn.functional as F

from fedfew.algorithms.parts.common import make_optimizer, minibatches
from fedfew.algorithms.parts.frl_deployment import (
    DeploymentAlgorithm,
    LinearDeployment,
    LinearFL,
    evaluate_deployment,
)
from fedfew.algorithms.parts.frl_losses import (
    Prototypes,
    aggregate_prototypes,
    class_means,
    distance_loss,
    features_of,
    gpal_loss,
    gpal_objective,
    local_prototypes,
    prototype_loss,
    rows_of,
    squared_distances,
)
from fedfew.algorithms.parts.frl_options import FRLOptions
from fedfew.algorithms.parts.frl_rounds import (
    EpisodeRound,
    MetaHeadLinearFL,
    MetaHeadStart,
    PrototypeFL,
    ReportClasses,
)
from fedfew.algorithms.parts.frl_tasks import (
    frl_split,
    merged_head,
    on_rows,
    split_support_query,
    task_label_rows,
    with_prepared_head,
)
from fedfew.core.seeding import torch_generator
from fedfew.data.dataset import LabelledDataset
from fedfew.engine.round import RoundOutcome, run_round
from fedfew.interface.aggregation import weighted_average, weights_for
from fedfew.interface.algorithm import Algorithm, ClientData, ClientResult, Context, EvalData, Payload
from fedfew.interface.registration import register
from fedfew.interface.state import StateDict, get_state, load_state_
from fedfew.models.base import FewShotModel
from fedfew.privacy.clipping import REFERENCE
from fedfew.privacy.mechanism import STATE_KEY

if TYPE_CHECKING:
    from fedfew.engine.base import Engine
    from fedfew.privacy.mechanism import PrivateAggregation

# The options, the mathematics, the data split and the inner rounds live in modules of their own; their
# names stay importable from here, where tests and older code import them.
__all__ = ["FRL", "EpisodeRound", "FRLOptions", "MetaHeadLinearFL", "MetaHeadStart", "PrototypeFL", "Prototypes",
           "ReportClasses", "aggregate_prototypes", "class_means", "distance_loss", "features_of", "frl_split",
           "gpal_loss", "gpal_objective", "local_prototypes", "merged_head", "on_rows", "prototype_loss", "rows_of",
           "split_support_query", "squared_distances", "task_label_rows", "with_prepared_head"]


class PrivateState(TypedDict, total=False):
    """The keys a private run adds (a base class: ``NotRequired`` needs Python 3.11): privacy's state
    (``STATE_KEY``, the clip) and, in the meta-update round, the flag that sends the clients phi^t to
    measure their updates from (``REFERENCE``)."""

    dp: dict[str, float]
    dp_reference: bool


class FRLServer(PrivateState):
    """The server state between episodes: phi (the encoder, and the linear variant's meta-learned head)."""

    model: StateDict


class MetaRoundServer(PrivateState):
    """The server state of an episode's meta-update round: phi^t, the episode's theta^R and its global
    prototypes (None without GPAL's prototypes: the linear variant)."""

    model: StateDict
    adapted: StateDict
    prototypes: Prototypes | None


class EpisodeMemory(TypedDict):
    """What a participant keeps during one episode (its private state there): the phi^t it downloaded
    in round 0, where the meta-update starts from."""

    initial: StateDict


# -- the outer algorithm: T meta-training episodes -----------------------------------------------
@register("frl", help="FRL: meta-train an initial model for R-round FL (prototype loss + GPAL, Alg. 1)")
class FRL(Algorithm[FRLOptions]):
    """One simulator round = one meta-training episode of R + 1 rounds (module docstring)."""
    secure_sum = None
    secure_sum_refused = ("its rounds nest R rounds of FL and a meta-update, and GPAL aggregates "
                          "prototypes: not one masked sum per round (not covered yet)")
    dp_refused = ("covered with classifier: distance (GPAL), central-dp with a fixed clip, our "
                  "extension: every inner round's model update and prototypes and the meta-update's "
                  "update, one joint clip per release, R + 1 releases an episode accounted, deployment "
                  "groups outside the federation; classifier: linear first asks the participants which "
                  "classes they hold and releases their union un-noised")

    def __init__(self, options: FRLOptions, context: Context) -> None:
        super().__init__(options, context)
        self.prototype_fl = PrototypeFL(options, context)
        #: rows of phi's meta-learned head (|C_b|, enough for any episode), None: phi is an encoder
        self.head_rows: int | None = None
        if options.classifier == "linear" and options.head_init == "meta":
            self.head_rows = len(context.train_classes)
            if options.deployment.classes > self.head_rows:
                raise ValueError(
                    f"algorithm.options.deployment.classes={options.deployment.classes} exceeds the "
                    f"{self.head_rows} preparation classes, the rows of the meta-learned head (head_init: meta); "
                    "use head_init: xavier"
                )
        fl_class = LinearFL if self.head_rows is None else MetaHeadLinearFL
        self.linear_fl = LinearDeployment(options.train_options(), context, fl_class)
        self.model = context.make_model(self.head_rows)  # phi: an encoder, and the meta-learned head
        #: Client-level DP (our extension, :mod:`fedfew.privacy.mechanism`): the simulator hands it over,
        #: since the episode's R + 1 rounds are played here. None: no privacy.
        self.privacy: PrivateAggregation | None = None

    @property
    def dp_upload(self) -> str | None:  # type: ignore[override]
        """GPAL (``classifier: distance``): each release's model update and prototypes, clipped together.
        The linear variant is refused: its first exchange releases the union of the participants' classes."""
        return "frl-prototypes" if self.options.classifier == "distance" else None

    @property
    def dp_releases(self) -> int:
        """What an episode releases to its participants: R inner rounds and the meta-update."""
        return self.options.rounds + 1

    def inner_algorithm(self, num_classes: int) -> DeploymentAlgorithm:
        return self.prototype_fl if self.options.classifier == "distance" else self.linear_fl(num_classes)

    def init_server(self, generator: torch.Generator) -> FRLServer:
        return {"model": get_state(self.context.make_model(self.head_rows))}

    def client_part(self, name: str, **args: Any) -> Algorithm:
        """"inner": the inner FL of an episode (``classes``: the linear head's width; ``keep_initial``:
        round 0, whose clients keep the phi^t they download); "classes": the linear variant's
        question to the participants of which classes they hold."""
        if name == "inner":
            return EpisodeRound(self.inner_algorithm(int(args.get("classes", 0))), list(self.model.state_dict()),
                                bool(args.get("keep_initial", False)))
        if name == "classes":
            return ReportClasses(self.options, self.context)
        return super().client_part(name, **args)

    # -- one episode ------------------------------------------------------------------------
    def play_round(self, server: FRLServer, engine: Engine, selected: Sequence[int], round_index: int) -> RoundOutcome:
        opts = self.options
        phi: StateDict = server["model"]
        episode = str(round_index)
        namespace = f"frl/{episode}"  # the participants' memory of this episode (phi^t), dropped after it
        down = up = 0
        classes: list[int] | None = None
        if opts.classifier == "linear":  # the head spans the classes the participants hold: ask them
            asked = run_round(engine, self, {}, selected, round_index, f"{episode}/classes", part="classes")
            down, up = asked.bytes_down, asked.bytes_up
            classes = [int(c) for c in asked.server.get("classes", [])]
            if not classes:  # nobody answered: the episode cannot start
                return RoundOutcome(server, {}, down, up, asked.asked, asked.failed, asked.late)
        num_classes = len(classes) if classes is not None else 0
        split: dict[str, object] = {"episode": episode, "fraction": opts.support_fraction, "classes": classes}
        if classes is not None and self.head_rows is not None:  # MAML-style labels on phi's head rows
            tau = opts.deployment.classes
            rows = task_label_rows(len(classes), tau, torch_generator(engine.seed, "frl-labels", episode))
            num_classes = max(len(classes), tau)
            split.update(rows=rows.tolist(), width=num_classes)
        inner = self.inner_algorithm(num_classes)
        inner_server = inner.start(phi, num_classes, torch_generator(engine.seed, "frl-episode", episode))
        private = self.privacy
        if private is not None:  # every release of the episode is clipped and noised with the run's clip
            inner_server = {**inner_server, STATE_KEY: server[STATE_KEY]}
        inner_metrics: dict[str, float] = {}
        for r in range(opts.rounds):  # lines 6-14: R rounds of FL on the support sets
            outcome = run_round(engine, self, inner_server, selected, round_index, f"{episode}/r{r}",
                                part="inner", part_args={"classes": num_classes, "keep_initial": r == 0},
                                view="frl-split", view_args={**split, "half": "support"}, namespace=namespace,
                                privacy=private)
            inner_server = outcome.server
            down, up = down + outcome.bytes_down, up + outcome.bytes_up
            for k in ("loss", "gpal_loss"):
                values = [res.metrics[k] for res in outcome.results.values() if k in res.metrics]
                if values:
                    inner_metrics[f"round{r}_{k}"] = sum(values) / len(values)
        meta_server: MetaRoundServer = {"model": phi, "adapted": inner_server["model"], "prototypes": inner_server.get("prototypes")}
        if private is not None:  # the clients' updates are phi_k - phi^t: they are sent phi^t to measure them
            meta_server = {**meta_server, REFERENCE: True, STATE_KEY: server[STATE_KEY]}
        # Each participant reads the phi^t it kept in round 0 from its private state (namespace).
        outcome = run_round(engine, self, meta_server, selected, round_index, f"{episode}/meta",
                            view="frl-split", view_args={**split, "half": "query"}, namespace=namespace,
                            privacy=private)
        for res in outcome.results.values():
            res.metrics.update(inner_metrics)
        if private is None:
            return RoundOutcome({"model": outcome.server["model"]}, outcome.results, down + outcome.bytes_down,
                                up + outcome.bytes_up, outcome.asked, outcome.failed, outcome.late)
        return RoundOutcome({"model": outcome.server["model"], STATE_KEY: server[STATE_KEY]},
                            outcome.results, down + outcome.bytes_down, up + outcome.bytes_up, outcome.asked,
                            outcome.failed, outcome.late, outcome.privacy)

    # -- the meta-update round (lines 15-20) -------------------------------------------------
    def broadcast(self, server: MetaRoundServer, client_id: int) -> Payload:
        payload: Payload = {"model": server["adapted"]}
        prototypes = server.get("prototypes")
        if prototypes is not None:
            payload["prototypes"] = {k: prototypes[k] for k in ("classes", "prototypes")}
        if server.get(REFERENCE):  # private: phi^t, what the clipped update phi_k - phi^t is measured from
            payload[REFERENCE] = server["model"]
        return payload

    def adapted_model(self, adapted: StateDict) -> FewShotModel:
        if self.options.classifier == "distance":
            return load_state_(self.prototype_fl.model, adapted)
        return load_state_(self.linear_fl(int(adapted["head.weight"].shape[0])).model, adapted)

    def query_loss(self, model: FewShotModel, query: LabelledDataset, batch: torch.Tensor | None,
                   support: LabelledDataset | None, global_prototypes: Prototypes | None) -> tuple[torch.Tensor, float]:
        """L_Q: the variant's loss on the query set (or one query minibatch) and its accuracy."""
        labels = query.labels if batch is None else query.labels[batch]
        if self.options.classifier == "linear":
            args: tuple[torch.Tensor, ...] = (query.inputs,) if query.lengths is None else (query.inputs, query.lengths)
            if batch is not None:
                args = tuple(a[batch] for a in args)
            logits = model(*args)
            return F.cross_entropy(logits, labels), float((logits.argmax(-1) == labels).float().mean())
        features = features_of(model, query, batch)
        if self.options.query_prototypes == "query":
            classes, targets = torch.unique(labels, return_inverse=True)
            prototypes = class_means(features, targets, len(classes))
        else:
            if support is None:
                raise ValueError("query_prototypes: support needs the support set")
            classes, support_targets = torch.unique(support.labels, return_inverse=True)
            prototypes = class_means(features_of(model, support), support_targets, len(classes))
            targets = rows_of(classes, labels)
        logits = -squared_distances(features, prototypes)
        loss = distance_loss(logits, targets, self.options.eq2_classes)
        gpal = None
        if global_prototypes is not None and self.options.gamma < 1:
            gpal = gpal_loss(features, labels, global_prototypes, self.options.eq2_classes)
        loss = gpal_objective(loss, gpal, self.options.gamma, self.options.gpal_form)
        return loss, float((logits.argmax(-1) == targets).float().mean())

    def client_update(self, payload: Payload, state: EpisodeMemory | None, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        """phi_k = phi^t - beta (grad L_Q(theta^R) + weight_decay phi^t) (line 19); with
        ``extra_query_steps``, further SGD steps on the remaining query minibatches (authors' code)."""
        opts = self.options
        if state is None:  # missed round 0 of the episode (a fault): it holds no phi^t to update
            return ClientResult.sat_out(None)
        phi: StateDict = state["initial"]
        query, support = data.train, data.val
        if len(query) == 0:  # every class had a single sample, all in support: nothing to meta-learn from
            return ClientResult.sat_out(state)
        model = self.adapted_model(payload["model"])
        model.train()
        global_prototypes = payload.get("prototypes")
        batches = minibatches(len(query), opts.batch_size, generator) if opts.extra_query_steps else [None]
        loss, accuracy = self.query_loss(model, query, batches[0], support, global_prototypes)
        names = [n for n, p in model.named_parameters() if n in phi and p.requires_grad]  # a frozen table stays
        params = dict(model.named_parameters())
        grads = torch.autograd.grad(loss, [params[n] for n in names])
        updated = {name: tensor.clone() for name, tensor in phi.items()}
        with torch.no_grad():
            for name, grad in zip(names, grads):
                updated[name] -= opts.meta_lr * (grad + opts.weight_decay * phi[name])
        metrics = {"query_loss": float(loss.detach()), "query_accuracy": accuracy}
        if len(batches) > 1:
            model = load_state_(self.model, updated)
            optimizer = make_optimizer("sgd", model.parameters(), opts.meta_lr, 0.0, opts.weight_decay)
            for batch in batches[1:]:
                extra, _ = self.query_loss(model, query, batch, support, global_prototypes)
                optimizer.zero_grad(set_to_none=True)
                extra.backward()
                optimizer.step()
            updated = get_state(model)
        return ClientResult(upload={"model": updated}, state=state, metrics=metrics,
                            num_samples=len(query) + (len(support) if support is not None else 0))

    def aggregate(self, server: MetaRoundServer, results: dict[int, ClientResult],
                  generator: torch.Generator) -> FRLServer:
        sent = [results[c] for c in sorted(results) if "model" in results[c].upload]
        if not sent:
            return {"model": server["model"]}
        weights = weights_for(self.options.aggregation, [r.num_samples for r in sent], [0] * len(sent))
        phi = weighted_average([r.upload["model"] for r in sent], weights)
        if self.head_rows is not None:  # the episode moved the first rows of the head; the rest keep theirs
            phi = merged_head(server["model"], phi)
        return {"model": phi}

    # -- deployment (section 2.3) ------------------------------------------------------------
    def evaluate(self, server: FRLServer, data: EvalData, generator: torch.Generator) -> dict[str, float]:
        tau = self.options.deployment.classes
        return evaluate_deployment(self.inner_algorithm(tau), server["model"], self.options.deployment,
                                   self.options.rounds, data, self.context)
