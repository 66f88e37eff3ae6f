"""One round of broadcast, client updates and aggregation, on any engine: :func:`run_round` is the
building block of every run (the :class:`~fedfew.engine.simulator.Simulator` plays one per round; FRL nests
R of them inside each meta-training episode), with its communication accounting (:class:`CommLog`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedfew.core.seeding import derive_seed, torch_generator
from fedfew.engine.base import Engine, InProcessEngine, Replies
from fedfew.engine.tasks import MAIN, ClientTask, resolve_part
from fedfew.interface.algorithm import Algorithm, ClientData, ClientResult
from fedfew.interface.serialize import named_parts
from fedfew.interface.state import payload_bytes
from fedfew.interface.static import crossing_bytes, static_tensors

if TYPE_CHECKING:
    from fedfew.privacy.mechanism import PrivateAggregation


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
    server: Any  # the next server state, in the algorithm's own form (its hooks read it)
    results: dict[int, ClientResult]
    bytes_down: int
    bytes_up: int
    asked: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)
    #: A private round's record (the clip used, the noised share within it), else None.
    privacy: dict[str, float] | None = None

    @property
    def replied(self) -> list[int]:
        return sorted(self.results)

    @property
    def trained(self) -> list[int]:
        return sorted(c for c, r in self.results.items() if not r.skipped)


def run_round(
    engine: Engine,
    algorithm: Algorithm,
    server: object,
    selected: Sequence[int],
    round_index: int,
    round_key: int | str,
    *,
    part: str = "",
    part_args: Mapping[str, object] | None = None,
    view: str = "",
    view_args: Mapping[str, object] | None = None,
    namespace: str = MAIN,
    privacy: PrivateAggregation | None = None,
    record_rows: bool = False,
) -> RoundOutcome:
    """One round: each selected client gets its payload and updates with its own generator (derived
    from seed, round key and client id, so order does not matter) on ``engine``; the server
    aggregates the replies that arrived (none: the server state stays). ``part`` and ``view`` name
    the part of ``algorithm`` and the view of the clients' data the round runs (FRL's inner rounds).
    With ``privacy`` the clients clip their updates where they run and the server's noised average
    (:meth:`fedfew.privacy.PrivateAggregation.aggregate`) replaces the algorithm's aggregation.
    ``record_rows``: each client returns the dataset rows its episodes used (``ClientResult.rows_used``)."""
    spec = privacy.client_spec(named_parts(server, "a private run's server state")).to_json() if privacy is not None else None
    task = ClientTask(round_index, str(round_key), part, dict(part_args or {}), view, dict(view_args or {}),
                      namespace, spec, record_rows)
    actor = resolve_part(algorithm, task)
    payloads = {cid: actor.broadcast(server, cid) for cid in sorted(selected)}
    # A private Poisson round may ask no client; it still releases (the noise alone), below.
    replies = engine.execute(task, payloads) if payloads else Replies({})
    static = static_tensors(algorithm)  # frozen parameters: both sides hold them, they do not cross
    count = (lambda obj: crossing_bytes(obj, static)) if static else payload_bytes
    down = replies.bytes_down
    if down is None:
        down = sum(count(p) for cid, p in payloads.items() if cid not in replies.failed)
    up = replies.bytes_up
    if up is None:
        up = sum(count(r.upload) for r in replies.results.values())
    record = None
    if privacy is not None:
        # Every private round releases a noised model, whoever replied: skipping the noise when no one
        # did would tell an observer that the sample (or every reply) was empty.
        server, record = privacy.aggregate(named_parts(server, "a private run's server state"), replies.results,
                                           engine.seed, task.round_key)
    elif replies.results:
        torch.manual_seed(derive_seed(engine.seed, "aggregate-global", task.round_key))
        server = actor.aggregate(server, replies.results, torch_generator(engine.seed, "aggregate", task.round_key))
    return RoundOutcome(server, replies.results, down, up, sorted(payloads), replies.failed, replies.late, record)


def simulate_round(algorithm: Algorithm, server: object, clients: Sequence[ClientData] | Mapping[int, ClientData],
                   client_states: dict[int, object], selected: Sequence[int], seed: int,
                   round_key: int | str) -> RoundOutcome:
    """One round in this process on plain data (a library and test convenience): ``clients`` indexed
    by client id, ``client_states`` a dict updated in place with the selected clients' new states."""
    engine = InProcessEngine(algorithm, clients, seed)
    engine.state_of = lambda namespace, cid: client_states.get(cid)  # type: ignore[method-assign]
    outcome = run_round(engine, algorithm, server, selected, 0, round_key)
    client_states.update(engine._staged)
    engine.discard_round()
    return outcome


def mean_metrics(results: dict[int, ClientResult]) -> dict[str, float]:
    keys = {k for r in results.values() for k in r.metrics}
    return {f"train_{k}": float(np.mean([r.metrics[k] for r in results.values() if k in r.metrics])) for k in sorted(keys)}
