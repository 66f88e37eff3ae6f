"""FRL: few-round learning (Park, Han, Kim, Seo and Moon, "Few-Round Learning for Federated
Learning", NeurIPS 2021), with prototype aggregation (GPAL).

FRL prepares an initial model phi such that any new group of clients, possibly holding classes never
seen, reaches a good global model within R rounds of FL. Preparation (Algorithm 1) is meta-learning
by FL over N participants; one simulator round is one meta-training episode t:

1. the server draws K participants (the simulator's client schedule);
2. each splits its local data D_k into a support set S_k and a query set Q_k (half of each class);
3. theta^0 = phi^t, then R rounds of FL on the support sets (:class:`PrototypeFL`, one
   :func:`~fedfew.engine.simulator.run_round` each). In round r client k

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

Deployment (section 2.3, :mod:`fedfew.deployment`): from phi^T a new group of K clients holding tau
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

from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from fedfew.algorithms.common import TrainOptions, make_optimizer, minibatches
from fedfew.data.dataset import LabelledDataset
from fedfew.deployment import (
    DeploymentAlgorithm,
    DeploymentOptions,
    LinearDeployment,
    LinearFL,
    evaluate_deployment,
    relabelled,
)
from fedfew.engine.aggregation import weighted_average, weights_for
from fedfew.engine.algorithm import Algorithm, ClientData, ClientResult, Context, EvalData, Options, register
from fedfew.engine.simulator import RoundOutcome, run_round
from fedfew.engine.state import StateDict, get_state, load_state_
from fedfew.engine.tasks import DATA_VIEWS
from fedfew.models.base import FewShotModel
from fedfew.seeding import seed_torch_init, torch_generator

Prototypes = dict[str, torch.Tensor]  # {"classes": [c] class ids, "prototypes": [c, d], "counts": [c]}


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
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions, description=(
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


# -- the mathematics ------------------------------------------------------------------------------
def squared_distances(features: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """||f_i - p_j||^2: [n, c]. Written out rather than with cdist, whose gradient is NaN at zero
    distance (a one-sample class in a minibatch is its own prototype)."""
    return (features.unsqueeze(1) - prototypes.unsqueeze(0)).pow(2).sum(-1)


def class_means(features: torch.Tensor, targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Eq. 1: the mean feature of each class 0..num_classes-1 (every class must occur)."""
    sums = torch.zeros(num_classes, features.shape[1], dtype=features.dtype).index_add(0, targets, features)
    counts = torch.bincount(targets, minlength=num_classes)
    if bool((counts == 0).any()):
        raise ValueError("a class has no sample to make a prototype of")
    return sums / counts.unsqueeze(1).to(features.dtype)


def distance_loss(logits: torch.Tensor, targets: torch.Tensor, classes: Literal["all", "others"] = "all") -> torch.Tensor:
    """Eq. 2's loss from logits = -d(g(x), prototypes), averaged over the rows:
    ``all`` (ours, ProtoNet's): d_y + log sum_{c'} exp(-d_c'), the cross-entropy of the softmax;
    ``others`` (eq. 2 as printed): d_y + log sum_{c' != y} exp(-d_c'), unbounded below (scaling the
    features up drives it to -inf once a sample is nearer its own prototype than any other); with
    a single prototype the log-sum term is empty and dropped."""
    if classes == "all":
        return F.cross_entropy(logits, targets)
    own = logits.gather(1, targets.unsqueeze(1)).squeeze(1)
    if logits.shape[1] < 2:
        return (-own).mean()
    others = logits.masked_fill(F.one_hot(targets, logits.shape[1]).bool(), float("-inf"))
    return (torch.logsumexp(others, dim=1) - own).mean()


def prototype_loss(features: torch.Tensor, targets: torch.Tensor, prototypes: torch.Tensor,
                   classes: Literal["all", "others"] = "all") -> torch.Tensor:
    """Eq. 2 (and, with the global prototypes, L_aux of eq. 3) over negative squared distances to the
    prototypes (see :func:`distance_loss`); ``targets`` index rows of ``prototypes``."""
    return distance_loss(-squared_distances(features, prototypes), targets, classes)


def rows_of(classes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Position of each label in the sorted ``classes`` (an error if some label is absent)."""
    rows = torch.searchsorted(classes, labels).clamp_max(len(classes) - 1)
    if not bool((classes[rows] == labels).all()):
        raise ValueError("a sample's class has no global prototype")
    return rows


def gpal_loss(features: torch.Tensor, labels: torch.Tensor, global_prototypes: Prototypes,
              classes: Literal["all", "others"] = "all") -> torch.Tensor:
    """L_aux of eq. 3: the prototype loss against the previous round's global prototypes of all classes."""
    rows = rows_of(global_prototypes["classes"], labels)
    return prototype_loss(features, rows, global_prototypes["prototypes"], classes)


def gpal_objective(local: torch.Tensor, aux: torch.Tensor | None, gamma: float,
                   form: Literal["convex", "additive"] = "convex") -> torch.Tensor:
    """Eq. 3: f = gamma L_local + (1 - gamma) L_aux (``convex``, the paper) or L_local + (1 - gamma)
    L_aux (``additive``, the authors' code); f = L_local where there is no L_aux (round 0) or gamma = 1."""
    if aux is None or gamma >= 1:
        return local
    return (gamma if form == "convex" else 1.0) * local + (1.0 - gamma) * aux


def features_of(model: FewShotModel, data: LabelledDataset, index: torch.Tensor | None = None) -> torch.Tensor:
    if index is None:
        return model.features(data.inputs) if data.lengths is None else model.features(data.inputs, data.lengths)
    if data.lengths is None:
        return model.features(data.inputs[index])
    return model.features(data.inputs[index], data.lengths[index])


def local_prototypes(model: FewShotModel, data: LabelledDataset) -> Prototypes:
    """A client's prototypes of each class it holds (eq. 1), with the class counts |S_{k,n}|."""
    classes, targets = torch.unique(data.labels, return_inverse=True)
    with torch.no_grad():
        prototypes = class_means(features_of(model, data), targets, len(classes))
    return {"classes": classes, "prototypes": prototypes, "counts": torch.bincount(targets).to(prototypes.dtype)}


def aggregate_prototypes(uploads: list[Prototypes], client_weights: torch.Tensor | None = None) -> Prototypes:
    """Global prototypes: for each class, the mean of the clients' prototypes weighted by their class
    counts |S_{k,n}| (``client_weights`` None), or by one weight per client (uniform: all ones)."""
    classes = torch.cat([u["classes"] for u in uploads])
    rows = torch.cat([u["prototypes"] for u in uploads]).to(torch.float64)
    if client_weights is None:
        weights = torch.cat([u["counts"] for u in uploads]).to(torch.float64)
    else:
        weights = torch.cat([w.expand(len(u["classes"])) for u, w in zip(uploads, client_weights.to(torch.float64))])
    merged, position = torch.unique(classes, return_inverse=True)
    sums = torch.zeros(len(merged), rows.shape[1], dtype=torch.float64).index_add(0, position, rows * weights.unsqueeze(1))
    totals = torch.zeros(len(merged), dtype=torch.float64).index_add(0, position, weights)
    dtype = uploads[0]["prototypes"].dtype
    return {"classes": merged, "prototypes": (sums / totals.unsqueeze(1)).to(dtype), "counts": totals.to(dtype)}


def split_support_query(labels: torch.Tensor, fraction: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class, a random ``fraction`` of the positions for support and the rest for query (a class
    with one sample goes to support only)."""
    support, query = [], []
    for cls in torch.unique(labels):
        positions = torch.nonzero(labels == cls).flatten()
        positions = positions[torch.randperm(len(positions), generator=generator, device=generator.device)]
        n = len(positions)
        cut = n if n < 2 else min(max(int(round(fraction * n)), 1), n - 1)
        support.append(positions[:cut])
        query.append(positions[cut:])
    return torch.cat(support).sort().values, torch.cat(query).sort().values


# -- the linear variant's meta-learned head ---------------------------------------------------------
def task_label_rows(num_classes: int, min_rows: int, generator: torch.Generator) -> torch.Tensor:
    """MAML-style labels for a task of ``num_classes`` classes (in sorted class order): distinct rows
    of the head, drawn at random among the first max(num_classes, min_rows). With num_classes >=
    min_rows this is labels 0..N-1 in a random order; a task with fewer classes than a deployment
    group has (min_rows = tau) spreads them over all tau rows, so that every row a group uses is trained."""
    width = max(num_classes, min_rows)
    return torch.randperm(width, generator=generator, device=generator.device)[:num_classes].cpu()


def with_prepared_head(model: torch.nn.Module, prepared: StateDict) -> StateDict:
    """``model``'s state with every tensor from ``prepared``, the head's cut to ``model``'s rows (the
    first rows of the meta-learned head): the meta-learned initialisation of a narrower task."""
    state = get_state(model)
    for name, tensor in state.items():
        source = prepared[name]
        if name.startswith("head."):
            if source.shape[0] < tensor.shape[0]:
                raise ValueError(f"the prepared head has {source.shape[0]} rows, the task needs {tensor.shape[0]}")
            source = source[: tensor.shape[0]]
        state[name] = source.clone()
    return state


def merged_head(full: StateDict, part: StateDict) -> StateDict:
    """``part`` with each head tensor written into the first rows of ``full``'s (rows a task did not
    use keep their values in ``full``)."""
    merged = dict(part)
    for name, tensor in part.items():
        if name.startswith("head.") and tensor.shape != full[name].shape:
            whole = full[name].clone()
            whole[: tensor.shape[0]] = tensor
            merged[name] = whole
    return merged


class MetaHeadStart:
    """Mixin for a :class:`LinearFL`: a group (or an episode) starts from the prepared model's own
    head, cut to its width, instead of a Xavier head."""

    model: torch.nn.Module
    num_classes: int

    def start(self, prepared: StateDict, num_classes: int, generator: torch.Generator) -> dict[str, Any]:
        if num_classes != self.num_classes:
            raise ValueError(f"this LinearFL has a {self.num_classes}-way head, the group has {num_classes} classes")
        return {"model": with_prepared_head(self.model, prepared)}


class MetaHeadLinearFL(MetaHeadStart, LinearFL):
    """FedAvg with cross-entropy from the prepared encoder and head (FRL's linear variant, ``head_init: meta``)."""


# -- the R rounds of FL inside an episode (and at deployment) ----------------------------------
class PrototypeFL(DeploymentAlgorithm):
    """One round of FRL's inner FL: prototype loss (eq. 2) and GPAL combined by eq. 3 locally; models and
    prototypes averaged on the server. Labels are class indices of the episode (or the group)."""

    Options = FRLOptions
    options: FRLOptions

    def __init__(self, options: FRLOptions, context: Context) -> None:
        super().__init__(options, context)
        self.model = context.make_model(None)

    def start(self, prepared: StateDict, num_classes: int, generator: torch.Generator) -> dict[str, Any]:
        return {"model": prepared, "prototypes": None}

    def broadcast(self, server: dict[str, Any], client_id: int) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": server["model"]}
        if server.get("prototypes") is not None:
            payload["prototypes"] = {k: server["prototypes"][k] for k in ("classes", "prototypes")}
        return payload

    def local_loss(self, model: FewShotModel, data: LabelledDataset, batch: torch.Tensor,
                   downloaded: Prototypes | None, global_prototypes: Prototypes | None) -> tuple[torch.Tensor, dict[str, float]]:
        """Eq. 2 on a minibatch, combined with L_aux by eq. 3 when global prototypes were sent (round >= 1)."""
        features = features_of(model, data, batch)
        labels = data.labels[batch]
        if downloaded is not None:  # prototypes of S_k with the downloaded model, held fixed
            targets = rows_of(downloaded["classes"], labels)
            logits = -squared_distances(features, downloaded["prototypes"])
        else:  # the authors' code: prototypes of this minibatch with the current model
            classes, targets = torch.unique(labels, return_inverse=True)
            logits = -squared_distances(features, class_means(features, targets, len(classes)))
        local = distance_loss(logits, targets, self.options.eq2_classes)
        metrics = {"local_loss": float(local.detach()), "accuracy": float((logits.argmax(-1) == targets).float().mean())}
        gpal = None
        if global_prototypes is not None and self.options.gamma < 1:
            gpal = gpal_loss(features, labels, global_prototypes, self.options.eq2_classes)
            metrics["gpal_loss"] = float(gpal.detach())
        loss = gpal_objective(local, gpal, self.options.gamma, self.options.gpal_form)
        metrics["loss"] = float(loss.detach())
        return loss, metrics

    def client_update(self, payload: dict[str, Any], state: Any, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        opts = self.options
        model = load_state_(self.model, payload["model"])
        model.train()
        support = data.train
        downloaded = local_prototypes(model, support) if opts.local_prototypes == "downloaded" else None
        global_prototypes = payload.get("prototypes")
        optimizer = make_optimizer("sgd", model.parameters(), opts.lr, opts.momentum, opts.weight_decay)
        sums: dict[str, float] = {}
        steps = 0
        for _ in range(opts.local_epochs):
            for batch in minibatches(len(support), opts.batch_size, generator):
                loss, metrics = self.local_loss(model, support, batch, downloaded, global_prototypes)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                steps += 1
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
        upload = {"model": get_state(model), "prototypes": local_prototypes(model, support)}
        return ClientResult(upload=upload, state=state, metrics={k: v / steps for k, v in sums.items()},
                            num_samples=len(support))

    def aggregate(self, server: dict[str, Any], results: dict[int, ClientResult],
                  generator: torch.Generator) -> dict[str, Any]:
        sent = [results[c] for c in sorted(results)]
        weights = weights_for(self.options.aggregation, [r.num_samples for r in sent], [0] * len(sent))
        uniform = torch.ones(len(sent)) if self.options.aggregation == "uniform" else None
        return {"model": weighted_average([r.upload["model"] for r in sent], weights),
                "prototypes": aggregate_prototypes([r.upload["prototypes"] for r in sent], uniform)}

    @torch.no_grad()
    def classify(self, server: dict[str, Any], data: LabelledDataset) -> torch.Tensor:
        """Negative squared distance of each sample's features (global model) to the global
        prototypes; a class with no global prototype gets -inf."""
        if server.get("prototypes") is None:
            raise ValueError("no global prototypes yet: deployment needs at least one round")
        model = load_state_(self.model, server["model"])
        model.train()
        found = server["prototypes"]
        logits = torch.full((len(data), data.num_classes), float("-inf"))
        logits[:, found["classes"]] = -squared_distances(features_of(model, data), found["prototypes"])
        return logits


# -- the episode's pieces that run on the clients ---------------------------------------------------
@DATA_VIEWS.register("frl-split", help="FRL: a client's support or query half of its data for one episode")
def frl_split(data: ClientData, *, seed: int, round_key: str, episode: str, fraction: float, half: str,
              classes: list[int] | None = None, rows: list[int] | None = None, width: int | None = None) -> ClientData:
    """Step 2 of an episode: each class of the client's data split into support and query with the
    client's generator for the episode; labels stay global class ids, or become indices of
    ``classes`` (the linear variant's head), or, with ``rows``, the head row ``rows[i]`` of
    ``classes[i]`` among ``width`` (the meta-learned head's MAML-style labels). The query half
    carries the support half as ``val``."""
    local = data.train
    s, q = split_support_query(local.labels, fraction, torch_generator(seed, "frl-support-query", episode,
                                                                        data.client_id))
    if classes is None:
        support, query = local.subset(s), local.subset(q)
    else:
        order = torch.as_tensor(classes, dtype=torch.long)
        support, query = relabelled(local, s, order), relabelled(local, q, order)
        if rows is not None:
            support, query = on_rows(support, rows, width), on_rows(query, rows, width)
    if half == "support":
        return ClientData(data.client_id, support)
    if half == "query":
        return ClientData(data.client_id, query, val=support)
    raise ValueError(f"frl-split: half must be 'support' or 'query', not {half!r}")


def on_rows(data: LabelledDataset, rows: list[int], width: int | None) -> LabelledDataset:
    """``data`` (labels 0..c-1) with label i moved to head row ``rows[i]`` of ``width`` rows."""
    width = width if width is not None else max(rows) + 1
    names = [f"(row {r})" for r in range(width)]
    for i, r in enumerate(rows):
        names[r] = data.class_names[i]
    return LabelledDataset(inputs=data.inputs, labels=torch.as_tensor(rows, dtype=torch.long)[data.labels],
                           class_names=names, name=data.name, lengths=data.lengths)


class EpisodeRound(Algorithm):
    """A round of an episode's inner FL: the inner algorithm, whose clients also remember, in round 0,
    the encoder phi^t they downloaded (the private state the meta-update starts from)."""

    def __init__(self, inner: DeploymentAlgorithm, phi_keys: list[str], keep_initial: bool) -> None:
        super().__init__(inner.options, inner.context)
        self.inner, self.phi_keys, self.keep_initial = inner, phi_keys, keep_initial

    def broadcast(self, server: dict[str, Any], client_id: int) -> dict[str, Any]:
        return self.inner.broadcast(server, client_id)

    def client_update(self, payload: dict[str, Any], state: Any, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        result = self.inner.client_update(payload, None, data, generator)
        if self.keep_initial:
            state = {"initial": {k: payload["model"][k] for k in self.phi_keys}}
        result.state = state
        return result

    def aggregate(self, server: dict[str, Any], results: dict[int, ClientResult],
                  generator: torch.Generator) -> dict[str, Any]:
        return self.inner.aggregate(server, results, generator)


class ReportClasses(Algorithm):
    """The linear variant's first exchange of an episode: each participant reports the classes it
    holds, and the server takes their union (the width of the episode's head)."""

    def broadcast(self, server: dict[str, Any], client_id: int) -> dict[str, Any]:
        return {}

    def client_update(self, payload: dict[str, Any], state: Any, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        return ClientResult(upload={"classes": torch.unique(data.train.labels)}, state=state,
                            num_samples=data.num_samples)

    def aggregate(self, server: dict[str, Any], results: dict[int, ClientResult],
                  generator: torch.Generator) -> dict[str, Any]:
        return {"classes": torch.unique(torch.cat([r.upload["classes"] for r in results.values()]))}


# -- the outer algorithm: T meta-training episodes -----------------------------------------------
@register("frl", help="FRL: meta-train an initial model for R-round FL (prototype loss + GPAL, Alg. 1)")
class FRL(Algorithm):
    """One simulator round = one meta-training episode of R + 1 rounds (module docstring)."""

    Options = FRLOptions
    options: FRLOptions

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

    def inner_algorithm(self, num_classes: int) -> DeploymentAlgorithm:
        return self.prototype_fl if self.options.classifier == "distance" else self.linear_fl(num_classes)

    def init_server(self, generator: torch.Generator) -> dict[str, Any]:
        seed_torch_init(generator)
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
    def play_round(self, server: dict[str, Any], engine: Any, selected: Any, round_index: int) -> RoundOutcome:
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
        split: dict[str, Any] = {"episode": episode, "fraction": opts.support_fraction, "classes": classes}
        if classes is not None and self.head_rows is not None:  # MAML-style labels on phi's head rows
            tau = opts.deployment.classes
            rows = task_label_rows(len(classes), tau, torch_generator(engine.seed, "frl-labels", episode))
            num_classes = max(len(classes), tau)
            split.update(rows=rows.tolist(), width=num_classes)
        inner = self.inner_algorithm(num_classes)
        inner_server = inner.start(phi, num_classes, torch_generator(engine.seed, "frl-episode", episode))
        inner_metrics: dict[str, float] = {}
        for r in range(opts.rounds):  # lines 6-14: R rounds of FL on the support sets
            outcome = run_round(engine, self, inner_server, selected, round_index, f"{episode}/r{r}",
                                part="inner", part_args={"classes": num_classes, "keep_initial": r == 0},
                                view="frl-split", view_args={**split, "half": "support"}, namespace=namespace)
            inner_server = outcome.server
            down, up = down + outcome.bytes_down, up + outcome.bytes_up
            for k in ("loss", "gpal_loss"):
                values = [res.metrics[k] for res in outcome.results.values() if k in res.metrics]
                if values:
                    inner_metrics[f"round{r}_{k}"] = sum(values) / len(values)
        meta_server = {"model": phi, "adapted": inner_server["model"], "prototypes": inner_server.get("prototypes")}
        # Each participant reads the phi^t it kept in round 0 from its private state (namespace).
        outcome = run_round(engine, self, meta_server, selected, round_index, f"{episode}/meta",
                            view="frl-split", view_args={**split, "half": "query"}, namespace=namespace)
        for res in outcome.results.values():
            res.metrics.update(inner_metrics)
        return RoundOutcome({"model": outcome.server["model"]}, outcome.results, down + outcome.bytes_down,
                            up + outcome.bytes_up, outcome.asked, outcome.failed, outcome.late)

    # -- the meta-update round (lines 15-20) -------------------------------------------------
    def broadcast(self, server: dict[str, Any], client_id: int) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": server["adapted"]}
        if server.get("prototypes") is not None:
            payload["prototypes"] = {k: server["prototypes"][k] for k in ("classes", "prototypes")}
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
            args = (query.inputs,) if query.lengths is None else (query.inputs, query.lengths)
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

    def client_update(self, payload: dict[str, Any], state: Any, data: ClientData,
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

    def aggregate(self, server: dict[str, Any], results: dict[int, ClientResult],
                  generator: torch.Generator) -> dict[str, Any]:
        sent = [results[c] for c in sorted(results) if "model" in results[c].upload]
        if not sent:
            return {"model": server["model"]}
        weights = weights_for(self.options.aggregation, [r.num_samples for r in sent], [0] * len(sent))
        phi = weighted_average([r.upload["model"] for r in sent], weights)
        if self.head_rows is not None:  # the episode moved the first rows of the head; the rest keep theirs
            phi = merged_head(server["model"], phi)
        return {"model": phi}

    # -- deployment (section 2.3) ------------------------------------------------------------
    def evaluate(self, server: dict[str, Any], data: EvalData, generator: torch.Generator) -> dict[str, float]:
        tau = self.options.deployment.classes
        return evaluate_deployment(self.inner_algorithm(tau), server["model"], self.options.deployment,
                                   self.options.rounds, data, self.context)
