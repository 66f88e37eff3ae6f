"""FRL's deployment stage (Park et al. 2021, section 2.3), shared by FRL and its baselines.

A *deployment group* is K new clients holding tau classes (by default all unseen in preparation).
Starting from a prepared model, the group runs R rounds of FL; the resulting global model then
classifies the pooled query set of all K clients. The score of a method is the mean accuracy over G
groups with its 95% confidence interval.

The groups are drawn from ``(seed, split, group index)`` only (:func:`draw_groups`), and each
group's R rounds use client generators derived from the same keys, so every method run with the
same seed and the same :class:`DeploymentOptions` is scored on the same clients, the same
support/query splits and the same minibatch orders.

Group structure (the authors' data loaders; the paper's "two shards of one class each"):

* non-IID (default): each chosen class's samples are cut into shards of one class; the K x s shards
  (s = ``shards_per_client``, 2) are dealt at random, s per client (a client may draw two shards of
  one class); each shard is split into support and query (``support_fraction``, half).
* IID: each class's samples are split evenly over the K clients, each part into support and query.

How a method learns in the R rounds and how it classifies is a :class:`DeploymentAlgorithm`: an
ordinary :class:`~fedfew.engine.Algorithm` (run with :func:`~fedfew.engine.round.run_round`)
plus ``start`` (the group's initial server state built from the prepared model) and ``classify``.
:class:`LinearFL` is FedAvg with a Xavier-initialised tau-way linear head, the deployment of the
FedAvg, fine-tuning and one-shot baselines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from pydantic import Field, model_validator

from fedfew.core.seeding import numpy_generator, torch_generator
from fedfew.data.dataset import LabelledDataset
from fedfew.engine.base import Engine, InProcessEngine
from fedfew.engine.round import run_round
from fedfew.fewshot.evaluation import mean_ci95
from fedfew.interface.aggregation import weighted_average
from fedfew.interface.algorithm import (
    Algorithm,
    ClientData,
    ClientResult,
    Context,
    EvalData,
    Options,
    OptionsT,
    Parts,
    Payload,
)
from fedfew.interface.state import StateDict, get_state, load_state_

if TYPE_CHECKING:  # fedfew.algorithms imports its modules, and FRL's imports this one
    from fedfew.algorithms.parts.common import TrainOptions


class DeploymentOptions(Options):
    """The deployment protocol of section 2.3 (defaults: the paper's)."""

    #: G, the number of deployment groups scored (the paper: 1000).
    groups: int = Field(1000, ge=1)
    #: K, the clients of a group.
    clients: int = Field(10, ge=1)
    #: tau, the classes a group holds.
    classes: int = Field(5, ge=2)
    #: How many of the tau classes are seen (preparation) classes; Table 3 uses 3 (2 unseen + 3 seen).
    seen_classes: int = Field(0, ge=0)
    iid: bool = False
    shards_per_client: int = Field(2, ge=1)
    #: Samples of each chosen class used by the group (None: all samples of the scarcest chosen class).
    samples_per_class: int | None = Field(None, ge=2)
    support_fraction: float = Field(0.5, gt=0, lt=1)
    #: R at deployment (None: the method's own R, 3 for the baselines); set it to deploy with a
    #: different R than the model was prepared for.
    rounds: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> DeploymentOptions:
        if self.seen_classes > self.classes:
            raise ValueError(
                f"algorithm.options.deployment.seen_classes={self.seen_classes} exceeds "
                f"deployment.classes={self.classes}"
            )
        return self


@dataclass
class DeploymentGroup:
    """One group: its classes (label j is global class ``classes[j]``) and each client's support and
    query positions in the dataset."""

    classes: torch.Tensor
    support: list[torch.Tensor]
    query: list[torch.Tensor]


# -- drawing the groups ---------------------------------------------------------------------------
def participant_positions(clients: list[ClientData]) -> torch.Tensor:
    """The rows of the loaded dataset that some participant trains on (their subsets keep them)."""
    rows = [torch.arange(len(c.train)) if c.train.positions is None else c.train.positions for c in clients]
    return torch.unique(torch.cat(rows)) if rows else torch.zeros(0, dtype=torch.long)


def held_out_positions(dataset: LabelledDataset, classes: list[int], held: torch.Tensor) -> dict[int, np.ndarray]:
    """For each class in ``classes`` that some preparation client holds (a *seen* class), the
    positions of its samples that no client holds (``held``: the participants' rows of ``dataset``,
    :func:`participant_positions`).

    Seen classes at deployment (Table 3) must not reuse samples a participant trained on."""
    labels = dataset.labels.cpu().numpy()
    taken = np.zeros(len(labels), dtype=bool)
    taken[held.cpu().numpy()] = True
    held_classes = set(np.unique(labels[taken]).tolist())
    out: dict[int, np.ndarray] = {}
    for cls in (c for c in classes if c in held_classes):
        positions = np.flatnonzero(labels == cls)
        out[cls] = positions[~taken[positions]]
    return out


def _split_support_query(positions: np.ndarray, fraction: float, what: str) -> tuple[np.ndarray, np.ndarray]:
    cut = int(round(len(positions) * fraction))
    cut = min(max(cut, 1), len(positions) - 1)
    if len(positions) < 2:
        raise ValueError(
            f"{what} holds {len(positions)} sample(s); a support and a query sample are needed: raise "
            "algorithm.options.deployment.samples_per_class or lower deployment.clients"
        )
    return positions[:cut], positions[cut:]


def draw_group(pools: list[np.ndarray], classes: np.ndarray, options: DeploymentOptions,
               rng: np.random.Generator) -> DeploymentGroup:
    """One group from the chosen classes' available positions (``pools[j]`` for ``classes[j]``)."""
    tau, k = len(classes), options.clients
    per_class = options.samples_per_class or min(len(p) for p in pools)
    taken = [rng.permutation(p)[:per_class] for p in pools]
    support: list[list[np.ndarray]] = [[] for _ in range(k)]
    query: list[list[np.ndarray]] = [[] for _ in range(k)]
    if options.iid:
        for j, samples in enumerate(taken):
            for client, part in enumerate(np.array_split(samples, k)):
                s, q = _split_support_query(part, options.support_fraction, f"client {client}'s share of class {classes[j]}")
                support[client].append(s)
                query[client].append(q)
    else:
        total = k * options.shards_per_client
        if total < tau:
            raise ValueError(
                f"{k} clients x {options.shards_per_client} shards cannot cover {tau} classes: raise "
                "algorithm.options.deployment.clients or shards_per_client, or set deployment.iid"
            )
        shard_class = np.arange(total) % tau  # classes get equal numbers of shards (+-1)
        shards: list[np.ndarray] = []
        for j in range(tau):
            count = int((shard_class == j).sum())
            shards.extend(np.array_split(taken[j], count))
        # shards are listed class by class; shard_class in that order:
        order_class = np.concatenate([np.full(int((shard_class == j).sum()), j) for j in range(tau)])
        deal = rng.permutation(total).reshape(k, options.shards_per_client)
        for client, row in enumerate(deal):
            for shard in row:
                s, q = _split_support_query(shards[shard], options.support_fraction,
                                            f"a shard of class {classes[order_class[shard]]}")
                support[client].append(s)
                query[client].append(q)
    return DeploymentGroup(
        classes=torch.as_tensor(classes, dtype=torch.long),
        support=[torch.from_numpy(np.sort(np.concatenate(s))) for s in support],
        query=[torch.from_numpy(np.sort(np.concatenate(q))) for q in query],
    )


def draw_groups(dataset: LabelledDataset, unseen: list[int], options: DeploymentOptions, seed: int, split: str,
                seen: dict[int, np.ndarray] | None = None) -> list[DeploymentGroup]:
    """G groups of ``options.classes`` classes: ``classes - seen_classes`` from ``unseen`` and
    ``seen_classes`` from ``seen`` (class -> usable positions). Each group depends only on
    ``(seed, split, its index)``, the data and the options."""
    labels = dataset.labels.cpu().numpy()
    need = options.samples_per_class or 2 * options.clients
    unseen_pools = {c: np.flatnonzero(labels == c) for c in unseen}
    unseen_ok = sorted(c for c, p in unseen_pools.items() if len(p) >= need)
    seen_pools = seen or {}
    seen_ok = sorted(c for c, p in seen_pools.items() if len(p) >= need)
    n_unseen = options.classes - options.seen_classes
    if len(unseen_ok) < n_unseen:
        raise ValueError(
            f"deployment on {split}: {n_unseen} unseen classes with at least {need} samples are needed, "
            f"only {len(unseen_ok)} exist; lower algorithm.options.deployment.classes or samples_per_class"
        )
    if len(seen_ok) < options.seen_classes:
        raise ValueError(
            f"deployment on {split}: {options.seen_classes} seen classes with at least {need} samples no "
            f"participant holds are needed, only {len(seen_ok)} exist; lower deployment.seen_classes or "
            "samples_per_class, or give the participants fewer samples (partition.options.shard_size)"
        )
    groups = []
    for g in range(options.groups):
        rng = numpy_generator(seed, "frl-deployment", split, g)
        chosen = list(rng.choice(unseen_ok, n_unseen, replace=False))
        if options.seen_classes:
            chosen += list(rng.choice(seen_ok, options.seen_classes, replace=False))
        classes = np.array(chosen, dtype=np.int64)
        pools = [unseen_pools[c] if c in unseen_pools else seen_pools[c] for c in classes]
        groups.append(draw_group(pools, classes, options, rng))
    return groups


def relabelled(dataset: LabelledDataset, positions: torch.Tensor, classes: torch.Tensor) -> LabelledDataset:
    """The samples at ``positions`` with labels 0..len(classes)-1 in the order of ``classes``."""
    mapping = torch.full((dataset.num_classes,), -1, dtype=torch.long)
    mapping[classes] = torch.arange(len(classes))
    labels = mapping[dataset.labels[positions]]
    if bool((labels < 0).any()):
        raise ValueError("a sample's class is not among the given classes")
    return LabelledDataset(
        inputs=dataset.inputs[positions],
        labels=labels,
        class_names=[dataset.class_names[int(c)] for c in classes],
        name=dataset.name,
        lengths=None if dataset.lengths is None else dataset.lengths[positions],
    )


# -- the methods' side ----------------------------------------------------------------------------
class DeploymentAlgorithm(Algorithm[OptionsT]):
    """An FL algorithm run for R rounds by a deployment group, with the two extra steps the protocol
    needs. ``start`` may ignore parts of the prepared state (a baseline's |C_b|-way head)."""

    def start(self, prepared: StateDict, num_classes: int, generator: torch.Generator) -> Parts:
        raise NotImplementedError

    def classify(self, server: Parts, data: LabelledDataset) -> torch.Tensor:
        """Logits [n, num_classes] of the group's global model for ``data``."""
        raise NotImplementedError


def deploy(algorithm: DeploymentAlgorithm, prepared: StateDict, dataset: LabelledDataset, group: DeploymentGroup,
           rounds: int, seed: int, key: str, context: Context | None = None) -> tuple[float, int]:
    """Run ``rounds`` rounds of ``algorithm`` in ``group`` from ``prepared`` on the configured engine
    (``context.new_federation``; in this process without one); return the pooled query accuracy and
    the bytes exchanged."""
    tau = len(group.classes)
    clients = [ClientData(i, relabelled(dataset, s, group.classes)) for i, s in enumerate(group.support)]
    query = relabelled(dataset, torch.cat(group.query), group.classes)
    server = algorithm.start(prepared, tau, torch_generator(seed, "deploy-start", key))
    if context is not None and context.new_federation is not None:
        engine: Engine = context.new_federation(algorithm, clients)
    else:
        engine = InProcessEngine(algorithm, clients, seed)
    everyone = list(range(len(clients)))
    sent = 0
    with engine:  # the group's own FL; its global model is scored on the server
        for r in range(rounds):
            outcome = run_round(engine, algorithm, server, everyone, r, f"{key}/round{r}")
            engine.end_round(r)
            server = outcome.server
            sent += outcome.bytes_down + outcome.bytes_up
    logits = algorithm.classify(server, query)
    return float((logits.argmax(-1) == query.labels).double().mean()), sent


def deployment_groups(options: DeploymentOptions, data: EvalData,
                      context: Context) -> tuple[LabelledDataset, list[DeploymentGroup]]:
    """The dataset and the groups for evaluation data ``data``: unseen classes are those of its
    fixed episodes' pool (the split's classes), seen ones the preparation classes."""
    if data.episodes is None:
        raise ValueError(
            f"FRL's deployment draws groups from the {data.split} classes of a few-shot task; set task: fewshot"
        )
    dataset = data.episodes.sampler.dataset
    unseen = [int(c) for c in data.episodes.sampler.classes]
    seen = None
    if options.seen_classes:
        held = context.participant_positions
        seen = held_out_positions(dataset, list(context.train_classes),
                                  torch.zeros(0, dtype=torch.long) if held is None else held)
    return dataset, draw_groups(dataset, unseen, options, context.seed, data.split, seen)


def evaluate_deployment(algorithm: DeploymentAlgorithm, prepared: StateDict, options: DeploymentOptions,
                        default_rounds: int, data: EvalData, context: Context) -> dict[str, float]:
    """Section 2.3: mean pooled-query accuracy and 95% CI over the G groups."""
    rounds = default_rounds if options.rounds is None else options.rounds
    dataset, groups = deployment_groups(options, data, context)
    scores, sent = [], 0
    for g, group in enumerate(groups):
        accuracy, group_bytes = deploy(algorithm, prepared, dataset, group, rounds, context.seed,
                                       f"deploy/{data.split}/{g}", context)
        scores.append(accuracy)
        sent += group_bytes
    summary = mean_ci95(scores)
    return {"accuracy": summary.mean, "ci95": summary.ci95, "groups": float(len(groups)),
            "deploy_rounds": float(rounds), "deploy_bytes_per_group": sent / len(groups)}


# -- FedAvg with a fresh linear head: the baselines' deployment --------------------------------
def with_fresh_head(model: torch.nn.Module, prepared: StateDict, generator: torch.Generator) -> StateDict:
    """``model``'s state with every non-head tensor from ``prepared`` and a Xavier-uniform head
    (zero bias): "replace the last layer with a Xavier-initialised N-way layer"."""
    state = get_state(model)
    for name in state:
        if not name.startswith("head.") and name in prepared:
            state[name] = prepared[name].clone()
    if "head.weight" in state:
        weight = state["head.weight"]
        fresh = torch.empty(weight.shape, dtype=weight.dtype, device=generator.device)  # drawn on the CPU
        torch.nn.init.xavier_uniform_(fresh, generator=generator)
        weight.copy_(fresh)
    if "head.bias" in state:
        state["head.bias"].zero_()
    return state


#: The options of a :class:`LinearFL` subclass.
TrainOptionsT = TypeVar("TrainOptionsT", bound="TrainOptions")


class LinearFL(DeploymentAlgorithm[TrainOptionsT]):
    """FedAvg (sample-weighted) with cross-entropy on a tau-way linear head, Xavier-initialised at
    the start of each group; the global model's head classifies."""

    def __init__(self, options: TrainOptionsT, context: Context, num_classes: int) -> None:
        super().__init__(options, context)
        self.num_classes = num_classes
        self.model = context.make_model(num_classes)

    def start(self, prepared: StateDict, num_classes: int, generator: torch.Generator) -> Parts:
        if num_classes != self.num_classes:
            raise ValueError(f"this LinearFL has a {self.num_classes}-way head, the group has {num_classes} classes")
        return {"model": with_fresh_head(self.model, prepared, generator)}

    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        from fedfew.algorithms.parts.common import model_update, train_epochs  # see the TYPE_CHECKING import

        return model_update(self.model, payload, state, data.num_samples,
                            lambda model: train_epochs(model, data.train, data.train.labels, self.options, generator))

    def aggregate(self, server: Parts, results: dict[int, ClientResult],
                  generator: torch.Generator) -> Parts:
        sent = list(results.values())
        return {**server, "model": weighted_average([r.upload["model"] for r in sent], [r.num_samples for r in sent])}

    @torch.no_grad()
    def classify(self, server: Parts, data: LabelledDataset) -> torch.Tensor:
        model = load_state_(self.model, server["model"])
        model.eval()
        args = (data.inputs,) if data.lengths is None else (data.inputs, data.lengths)
        logits = model(*args)
        model.train()
        return logits


class LinearDeployment:
    """One :class:`LinearFL` per number of classes (the head's width), built on first use."""

    def __init__(self, options: TrainOptions, context: Context, fl_class: type[LinearFL] = LinearFL) -> None:
        self.options, self.context, self.fl_class = options, context, fl_class
        self._by_width: dict[int, LinearFL] = {}

    def __call__(self, num_classes: int) -> LinearFL:
        if num_classes not in self._by_width:
            self._by_width[num_classes] = self.fl_class(self.options, self.context, num_classes)
        return self._by_width[num_classes]
