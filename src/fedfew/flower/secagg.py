"""Secure aggregation on the Flower engines: Flower's SecAgg+ protocol, its ClientApp side and its
ServerApp side, around fedfew's rounds (``flower.secure_aggregation``; docs/privacy.md).

* A node: Flower's own ``secaggplus_mod`` (:func:`flwr.client.mod.secaggplus_mod`) answers the
  protocol's four stages of a ``train`` message; in its third stage it calls fedfew's train handler,
  which replies with the client's vector (:func:`secure_input`, the vector of
  :func:`fedfew.privacy.secure_sum.client_vector`) in the form the mod takes (a ``FitRes`` of
  weight 1), and the mod quantises and masks it. :func:`secure_aggregation_mod` puts the mod in front
  of fedfew's handler for the rounds that ask for it and turns a client's failure into fedfew's one-line
  error reply.
* The server: :class:`SecureRounds` runs the stages of Flower's own
  :class:`flwr.server.workflow.SecAggPlusWorkflow` (setup, share keys, collect masked vectors, unmask;
  Flower's code, unchanged) through the Flower engine's message exchange, with fedfew's task as the
  third stage's content. What comes back to the server is the protocol's keys and encrypted shares,
  the masked vectors and the unmasked *sum* (Flower's unmask stage); the engine turns that sum into the
  results the algorithm's (or DP-FedAvg's) aggregation takes (:func:`~fedfew.privacy.secure_sum.server_results`).

The workflow's legacy hooks (a ``Strategy``'s ``configure_fit`` and ``aggregate_fit``) are filled by
:class:`_Round`: the first names the round's nodes, the second receives the sum.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import (
    Code,
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Parameters,
    ReconnectIns,
    Scalar,
    Status,
    bytes_to_ndarray,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.serverapp import Grid

from fedfew.engine.base import Delivery
from fedfew.engine.tasks import ClientTask
from fedfew.flower.errors import FlowerRunError
from fedfew.flower.records import to_records
from fedfew.interface.algorithm import Payload
from fedfew.interface.static import static_tensors
from fedfew.privacy.secure_sum import (
    SecureAggregationError,
    SecureSettings,
    SecureSpec,
    SecureSum,
    check_algorithm,
    client_vector,
    dp_margin,
    layout,
    server_results,
    vector_size,
)

if TYPE_CHECKING:
    from fedfew.interface.algorithm import Algorithm, ClientResult


class FlowerEngine(Protocol):
    """What a secure round uses of :class:`fedfew.flower.engine.FlowerEngine` (a protocol, so that the
    engine, which builds :class:`SecureRounds`, and this module do not import each other)."""

    algorithm: Algorithm
    node_of: dict[int, int]
    round_timeout: float
    message_log: Path | None

    def _exchange(self, messages: list[tuple[int, Message]], timeout: float) -> list[tuple[int, Message]]: ...

    def _failed_delivery(self, cid: int, reply: Message, doing: str) -> bool: ...

    def _content(self, reply: Message, doing: str) -> RecordDict: ...

    def _log(self, kind: str, key: str, cid: int, content: RecordDict, sent: float | None = None) -> None: ...

__all__ = ["SECURE_KEY", "SecureRounds", "content_bytes", "secure_aggregation_mod", "secure_input"]

logger = logging.getLogger(__name__)

#: The record of a secure round's task that tells the node what vector to send (JSON).
SECURE_KEY = "fedfew.secagg"
_STAGES = (Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT_MASKED_VECTORS, Stage.UNMASK)


# -- a node --------------------------------------------------------------------------------------------
class _ClientFailed(Exception):
    """fedfew's handler replied with its error record: the node answers with that record."""

    def __init__(self, content: RecordDict) -> None:
        super().__init__("the client failed")
        self.content = content


def secure_aggregation_mod(msg: Message, ctxt: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """A ``train`` message of a secure round goes through Flower's ``secaggplus_mod`` (which calls fedfew's
    handler in its third stage); any other message goes straight to the handler. A failure (fedfew's own,
    or the protocol's: a share that does not decrypt, a stage out of order) is the one-line error reply
    the server stops the run with, never a silent dropout."""
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, ctxt)

    def handler(message: Message, context: Context) -> Message:
        reply = call_next(message, context)
        if "error" in reply.content.config_records:
            raise _ClientFailed(reply.content)
        return reply

    stage = str(msg.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE, "?"))
    try:
        return secaggplus_mod(msg, ctxt, handler)
    except _ClientFailed as failed:
        return Message(failed.content, reply_to=msg)
    except Exception as err:  # the protocol's own failure on this node
        detail = " ".join(f"{type(err).__name__}: {err}".split())
        cid = ctxt.node_config.get("client-id", ctxt.node_config.get("partition-id"))
        record = ConfigRecord({"client": str(cid), "message": f"secure aggregation, stage {stage}: {detail}"})
        return Message(RecordDict({"error": record}), reply_to=msg)


def secure_input(spec: SecureSpec, payload: Payload, result: ClientResult, frozen: Collection[str]) -> RecordDict:
    """What fedfew's train handler replies in a secure round: the client's vector as the ``FitRes`` that
    ``secaggplus_mod`` masks (weight 1: fedfew's weights are inside the vector), and whether it sat the
    round out (the one thing of its result that travels in the clear). Its metrics, sample counts and
    upload stay on the node."""
    vector, skipped = client_vector(spec, payload["model"], result, frozen)
    fitres = FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters([vector]),
                    num_examples=1, metrics={"skipped": int(skipped)})
    return compat.fitres_to_recorddict(fitres, keep_input=False)


# -- the server ------------------------------------------------------------------------------------------
def content_bytes(content: RecordDict) -> int:
    """Bytes a message carried: its arrays' data and the bytes in its config records (keys, encrypted
    shares, masked vectors)."""
    total = sum(len(array.data) for record in content.array_records.values() for array in record.values())
    for record in content.config_records.values():
        for value in record.values():
            if isinstance(value, bytes):
                total += len(value)
            elif isinstance(value, list):
                total += sum(len(v) for v in value if isinstance(v, bytes))
    return total


class _Proxy(ClientProxy):
    """What the workflow knows of a sampled client: its node id. Flower's legacy calls to a client are
    never made (the workflow sends its messages through :class:`_Exchange`)."""

    def __init__(self, node_id: int) -> None:
        super().__init__(str(node_id))
        self.node_id = node_id

    def _not_used(self) -> NotImplementedError:
        return NotImplementedError("a secure round reaches its clients through fedfew's exchange")

    def get_properties(self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None) -> GetPropertiesRes:
        raise self._not_used()

    def get_parameters(self, ins: GetParametersIns, timeout: float | None, group_id: int | None) -> GetParametersRes:
        raise self._not_used()

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        raise self._not_used()

    def evaluate(self, ins: EvaluateIns, timeout: float | None, group_id: int | None) -> EvaluateRes:
        raise self._not_used()

    def reconnect(self, ins: ReconnectIns, timeout: float | None, group_id: int | None) -> DisconnectRes:
        raise self._not_used()


class _Round(Strategy):
    """The workflow's legacy hooks: ``configure_fit`` names the round's nodes (their content is fedfew's,
    set after the setup stage), ``aggregate_fit`` receives the unmasked sum (every result carries it)."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes
        self.summed: list[tuple[ClientProxy, FitRes]] | None = None

    # The fit side's clients are _Proxy objects (a node id each).
    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        return [(_Proxy(n), FitIns(Parameters(tensors=[], tensor_type=""), {})) for n in self.nodes]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[tuple[ClientProxy, FitRes] | BaseException]) -> tuple[None, dict[str, Scalar]]:
        self.summed = list(results)
        return None, {}

    def initialize_parameters(self, client_manager: ClientManager) -> None:
        return None

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[tuple[ClientProxy, EvaluateRes] | BaseException]) -> tuple[None, dict[str, Scalar]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> None:
        return None


class _Exchange:
    """The Grid the workflow's stages talk through: fedfew's own exchange (its timeout, its log, its byte
    counts), which stops the run at a client's error reply."""

    def __init__(self, engine: FlowerEngine, round_key: str) -> None:
        self.engine, self.round_key = engine, round_key
        self.client_of = {node: cid for cid, node in engine.node_of.items()}
        self.up: dict[int, int] = {}
        self.down = 0
        self.stage = ""
        self.received: dict[str, dict[int, RecordDict]] = {}  # stage -> cid -> reply content
        self.seconds: dict[str, float] = {}  # stage -> wall-clock seconds of its exchange

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        if not messages:
            return []
        self.stage = str(messages[0].content.config_records[RECORD_KEY_CONFIGS][Key.STAGE])
        pairs = [(self.client_of[m.metadata.dst_node_id], m) for m in messages]
        self.down += sum(content_bytes(m.content) for _, m in pairs)
        doing = f"running round {self.round_key} (secure aggregation, stage {self.stage})"
        sent, out = time.time(), []
        for cid, reply in self.engine._exchange(pairs, timeout or self.engine.round_timeout):
            if self.engine._failed_delivery(cid, reply, doing):  # the node went away: a dropout
                out.append(reply)
                continue
            content = self.engine._content(reply, doing)  # an error record: the run stops here
            self.up[cid] = self.up.get(cid, 0) + content_bytes(content)
            self.received.setdefault(self.stage, {})[cid] = content
            self.engine._log(f"secagg-{self.stage}", self.round_key, cid, content, sent)
            out.append(reply)
        self.seconds[self.stage] = round(time.time() - sent, 3)
        return out


class SecureRoundRecord(TypedDict):
    """A secure round as :attr:`SecureRounds.history` and ``RUN/flower/secagg.jsonl`` record it."""

    round: int
    mode: str
    asked: list[int]
    summed: list[int]
    trained: list[int]
    dropped: list[int]
    left_after_masking: list[int]  # summed, but gone before the unmask stage: their inputs stay in the sum
    num_shares: int
    threshold: int
    step: float
    coordinates: int
    weight_sum: float | None
    dp_clip_margin: float
    error_bound: float
    seconds: dict[str, float]  # stage -> wall-clock seconds of its exchange


class LastRound(TypedDict, total=False):
    """The last secure round's arrays as the server saw them (:attr:`SecureRounds.last`)."""

    sum: np.ndarray  # the unmasked sum
    masked: dict[int, np.ndarray]  # the third stage's masked vector, by client


class SecureRounds:
    """A Flower engine's rounds under secure aggregation (``FlowerEngine.secure``)."""

    def __init__(self, settings: SecureSettings, algorithm: Algorithm) -> None:
        self.settings = settings
        self.weight = check_algorithm(algorithm)
        self.frozen = frozenset(static_tensors(algorithm))
        #: Per round: who was summed, who dropped, the threshold and the error bound (also appended to
        #: RUN/flower/secagg.jsonl).
        self.history: list[SecureRoundRecord] = []
        #: The last round's arrays as the server saw them: the third stage's masked vectors (by client)
        #: and the unmasked sum.
        self.last: LastRound = {}

    def spec(self, task: ClientTask, shapes: list[tuple[str, tuple[int, ...]]]) -> tuple[SecureSpec, ClientTask, float]:
        """(what the nodes are told to send, the task they run, the central-dp clip margin)."""
        s = self.settings
        spec: SecureSpec = {"mode": "mean", "weight": self.weight, "max_weight": s.max_weight,
                                "clipping_range": s.clipping_range}
        margin = 0.0
        if task.privacy is not None:
            privacy = dict(task.privacy)
            spec = {**spec, "mode": "dp", "within": bool(privacy.get("adaptive"))}
            if not privacy.get("local_noise"):  # central-dp: clip below C by the quantisation's reach
                margin = dp_margin(sum(int(np.prod(shape)) for _, shape in shapes), s.step)
                if margin >= float(privacy["clip"]):
                    raise FlowerRunError(f"flower.secure_aggregation: the quantisation step {s.step:.3g} is too coarse "
                                         f"for privacy clip {privacy['clip']:g} on a model of this size: raise "
                                         "quantization_range or lower clipping_range")
                privacy["clip"] = float(privacy["clip"]) - margin
                task = dataclasses.replace(task, privacy=privacy)
        spec["size"] = vector_size(spec, shapes)
        return spec, task, margin

    def deliver(self, engine: FlowerEngine, task: ClientTask, payloads: Mapping[int, Payload]) -> Delivery:
        clients = sorted(payloads)
        if not clients:
            return Delivery({})
        model = payloads[clients[0]]["model"]
        for cid in clients:  # the sum is of updates against one global model
            other = payloads[cid]
            if set(other) != {"model"} or (other["model"] is not model and not all(
                    torch.equal(other["model"][name], model[name]) for name in model)):
                raise FlowerRunError("secure aggregation needs the same broadcast (the global model) for every "
                                     "client of a round")
        shapes = layout(model, self.frozen)
        spec, task, margin = self.spec(task, shapes)
        arrays, meta = to_records({"model": model}, static_tensors(engine.algorithm))
        task_json = json.dumps(task.to_json())

        def content(cid: int) -> RecordDict:
            return RecordDict({"payload": arrays, "payload.meta": meta,
                               "task": ConfigRecord({"task": task_json, "client": cid}),
                               SECURE_KEY: ConfigRecord({"json": json.dumps(spec)})})

        s = self.settings
        workflow = SecAggPlusWorkflow(s.num_shares, s.reconstruction_threshold, max_weight=1.0,
                                      clipping_range=s.clipping_range, quantization_range=s.quantization_range,
                                      modulus_range=s.modulus_range, timeout=engine.round_timeout)
        nodes = [engine.node_of[cid] for cid in clients]
        strategy = _Round(nodes)
        state = RecordDict({MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND: task.round + 1}),
                            MAIN_PARAMS_RECORD: ArrayRecord()})
        context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}),
                                strategy=strategy)
        exchange = _Exchange(engine, task.round_key)
        grid = cast(Grid, exchange)
        flow = WorkflowState()
        stages = (workflow.setup_stage, workflow.share_keys_stage, workflow.collect_masked_vectors_stage,
                  workflow.unmask_stage)
        for name, stage in zip(_STAGES, stages):
            if not stage(grid, context, flow):
                raise FlowerRunError(self._halted(task, name, flow, clients, engine))
            if name == Stage.SETUP:  # the third stage carries fedfew's task to each node
                flow.nid_to_fitins = {engine.node_of[cid]: content(cid) for cid in clients}
        if strategy.summed is None:
            raise FlowerRunError(f"secure aggregation of round {task.round + 1} ended without a sum")
        return self._results(engine, task, spec, model, strategy.summed, exchange, margin, clients, flow)

    def _halted(self, task: ClientTask, stage: str, flow: WorkflowState, clients: list[int],
                engine: FlowerEngine) -> str:
        client_of = {node: cid for cid, node in engine.node_of.items()}
        alive = sorted(client_of[n] for n in flow.active_node_ids if n in client_of)
        gone = sorted(set(clients) - set(alive))
        if len(clients) < 2:
            return (f"secure aggregation of round {task.round + 1} needs at least 2 clients, {len(clients)} was asked "
                    "(federation.clients_per_round, federation.dropout)")
        return (f"secure aggregation of round {task.round + 1} failed at stage {stage}: client(s) {gone} dropped and "
                f"{len(alive)} of {len(clients)} remain, fewer than the {flow.threshold} shares needed to unmask "
                f"(flower.secure_aggregation.reconstruction_threshold={self.settings.reconstruction_threshold}, "
                f"num_shares={self.settings.num_shares}): the round's sum cannot be recovered")

    def _results(self, engine: FlowerEngine, task: ClientTask, spec: SecureSpec, model: Mapping[str, torch.Tensor],
                 summed: list[tuple[ClientProxy, FitRes]], exchange: _Exchange, margin: float, asked: list[int],
                 flow: WorkflowState) -> Delivery:
        client_of = {node: cid for cid, node in engine.node_of.items()}
        cids = sorted(client_of[proxy.node_id] for proxy, _ in summed)
        skipped = {client_of[proxy.node_id] for proxy, fitres in summed if int(fitres.metrics.get("skipped", 0))}
        vector = parameters_to_ndarrays(summed[0][1].parameters)[0] * len(summed)  # the workflow divides by K
        privacy = self.settings.privacy
        denominator = None
        if task.privacy is not None and privacy is not None:
            denominator = privacy.per_round if privacy.central else max(len(cids) - len(skipped), 1)
        try:
            out = server_results(spec, model, np.asarray(vector, dtype=np.float64), cids, skipped, self.settings.step,
                                 self.frozen, denominator, margin)
        except SecureAggregationError as err:
            raise FlowerRunError(str(err)) from None
        self._record(engine, task, spec, out, asked, exchange, flow, margin)
        return Delivery(out.results, bytes_up={cid: exchange.up.get(cid, 0) for cid in cids},
                        bytes_down=exchange.down)

    def _record(self, engine: FlowerEngine, task: ClientTask, spec: SecureSpec, out: SecureSum, asked: list[int],
                exchange: _Exchange, flow: WorkflowState, margin: float) -> None:
        summed = sorted(out.results)
        entry: SecureRoundRecord = {"round": task.round + 1, "mode": spec["mode"], "asked": asked, "summed": summed,
                 "trained": out.trained, "dropped": sorted(set(asked) - set(summed)),
                 "left_after_masking": sorted(set(summed) - set(exchange.received.get(Stage.UNMASK, {}))),
                 "num_shares": flow.num_shares, "threshold": flow.threshold, "step": self.settings.step, "coordinates": int(out.total.size),
                 "weight_sum": out.weight_sum, "dp_clip_margin": margin, "error_bound": out.error_bound,
                 "seconds": dict(exchange.seconds)}
        if entry["dropped"]:
            logger.warning("secure aggregation, round %d: client(s) %s dropped during the protocol; the sum of the "
                           "other %d was unmasked", task.round + 1, entry["dropped"], len(summed))
        if entry["left_after_masking"]:
            logger.warning("secure aggregation, round %d: client(s) %s left after sending their masked vectors; their "
                           "inputs are in the sum (the others' shares removed their private masks)", task.round + 1,
                           entry["left_after_masking"])
        self.history.append(entry)
        self.last = {"sum": out.total, "masked": {cid: _masked(c) for cid, c in
                                                  exchange.received.get(Stage.COLLECT_MASKED_VECTORS, {}).items()}}
        if engine.message_log is not None:
            with open(engine.message_log.parent / "secagg.jsonl", "a") as f:
                f.write(json.dumps(entry) + "\n")


def _masked(content: RecordDict) -> np.ndarray:
    """The masked vector of a third-stage reply (the weight factor first, then the vector, mod M)."""
    parts = [bytes_to_ndarray(b) for b in cast(list[bytes], content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS])]
    return np.concatenate([p.reshape(-1) for p in parts])

