"""The Flower engine: the server side of fedfew on Flower's deployment runtime.

It runs inside the ServerApp. Each client is a SuperNode; a client task is a Flower message to that
node (``train``), whose reply carries the upload and metrics; the node keeps its private state in its
``context.state``. Before the first round the engine waits for the nodes, sends each the run's config
(``query``) and learns which client id each node is. Personalised evaluation asks every node to
score its own model (``evaluate``). Bytes are counted from the arrays the messages actually carried.

A node that does not reply within ``flower.round_timeout`` seconds counts as failed for that round
(the round aggregates the replies that arrived); a node that replies with an error stops the run with
that error.

With ``flower.secure_aggregation`` a round is Flower's SecAgg+ protocol (:mod:`fedfew.flower.secagg`):
the server receives masked vectors and learns only their sum, from which the round's results are made.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedfew.core.jsontypes import JSONObject, JSONValue
from fedfew.engine.base import Delivery, Engine, Faults
from fedfew.engine.tasks import ClientTask
from fedfew.flower.errors import FlowerRunError as FlowerRunError
from fedfew.flower.records import array_bytes, parts_from_records, record_int, to_records
from fedfew.interface.algorithm import (
    Algorithm,
    ClientData,
    ClientResult,
    ClientScores,
    EvalData,
    Payload,
)
from fedfew.interface.compute import CPU_FP32, Compute
from fedfew.interface.state_store import ClientStates, RemoteClientStates
from fedfew.interface.static import static_tensors

if TYPE_CHECKING:
    from fedfew.privacy.secure_sum import SecureSettings

logger = logging.getLogger(__name__)


def remote_states(client_ids: list[int]) -> ClientStates:
    return RemoteClientStates(client_ids)


class _LogEntry(TypedDict, total=False):
    """A line of the message log (``RUN/flower/messages.jsonl``): what one reply carried, and when."""

    type: str
    key: str
    client: int
    records: dict[str, list[str]]  # record name -> its keys
    array_bytes: dict[str, int]  # array record name -> bytes of its arrays
    timing: JSONObject
    where: JSONValue


class FlowerEngine(Engine):
    """The server side of a Flower run (built by the ServerApp with its grid): a task is a message
    to the client's node, which keeps the client's private state."""

    name = "flower"
    holds_states = False

    def __init__(self, grid: Grid, algorithm: Algorithm, seed: int, config: JSONObject, num_clients: int,
                 faults: Faults | None = None, compute: Compute = CPU_FP32, round_timeout: float = 600.0,
                 startup_timeout: float = 300.0, message_log: Path | None = None,
                 secure: SecureSettings | None = None) -> None:
        super().__init__(algorithm, seed, None, faults, compute)
        self.grid, self.round_timeout = grid, round_timeout
        self.message_log = message_log
        #: Secure aggregation's rounds (``flower.secure_aggregation``), or None.
        self.secure = None
        if secure is not None:
            from fedfew.flower.secagg import SecureRounds

            self.secure = SecureRounds(secure, algorithm)  # refuses an algorithm it does not cover
        self.node_of = self._connect(config, num_clients, startup_timeout)

    # -- setting up -------------------------------------------------------------------------------
    def _connect(self, config: JSONObject, num_clients: int, timeout: float) -> dict[int, int]:
        deadline = time.monotonic() + timeout
        while len(list(self.grid.get_node_ids())) < num_clients:
            if time.monotonic() > deadline:
                raise FlowerRunError(f"{len(list(self.grid.get_node_ids()))} of {num_clients} SuperNodes connected "
                                     f"within {timeout:.0f} s (flower.startup_timeout)")
            time.sleep(0.5)
        nodes = sorted(self.grid.get_node_ids())
        hello = RecordDict({"fedfew": ConfigRecord({"config": json.dumps(config)})})
        messages = [(n, Message(hello, dst_node_id=n, message_type=MessageType.QUERY)) for n in nodes]
        node_of: dict[int, int] = {}
        for node, reply in self._exchange(messages, max(deadline - time.monotonic(), 60.0)):
            content = self._content(reply, "setting up")
            cid = record_int(content["fedfew"]["client-id"])
            if cid in node_of:
                raise FlowerRunError(f"two SuperNodes say they are client {cid} (check their --node-config)")
            node_of[cid] = node
        missing = sorted(set(range(num_clients)) - set(node_of))
        if missing:
            raise FlowerRunError(f"no SuperNode answered as client(s) {missing[:10]} (the config has {num_clients} "
                                 "clients; start one SuperNode per client with --node-config 'client-id=K')")
        return node_of

    def _exchange(self, messages: list[tuple[int, Message]], timeout: float) -> list[tuple[int, Message]]:
        """Send (client, message) pairs and collect the replies that arrive within ``timeout`` seconds,
        each paired with the client it answers (by the id of the message it replies to). Each reply's
        arrival time (when this side pulled it) is kept in ``self.arrived`` by client."""
        ids = list(self.grid.push_messages([m for _, m in messages]))
        client_of = {mid: cid for mid, (cid, _) in zip(ids, messages)}
        pending, replies = set(ids), []
        self.arrived: dict[int, float] = {}
        deadline = time.monotonic() + timeout
        while pending:
            for reply in self.grid.pull_messages(list(pending)):
                mid = reply.metadata.reply_to_message_id
                if mid in pending:
                    pending.discard(mid)
                    replies.append((client_of[mid], reply))
                    self.arrived[client_of[mid]] = time.time()
            if pending:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        return replies

    def _failed_delivery(self, cid: int, reply: Message, doing: str) -> bool:
        """A reply the runtime made (the node went away, the message expired): that client failed."""
        if not reply.has_error():
            return False
        logger.warning("client %s failed while %s: %s", cid, doing, reply.error.reason)
        return True

    def _content(self, reply: Message, doing: str) -> RecordDict:
        if reply.has_error():
            raise FlowerRunError(f"a SuperNode failed while {doing}: {reply.error.reason}")
        content = reply.content
        if "error" in content:
            # str(): the error record's entries are strings, typed as any record value (bytes included).
            error = content["error"]
            raise FlowerRunError(f"client {str(error.get('client'))} failed while {doing}: "
                                 f"{str(error['message'])}")
        return content

    # -- client tasks ---------------------------------------------------------------------------------
    def deliver(self, task: ClientTask, payloads: Mapping[int, Payload]) -> Delivery:
        if self.secure is not None:  # the server sees the masked sum only
            return self.secure.deliver(self, task, payloads)
        messages, down = [], 0
        for cid in sorted(payloads):
            arrays, meta = to_records(payloads[cid], static_tensors(self.algorithm))
            down += array_bytes(arrays)
            content = RecordDict({"payload": arrays, "payload.meta": meta,
                                  "task": ConfigRecord({"task": json.dumps(task.to_json()), "client": cid})})
            messages.append((cid, Message(content, dst_node_id=self.node_of[cid], message_type=MessageType.TRAIN,
                                          group_id=str(task.round))))
        results: dict[int, ClientResult] = {}
        up: dict[int, int] = {}
        sent = time.time()
        doing = f"running round {task.round_key}"
        for cid, reply in self._exchange(messages, self.round_timeout):
            if self._failed_delivery(cid, reply, doing):
                continue
            content = self._content(reply, doing)
            self._log("train", task.round_key, cid, content, sent)
            up[cid] = array_bytes(content["upload"])
            upload = parts_from_records(content["upload"], content["upload.meta"], static_tensors(self.algorithm),
                                        "an upload")
            results[cid] = ClientResult.from_summary(upload=upload, state=None,
                                                     summary=json.loads(str(content["result"]["json"])))
        return Delivery(results, bytes_up=up, bytes_down=down)

    def evaluate_clients(self, server: object, client_states: Mapping[int, object], clients: list[ClientData],
                         data: EvalData) -> dict[int, ClientScores]:
        messages = []
        for client in sorted(clients, key=lambda c: c.client_id):
            arrays, meta = to_records(self.algorithm.broadcast(server, client.client_id), static_tensors(self.algorithm))
            content = RecordDict({"payload": arrays, "payload.meta": meta,
                                  "task": ConfigRecord({"split": data.split, "client": client.client_id})})
            messages.append((client.client_id, Message(content, dst_node_id=self.node_of[client.client_id],
                                                       message_type=MessageType.EVALUATE)))
        scores: dict[int, ClientScores] = {}
        doing = f"evaluating on {data.split}"
        for cid, reply in self._exchange(messages, self.round_timeout):
            if self._failed_delivery(cid, reply, doing):
                continue
            content = self._content(reply, doing)
            self._log("evaluate", data.split, cid, content)
            scores[cid] = parts_from_records(content["scores"], content["scores.meta"], static_tensors(self.algorithm),
                                             "a client's scores")
        if not scores:
            raise FlowerRunError(f"no client returned its {data.split} scores within {self.round_timeout:.0f} s "
                                 "(flower.round_timeout)")
        missing = sorted(set(self.node_of) - set(scores))
        if missing:  # a node gone: the clients that answered are scored, and the log says who did not
            logger.warning("client(s) %s did not return their %s scores; the evaluation covers the others",
                           missing[:10], data.split)
        return {cid: scores[cid] for cid in sorted(scores)}

    def _log(self, kind: str, key: str, cid: int, content: RecordDict, sent: float | None = None) -> None:
        """What each reply carried (record names, array names and bytes): the audit of what left a node;
        with the times the message was sent, its ClientApp process had started and imported fedfew, its
        handler began and ended, and the reply was back (what a round's time is made of)."""
        if self.message_log is None:
            return
        entry: _LogEntry = {
            "type": kind, "key": key, "client": cid,
            "records": {name: sorted(record.keys()) for name, record in content.items()},
            "array_bytes": {name: array_bytes(record) for name, record in content.array_records.items()}}
        if sent is not None and "result" in content:
            result = json.loads(str(content["result"]["json"]))
            entry["timing"] = {"sent": sent, **result.get("timing", {}), "received": self.arrived.get(cid, time.time())}
            if "where" in result:
                entry["where"] = result["where"]
        with open(self.message_log, "a") as f:
            f.write(json.dumps(entry) + "\n")
