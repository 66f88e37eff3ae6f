"""fedfew's Flower app: ``server_app`` (a ServerApp) and ``client_app`` (a ClientApp).

The ServerApp runs a fedfew experiment exactly as ``fedfew run`` does (the same run folder,
checkpoints, evaluation and summary) with the :class:`~fedfew.flower.engine.FlowerEngine`; the
ClientApp answers its three messages on a SuperNode:

* ``query``: the run's config arrives; the node stores it in ``context.state``, builds (or reads from
  its cache) its algorithm and its own data, and answers with its client id;
* ``train``: a client task; the node runs it on its own data with its private state from
  ``context.state``, keeps the new state there, and replies with the upload and metrics only (in a
  secure round, ``flower.secure_aggregation``, Flower's ``secaggplus_mod`` answers the protocol's
  stages and masks the vector this handler makes of the result: :mod:`fedfew.flower.secagg`);
* ``evaluate``: a personalised method's client scores its own model on the split's tasks.

Run configuration (``flwr run ... --run-config``): ``fedfew-config`` (the experiment config as
base64-encoded JSON) or ``config-file`` (a YAML path on the server's machine), and ``run-dir`` (a
run folder made by ``fedfew run``, or a folder to make a new run folder in).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psutil
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedfew.engine.protocol import MAIN, evaluate_generator, init_generator
from fedfew.engine.static import static_tensors
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
from fedfew.flower.records import from_records, to_records
from fedfew.flower.secagg import SECURE_KEY, secure_aggregation_mod, secure_input


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

server_app = ServerApp()
client_app = ClientApp()


def where_this_runs() -> dict[str, Any]:
    """Which machine and process answered (and, on Ray, which Ray node): recorded with each reply."""
    where: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        where["ray_node"] = ray.get_runtime_context().get_node_id()
    return where


# -- the server ------------------------------------------------------------------------------------
def run_settings(run_config: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(config as a dict, run folder) from the run configuration."""
    import yaml

    encoded = str(run_config.get("fedfew-config") or "")
    if encoded:
        config = json.loads(base64.b64decode(encoded))
    elif run_config.get("config-file"):
        config = yaml.safe_load(Path(str(run_config["config-file"])).read_text())
    else:
        raise ValueError("fedfew's ServerApp needs --run-config 'config-file=\"CONFIG.yaml\"' (or fedfew-config)")
    return config, (str(run_config["run-dir"]) if run_config.get("run-dir") else None)


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    from fedfew.flower.server import run_on_flower

    config, run_dir = run_settings(dict(context.run_config))
    run_on_flower(grid, config, run_dir)


# -- a client --------------------------------------------------------------------------------------
def _error_reply(msg: Message, cid: Any, err: BaseException) -> Message:
    detail = "".join(traceback.format_exception_only(type(err), err)).strip()
    return Message(RecordDict({"error": ConfigRecord({"client": str(cid), "message": detail})}), reply_to=msg)


@client_app.query()
def hello(msg: Message, context: Context, prepare: bool = True) -> Message:
    """Store the run's config; with ``prepare``, build and cache the node's algorithm and data now (a
    simulated node's cache was written by the server: it skips this)."""
    cid: Any = context.node_config.get("client-id")
    try:
        client_id, data_root, cache_dir = node_settings(dict(context.node_config))
        config = json.loads(str(msg.content["fedfew"]["config"]))
        for key in [k for k in context.state if k.startswith("fedfew.")]:  # a run starts: nothing from before
            del context.state[key]
        store_config(context.state, config)
        if prepare:
            torch.set_num_threads(1)
            node_setup(stored_config(context.state), client_id, data_root, cache_dir)  # build and cache now
        return Message(RecordDict({"fedfew": ConfigRecord({"client-id": client_id})}), reply_to=msg)
    except Exception as err:  # the server reports it and stops the run
        return _error_reply(msg, cid, err)


@client_app.train(mods=[secure_aggregation_mod])  # Flower's SecAgg+ on the rounds that ask for it
def train(msg: Message, context: Context) -> Message:
    cid: Any = context.node_config.get("client-id")
    started = time.time()
    try:
        torch.set_num_threads(int(os.environ.get("FEDFEW_NODE_THREADS", "1")))
        client_id, data_root, cache_dir = node_settings(dict(context.node_config))
        setup = node_setup(stored_config(context.state), client_id, data_root, cache_dir)
        task = ClientTask.from_json(json.loads(str(msg.content["task"]["task"])))
        static = static_tensors(setup.algorithm)  # frozen parameters: this node's own copy
        payload = from_records(msg.content["payload"], msg.content["payload.meta"], static)
        state = read_state(context.state, task.namespace, task.round)
        if state is None and task.namespace == MAIN:  # first contact: the client's initial state
            state = setup.algorithm.init_client_state(setup.client, init_generator(setup.config.seed, client_id))
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


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    cid: Any = context.node_config.get("client-id")
    try:
        torch.set_num_threads(int(os.environ.get("FEDFEW_NODE_THREADS", "1")))
        client_id, data_root, cache_dir = node_settings(dict(context.node_config))
        setup = node_setup(stored_config(context.state), client_id, data_root, cache_dir)
        split = str(msg.content["task"]["split"])
        data = node_evaluation_data(setup.config, data_root, split)
        payload = from_records(msg.content["payload"], msg.content["payload.meta"], static_tensors(setup.algorithm))
        state = read_state(context.state, MAIN, -1)
        if state is None:  # never trained: its initial state, as the server side would create it
            state = setup.algorithm.init_client_state(setup.client, init_generator(setup.config.seed, client_id))
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
