"""``runtime.batch_clients: true``: the clients of a round run as one batched computation in this
process (one device), through the algorithm's :meth:`~fedfew.engine.Algorithm.client_update_batch`.

Everything else is the in-process engine's: the same faults drawn from the same seed, the same
private-state staging, the same replies in client order. Each client's generator is the one
:func:`~fedfew.engine.tasks.run_client_task` would give it (seed, round key, client id), so the
clients draw the sequential path's episodes. What the batched path does not do is reseed torch's
global generator per client: the layers it can stack draw nothing from it (no dropout).

Tasks of a nested algorithm part or a data view (FRL's inner rounds) run one client after the other,
as in :class:`~fedfew.engine.base.InProcessEngine`.
"""

from __future__ import annotations

from collections.abc import Mapping

from fedfew.core.errors import UsageError
from fedfew.engine.base import Delivery, Faults, InProcessEngine
from fedfew.engine.tasks import ClientTask, private_result
from fedfew.interface.algorithm import Algorithm, ClientData, ClientResult, Payload
from fedfew.interface.compute import CPU_FP32, Compute, compile_mode
from fedfew.interface.protocol import update_generator
from fedfew.interface.state_store import ClientStates


class BatchingUnsupportedError(UsageError):
    """``runtime.batch_clients`` was asked for an algorithm (or model) that cannot batch its clients."""


class BatchedEngine(InProcessEngine):
    """The clients of a round as one batched computation, in this process."""

    name = "batched"

    def __init__(self, algorithm: Algorithm, clients: list[ClientData] | Mapping[int, ClientData], seed: int,
                 states: ClientStates | None = None, faults: Faults | None = None,
                 compute: Compute = CPU_FP32, compile_mode: str = "off") -> None:
        reason = algorithm.batching_unsupported()
        if reason is not None:
            raise BatchingUnsupportedError(f"runtime.batch_clients: {reason}; set runtime.batch_clients: false")
        super().__init__(algorithm, clients, seed, states, faults, compute)
        #: runtime.compile: the stacked loss through torch.compile (algorithms/parts/batched_episodic.py)
        self.compile_mode = compile_mode

    def deliver(self, task: ClientTask, payloads: Mapping[int, Payload]) -> Delivery:
        # The base engine has drawn the faults and keeps the states; the clients of ``payloads`` all run.
        # Rows used are recorded per client (the membership check): one client at a time, with the same
        # numbers as the batched form (tests/engine/test_batched.py).
        if task.part or task.view or task.record_rows:
            return super().deliver(task, payloads)
        todo = sorted(payloads)
        generators = [update_generator(self.seed, task.round_key, cid) for cid in todo]

        with self.compute.scope(), compile_mode(self.compile_mode):
            updates = self.algorithm.client_update_batch(
                [payloads[cid] for cid in todo], [self.state_of(task.namespace, cid) for cid in todo],
                [self.clients[cid] for cid in todo], generators)
        results: dict[int, ClientResult] = {
            cid: private_result(self.algorithm, task, update, payloads[cid], self.seed, cid)
            for cid, update in zip(todo, updates, strict=True)}
        return Delivery(results)
