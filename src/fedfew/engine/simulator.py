"""The in-process simulator: rounds of broadcast, client updates and aggregation.

:func:`run_round` is the building block (FRL nests R of them inside each meta-training episode);
:class:`Simulator` adds seeded client sampling drawn once, communication accounting, evaluation on
validation classes with best-round selection, and a final test.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedfew.engine.algorithm import Algorithm, ClientData, ClientResult, EvalData
from fedfew.engine.state import payload_bytes
from fedfew.seeding import numpy_generator, torch_generator


@dataclass
class CommLog:
    """Bytes sent down (server to clients) and up (clients to server), per round."""

    down: list[int] = field(default_factory=list)
    up: list[int] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.down) + sum(self.up)


@dataclass
class RoundOutcome:
    server: Any
    results: dict[int, ClientResult]
    bytes_down: int
    bytes_up: int


def run_round(
    algorithm: Algorithm,
    server: Any,
    clients: Sequence[ClientData],
    client_states: dict[int, Any],
    selected: Sequence[int],
    seed: int,
    round_key: int | str,
) -> RoundOutcome:
    """One round: each selected client gets its payload, updates with its own generator (derived
    from seed, round and client id, so order does not matter), and the server aggregates.
    ``client_states`` is updated in place with each client's new private state."""
    results: dict[int, ClientResult] = {}
    down = up = 0
    for cid in selected:
        payload = algorithm.broadcast(server, cid)
        down += payload_bytes(payload)
        result = algorithm.client_update(
            payload, client_states.get(cid), clients[cid], torch_generator(seed, "client", round_key, cid)
        )
        up += payload_bytes(result.upload)
        client_states[cid] = result.state
        results[cid] = result
    server = algorithm.aggregate(server, results, torch_generator(seed, "aggregate", round_key))
    return RoundOutcome(server, results, down, up)


def client_schedule(num_clients: int, per_round: int | float, rounds: int, seed: int) -> list[list[int]]:
    """Which clients take part in each round, drawn once from the seed so that every algorithm run
    with the same seed sees the same clients. ``per_round`` is a count or a fraction in (0, 1]."""
    if isinstance(per_round, float) and per_round <= 1.0:
        count = max(1, round(per_round * num_clients))
    else:
        count = int(per_round)
    if not 1 <= count <= num_clients:
        raise ValueError(f"clients per round must be in 1..{num_clients}, got {per_round}")
    rng = numpy_generator(seed, "schedule")
    return [sorted(rng.choice(num_clients, count, replace=False).tolist()) for _ in range(rounds)]


ProgressHook = Callable[[int, dict[str, float]], None]


class Simulator:
    """Runs ``algorithm`` over ``clients`` for a number of rounds."""

    def __init__(
        self,
        algorithm: Algorithm,
        clients: list[ClientData],
        seed: int,
        val: EvalData | None = None,
        test: EvalData | None = None,
    ) -> None:
        self.algorithm, self.clients, self.seed = algorithm, clients, seed
        self.val, self.test = val, test
        self.comm = CommLog()
        self.server = algorithm.init_server(torch_generator(seed, "server-init"))
        self.client_states: dict[int, Any] = {
            c.client_id: algorithm.init_client_state(c, torch_generator(seed, "client-init", c.client_id))
            for c in clients
        }

    def evaluate(self, data: EvalData, server: Any = None, client_states: dict[int, Any] | None = None) -> dict[str, float]:
        return self.algorithm.evaluate(
            self.server if server is None else server,
            self.client_states if client_states is None else client_states,
            self.clients,
            data,
            torch_generator(self.seed, "evaluate", data.split),
        )

    def run(
        self,
        rounds: int,
        clients_per_round: int | float,
        eval_every: int = 1,
        track_test: bool = False,
        on_round: ProgressHook | None = None,
    ) -> dict[str, Any]:
        """Train for ``rounds``; returns the per-round history, the selected round and final test
        metrics. With validation data the best round by validation accuracy is kept (never chosen on
        test); without it, the last round is."""
        schedule = client_schedule(len(self.clients), clients_per_round, rounds, self.seed)
        history: list[dict[str, float]] = []
        best: tuple[float, int, Any, Any] | None = None
        last_test: dict[str, float] | None = None
        start = time.perf_counter()
        for r, selected in enumerate(schedule):
            outcome = self.algorithm.play_round(self.server, self.clients, self.client_states, selected, self.seed, r)
            if outcome is None:  # the standard round (every algorithm but those that nest rounds)
                outcome = run_round(self.algorithm, self.server, self.clients, self.client_states, selected, self.seed, r)
            self.server = outcome.server
            self.comm.down.append(outcome.bytes_down)
            self.comm.up.append(outcome.bytes_up)
            record: dict[str, float] = {"round": r + 1, "bytes_down": outcome.bytes_down, "bytes_up": outcome.bytes_up}
            record.update(_mean_metrics(outcome.results))
            last = r + 1 == rounds
            if (r + 1) % eval_every == 0 or last:
                if self.val is not None:
                    val = self.evaluate(self.val)
                    record.update({f"val_{k}": v for k, v in val.items()})
                    if best is None or val["accuracy"] > best[0]:
                        best = (val["accuracy"], r + 1, copy.deepcopy(self.server), copy.deepcopy(self.client_states))
                if self.test is not None and (track_test or self.val is None):
                    test = self.evaluate(self.test)
                    record.update({f"test_{k}": v for k, v in test.items()})
                    if last:
                        last_test = test
            record["seconds"] = time.perf_counter() - start
            history.append(record)
            if on_round is not None:
                on_round(r + 1, record)
        selected_round = rounds
        server, states = self.server, self.client_states
        if best is not None:
            _, selected_round, server, states = best
        if best is None and last_test is not None:
            final = last_test  # the last round, already scored: no second pass over the test tasks
        else:
            final = self.evaluate(self.test, server, states) if self.test is not None else {}
        self.best_server, self.best_client_states = server, states
        return {"history": history, "selected_round": selected_round, "test": final, "comm": self.comm}


def _mean_metrics(results: dict[int, ClientResult]) -> dict[str, float]:
    keys = {k for r in results.values() for k in r.metrics}
    return {f"train_{k}": float(np.mean([r.metrics[k] for r in results.values() if k in r.metrics])) for k in sorted(keys)}
