"""The ServerApp's work: a fedfew run whose rounds go to the SuperNodes through
:class:`~fedfew.flower.engine.FlowerEngine`, in the run folder ``fedfew run`` made (or a new one),
with the same checkpoints, evaluation and summary as any other engine."""

from __future__ import annotations

import logging
from pathlib import Path

from flwr.serverapp import Grid

from fedfew.config.validation import load_config
from fedfew.core.jsontypes import JSONObject
from fedfew.engine.base import Faults
from fedfew.flower.engine import FlowerEngine
from fedfew.interface.compute import Compute
from fedfew.interface.state_store import ClientStates
from fedfew.privacy.secure_sum import SecureSettings
from fedfew.run.experiment import Experiment
from fedfew.run.folder import RunFolder
from fedfew.run.results import RunSummary
from fedfew.run.runner import new_run, train_in_folder

logger = logging.getLogger(__name__)


def run_on_flower(grid: Grid, config_data: JSONObject, run_dir: str | None) -> RunSummary:
    """Run ``config_data`` with the Flower engine in the run folder ``run_dir`` (made by ``fedfew
    run``; or a new run folder under it, or under runtime.output_dir)."""
    config = load_config(config_data)
    if run_dir and (Path(run_dir) / "config.yaml").is_file():
        folder = RunFolder(run_dir)
    else:
        folder = new_run(config, run_dir, engine="flower")
    (folder.path / "flower").mkdir(exist_ok=True)
    f = config.flower

    def engine(experiment: Experiment, states: ClientStates, faults: Faults, compute: Compute) -> FlowerEngine:
        return FlowerEngine(grid, experiment.algorithm, config.seed, config_data, len(experiment.clients), faults,
                            compute, f.round_timeout, f.startup_timeout, folder.path / "flower" / "messages.jsonl",
                            SecureSettings.from_config(f.secure_aggregation, experiment))

    resume = folder.has_checkpoint()
    if resume:
        logger.warning("resuming on Flower: the clients' private states were held by the nodes of the interrupted "
                       "run and start again from their initial values")
    with folder.held():
        return train_in_folder(folder, config, False, None, resume=resume, engine_factory=engine)
