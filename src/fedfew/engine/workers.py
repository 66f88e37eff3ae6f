"""``runtime.engine: workers`` (``runtime.engine_options: {workers: N}``): the clients of a round run
in N worker processes, one thread each.

The workers are forked once, after the experiment is built, so every client's data is shared with
them copy-on-write (never pickled, never copied per round). A task goes to whichever worker is free;
what travels between the processes is the flat state form (:mod:`fedfew.interface.serialize`): the
payload (serialised once per distinct payload in a round), the client's private state, and back the
upload and the new state. Private states stay with the server-side store, as with the in-process
engine, so checkpoints and evaluation see them the same way.

Each update is a pure function of (payload, state, data, seeded generator) and replies are put in
client order before aggregation, so N workers give exactly the numbers of one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import multiprocessing as mp
import os
import signal
import traceback
from collections.abc import Mapping
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from fedfew.core.errors import UsageError
from fedfew.engine.base import ENGINES, Delivery, Engine, EngineError, EngineSetup, Faults
from fedfew.engine.tasks import ClientTask, run_client_task
from fedfew.interface import serialize
from fedfew.interface.algorithm import Algorithm, ClientData, ClientResult, EvalData, Payload
from fedfew.interface.compute import CPU_FP32, Compute
from fedfew.interface.protocol import from_wire, to_wire
from fedfew.interface.serialize import named_parts
from fedfew.interface.state_store import ClientStates

logger = logging.getLogger(__name__)


class WorkerError(EngineError):
    """A worker process failed; the message carries the client and the worker's error."""


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this worker when its parent dies (even by kill -9), and exit at once if
    the parent is already gone (it died before the request was made). Elsewhere the worker still
    ends when its pipe closes, since it holds no copy of the parent's end."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the closed pipe ends the worker
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _worker_main(conn: Connection, algorithm: Algorithm, clients: Mapping[int, ClientData], seed: int,
                 compute: Compute, evals: Mapping[str, EvalData], parent_pid: int,
                 not_mine: tuple[Connection, ...]) -> None:
    _die_with_parent(parent_pid)
    for other in not_mine:  # the parent's ends (this worker's and the earlier workers'): a copy kept
        other.close()       # open here would hide the parent's death from recv()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the workers
    torch.set_num_threads(1)
    payload_cache: dict[bytes, Payload] = {}
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        if message[0] == "scores":  # a share of the evaluation episodes, scored with the server's model
            _, split, indices, server_bytes = message
            try:
                server = serialize.from_bytes(server_bytes)[0]
                with compute.scope():
                    scores = algorithm.episode_scores(server, evals[split], indices)
                conn.send(("ok", -1, scores))
            except Exception as err:
                conn.send(("error", -1, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
            continue
        _, task_json, cid, payload_key, payload_bytes, state_bytes = message
        try:
            if payload_bytes is not None:
                payload_cache = {payload_key: named_parts(serialize.from_bytes(payload_bytes)[0], "a payload")}
            payload = payload_cache[payload_key]
            state = None if state_bytes is None else serialize.from_bytes(state_bytes)[0]
            with compute.scope():
                result = run_client_task(algorithm, ClientTask.from_json(task_json), clients[cid], payload, state,
                                         seed)
            conn.send(("ok", cid, serialize.to_bytes(to_wire(result))))
        except Exception as err:  # report, keep serving: the parent decides
            conn.send(("error", cid, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


class WorkersOptions(BaseModel):
    """``runtime.engine_options`` of the workers engine."""

    model_config = ConfigDict(extra="forbid")
    #: Worker processes, one thread each (keep it at or below the free cores).
    workers: int = Field(2, ge=1)


class WorkersStartError(UsageError, EngineError):
    """The workers engine cannot start here (no 'fork' start method)."""


@ENGINES.register("workers", help="the clients of a round spread over worker processes (engine_options.workers)")
class WorkersEngine(Engine):
    """The clients of a round spread over ``workers`` forked processes (one thread each)."""

    name = "workers"
    Options = WorkersOptions
    honours_privacy = True

    def __init__(self, algorithm: Algorithm, clients: list[ClientData] | Mapping[int, ClientData], seed: int,
                 states: ClientStates | None = None, faults: Faults | None = None, workers: int = 2,
                 compute: Compute = CPU_FP32, evals: Mapping[str, EvalData] | None = None) -> None:
        super().__init__(algorithm, seed, states, faults, compute)
        if workers < 1:
            raise WorkersStartError(f"runtime.engine_options.workers must be at least 1, got {workers}")
        if "fork" not in mp.get_all_start_methods():
            raise WorkersStartError("runtime.engine: workers needs the 'fork' start method (Linux); use "
                                    "runtime.engine: inprocess here")
        by_id = clients if isinstance(clients, Mapping) else {c.client_id: c for c in clients}
        context = mp.get_context("fork")
        self._connections: list[Connection] = []
        self._processes: list[Any] = []  # started processes (their pid set)
        for _ in range(workers):
            parent, child = context.Pipe()
            not_mine = (*self._connections, parent)
            process = context.Process(target=_worker_main, args=(child, algorithm, by_id, seed, compute, dict(evals or {}),
                                                                 os.getpid(), not_mine), daemon=True)
            process.start()
            child.close()
            self._connections.append(parent)
            self._processes.append(process)

    @classmethod
    def build(cls, setup: EngineSetup, options: BaseModel) -> Engine:
        assert isinstance(options, WorkersOptions)
        return cls(setup.algorithm, setup.clients, setup.seed, setup.states, setup.faults, options.workers,
                   setup.compute, setup.evals)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    def deliver(self, task: ClientTask, payloads: Mapping[int, Payload]) -> Delivery:
        encoded: dict[int, tuple[bytes, bytes]] = {}  # id(payload) -> (key, bytes): each distinct payload once
        last_sent: dict[int, bytes] = {}  # worker connection -> key of the payload it holds
        task_json = task.to_json()
        results: dict[int, ClientResult] = {}
        free = list(self._connections)
        busy: dict[Connection, int] = {}
        pending = sorted(payloads)
        try:
            while pending or busy:
                while pending and free:
                    cid, conn = pending.pop(0), free.pop(0)
                    payload = payloads[cid]
                    if id(payload) not in encoded:
                        data = serialize.to_bytes(payload)
                        encoded[id(payload)] = (str(len(encoded)).encode(), data)
                    key, data = encoded[id(payload)]
                    holds = last_sent.get(id(conn)) == key  # a worker keeps the last payload it was sent
                    last_sent[id(conn)] = key
                    state = self.state_of(task.namespace, cid)
                    conn.send(("task", task_json, cid, key, None if holds else data,
                               None if state is None else serialize.to_bytes(state)))
                    busy[conn] = cid
                for ready in wait(list(busy)):
                    conn = ready  # type: ignore[assignment]
                    cid = busy.pop(conn)
                    try:
                        status, got, body = conn.recv()
                    except EOFError:
                        raise WorkerError(f"a worker process died while running client {cid}") from None
                    if status != "ok":
                        raise WorkerError(f"client {got} failed in a worker process: {body.splitlines()[0]}")
                    results[got] = from_wire(serialize.from_bytes(body)[0])
                    free.append(conn)
        except BaseException:
            self._drain(busy)
            raise
        return Delivery(results)

    def episode_scores(self, server: object, data: EvalData) -> list[float]:
        """The evaluation episodes split into one contiguous share per worker, scored in parallel and
        put back in order (each episode's score does not depend on which process computes it)."""
        assert data.episodes is not None
        shares = [list(share) for share in _split(len(data.episodes), len(self._connections))]
        server_bytes = serialize.to_bytes(server)
        used = [(conn, share) for conn, share in zip(self._connections, shares) if share]
        for conn, share in used:
            conn.send(("scores", data.split, share, server_bytes))
        scores: list[float] = []
        for conn, _ in used:
            try:
                status, _, body = conn.recv()
            except EOFError:
                raise WorkerError("a worker process died while scoring evaluation episodes") from None
            if status != "ok":
                raise WorkerError(f"scoring evaluation episodes failed in a worker process: {body.splitlines()[0]}")
            scores.extend(body)
        return scores

    def _drain(self, busy: dict[Connection, int]) -> None:
        """After an interrupt, collect the replies still on their way so the pipes stay in step."""
        for conn in list(busy):
            try:
                if conn.poll(30):
                    conn.recv()
            except (EOFError, OSError):
                pass

    def close(self) -> None:
        for conn in self._connections:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
                process.join(timeout=5)
        for conn in self._connections:
            conn.close()
        self._connections, self._processes = [], []


def _split(count: int, parts: int) -> list[range]:
    """``range(count)`` cut into ``parts`` contiguous pieces of sizes differing by at most one."""
    size, extra = divmod(count, parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(parts)]
