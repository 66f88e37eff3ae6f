"""From a validated config to a finished run: data, partition, clients, evaluation tasks, algorithm
and simulator, built once (no data is re-read per round)."""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedfew.algorithms import register_all
from fedfew.algorithms.parts.frl_deployment import participant_positions
from fedfew.config.engines import ENGINES
from fedfew.config.validation import ConfigError, ExperimentConfig, HeldOutTest, load_config
from fedfew.core.seeding import numpy_generator
from fedfew.core.signature_options import options_schema
from fedfew.data import LabelledDataset, load_dataset
from fedfew.data.dataset import DataError
from fedfew.data.splits import class_id
from fedfew.engine.base import Engine, EngineSetup, ExperimentBuilder, Faults, InProcessEngine
from fedfew.engine.schedule import round_size
from fedfew.engine.simulator import Simulator
from fedfew.fewshot.corruption import corrupt_data, corrupted_ids, split_options
from fedfew.fewshot.corruption import parse as parse_corruption
from fedfew.fewshot.episodes import (
    EpisodeError,
    EpisodeSampler,
    FixedEpisodes,
    check_eval_classes,
    fixed_episodes,
    load_tasks,
)
from fedfew.fewshot.partition import PARTITIONS, PartitionError, partition
from fedfew.interface.algorithm import Algorithm, ClientData, Context, EpisodeShape, EvalData
from fedfew.interface.compute import Compute
from fedfew.interface.protocol import init_generator, initial_client_state
from fedfew.interface.registration import ALGORITHMS
from fedfew.interface.state_store import ClientStates, RemoteClientStates
from fedfew.interface.static import static_tensors
from fedfew.models import FewShotModel, build_model
from fedfew.models.base import ModelBuildError
from fedfew.privacy import PrivateAggregation, membership

register_all()  # the built-in algorithms, registered before any config names one

logger = logging.getLogger(__name__)

EngineFactory = Callable[["Experiment", ClientStates, Faults, Compute], Engine]


@dataclass
class Experiment:
    config: ExperimentConfig
    dataset: LabelledDataset
    clients: list[ClientData]
    context: Context
    algorithm: Algorithm
    val: EvalData | None
    test: EvalData
    #: Seconds it took to load the data set (reading, and encoding texts with a sentence encoder):
    #: paid once per data set in a batch, so reported beside each run's own seconds, not inside them.
    data_seconds: float = 0.0
    #: Client-level differential privacy (config ``privacy``), or None when it is off.
    privacy: PrivateAggregation | None = None
    #: The rows of the dataset held out from every client as the membership-inference attack's
    #: non-members (``eval.membership_inference``), or None when it is off.
    membership_rows: torch.Tensor | None = None

    def simulator(self, states_dir: Path | None = None, engine_factory: EngineFactory | None = None) -> Simulator:
        """A simulator for this experiment. Client states are kept in memory, or spilled to files in
        ``states_dir`` when ``runtime.client_states`` says so ("auto": above 100 clients)."""
        config, seed = self.config, self.config.seed
        by_id = {c.client_id: c for c in self.clients}
        run_states_dir = states_dir  # the run folder's (an engine's logs go beside it), before any spill folder

        def init_state(cid: int) -> object:
            return initial_client_state(self.algorithm, by_id[cid], init_generator(seed, cid))

        policy = config.runtime.client_states
        spill = policy == "disk" or (policy == "auto" and len(self.clients) > 100)
        if spill and states_dir is None:
            states_dir = Path(tempfile.mkdtemp(prefix="fedfew-states-"))
        states = ClientStates([c.client_id for c in self.clients], init_state, states_dir, spill=spill)
        faults = Faults(config.federation.dropout, config.federation.stragglers)
        compute = Compute.from_runtime(config.runtime.device, config.runtime.precision)
        engine: Engine
        if engine_factory is not None:  # an engine made by its own runtime (the Flower ServerApp)
            engine = engine_factory(self, states, faults, compute)
        elif config.runtime.batch_clients:  # validated: only with runtime.engine: inprocess
            from fedfew.engine.batched import BatchedEngine

            engine = BatchedEngine(self.algorithm, by_id, seed, states, faults, compute, config.runtime.compile)
        else:
            if config.runtime.compile != "off":  # validated: with runtime.engine: inprocess
                compile_model(self.algorithm, config.runtime.compile)
            evals = {d.split: d for d in (self.val, self.test) if d is not None}
            setup = EngineSetup(self.algorithm, by_id, seed, states, faults, compute, evals, self, run_states_dir,
                                NODE_BUILDER)
            engine = ENGINES.get(config.runtime.engine).build(setup, config.engine_options())
        if not engine.holds_states:  # the clients keep their states themselves (Flower nodes)
            states = RemoteClientStates([c.client_id for c in self.clients])
        simulator = Simulator(self.algorithm, self.clients, seed, self.val, self.test, states=states, engine=engine,
                              init_seed=config.model.init_seed, per_class=config.eval.per_class, privacy=self.privacy)
        simulator.record_rows = config.eval.membership_inference is not None  # the attack's members
        return simulator


def compile_model(algorithm: Algorithm, mode: str) -> None:
    """``runtime.compile`` on the sequential path: the algorithm's model called through
    ``torch.compile`` (``nn.Module.compile``: its parameters and state are untouched, only the call
    goes through inductor). Algorithms without a single ``model`` run eager."""
    model = getattr(algorithm, "model", None)
    if isinstance(model, torch.nn.Module):
        model.compile(mode=None if mode == "default" else mode)


@dataclass
class AlgorithmInputs:
    """What building an algorithm needs to know about the data (never the data itself): a Flower
    node rebuilds its algorithm from these and the config."""

    input_shape: tuple[int, ...]
    num_classes: int
    train_classes: list[int]
    dataset_name: str
    model_options: dict[str, Any]  # text models: vocab_size and pretrained vectors
    num_clients: int


def build_algorithm(config: ExperimentConfig, inputs: AlgorithmInputs) -> tuple[Context, Algorithm]:
    make, make_named = _model_factory(config, inputs.input_shape, inputs.model_options)
    context = Context(
        seed=config.seed,
        make_model=make,
        make_model_named=make_named,
        input_shape=inputs.input_shape,
        num_classes=inputs.num_classes,
        train_classes=inputs.train_classes,
        episode=training_episode(config),
        task=config.task,
        extras={"dataset": inputs.dataset_name},
        num_clients=inputs.num_clients,
        num_rounds=config.federation.rounds,
        corrupt_clients=corrupted_ids(config.partition.options),
    )
    cls = ALGORITHMS.get(config.algorithm.name)
    episodes = config.episodes
    for key, given, takes in (("train_way", episodes.train_way, "takes_training_way"),
                              ("train_query", episodes.train_query, "takes_training_query")):
        if given is not None and not getattr(cls, takes, False):
            raise ConfigError(f"episodes.{key}: {config.algorithm.name} trains on episodes of the evaluation's shape; "
                              + ("only a head-less learner (fl-proto) takes a training way of its own"
                                 if key == "train_way" else "only the episodic FedAvg family takes a training query count"))
    try:
        algorithm = cls(config.algorithm_options(), context)
    except ModelBuildError:  # model.options or the data's shape: the message names both, not the algorithm
        raise
    except ValueError as err:  # the algorithm refuses this config (a classification method on few-shot tasks)
        raise ConfigError(f"algorithm.name: {err}") from None
    return context, algorithm


def training_episode(config: ExperimentConfig) -> EpisodeShape:
    """The shape of the clients' training episodes: the evaluation's unless ``episodes.train_way`` or
    ``episodes.train_query`` says otherwise."""
    episodes = config.episodes
    return EpisodeShape(episodes.train_way or episodes.n_way, episodes.k_shot, episodes.train_query or episodes.q_query)


def _model_factory(config: ExperimentConfig, input_shape: tuple[int, ...], extra: Mapping[str, object]):
    device = torch.get_default_device()

    def make_named(name: str, num_classes: int | None, **options: object) -> FewShotModel:
        merged = {**extra, **(config.model.options if name == config.model.name else {}), **options}
        with torch.device("cpu"):  # initialised from the CPU generator: the same numbers on every device
            model = build_model(name, input_shape, num_classes, channels_last=config.model.channels_last, **merged)
        return model.to(device)

    def make(num_classes: int | None) -> FewShotModel:
        return make_named(config.model.name, num_classes)

    return make, make_named


def text_model_options(dataset: LabelledDataset, model_name: str) -> dict[str, Any]:
    """Text encoders need the vocabulary size (and take pretrained vectors if the loader has them)."""
    if not dataset.is_text:
        return {}
    options: dict[str, Any] = {}
    vocab = dataset.extras.get("vocab")
    if vocab is not None:
        options["vocab_size"] = len(vocab)
    if dataset.extras.get("embeddings") is not None:
        options["pretrained"] = dataset.extras["embeddings"]
    return options


def _sample_split(labels: torch.Tensor, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A stratified split of positions into (rest, held-out ``fraction``)."""
    rest, held = [], []
    y = labels.cpu().numpy()
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        cut = int(round(len(idx) * fraction))
        held.append(idx[:cut])
        rest.append(idx[cut:])
    return np.sort(np.concatenate(rest)), np.sort(np.concatenate(held))


def _held_out(dataset: LabelledDataset, spec: HeldOutTest, seed: int) -> tuple[list[int], torch.Tensor]:
    """The test classes and the positions held out for testing (``splits.test: {classes, holdout}``): of each
    listed class, round(holdout x its samples) drawn by a seeded permutation; the rest may train."""
    try:
        classes = sorted({class_id(c, dataset.class_names, "splits.test.classes") for c in spec.classes})
    except DataError as err:
        raise ConfigError(str(err)) from None
    if len(classes) < 2:
        raise ConfigError(f"splits.test.classes: name at least 2 distinct classes (got {spec.classes})")
    rng = numpy_generator(seed, "test-holdout")
    labels = dataset.labels.cpu().numpy()
    held = [rng.permutation(np.flatnonzero(labels == c))[: int(round(spec.holdout * int((labels == c).sum())))]
            for c in classes]
    return classes, torch.from_numpy(np.sort(np.concatenate(held))).to(dataset.labels.device)


_DATASETS: dict[str, tuple[LabelledDataset, float]] | None = None
_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """A warning about the data or config, once per process (validation and the run build alike)."""
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning("%s", message)


@contextlib.contextmanager
def dataset_cache() -> Iterator[None]:
    """Inside this block, each dataset (name, root, options) is loaded once: validating a batch of
    configs and then running them reads the data once."""
    global _DATASETS
    outer = _DATASETS
    _DATASETS = {} if outer is None else outer
    try:
        yield
    finally:
        _DATASETS = outer


def _load(config: ExperimentConfig) -> tuple[LabelledDataset, float]:
    """The data set and the seconds its loading took (when it was loaded, maybe before this run)."""
    d = config.dataset

    def load() -> tuple[LabelledDataset, float]:
        start = time.perf_counter()
        dataset = load_dataset(d.name, d.root, **d.options)
        return dataset, time.perf_counter() - start

    if _DATASETS is None:
        return load()
    key = json.dumps([d.name, d.root, d.options], sort_keys=True, default=str)
    if key not in _DATASETS:
        _DATASETS[key] = load()
    return _DATASETS[key]


def build_experiment(config: ExperimentConfig) -> Experiment:
    """Data, partition, clients, evaluation tasks and algorithm, on ``runtime.device``: tensors made
    here live there; models are built on the CPU (the same initial numbers on any device) and moved."""
    torch.set_num_threads(config.runtime.threads)
    device = Compute.from_runtime(config.runtime.device, config.runtime.precision).device
    with torch.device(device):
        return _build(config, device)


def _build(config: ExperimentConfig, device: torch.device) -> Experiment:
    seed = config.seed
    membership_rows: torch.Tensor | None = None
    dataset, data_seconds = _load(config)
    dataset = dataset.to(device)
    episode = EpisodeShape(config.episodes.n_way, config.episodes.k_shot, config.episodes.q_query)
    val: EvalData | None = None
    if config.task == "fewshot":
        held_out = config.splits.test if isinstance(config.splits.test, HeldOutTest) else None
        for key in ("train", "test") if held_out is None else ("train",):
            split = getattr(config.splits, key)
            if not dataset.splits.get(split):
                sizes = ", ".join(f"{name} {len(classes)}" for name, classes in dataset.splits.items())
                raise ConfigError(f"splits.{key}: dataset {dataset.name!r} has no classes in split {split!r}: it has "
                                  f"{dataset.num_classes} class(es) in all ({sizes}); a few-shot run needs classes in "
                                  f"splits.train and splits.test (more classes, or dataset.options.class_split)")
        train_classes = list(dataset.splits[config.splits.train])
        if held_out is None:
            pool = dataset.split(config.splits.train)
        else:
            test_classes, held_positions = _held_out(dataset, held_out, seed)
            if config.episodes.test_tasks:
                raise ConfigError("episodes.test_tasks: a tasks file fixes its own test samples; it cannot be "
                                  "combined with held-out samples (splits.test: {classes, holdout})")
            train_idx = dataset.indices_of_classes(train_classes)
            pool = dataset.subset(train_idx[~torch.isin(train_idx, held_positions)])
        attack = config.eval.membership_inference
        if attack is not None:  # opt-in: its non-members, kept from every client
            kept_out = torch.from_numpy(membership.hold_out(pool.labels, attack.examples, seed))
            keep = torch.ones(len(pool), dtype=torch.bool)
            keep[kept_out] = False
            membership_rows = pool.subset(kept_out).positions
            pool = pool.subset(torch.nonzero(keep).flatten())
        has_val = bool(config.splits.val and dataset.splits.get(config.splits.val))
        if config.splits.val and not has_val:
            _warn_once(
                f"dataset {dataset.name!r} has no classes in split {config.splits.val!r}, so no round is "
                "selected on validation classes (the last round is reported); hold some out with "
                "dataset.options.class_split, or set splits.val: null to say so")
        try:
            generated = (None if config.episodes.test_tasks or held_out else config.splits.test,
                         config.splits.val if has_val else None)
            for split in generated:  # a test_tasks file fixes its own episodes
                if isinstance(split, str):
                    check_eval_classes(dataset, dataset.splits[split], episode.n_way, episode.k_shot, episode.q_query,
                                       split)
            if held_out is not None:  # the sampler names a class with too few held-out samples
                test = EvalData("test", episodes=FixedEpisodes(
                    EpisodeSampler(dataset, episode.n_way, episode.k_shot, episode.q_query, classes=test_classes,
                                   indices=held_positions), config.episodes.test_episodes, seed, tag="test"))
            elif config.episodes.test_tasks:
                test_classes = dataset.splits[str(config.splits.test)]
                test = EvalData("test", episodes=load_tasks(
                    config.episodes.test_tasks, dataset, test_classes, episode.n_way, episode.k_shot,
                    episode.q_query))
            else:
                test_classes = dataset.splits[str(config.splits.test)]
                test = EvalData("test", episodes=fixed_episodes(
                    dataset, test_classes, episode.n_way, episode.k_shot, episode.q_query,
                    config.episodes.test_episodes, seed, tag="test"))
            if has_val:
                val = EvalData("val", episodes=fixed_episodes(
                    dataset, dataset.splits[str(config.splits.val)], episode.n_way, episode.k_shot, episode.q_query,
                    config.episodes.val_episodes, seed, tag="val"))
        except EpisodeError as err:
            raise ConfigError(f"episodes: {err}") from None
    else:
        train_classes = list(range(dataset.num_classes))
        is_test = dataset.extras.get("is_test")
        if isinstance(is_test, torch.Tensor) and bool(is_test.any()) and bool((~is_test).any()):
            train_idx, test_idx = torch.nonzero(~is_test).flatten(), torch.nonzero(is_test).flatten()
        else:
            rest, held = _sample_split(dataset.labels, config.classification.test_fraction,
                                       numpy_generator(seed, "test-split"))
            train_idx, test_idx = torch.from_numpy(rest), torch.from_numpy(held)
        pool = dataset.subset(train_idx)
        test = EvalData("test", dataset=dataset.subset(test_idx))

    own_options, corrupt_raw = split_options(config.partition.options)
    corrupt = parse_corruption(corrupt_raw, config.partition.num_clients)
    schema = options_schema(PARTITIONS.get(config.partition.name), ("labels", "num_clients", "rng", "groups"))
    options = schema.model_validate(own_options).model_dump(exclude_unset=True)
    if config.partition.name == "natural":
        options["groups"] = None if pool.groups is None else pool.groups.cpu()
    try:
        entropy = config.partition.rng_entropy
        rng = np.random.default_rng(entropy) if entropy is not None else numpy_generator(seed, "partition")
        parts = partition(config.partition.name, pool.labels.cpu(), config.partition.num_clients, rng, **options)
    except PartitionError as err:
        raise ConfigError(f"partition: {err}") from None
    except TypeError as err:
        raise ConfigError(f"partition.options: {err}") from None
    clients = []
    for cid, idx in enumerate(parts):
        local = pool.subset(torch.from_numpy(idx))
        client_val = None
        if config.task == "classification" and config.classification.client_val_fraction > 0:
            rest, held = _sample_split(local.labels, config.classification.client_val_fraction,
                                       numpy_generator(seed, "client-val", cid))
            local, client_val = local.subset(torch.from_numpy(rest)), local.subset(torch.from_numpy(held))
        clients.append(ClientData(cid, local, client_val))
    if corrupt is not None:  # after every other draw: the clean clients and the rest of the run are unchanged
        clients = [corrupt_client(c, corrupt.kind, train_classes, seed) if c.client_id in corrupt.clients else c
                   for c in clients]

    meta = AlgorithmInputs(dataset.input_shape, dataset.num_classes, train_classes, dataset.name,
                           text_model_options(dataset, config.model.name), len(clients))
    context, algorithm = build_algorithm(config, meta)
    if config.eval.per_class and (config.task != "fewshot" or not algorithm.predicts_episodes):
        raise ConfigError(f"eval.per_class: {config.algorithm.name} on a {config.task} task has no per-class "
                          "accuracy (it needs few-shot episodes scored on the server's model, e.g. fl-maml, "
                          "fedfsl-*); set eval.per_class: false")
    if config.eval.membership_inference is not None:
        membership.check(algorithm, config.task)
    context.new_federation = federation_factory(config)
    context.participant_positions = participant_positions(clients)
    privacy = private_aggregation(config, algorithm, len(clients))
    return Experiment(config, dataset, clients, context, algorithm, val, test, data_seconds, privacy, membership_rows)


def private_aggregation(config: ExperimentConfig, algorithm: Algorithm, num_clients: int) -> PrivateAggregation | None:
    """The server side of ``config.privacy`` for ``algorithm`` (None when it is off): refuses an
    algorithm whose upload it cannot cover, and solves a target epsilon's noise multiplier, before any
    round runs."""
    if not config.privacy.enabled:
        return None
    per_round = round_size(num_clients, config.federation.clients_per_round)
    return PrivateAggregation(config.privacy, algorithm, num_clients, per_round, config.federation.rounds,
                              static_tensors(algorithm).keys(), config.flower.secure_aggregation.enabled)


def corrupt_client(client: ClientData, kind: str, classes: list[int], seed: int) -> ClientData:
    """``client`` with its data (and its own validation split) spoiled by ``kind``
    (``partition.options.corrupt``, :mod:`fedfew.fewshot.corruption`)."""
    val = None if client.val is None else corrupt_data(client.val, kind, classes, seed, client.client_id, "val")
    return ClientData(client.client_id, corrupt_data(client.train, kind, classes, seed, client.client_id), val)


def federation_factory(config: ExperimentConfig) -> Callable[[Algorithm, list[ClientData]], Engine]:
    """Engines of the configured kind for federations of new clients an algorithm makes itself
    (FRL's deployment groups), without faults. An engine that runs elsewhere (Flower) has no nodes
    for such clients: they run in the server's process."""
    kind = ENGINES.get(config.runtime.engine)
    compute = Compute.from_runtime(config.runtime.device, config.runtime.precision)
    options = config.engine_options()

    def new_federation(algorithm: Algorithm, clients: list[ClientData]) -> Engine:
        if kind.runs_elsewhere:
            return InProcessEngine(algorithm, clients, config.seed, compute=compute)
        setup = EngineSetup(algorithm, {c.client_id: c for c in clients}, config.seed, None, Faults(), compute)
        return kind.build(setup, options)

    return new_federation


#: What an engine's own nodes need of this module (flower-sim's virtual SuperNodes, the ClientApp):
#: handed to the engines in EngineSetup, which sit below this module and never import it.
NODE_BUILDER = ExperimentBuilder(load_config, build_experiment, AlgorithmInputs, build_algorithm, text_model_options,
                                 where=f"{__name__}:NODE_BUILDER")
