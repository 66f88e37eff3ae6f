"""``runtime.engine: flower`` on this machine: the engine registered under that name.

A run on Flower trains in the ServerApp (:mod:`fedfew.flower.apps.server`), a process of its own; this
process starts the federation (a SuperLink and one SuperNode per client, :mod:`fedfew.flower.local`),
hands it the run folder, follows the folder's status for the progress bar and reads the summary back
at the end. Every process is stopped at the end, on error or Ctrl-C too. Nothing here imports flwr:
the engine is registered whether or not Flower is installed, and a run asks for it only when it starts.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import logging
from typing import TYPE_CHECKING

from pydantic import BaseModel

from fedfew.core.errors import ConfigError, RunInterrupted
from fedfew.core.jsontypes import JSONObject
from fedfew.core.progress import progress_bar
from fedfew.engine.base import ENGINES, Engine, EngineSetup, InProcessEngine, Launch, RunFolderView
from fedfew.flower.errors import FlowerRunError

if TYPE_CHECKING:
    from fedfew.core.config_schema import ExperimentSchema
    from fedfew.flower.local import FlowerSettings, LocalFederation

__all__ = ["FlowerLaunch", "FlowerRunError", "flower_settings", "run_local_flower", "run_on_federation"]

logger = logging.getLogger(__name__)


def flower_settings(config: ExperimentSchema) -> FlowerSettings:
    """The ``flower:`` section as the local federation takes it (an error if Flower is missing)."""
    if importlib.util.find_spec("flwr") is None:
        raise ConfigError("runtime.engine=flower needs Flower: pip install 'fedfew[flower]'")
    from fedfew.flower.local import FlowerSettings

    f = config.flower
    return FlowerSettings(f.round_timeout, f.startup_timeout, f.port, f.tls, f.node_auth)


@ENGINES.register("flower", help="Flower's deployment runtime: a SuperLink and one SuperNode per client")
class FlowerLaunch(Engine):
    """The name ``flower`` in :data:`~fedfew.engine.base.ENGINES`: the run goes to a local
    federation; the engine that runs its rounds is :class:`fedfew.flower.engine.FlowerEngine`, built
    by the ServerApp."""

    name = "flower"
    holds_states = False
    runs_elsewhere = True
    honours_privacy = True
    #: Its rounds can be Flower's SecAgg+ (``flower.secure_aggregation``): the server sees the masked sum.
    honours_secure_aggregation = True

    @classmethod
    def check_config(cls, config: ExperimentSchema) -> None:
        super().check_config(config)
        p = config.privacy
        if p.enabled and p.noise == "seeded" and "noise" not in p.model_fields_set:
            # Real parties hold the config on the deployment engine: reproducible noise only when asked for
            # (the default is secure, so this guards a default that would ever change, or a plugin's).
            raise ValueError("privacy.noise: seeded noise on runtime.engine=flower would let every party holding "
                             "the config regenerate it: set privacy.noise: seeded explicitly (research only) or secure")

    @classmethod
    def launch(cls, run: Launch) -> JSONObject:
        return run_local_flower(run.folder, run.config, run.progress, run.label, run.resume)


@ENGINES.register("flower-sim", help="Flower's Simulation Engine on Ray: one virtual SuperNode per client (flower.sim.*)")
class FlowerSimLaunch(Engine):
    """The name ``flower-sim``: the run trains in this process with
    :class:`fedfew.flower.simulation.FlowerSimEngine`, whose virtual SuperNodes run as Ray actors."""

    name = "flower-sim"
    holds_states = False
    honours_privacy = True
    honours_secure_aggregation = True

    @classmethod
    def build(cls, setup: EngineSetup, options: BaseModel) -> Engine:
        if setup.experiment is None:  # new clients an algorithm makes (FRL's deployment groups): in this
            return InProcessEngine.build(setup, options)  # process, as on flower (experiment.federation_factory)
        if importlib.util.find_spec("ray") is None or importlib.util.find_spec("flwr") is None:
            raise ConfigError("runtime.engine=flower-sim needs Flower's simulation extra: "
                              "pip install 'fedfew[flower-sim]'")
        if setup.builder is None:
            raise ConfigError("runtime.engine=flower-sim needs the experiment's builder (EngineSetup.builder)")
        # Imported when a flower-sim run starts: it imports flwr and ray. Its virtual nodes build the
        # experiment with setup.builder, handed down by fedfew.run.experiment (never imported from here).
        from fedfew.flower import simulation

        return simulation.start_simulation_engine(setup.experiment, setup.states, setup.faults, setup.compute,
                                                  setup.builder, setup.states_dir)


def run_local_flower(folder: RunFolderView, config: ExperimentSchema, progress: bool | None, label: str | None,
                     resume: bool = False) -> JSONObject:
    """``runtime.engine: flower`` on this machine: a SuperLink and a SuperNode per client as separate
    processes, the ServerApp (started by the SuperLink) training in ``folder``; every process stopped
    at the end, on error or Ctrl-C too."""
    settings = flower_settings(config)
    from fedfew.flower.local import LocalFederation

    federation = LocalFederation(folder.path / "flower", config.partition.num_clients, settings, config.dataset.root)
    try:
        with federation:
            return run_on_federation(federation, folder, config, progress, label, resume)
    except KeyboardInterrupt:
        status = folder.read_status()
        if status.get("status") == "complete":
            raise
        folder.set_status("interrupted", round=status.get("round", 0))
        raise RunInterrupted(folder.path, status.get("round", 0), config.federation.rounds) from None


def run_on_federation(federation: LocalFederation, folder: RunFolderView, config: ExperimentSchema, progress: bool | None = False,
                      label: str | None = None, resume: bool = False) -> JSONObject:
    """Run ``config`` in ``folder`` on a started :class:`~fedfew.flower.local.LocalFederation` (the
    ServerApp trains; this process follows the run folder) and return the summary."""
    show = config.runtime.progress if progress is None else progress
    bar = progress_bar(config, label, folder.read_status().get("round", 0) if resume else 0) if show else None
    encoded = base64.b64encode(json.dumps(config.model_dump(mode="json")).encode()).decode()

    def follow() -> None:
        if bar is not None:
            done = folder.read_status().get("round", 0)
            if done > bar.n:
                bar.update(done - bar.n)

    try:
        federation.run_app({"fedfew-config": encoded, "run-dir": str(folder.path)}, follow)
    finally:
        if bar is not None:
            bar.close()
    status = folder.read_status()
    if status.get("status") == "failed":
        raise FlowerRunError(f"the run failed on Flower: {status.get('error')} ({folder.path})")
    if status.get("status") != "complete":
        folder.set_status("failed", error="the ServerApp ended before the run finished")
        raise FlowerRunError(f"the ServerApp ended before the run finished: see {federation.folder}/*.log")
    summary = json.loads((folder.path / "summary.json").read_text())
    history = [json.loads(line) for line in (folder.path / "metrics.jsonl").read_text().splitlines()]
    summary.update({"history": history, "folder": str(folder.path), "label": label or config.name})
    return summary
