"""The ClientApp's handlers, a SuperNode's answers to fedfew's three messages (``query``, ``train``,
``evaluate``; :mod:`fedfew.flower.apps.components` describes them), shared by the deployment runtime's ClientApp
(:mod:`fedfew.flower.apps.components`) and the simulation's virtual nodes (:mod:`fedfew.flower.simulation`).

Each takes the :class:`~fedfew.engine.base.ExperimentBuilder` its app hands it: what a node needs of
:mod:`fedfew.run.experiment`, which sits above the engines and is never imported here.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from typing import cast

import psutil
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedfew.core.jsontypes import JSONObject
from fedfew.engine.base import ExperimentBuilder
from fedfew.engine.tasks import ClientTask, run_client_task
from fedfew.flower.node import (
    node_evaluation_data,
    node_settings,
    node_setup,
    read_state,
    store_config,
    stored_config,
    write_state,
)
from fedfew.flower.records import parts_from_records, to_records
from fedfew.flower.secagg import SECURE_KEY, secure_input
from fedfew.interface.protocol import MAIN, evaluate_generator, init_generator, initial_client_state
from fedfew.interface.static import static_tensors


def _process_started() -> float:
    """Wall-clock time this process started (now where the OS does not say)."""
    try:
        started = float(psutil.Process().create_time())
    except psutil.Error:
        return time.time()
    if hasattr(time, "CLOCK_BOOTTIME"):  # Linux: psutil adds the boot time in whole seconds; the boot clock
        # has it to the microsecond, so a start-up of a few tenths of a second is measured as it was
        started += time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) - psutil.boot_time()
    return started


# A ClientApp process serves one message: when it started and had imported fedfew (round timing).
PROCESS_STARTED, IMPORTED_AT = _process_started(), time.time()


def where_this_runs() -> JSONObject:
    """Which machine and process answered (and, on Ray, which Ray node): recorded with each reply."""
    where: JSONObject = {"host": socket.gethostname(), "pid": os.getpid()}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        where["ray_node"] = ray.get_runtime_context().get_node_id()
    return where


# -- a client --------------------------------------------------------------------------------------
def _payload_records(msg: Message) -> tuple[ArrayRecord, ConfigRecord]:
    """The payload's arrays and skeleton, as the server's engine put them (a RecordDict's values are
    typed as any kind of record)."""
    return cast(ArrayRecord, msg.content["payload"]), cast(ConfigRecord, msg.content["payload.meta"])


def _error_reply(msg: Message, cid: object, err: BaseException) -> Message:
    detail = "".join(traceback.format_exception_only(type(err), err)).strip()
    return Message(RecordDict({"error": ConfigRecord({"client": str(cid), "message": detail})}), reply_to=msg)


def hello(msg: Message, context: Context, builder: ExperimentBuilder, prepare: bool = True) -> Message:
    """Store the run's config; with ``prepare``, build and cache the node's algorithm and data now (a
    simulated node's cache was written by the server: it skips this)."""
    cid: object = context.node_config.get("client-id")
    try:
        client_id, data_root, cache_dir = node_settings(dict(context.node_config))
        config = json.loads(str(msg.content["fedfew"]["config"]))
        for key in [k for k in context.state if k.startswith("fedfew.")]:  # a run starts: nothing from before
            del context.state[key]
        store_config(context.state, config)
        if prepare:
            torch.set_num_threads(1)
            node_setup(stored_config(context.state, builder), client_id, data_root, cache_dir, builder)  # build and cache now
        return Message(RecordDict({"fedfew": ConfigRecord({"client-id": client_id})}), reply_to=msg)
    except Exception as err:  # the server reports it and stops the run
        return _error_reply(msg, cid, err)


def train(msg: Message, context: Context, builder: ExperimentBuilder) -> Message:
    """Run the client task of ``msg`` on this node's data and private state; reply with the upload."""
    cid: object = context.node_config.get("client-id")
    started = time.time()
    try:
        torch.set_num_threads(int(os.environ.get("FEDFEW_NODE_THREADS", "1")))
        client_id, data_root, cache_dir = node_settings(dict(context.node_config))
        setup = node_setup(stored_config(context.state, builder), client_id, data_root, cache_dir, builder)
        task = ClientTask.from_json(json.loads(str(msg.content["task"]["task"])))
        static = static_tensors(setup.algorithm)  # frozen parameters: this node's own copy
        payload = parts_from_records(*_payload_records(msg), static)
        state: object = read_state(context.state, task.namespace, task.round)
        if state is None and task.namespace == MAIN:  # first contact: the client's initial state
            state = initial_client_state(setup.algorithm, setup.client, init_generator(setup.config.seed, client_id))
        with setup.compute.scope():
            result = run_client_task(setup.algorithm, task, setup.client, payload, state, setup.config.seed)
        write_state(context.state, task.namespace, task.round, result.state)  # stays on this node
        if SECURE_KEY in msg.content:  # a secure round: the vector for secaggplus_mod to mask, nothing else
            content = secure_input(json.loads(str(msg.content[SECURE_KEY]["json"])), payload, result, static.keys())
            where = {"where": where_this_runs(), "timing": {"process": PROCESS_STARTED, "imported": IMPORTED_AT,
                                                            "started": started, "finished": time.time()}}
            content["result"] = ConfigRecord({"json": json.dumps(where)})
            return Message(content, reply_to=msg)
        arrays, meta = to_records(result.upload, static)
        summary = {**result.summary(), "where": where_this_runs(),
                   "timing": {"process": PROCESS_STARTED, "imported": IMPORTED_AT, "started": started,
                              "finished": time.time()}}
        return Message(RecordDict({"upload": arrays, "upload.meta": meta,
                                   "result": ConfigRecord({"json": json.dumps(summary)})}), reply_to=msg)
    except Exception as err:
        return _error_reply(msg, cid, err)


def evaluate(msg: Message, context: Context, builder: ExperimentBuilder) -> Message:
    """Score this node's own model on the split ``msg`` names (a personalised method's evaluation)."""
    cid: object = context.node_config.get("client-id")
    try:
        torch.set_num_threads(int(os.environ.get("FEDFEW_NODE_THREADS", "1")))
        client_id, data_root, cache_dir = node_settings(dict(context.node_config))
        setup = node_setup(stored_config(context.state, builder), client_id, data_root, cache_dir, builder)
        split = str(msg.content["task"]["split"])
        data = node_evaluation_data(setup.config, data_root, split, builder)
        payload = parts_from_records(*_payload_records(msg), static_tensors(setup.algorithm))
        state: object = read_state(context.state, MAIN, -1)
        if state is None:  # never trained: its initial state, as the server side would create it
            state = initial_client_state(setup.algorithm, setup.client, init_generator(setup.config.seed, client_id))
            write_state(context.state, MAIN, -1, state)
        generator = evaluate_generator(setup.config.seed, split, client_id)
        with setup.compute.scope():
            scores = setup.algorithm.evaluate_client(payload, state, setup.client, data, generator)
        # In the state form, as uploads travel: scores are numbers, but an evaluation may send a model
        # (f2l's test_client_model: average sends each client-model to be averaged).
        arrays, meta = to_records(scores, static_tensors(setup.algorithm))
        return Message(RecordDict({"scores": arrays, "scores.meta": meta}), reply_to=msg)
    except Exception as err:
        return _error_reply(msg, cid, err)
