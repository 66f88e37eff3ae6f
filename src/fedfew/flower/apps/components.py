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
from pathlib import Path

from flwr.app import Context, Message, UserConfig
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedfew.core.jsontypes import JSONObject
from fedfew.flower import handlers
from fedfew.flower.secagg import secure_aggregation_mod
from fedfew.run.experiment import NODE_BUILDER

server_app = ServerApp()
client_app = ClientApp()


# -- the server ------------------------------------------------------------------------------------
def run_settings(run_config: UserConfig) -> tuple[JSONObject, str | None]:
    """(config as a dict, run folder) from the run configuration."""
    from fedfew.core.yaml12 import load_yaml

    encoded = str(run_config.get("fedfew-config") or "")
    if encoded:
        config = json.loads(base64.b64decode(encoded))
    elif run_config.get("config-file"):
        config = load_yaml(Path(str(run_config["config-file"])).read_text())
    else:
        raise ValueError("fedfew's ServerApp needs --run-config 'config-file=\"CONFIG.yaml\"' (or fedfew-config)")
    return config, (str(run_config["run-dir"]) if run_config.get("run-dir") else None)


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    from fedfew.flower.apps.server import run_on_flower

    config, run_dir = run_settings(dict(context.run_config))
    run_on_flower(grid, config, run_dir)


# -- a client: the handlers (fedfew.flower.handlers) with this package's experiment builder ------------
@client_app.query()
def hello(msg: Message, context: Context) -> Message:
    return handlers.hello(msg, context, NODE_BUILDER)


@client_app.train(mods=[secure_aggregation_mod])  # Flower's SecAgg+ on the rounds that ask for it
def train(msg: Message, context: Context) -> Message:
    return handlers.train(msg, context, NODE_BUILDER)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return handlers.evaluate(msg, context, NODE_BUILDER)
