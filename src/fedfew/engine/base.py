"""Engines: where client tasks run. They all sit behind one small interface, so that an algorithm
never knows which one runs it.

* :class:`InProcessEngine` (``runtime.engine: inprocess``): every client in this process, one after
  the other.
* ``workers`` (:mod:`fedfew.engine.workers`): the clients of a round spread over worker processes.
* ``flower`` (:mod:`fedfew.flower`): each client a Flower SuperNode.

**The template.** :meth:`Engine.execute` is written once, here: it draws the client faults
(``federation.dropout``, ``federation.stragglers``) from the seed and the round key, hands the tasks
of the clients that did not fail to :meth:`Engine.deliver` (the one thing an engine implements: how
tasks reach clients and results come back), keeps the new private states, drops the replies of
stragglers and builds the :class:`Replies` with their byte counts. States written to the persistent
namespace during a round become visible to the server side (evaluation, checkpoints) only at
:meth:`Engine.end_round`, so an interrupted round leaves the states of the last finished one.

**Choosing one.** Engines are registered by name in :data:`ENGINES` (``runtime.engine``), with their
options (``runtime.engine_options``) as a pydantic model in ``Options``. An engine built in this
process implements :meth:`Engine.build`; one that runs the whole run in its own processes (Flower)
sets ``runs_elsewhere`` and implements :meth:`Engine.launch`. Adding one is one decorator::

    @ENGINES.register("my-engine", help="one line for `fedfew list engines`")
    class MyEngine(Engine):
        def deliver(self, task, payloads): ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from fedfew.core.errors import RunFailedError
from fedfew.core.registry import Registry
from fedfew.core.seeding import numpy_generator
from fedfew.engine.tasks import ClientTask, run_client_task
from fedfew.interface.algorithm import (
    Algorithm,
    ClientData,
    ClientResult,
    ClientScores,
    EvalData,
    Payload,
)
from fedfew.interface.compute import CPU_FP32, Compute
from fedfew.interface.protocol import MAIN, evaluate_generator
from fedfew.interface.state_store import ClientStates

if TYPE_CHECKING:
    from fedfew.core.config_schema import ExperimentSchema


class EngineError(RunFailedError):
    """An engine could not run a round (a worker died, a Flower node failed); the message says which."""


@dataclass(frozen=True)
class Faults:
    """Simulated client faults: ``dropout`` of the clients asked fail before receiving anything (no
    payload sent, no reply, state unchanged);
    ``stragglers`` of the others reply after the deadline (they trained and keep their new private
    state, but the server has moved on without their reply)."""

    dropout: float = 0.0
    stragglers: float = 0.0

    def draw(self, clients: list[int], seed: int, round_key: str) -> tuple[set[int], set[int]]:
        """(failed, late) among ``clients``: round(fraction x count) of each, chosen with the
        generator of (seed, round key) alone."""
        if not clients or (self.dropout <= 0 and self.stragglers <= 0):
            return set(), set()
        rng = numpy_generator(seed, "faults", round_key)
        order = [clients[i] for i in rng.permutation(len(clients))]
        n_failed, n_late = self.counts(len(clients))
        return set(order[:n_failed]), set(order[n_failed:n_failed + n_late])

    def counts(self, asked: int) -> tuple[int, int]:
        """(failed, late) of ``asked`` clients: round(fraction x asked) each, the late ones capped by
        those left. Validation uses this too, to refuse settings that leave no client to reply."""
        n_failed = int(round(self.dropout * asked))
        n_late = min(int(round(self.stragglers * asked)), asked - n_failed)
        return n_failed, n_late


@dataclass
class Replies:
    """What came back from one task: the replies in time (by client id, ascending) and who failed or
    was late."""

    results: dict[int, ClientResult]
    failed: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)
    #: Bytes actually received (only the replies in time); None: count the uploads' tensors.
    bytes_up: int | None = None
    #: Bytes actually sent; None: count the payloads of the clients that did not fail.
    bytes_down: int | None = None


@dataclass
class Delivery:
    """What an engine's :meth:`Engine.deliver` brings back: the result of every client that replied
    (late ones too; a client missing here failed in transit), and, where the transport counts them,
    the bytes each reply carried up and the bytes sent down."""

    results: dict[int, ClientResult]
    bytes_up: dict[int, int] | None = None
    bytes_down: int | None = None


class NoOptions(BaseModel):
    """An engine without options."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class ExperimentBuilder:
    """What an engine that builds experiments where its clients are (Flower's SuperNodes) needs of
    :mod:`fedfew.run.experiment`, a layer above the engines: handed down in :class:`EngineSetup` (and to
    the ClientApp by its module) instead of imported, so the engines never import up.

    ``where`` names this builder (``"module:attribute"``) for a process that must load it by name:
    a virtual SuperNode of Flower's simulation, which gets no Python object from this process."""

    #: A config (as a dict) validated against the registries: ``config.load_config``.
    load_config: Callable[[dict[str, Any]], ExperimentSchema]
    #: The whole experiment of a config: ``experiment.build_experiment``.
    build_experiment: Callable[[Any], Any]
    #: What building an algorithm needs of the dataset, from its cached values: ``experiment.AlgorithmInputs``.
    algorithm_inputs: Callable[..., Any]
    #: (context, algorithm) of a config and those inputs: ``experiment.build_algorithm``.
    build_algorithm: Callable[[Any, Any], tuple[Any, Algorithm]]
    #: The text model's options of a dataset and model name: ``experiment.text_model_options``.
    text_model_options: Callable[[Any, str], dict[str, Any]]
    where: str


@dataclass
class EngineSetup:
    """What building an engine in this process gets: the algorithm, every client's data, the seed,
    the server side's store of private states, the faults to simulate, where to compute, and the
    evaluation splits (an engine may score evaluation episodes itself)."""

    algorithm: Algorithm
    clients: Mapping[int, ClientData]
    seed: int
    states: ClientStates | None
    faults: Faults
    compute: Compute = CPU_FP32
    evals: Mapping[str, EvalData] = field(default_factory=dict)
    #: The experiment being built and its run folder's states folder (None outside a run folder):
    #: for an engine that starts its own runtime around the experiment (flower-sim).
    experiment: Any = None
    states_dir: Path | None = None
    #: How the engine's own nodes build the experiment (None where the experiment is not built here).
    builder: ExperimentBuilder | None = None


class RunFolderView(Protocol):
    """What an engine that runs the whole run (:meth:`Engine.launch`) uses of its run folder
    (:class:`fedfew.run.folder.RunFolder`, a layer above the engines): where it is, and its status,
    which the run's own processes write (the checkpoints go under its path)."""

    path: Path

    def read_status(self) -> dict[str, Any]: ...

    def set_status(self, status: str, **info: Any) -> None: ...


@dataclass
class Launch:
    """A run handed to an engine that runs it in its own processes (:meth:`Engine.launch`): the
    run folder (config written, status running), its config, and how it is shown."""

    folder: RunFolderView
    config: ExperimentSchema
    progress: bool | None = None
    label: str | None = None
    resume: bool = False


class Engine:
    """The base every engine extends: it owns the fault draw, the late-reply filter, the byte counts
    and the :class:`Replies`; a subclass implements :meth:`deliver`."""

    name: ClassVar[str] = ""
    #: The schema of ``runtime.engine_options`` for this engine (unknown keys are errors).
    Options: ClassVar[type[BaseModel]] = NoOptions
    #: False when the clients keep their private states themselves (Flower nodes): results come
    #: back without a state and nothing is kept on the server side.
    holds_states: ClassVar[bool] = True
    #: True when the engine runs the whole run in its own processes: the runner calls :meth:`launch`
    #: with the run folder instead of building the engine here.
    runs_elsewhere: ClassVar[bool] = False
    #: True when every client update runs through :func:`~fedfew.engine.tasks.run_client_task` where
    #: the client is, which is where differential privacy clips it (config ``privacy``): an engine
    #: that runs client updates some other way refuses a private config.
    honours_privacy: ClassVar[bool] = False

    def __init__(self, algorithm: Algorithm, seed: int, states: ClientStates | None,
                 faults: Faults | None = None, compute: Compute = CPU_FP32) -> None:
        self.algorithm, self.seed, self.states = algorithm, seed, states
        self.faults = faults or Faults()
        self.compute = compute
        self._staged: dict[int, object] = {}  # private states, each in its algorithm's own form
        self._ephemeral: dict[str, dict[int, object]] = {}
        self._round = 0

    # -- choosing and building ------------------------------------------------------------------
    @classmethod
    def build(cls, setup: EngineSetup, options: BaseModel) -> Engine:
        """This engine for an experiment built in this process (``options``: validated ``Options``)."""
        raise EngineError(f"runtime.engine={cls.name} is not built in this process")

    @classmethod
    def launch(cls, run: Launch) -> dict[str, Any]:
        """Run ``run`` in this engine's own processes and return its summary (``runs_elsewhere``)."""
        raise EngineError(f"runtime.engine={cls.name} runs in this process")

    @classmethod
    def check_config(cls, config: ExperimentSchema) -> None:
        """What this engine asks of the rest of a config, beyond its own ``runtime.engine_options``
        (validated by :attr:`Options`): raise ``ValueError`` naming the keys to change. The config check
        (:class:`fedfew.config.validation.ExperimentConfig`) calls it through :data:`ENGINES`, so what only
        an engine knows stays in its class. The base refuses what runs only in the process that reads the
        config (compiled steps, batched clients, a device), which :class:`InProcessEngine` allows."""
        engine = config.runtime.engine
        if config.runtime.compile != "off":
            raise ValueError(f"runtime.compile compiles the clients' step in this process: set runtime.engine: "
                             f"inprocess (got {engine}) or runtime.compile: off")
        if config.runtime.batch_clients:
            raise ValueError("runtime.batch_clients runs a round's clients together in this process: set "
                             "runtime.engine: inprocess")
        if config.runtime.device != "cpu":
            raise ValueError("runtime.device=cuda/auto runs the clients in this process (one GPU): set "
                             "runtime.engine: inprocess")

    # -- the template ---------------------------------------------------------------------------
    def execute(self, task: ClientTask, payloads: Mapping[int, Payload]) -> Replies:
        """Run ``task`` for the clients ``payloads`` names: the replies in time, by client id."""
        asked = sorted(payloads)
        failed, late = self.faults.draw(asked, self.seed, task.round_key)
        delivery = self.deliver(task, {cid: payloads[cid] for cid in asked if cid not in failed})
        if self.holds_states:
            for cid in sorted(delivery.results):
                self.keep_state(task.namespace, cid, delivery.results[cid].state)
        lost = {cid for cid in asked if cid not in failed and cid not in delivery.results}
        in_time = {cid: delivery.results[cid] for cid in sorted(delivery.results) if cid not in late}
        bytes_up = None if delivery.bytes_up is None else sum(delivery.bytes_up.get(cid, 0) for cid in in_time)
        return Replies(in_time, sorted(failed | lost), sorted(late), bytes_up=bytes_up, bytes_down=delivery.bytes_down)

    def deliver(self, task: ClientTask, payloads: Mapping[int, Payload]) -> Delivery:
        """Get ``task`` with each client's payload to the clients of ``payloads`` (none of them a
        simulated failure) and bring back their results (a client's state: its private state as read
        by :meth:`state_of` for the task's namespace)."""
        raise NotImplementedError(f"engine {self.name!r} does not deliver tasks")

    def evaluate_clients(self, server: object, client_states: Mapping[int, object], clients: list[ClientData],
                         data: EvalData) -> dict[int, ClientScores]:
        """Every client's :meth:`~fedfew.engine.Algorithm.evaluate_client` of its own model (clients
        whose state is None have none and are left out), keyed by client id in ascending order. Here
        on the server side, where the states are; the Flower engine asks the nodes."""
        scores: dict[int, ClientScores] = {}
        for client in sorted(clients, key=lambda c: c.client_id):
            state = client_states.get(client.client_id)
            if state is None:
                continue
            payload = self.algorithm.broadcast(server, client.client_id)
            generator = evaluate_generator(self.seed, data.split, client.client_id)
            with self.compute.scope():
                scores[client.client_id] = self.algorithm.evaluate_client(payload, state, client, data, generator)
        return scores

    def episode_scores(self, server: object, data: EvalData) -> list[float]:
        """Every evaluation episode's score of the server's model (``splits_evaluation`` algorithms)."""
        assert data.episodes is not None
        with self.compute.scope():
            return self.algorithm.episode_scores(server, data, range(len(data.episodes)))

    def end_round(self, round_index: int) -> None:
        """Make the round's persistent states visible (version ``round_index + 1``) and drop the
        round's other namespaces."""
        if self.states is not None:
            for cid, state in sorted(self._staged.items()):
                self.states.put(cid, state, version=round_index + 1)
        self._staged.clear()
        self._ephemeral.clear()

    def discard_round(self) -> None:
        """Forget what an unfinished round wrote (an interrupt): the last finished round stands."""
        self._staged.clear()
        self._ephemeral.clear()

    def close(self) -> None:
        """Stop whatever the engine started (processes, servers)."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers for engines that hold states on the server side ----------------------------
    def state_of(self, namespace: str, cid: int) -> object:
        if namespace == MAIN:
            if cid in self._staged:
                return self._staged[cid]
            return None if self.states is None else self.states.get_state(cid)
        return self._ephemeral.get(namespace, {}).get(cid)

    def keep_state(self, namespace: str, cid: int, state: object) -> None:
        if namespace == MAIN:
            self._staged[cid] = state
        else:
            self._ephemeral.setdefault(namespace, {})[cid] = state


#: Every engine by name (``runtime.engine``); ``fedfew list engines`` prints them.
ENGINES: Registry[type[Engine]] = Registry("engine")


@ENGINES.register("inprocess", help="every client in this process, one after the other")
class InProcessEngine(Engine):
    """Every client in this process, in ascending id order."""

    name = "inprocess"
    honours_privacy = True

    def __init__(self, algorithm: Algorithm, clients: Sequence[ClientData] | Mapping[int, ClientData], seed: int,
                 states: ClientStates | None = None, faults: Faults | None = None,
                 compute: Compute = CPU_FP32) -> None:
        super().__init__(algorithm, seed, states, faults, compute)
        self.clients = clients

    @classmethod
    def check_config(cls, config: ExperimentSchema) -> None:
        """Everything the base refuses runs here: compiled steps, batched clients, a device."""

    @classmethod
    def build(cls, setup: EngineSetup, options: BaseModel) -> Engine:
        return cls(setup.algorithm, setup.clients, setup.seed, setup.states, setup.faults, setup.compute)

    def deliver(self, task: ClientTask, payloads: Mapping[int, Payload]) -> Delivery:
        results: dict[int, ClientResult] = {}
        for cid in sorted(payloads):
            with self.compute.scope():
                results[cid] = run_client_task(self.algorithm, task, self.clients[cid], payloads[cid],
                                               self.state_of(task.namespace, cid), self.seed)
        return Delivery(results)
