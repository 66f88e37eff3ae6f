"""``fedfew run`` and ``fedfew resume``: validation before any work, a live run folder, checkpoints,
resume and interrupts. The other commands have their own modules: re-scoring a finished run
(:mod:`fedfew.rescore`), sweeps and comparisons (:mod:`fedfew.sweep`), runs on Flower
(:mod:`fedfew.flower`); their old names still import from here."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedfew.config import ConfigError, ExperimentConfig, load_config
from fedfew.engine.engines import Launch
from fedfew.engine.simulator import NothingTrainedError, Simulator
from fedfew.engines import ENGINES
from fedfew.errors import RunInterrupted
from fedfew.experiment import EngineFactory, Experiment, build_experiment, dataset_cache
from fedfew.progress import progress_bar
from fedfew.results import markdown_table, plot_curves, summarise
from fedfew.runfolder import RunFolder, RunFolderError, check_output_base, new_run_path

logger = logging.getLogger(__name__)

#: Moved to their own modules (re-scoring: fedfew.rescore; sweeps: fedfew.sweep; Flower's
#: orchestration: fedfew.flower); these names still import from here.
_MOVED = {"evaluate_run": ("fedfew.rescore", "evaluate_run"), "EVALUATE_KEYS": ("fedfew.rescore", "EVALUATE_KEYS"),
          "parse_grid": ("fedfew.sweep", "parse_grid"), "sweep_configs": ("fedfew.sweep", "sweep_configs"),
          "sweep": ("fedfew.sweep", "sweep"), "write_comparison": ("fedfew.sweep", "write_comparison"),
          "run_on_federation": ("fedfew.flower.launch", "run_on_federation"),
          "run_on_flower": ("fedfew.flower.server", "run_on_flower"),
          "_run_local_flower": ("fedfew.flower.launch", "run_local_flower"),
          "_flower_settings": ("fedfew.flower.launch", "flower_settings")}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        module, attribute = _MOVED[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def warn(message: str) -> None:
    """Kept for callers of the old path: a warning through :mod:`logging`."""
    logger.warning("%s", message)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C while a checkpoint is written (a half-written checkpoint is harmless, but a
    status saying 'interrupted' must follow a whole one); the interrupt is raised right after."""
    pending: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    except ValueError:  # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            raise KeyboardInterrupt


# -- validation before any work -------------------------------------------------------------------
def preflight(config: ExperimentConfig, out_base: str | Path | None = None) -> None:
    """Everything that can be checked before training: the output folder, the data files, the
    partition, the evaluation tasks and the algorithm's construction. Raises the same clean errors
    the run itself would, so a batch stops before its first run."""
    check_output_base(Path(out_base or config.runtime.output_dir))
    build_experiment(config)


def validate_all(configs: list[ExperimentConfig], out_base: str | Path | None = None) -> None:
    with dataset_cache():
        for config in configs:
            preflight(config, out_base)


# -- one run --------------------------------------------------------------------------------------
def run_experiment(config: ExperimentConfig, out_base: str | Path | None = None, progress: bool | None = None,
                   label: str | None = None) -> dict[str, Any]:
    """Build and run ``config`` in a new run folder under ``out_base`` (default runtime.output_dir).
    Returns the summary with the run's history and folder."""
    folder = new_run(config, out_base)
    config = load_config(folder.path / "config.yaml")
    engine = ENGINES.get(config.runtime.engine)
    if engine.runs_elsewhere:
        return engine.launch(Launch(folder, config, progress, label))
    folder.lock()
    try:
        return _train(folder, config, progress, label)
    finally:
        folder.unlock()


def with_resolved_root(config: ExperimentConfig) -> ExperimentConfig:
    """The config with the data folder it will read (``$FEDFEW_DATA`` or ./data when it names none),
    recorded in the run folder so a resume reads the same data from anywhere."""
    if config.dataset.root is not None:
        return config
    from fedfew.data.registry import default_data_root

    root = str(default_data_root().resolve())
    return config.model_copy(update={"dataset": config.dataset.model_copy(update={"root": root})})


def new_run(config: ExperimentConfig, out_base: str | Path | None = None, engine: str | None = None) -> RunFolder:
    """A new run folder for ``config`` with its config and a running status (no lock taken);
    ``engine``: the engine the status names, if not the config's (the Flower ServerApp's)."""
    config = with_resolved_root(config)
    folder = RunFolder(new_run_path(out_base or config.runtime.output_dir, config.name))
    folder.write_config(config)
    folder.set_status("running", round=0, rounds=config.federation.rounds, name=config.name,
                      algorithm=config.algorithm.name, engine=engine or config.runtime.engine)
    return folder


def resume_run(path: str | Path, overrides: list[str] | None = None, progress: bool | None = None) -> dict[str, Any]:
    """Continue a run from its latest checkpoint (or from the start if it never made one) in its own
    folder. Only ``runtime.*`` values may be overridden: anything else would change what is run."""
    folder = RunFolder(path)
    if not (folder.path / "config.yaml").is_file():
        raise RunFolderError(f"{folder.path} is not a fedfew run folder (no config.yaml)")
    status = folder.read_status().get("status")
    if status == "complete":
        raise RunFolderError(f"run {folder.path} is complete: nothing to resume (`fedfew evaluate` re-scores it)")
    bad = [o for o in overrides or [] if not o.split("=", 1)[0].strip().startswith("runtime.")]
    if bad:
        raise ConfigError(f"fedfew resume takes only runtime.* overrides (the run's config is fixed); got {bad[0]!r}")
    config = load_config(folder.path / "config.yaml", overrides)
    engine = ENGINES.get(config.runtime.engine)
    if engine.runs_elsewhere:
        folder.set_status("running", resumed=folder.read_status().get("round", 0))
        return engine.launch(Launch(folder, config, progress, None, resume=True))
    folder.lock()
    try:
        folder.set_status("running", resumed=folder.read_status().get("round", 0))
        return _train(folder, config, progress, None, resume=True)
    finally:
        folder.unlock()


def _train(folder: RunFolder, config: ExperimentConfig, progress: bool | None, label: str | None,
           resume: bool = False, engine_factory: EngineFactory | None = None) -> dict[str, Any]:
    show = config.runtime.progress if progress is None else progress
    start = time.perf_counter()
    try:
        experiment = build_experiment(config)
    except Exception as err:
        folder.set_status("failed", error=str(err))
        raise
    try:
        simulator = experiment.simulator(states_dir=folder.states_dir, engine_factory=engine_factory)
    except Exception as err:
        folder.set_status("failed", error=str(err))
        raise
    try:
        return _train_on(folder, config, experiment, simulator, show, label, resume, start)
    except Exception as err:
        with contextlib.suppress(AttributeError):
            err.run_folder = folder.path  # type: ignore[attr-defined]  # the command line names its error.log
        raise
    finally:
        simulator.engine.close()


def _train_on(folder: RunFolder, config: ExperimentConfig, experiment: Experiment, simulator: Simulator,
              show: bool, label: str | None, resume: bool, start: float) -> dict[str, Any]:
    rounds = config.federation.rounds
    if resume and folder.has_checkpoint():
        folder.load_checkpoint(simulator)
    folder.rewrite_metrics(simulator.state.history)
    checkpointed = simulator.state.round
    bar = progress_bar(config, label, simulator.state.round) if show else None
    every = config.runtime.checkpoint_every

    def on_round(r: int, record: dict[str, Any], sim: Simulator) -> None:
        nonlocal checkpointed
        folder.append_metrics(record)
        if every and (r % every == 0 or r == rounds):
            with interrupts_deferred():
                folder.save_checkpoint(sim)
                checkpointed = r
        folder.set_status("running", round=r)
        if record.get("no_training") and sim.algorithm.trains:
            logger.warning("round %d: no client trained (every client asked sat out or failed)", r)
        if bar is not None:
            shown = {k.replace("train_", ""): f"{v:.3f}" for k, v in record.items()
                     if k in ("train_loss", "train_accuracy", "val_accuracy", "test_accuracy")}
            bar.set_postfix(shown, refresh=False)
            bar.update(1)

    try:
        outcome = simulator.run(rounds, config.federation.clients_per_round, config.eval.every,
                                config.eval.track_test, on_round, selection=config.eval.selection)
    except KeyboardInterrupt:
        with interrupts_deferred():
            if every and checkpointed != simulator.state.round:
                folder.save_checkpoint(simulator)
            folder.set_status("interrupted", round=simulator.state.round)
        raise RunInterrupted(folder.path, simulator.state.round, rounds) from None
    except NothingTrainedError as err:
        folder.set_status("failed", error=str(err))
        raise
    except Exception as err:
        (folder.path / "error.log").write_text(traceback.format_exc())
        folder.set_status("failed", error=f"{type(err).__name__}: {err}")
        raise
    finally:
        if bar is not None:
            bar.close()
    try:
        folder.save_model(simulator, outcome["selected_round"])
        seconds = time.perf_counter() - start + (simulator.state.seconds if resume else 0.0)
        summary = summarise(config, outcome, seconds, experiment.context)
        if summary.get("at_chance") and not summary.get("control"):
            logger.warning("%s: test accuracy %.2f%% is at chance (%.1f%%): the model learned nothing measurable at "
                           "this budget", config.name, 100 * summary["test"]["accuracy"], 100 * summary["chance"])
        _write_results(folder, config, outcome, summary)
    except Exception as err:
        (folder.path / "error.log").write_text(traceback.format_exc())
        folder.set_status("failed", error=f"{type(err).__name__}: {err}")
        raise
    folder.set_status("complete", round=rounds, selected_round=outcome["selected_round"])
    summary.update({"history": outcome["history"], "folder": str(folder.path), "label": label or config.name})
    summary["_simulator"] = simulator
    return summary


_progress_bar = progress_bar  # the old name

def _write_results(folder: RunFolder, config: ExperimentConfig, outcome: dict[str, Any],
                   summary: dict[str, Any]) -> None:
    (folder.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (folder.path / "results.md").write_text(f"# {config.name}\n\n" + markdown_table([summary]))
    plot_curves({config.algorithm.name: outcome["history"]}, folder.path / "accuracy.png", config.name)
