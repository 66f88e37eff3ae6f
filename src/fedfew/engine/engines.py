"""Engines: where client tasks run. They all sit behind one small interface, so that an algorithm
never knows which one runs it.

* :class:`InProcessEngine` (``runtime.engine: inprocess``): every client in this process, one after
  the other.
* ``workers`` (:mod:`fedfew.engine.workers`): the clients of a round spread over worker processes.
* ``flower`` (:mod:`fedfew.flower`): each client a Flower SuperNode.

An engine holds (or reaches) the clients' data and private states. :meth:`Engine.execute` runs one
task for the clients it is given payloads for and returns the replies that arrived; client faults
(``federation.dropout``, ``federation.stragglers``) are drawn here from the seed and the round key.
States written to the persistent namespace during a round become visible to the server side
(evaluation, checkpoints) only at :meth:`Engine.end_round`, so an interrupted round leaves the states
of the last finished one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedfew.engine.algorithm import Algorithm, ClientData, ClientResult, EvalData
from fedfew.engine.compute import CPU_FP32, Compute
from fedfew.engine.store import ClientStates
from fedfew.engine.tasks import MAIN, ClientTask, run_client_task
from fedfew.registry import Registry
from fedfew.seeding import numpy_generator, torch_generator


class EngineError(RuntimeError):
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


class Engine:
    """The interface every engine implements."""

    name = ""

    def __init__(self, algorithm: Algorithm, seed: int, states: ClientStates | None,
                 faults: Faults | None = None, compute: Compute = CPU_FP32) -> None:
        self.algorithm, self.seed, self.states = algorithm, seed, states
        self.faults = faults or Faults()
        self.compute = compute
        self._staged: dict[int, Any] = {}
        self._ephemeral: dict[str, dict[int, Any]] = {}
        self._round = 0

    # -- the interface --------------------------------------------------------------------------
    def execute(self, task: ClientTask, payloads: Mapping[int, dict[str, Any]]) -> Replies:
        raise NotImplementedError

    def evaluate_clients(self, server: Any, client_states: Mapping[int, Any], clients: list[ClientData],
                         data: EvalData) -> dict[int, dict[str, Any]]:
        """Every client's :meth:`~fedfew.engine.Algorithm.evaluate_client` of its own model (clients
        whose state is None have none and are left out), keyed by client id in ascending order. Here
        on the server side, where the states are; the Flower engine asks the nodes."""
        scores: dict[int, dict[str, Any]] = {}
        for client in sorted(clients, key=lambda c: c.client_id):
            state = client_states.get(client.client_id)
            if state is None:
                continue
            payload = self.algorithm.broadcast(server, client.client_id)
            generator = torch_generator(self.seed, "evaluate", data.split, client.client_id)
            with self.compute.scope():
                scores[client.client_id] = self.algorithm.evaluate_client(payload, state, client, data, generator)
        return scores

    def episode_scores(self, server: Any, data: EvalData) -> list[float]:
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
    def state_of(self, namespace: str, cid: int) -> Any:
        if namespace == MAIN:
            if cid in self._staged:
                return self._staged[cid]
            return None if self.states is None else self.states.get_state(cid)
        return self._ephemeral.get(namespace, {}).get(cid)

    def keep_state(self, namespace: str, cid: int, state: Any) -> None:
        if namespace == MAIN:
            self._staged[cid] = state
        else:
            self._ephemeral.setdefault(namespace, {})[cid] = state


class InProcessEngine(Engine):
    """Every client in this process, in ascending id order."""

    name = "inprocess"

    def __init__(self, algorithm: Algorithm, clients: list[ClientData] | Mapping[int, ClientData], seed: int,
                 states: ClientStates | None = None, faults: Faults | None = None,
                 compute: Compute = CPU_FP32) -> None:
        super().__init__(algorithm, seed, states, faults, compute)
        self.clients = clients

    def execute(self, task: ClientTask, payloads: Mapping[int, dict[str, Any]]) -> Replies:
        asked = sorted(payloads)
        failed, late = self.faults.draw(asked, self.seed, task.round_key)
        results: dict[int, ClientResult] = {}
        for cid in asked:
            if cid in failed:
                continue
            with self.compute.scope():
                result = run_client_task(self.algorithm, task, self.clients[cid], payloads[cid],
                                         self.state_of(task.namespace, cid), self.seed)
            self.keep_state(task.namespace, cid, result.state)
            if cid not in late:
                results[cid] = result
        return Replies(results, sorted(failed), sorted(late))


ENGINES: Registry[type[Engine]] = Registry("engine")
ENGINES.register("inprocess", help="every client in this process, one after the other")(InProcessEngine)
