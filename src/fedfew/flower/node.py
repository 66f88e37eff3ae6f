"""A SuperNode's side of fedfew: its algorithm, its own data and its private state.

Flower starts a new ClientApp process for every message, so nothing is kept in globals. What a node
needs between messages lives in two places:

* ``context.state`` (kept by the SuperNode for the run): the run's config, sent once by the server,
  and the client's private state in fedfew's flat form (an ArrayRecord plus its JSON skeleton per
  namespace). It never leaves the node: replies carry uploads and metrics only.
* a cache file on the node's disk (``cache-dir``): the client's own training (and validation) data
  and what building the algorithm needs to know of the dataset, so that later messages read a few
  megabytes instead of loading and partitioning the dataset again.

What a node needs of :mod:`fedfew.run.experiment` (loading the config, building the experiment or its
algorithm, the text model's options) comes as an :class:`~fedfew.engine.base.ExperimentBuilder`
argument: this module sits with the engines, below the experiment, and never imports it.

The node learns who it is from ``--node-config``: ``client-id`` (required), ``data-root`` (its data
folder; default ``$FEDFEW_DATA``, else ``./data``), ``cache-dir`` (default ``$FEDFEW_CACHE/flower``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypedDict, cast, overload

import torch
from flwr.app import ConfigRecord, RecordDict, UserConfig

from fedfew.core.config_schema import ExperimentSchema
from fedfew.core.errors import UsageError
from fedfew.core.jsontypes import JSONObject
from fedfew.data.dataset import LabelledDataset
from fedfew.engine.base import ExperimentBuilder
from fedfew.flower.records import from_records, record_int, to_records
from fedfew.interface import serialize
from fedfew.interface.algorithm import Algorithm, ClientData, EvalData, State
from fedfew.interface.algorithm import Context as AlgorithmContext
from fedfew.interface.compute import Compute
from fedfew.interface.protocol import MAIN

CONFIG_KEY = "fedfew.config.validation"
EPHEMERAL_KEY = "fedfew.ephemeral"


class NodeConfigError(UsageError):
    """A SuperNode's --node-config lacks what fedfew needs."""


def node_settings(node_config: UserConfig) -> tuple[int, str | None, Path]:
    """(client id, data root, cache folder) from a SuperNode's ``--node-config``."""
    if "client-id" not in node_config:
        raise NodeConfigError("this SuperNode was started without --node-config 'client-id=K': fedfew needs each "
                              "node's client id")
    try:
        client_id = int(node_config["client-id"])
    except (TypeError, ValueError):
        raise NodeConfigError(f"--node-config client-id must be an integer, got {node_config['client-id']!r}") from None
    root = node_config.get("data-root")
    cache = node_config.get("cache-dir") or Path(os.environ.get("FEDFEW_CACHE", Path.home() / ".cache" / "fedfew")) / "flower"
    return client_id, (str(root) if root else None), Path(str(cache))


# -- the run's config, kept in context.state ---------------------------------------------------------
def store_config(state: RecordDict, config: JSONObject) -> None:
    state[CONFIG_KEY] = ConfigRecord({"json": json.dumps(config)})


def stored_config(state: RecordDict, builder: ExperimentBuilder) -> ExperimentSchema:
    """The run's config as the server sent it, validated by ``builder``."""
    if CONFIG_KEY not in state:
        raise NodeConfigError("this node has not been sent the run's config (the server's first message)")
    return builder.load_config(json.loads(str(state[CONFIG_KEY]["json"])))


# -- the private state, kept in context.state --------------------------------------------------------
def _keys(namespace: str) -> tuple[str, str]:
    return f"fedfew.state.{namespace}.arrays", f"fedfew.state.{namespace}.meta"


def read_state(state: RecordDict, namespace: str, round_index: int) -> State:
    if namespace != MAIN:
        _drop_stale_ephemeral(state, round_index)
    arrays_key, meta_key = _keys(namespace)
    if meta_key not in state:
        return None
    return from_records(state[arrays_key], state[meta_key])


def write_state(state: RecordDict, namespace: str, round_index: int, value: object) -> None:
    arrays_key, meta_key = _keys(namespace)
    if value is None:
        for key in (arrays_key, meta_key):
            if key in state:
                del state[key]
        return
    arrays, meta = to_records(value)
    state[arrays_key], state[meta_key] = arrays, meta
    if namespace != MAIN:
        known = json.loads(str(state[EPHEMERAL_KEY]["namespaces"])) if EPHEMERAL_KEY in state else []
        state[EPHEMERAL_KEY] = ConfigRecord({"round": round_index,
                                             "namespaces": json.dumps(sorted(set(known) | {namespace}))})


def _drop_stale_ephemeral(state: RecordDict, round_index: int) -> None:
    """Namespaces other than the persistent one live for one top-level round (FRL's episode)."""
    if EPHEMERAL_KEY not in state or record_int(state[EPHEMERAL_KEY]["round"]) == round_index:
        return
    for namespace in json.loads(str(state[EPHEMERAL_KEY]["namespaces"])):
        for key in _keys(namespace):
            if key in state:
                del state[key]
    del state[EPHEMERAL_KEY]


def is_state_key(key: str) -> bool:
    return key.startswith("fedfew.state.")


# -- the node's algorithm and data -----------------------------------------------------------------
@dataclass
class NodeSetup:
    config: ExperimentSchema
    algorithm: Algorithm
    client: ClientData
    compute: Compute


class CachedDataset(TypedDict):
    """A client's dataset as its node's cache file holds it (:func:`cache_client`)."""

    inputs: torch.Tensor
    labels: torch.Tensor
    class_names: list[str]
    name: str
    groups: torch.Tensor | None
    lengths: torch.Tensor | None
    splits: dict[str, list[int]]


class CachedMeta(TypedDict):
    """What the algorithm's inputs are built from on a node (:func:`cache_client`)."""

    input_shape: list[int]
    num_classes: int
    train_classes: list[int]
    dataset_name: str
    model_options: JSONObject
    num_clients: int


class CachedNode(TypedDict):
    """A node's cache file (:func:`cache_client` writes it, :func:`node_setup` reads it)."""

    train: CachedDataset
    val: CachedDataset | None
    meta: CachedMeta


class CachedExperiment(Protocol):
    """What :func:`cache_client` reads of a built experiment (``fedfew.run.experiment.Experiment``, a layer
    above this one)."""

    @property
    def clients(self) -> Sequence[ClientData]: ...
    @property
    def context(self) -> AlgorithmContext: ...
    @property
    def dataset(self) -> LabelledDataset: ...


def _dataset_dict(data: LabelledDataset | None) -> CachedDataset | None:
    if data is None:
        return None
    return {"inputs": data.inputs, "labels": data.labels, "class_names": list(data.class_names), "name": data.name,
            "groups": data.groups, "lengths": data.lengths, "splits": data.splits}


@overload
def _dataset_from(d: CachedDataset) -> LabelledDataset: ...
@overload
def _dataset_from(d: None) -> None: ...
def _dataset_from(d: CachedDataset | None) -> LabelledDataset | None:
    if d is None:
        return None
    return LabelledDataset(inputs=d["inputs"], labels=d["labels"], class_names=d["class_names"], name=d["name"],
                           groups=d["groups"], lengths=d["lengths"], splits=d["splits"])


def _cache_key(config: ExperimentSchema, client_id: int, data_root: str | None) -> str:
    relevant = {k: config.model_dump(mode="json")[k] for k in
                ("seed", "task", "dataset", "splits", "classification", "partition", "model", "episodes")}
    text = json.dumps([relevant, client_id, data_root], sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def with_data_root(config: ExperimentSchema, data_root: str | None) -> ExperimentSchema:
    """The config with this node's data folder (the server's path means nothing here)."""
    return config.model_copy(update={"dataset": config.dataset.model_copy(update={"root": data_root})})


def node_setup(config: ExperimentSchema, client_id: int, data_root: str | None, cache_dir: Path,
               builder: ExperimentBuilder) -> NodeSetup:
    """This client's algorithm and data: from the cache file, or built from the dataset (and cached)."""
    config = with_data_root(config, data_root)
    compute = Compute.from_runtime(config.runtime.device, config.runtime.precision)
    path = cache_dir / f"node-{_cache_key(config, client_id, data_root)}.safetensors"
    if path.is_file():
        try:
            # The file cache_client wrote (one of another form fails below, and is rebuilt).
            cached = cast(CachedNode, serialize.load(path)[0])
            inputs = builder.algorithm_inputs(tuple(cached["meta"]["input_shape"]), cached["meta"]["num_classes"],
                                     list(cached["meta"]["train_classes"]), cached["meta"]["dataset_name"],
                                     cached["meta"]["model_options"], cached["meta"]["num_clients"])
            client = ClientData(client_id, _dataset_from(cached["train"]), _dataset_from(cached["val"]))
            _, algorithm = builder.build_algorithm(config, inputs)
            return NodeSetup(config, algorithm, client, compute)
        except (serialize.StateFormatError, KeyError, TypeError):
            path.unlink(missing_ok=True)  # a stale or broken cache: rebuild it
    experiment = builder.build_experiment(config)
    if not 0 <= client_id < len(experiment.clients):
        raise NodeConfigError(f"client-id {client_id} is outside 0..{len(experiment.clients) - 1} for this config")
    cache_client(config, experiment, client_id, data_root, cache_dir, builder)
    return NodeSetup(config, experiment.algorithm, experiment.clients[client_id], compute)


def cache_client(config: ExperimentSchema, experiment: CachedExperiment, client_id: int, data_root: str | None,
                 cache_dir: Path, builder: ExperimentBuilder) -> Path:
    """Write client ``client_id``'s cache file from a built experiment (what :func:`node_setup` reads):
    the simulation engine writes every client's once, so that its virtual nodes never load the dataset."""
    config = with_data_root(config, data_root)
    path = cache_dir / f"node-{_cache_key(config, client_id, data_root)}.safetensors"
    client = experiment.clients[client_id]
    ctx = experiment.context
    options = builder.text_model_options(experiment.dataset, config.model.name)
    meta = {"input_shape": list(ctx.input_shape), "num_classes": ctx.num_classes,
            "train_classes": list(ctx.train_classes), "dataset_name": experiment.dataset.name,
            "model_options": options, "num_clients": ctx.num_clients}
    serialize.save(path, {"train": _dataset_dict(client.train), "val": _dataset_dict(client.val), "meta": meta})
    return path


def node_evaluation_data(config: ExperimentSchema, data_root: str | None, split: str,
                         builder: ExperimentBuilder) -> EvalData:
    """The fixed evaluation tasks (or labelled set) of ``split``, built as the server builds them:
    a personalised method's clients score their own models on the same tasks."""
    experiment = builder.build_experiment(with_data_root(config, data_root))
    data = experiment.val if split == "val" else experiment.test
    if data is None:
        raise NodeConfigError(f"this config has no {split} data")
    return data

