"""What a client is asked to do, in terms every engine can carry: a :class:`ClientTask`.

A task names the part of the algorithm that runs (``""``: the algorithm itself; FRL's inner FL is
another part), the view of the client's own data it runs on (``""``: its training data; FRL's
support/query split is a view), the namespace of private state it reads and writes, and the round
key its generator is derived from. All of it is JSON-able, so the same task runs in this process, in
a worker process or on a Flower SuperNode, and :func:`run_client_task` is the one function that runs
it everywhere: the same inputs give the same result whichever engine calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from fedfew.core.registry import Registry
from fedfew.fewshot.episodes import recording_rows
from fedfew.interface.algorithm import Algorithm, ClientData, ClientResult, Payload
from fedfew.interface.protocol import MAIN, update_generator, update_global_seed
from fedfew.interface.static import static_tensors
from fedfew.privacy.clipping import ClientSpec, privatize

__all__ = ["DATA_VIEWS", "MAIN", "ClientTask", "DataView", "client_view", "private_result", "resolve_part",
           "run_client_task"]

DataView = Callable[..., ClientData]
#: Client-side transformations of a client's own data: ``view(data, seed=..., round_key=..., **args)``.
DATA_VIEWS: Registry[DataView] = Registry("data view")


@dataclass(frozen=True)
class ClientTask:
    round: int  # the top-level (simulator) round this task belongs to
    round_key: str  # what the client's generator is derived from, with the seed and its id
    part: str = ""
    part_args: dict[str, object] = field(default_factory=dict)
    view: str = ""
    view_args: dict[str, object] = field(default_factory=dict)
    namespace: str = MAIN
    #: Differential privacy's instructions to the client (a :class:`fedfew.privacy.ClientSpec` as
    #: JSON): clip the update where it is made. None: no privacy.
    privacy: dict[str, Any] | None = None
    #: Record the dataset rows the update's episodes use (``eval.membership_inference``): returned in
    #: ``ClientResult.rows_used``. Left out of the wire form when False.
    record_rows: bool = False

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        if not self.record_rows:
            del data["record_rows"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClientTask:
        return cls(**data)


def resolve_part(algorithm: Algorithm, task: ClientTask) -> Algorithm:
    return algorithm.client_part(task.part, **task.part_args) if task.part else algorithm


def client_view(data: ClientData, task: ClientTask, seed: int) -> ClientData:
    if not task.view:
        return data
    return DATA_VIEWS.get(task.view)(data, seed=seed, round_key=task.round_key, **task.view_args)


def run_client_task(algorithm: Algorithm, task: ClientTask, data: ClientData, payload: Payload,
                    state: object, seed: int) -> ClientResult:
    """One client update: the task's part of ``algorithm`` on the task's view of ``data``, with the
    client's generator for (seed, round key, client id); with ``task.privacy``, its upload clipped
    (and noised, local-dp) here, where the client is, before it is returned."""
    part = resolve_part(algorithm, task)
    generator = update_generator(seed, task.round_key, data.client_id)
    # Layers that draw from torch's global generator (dropout, DropBlock) get one seeded for this
    # update alone, so the update is the same in any process and after any history.
    torch.manual_seed(update_global_seed(seed, task.round_key, data.client_id))
    if task.record_rows:
        with recording_rows() as rows:
            result = part.client_update(payload, state, client_view(data, task, seed), generator)
        result.rows_used = sorted(rows)
    else:
        result = part.client_update(payload, state, client_view(data, task, seed), generator)
    return private_result(algorithm, task, result, payload, seed, data.client_id)


def private_result(algorithm: Algorithm, task: ClientTask, result: ClientResult, payload: Payload,
                   seed: int, client_id: int) -> ClientResult:
    """``result`` as a private client sends it when ``task.privacy`` says so (else ``result`` itself):
    :func:`fedfew.privacy.privatize`, frozen parameters left out."""
    if task.privacy is None:
        return result
    return privatize(result, payload, ClientSpec.from_json(task.privacy), seed, task.round_key, client_id,
                     static_tensors(algorithm).keys())
