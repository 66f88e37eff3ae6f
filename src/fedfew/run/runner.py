"""``fedfew run`` and ``fedfew resume``: validation before any work, a live run folder, checkpoints,
resume and interrupts. The other commands have their own modules: re-scoring a finished run
(:mod:`fedfew.run.rescore`), sweeps and comparisons (:mod:`fedfew.run.sweep`), runs on Flower
(:mod:`fedfew.flower`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedfew.config.engines import ENGINES
from fedfew.config.validation import ConfigError, ExperimentConfig, load_config
from fedfew.core.codeversion import numbers_version, package_version
from fedfew.core.errors import FedfewError, RunFailedError, RunInterrupted, UsageError
from fedfew.core.integrity import (
    RESUME_CHANGEABLE,
    config_digest,
    data_changed,
    note_not_recorded,
    sha256_bytes,
)
from fedfew.core.progress import progress_bar
from fedfew.core.tracking import Trackers
from fedfew.engine.base import Launch
from fedfew.engine.guard import DivergedError, LossGuard
from fedfew.engine.simulator import NothingTrainedError, Simulator
from fedfew.interface import serialize
from fedfew.privacy.membership import membership_inference
from fedfew.run.datarecord import data_record
from fedfew.run.experiment import EngineFactory, Experiment, build_experiment, dataset_cache
from fedfew.run.folder import (
    PENDING_RESULTS,
    STATUSES,
    RunFolder,
    RunFolderError,
    check_output_base,
    new_run_path,
    strict_json,
)
from fedfew.run.model_check import check_model_runs
from fedfew.run.results import (
    below_initial_message,
    markdown_table,
    participation,
    plot_curves,
    privacy_line,
    summarise,
)

logger = logging.getLogger(__name__)


class DataChangedError(UsageError):
    """The data a run recorded is not the data there now (a resume would train on other data)."""


class RunCrashedError(RunFailedError):
    """The run stopped on an unexpected error (a bug, a plugin's exception or sys.exit, a full disk);
    the message says what and where, the traceback is in RUN/error.log."""


def warn(message: str) -> None:
    """Kept for callers of the old path: a warning through :mod:`logging`."""
    logger.warning("%s", message)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C while a checkpoint is written (a half-written checkpoint is harmless, but a
    status saying 'interrupted' must follow a whole one); the interrupt is raised right after."""
    pending: list[int] = []
    deferred = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.getsignal(signum) for signum in deferred}
    try:
        for signum in deferred:
            signal.signal(signum, lambda signum, frame: pending.append(signum))
    except ValueError:  # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            raise KeyboardInterrupt


# -- validation before any work -------------------------------------------------------------------
def preflight(config: ExperimentConfig, out_base: str | Path | None = None) -> None:
    """Everything that can be checked before training: the output folder, the data files, the
    partition, the evaluation tasks and the algorithm's construction. Raises the same clean errors
    the run itself would, so a batch stops before its first run."""
    check_output_base(Path(out_base or config.runtime.output_dir))
    check_model_runs(build_experiment(config))


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
    written = load_config(folder.path / "config.yaml")  # the config as a resume reads it back
    folder.set_status("running", round=0, rounds=config.federation.rounds, name=config.name,
                      algorithm=config.algorithm.name, engine=engine or config.runtime.engine,
                      config_sha256=config_digest(written.model_dump(mode="json")))
    return folder


def check_run_folder(folder: RunFolder, command: str) -> dict[str, Any]:
    """The status of a run folder ``command`` may use: a config.yaml and a readable status.json with a
    known status (a folder without one is not a run, or has lost the record of its version and config)."""
    if not (folder.path / "config.yaml").is_file():
        raise RunFolderError(f"{folder.path} is not a fedfew run folder (no config.yaml)")
    path = folder.path / "status.json"
    if not path.is_file():
        raise RunFolderError(f"{folder.path} is not a fedfew run folder (no status.json): {command} needs the run's "
                             "record of its status, version and config; start a new run with `fedfew run`")
    recorded = folder.read_status()
    if recorded.get("status") not in STATUSES:
        raise RunFolderError(f"{path} is unreadable or names no status ({recorded.get('status')!r}): {command} "
                             "cannot tell which version wrote the run; start a new run with `fedfew run`")
    return recorded


def check_config_unchanged(folder: RunFolder, recorded: dict[str, Any], command: str) -> None:
    """Refuse a run whose config.yaml was edited since the run started, beyond what may change
    (:data:`fedfew.core.integrity.RESUME_CHANGEABLE`); a folder older than the record is used unchecked."""
    expected = recorded.get("config_sha256")
    path = folder.path / "config.yaml"
    if not isinstance(expected, str):
        note_not_recorded(path, "the config")
        return
    if config_digest(load_config(path).model_dump(mode="json")) != expected:
        raise ConfigError(f"{path} has changed since the run started: {command} uses the config the run was "
                          f"started with (only {', '.join(k + '.*' if '.' not in k else k for k in RESUME_CHANGEABLE)}"
                          " may change, in the file or with --set runtime.KEY=VALUE); restore it, or start a new run "
                          "with the new config")


def resume_run(path: str | Path, overrides: list[str] | None = None, progress: bool | None = None,
               allow_other_version: bool = False) -> dict[str, Any]:
    """Continue a run from its latest checkpoint (or from the start if it never made one) in its own
    folder. Only ``runtime.*`` values may be overridden: anything else would change what is run. A run
    written by another fedfew version or other number code is refused unless ``allow_other_version``
    (its rounds would then come from two versions: the summary records both)."""
    folder = RunFolder(path)
    recorded = check_run_folder(folder, "fedfew resume")
    status = recorded.get("status")
    if status == "complete":
        raise RunFolderError(f"run {folder.path} is complete: nothing to resume (`fedfew evaluate` re-scores it)")
    other = other_version(recorded)
    if other is not None:
        if not allow_other_version:
            raise RunFolderError(f"run {folder.path} was written by {_described(other['written_by'])} and this is "
                                 f"{_described(other['resumed_by'])}: its rounds would mix two versions' numbers; "
                                 "finish it with the version that started it, or pass --allow-other-version "
                                 "(the summary then records both)")
        logger.warning("resuming %s, written by %s, with %s (--allow-other-version): the summary records both",
                       folder.path, _described(other["written_by"]), _described(other["resumed_by"]))
        folder.set_status(status or "interrupted", other_version=other)
    bad = [o for o in overrides or [] if not o.split("=", 1)[0].strip().startswith("runtime.")]
    if bad:
        raise ConfigError(f"fedfew resume takes only runtime.* overrides (the run's config is fixed); got {bad[0]!r}")
    check_config_unchanged(folder, recorded, "fedfew resume")
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


def other_version(status: dict[str, Any]) -> dict[str, Any] | None:
    """{written_by, resumed_by} when the run of ``status`` was written by another fedfew version or other
    number code (:func:`fedfew.core.codeversion.numbers_version`) than this one; None when the same. A folder
    older than the code record (no ``code``) is judged by its package version alone."""
    now = {"fedfew": package_version(), "code": numbers_version()}
    then = {"fedfew": status.get("fedfew"), "code": status.get("code")}
    if then["fedfew"] is None:
        return None  # not written by a run (no status.json yet): nothing was computed to mix with
    same = then["fedfew"] == now["fedfew"] and then["code"] in (None, now["code"])
    return None if same else {"written_by": then, "resumed_by": now}


def _described(version: dict[str, Any]) -> str:
    code = version.get("code")
    return f"fedfew {version.get('fedfew')}" + (f" (number code {code})" if code else " (number code not recorded)")


def _train(folder: RunFolder, config: ExperimentConfig, progress: bool | None, label: str | None,
           resume: bool = False, engine_factory: EngineFactory | None = None) -> dict[str, Any]:
    show = config.runtime.progress if progress is None else progress
    start = time.perf_counter()
    try:
        experiment = build_experiment(config)
        record = data_record(experiment)
        if resume:
            check_same_data(folder, record)
        folder.write_data(record)  # what data the run used: RUN/data.json
        simulator = experiment.simulator(states_dir=folder.states_dir, engine_factory=engine_factory)
    except KeyboardInterrupt:  # while reading the data or starting the workers: nothing new finished
        done = folder.read_status().get("round", 0)
        folder.set_status("interrupted", round=done)
        raise RunInterrupted(folder.path, done, config.federation.rounds, "while the run was being set up") from None
    except DataChangedError:  # refused before any work: the run stands as it was, resumable on its data
        folder.set_status("interrupted", round=folder.read_status().get("round", 0))
        raise
    except FedfewError as err:
        folder.set_status("failed", error=str(err))
        raise
    except (Exception, SystemExit) as err:
        raise _failed(folder, err, "while the run was being set up") from err
    try:
        return _train_on(folder, config, experiment, simulator, show, label, resume, start)
    except Exception as err:
        with contextlib.suppress(AttributeError):
            err.run_folder = folder.path  # type: ignore[attr-defined]  # the command line names its error.log
        raise
    finally:
        simulator.engine.close()


def check_same_data(folder: RunFolder, record: dict[str, Any]) -> None:
    """Refuse to go on with a run whose data source changed since it recorded it (data.json)."""
    path = folder.path / "data.json"
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        recorded = None
    if not isinstance(recorded, dict) or recorded.get("source") is None or recorded.get("fingerprint") is None:
        if isinstance(recorded, dict) and recorded.get("source") is not None and "fingerprint" not in recorded:
            note_not_recorded(path, "the data source's content")  # an older run folder
        return
    why = data_changed(recorded, record)
    if why is not None:
        raise DataChangedError(f"the data of run {folder.path} has changed: {why}; restore the data the run started "
                               f"on (recorded in {path}) or start a new run")


def _failed(folder: RunFolder, err: BaseException, where: str) -> RunFailedError:
    """Record a run that stopped on an unexpected error (status failed, the traceback in error.log,
    room made first if the disk is full) and the one-line error to raise."""
    folder.release_reserve()  # a full disk: the few KiB kept for this record
    if isinstance(err, SystemExit):
        message = f"the run's code called sys.exit({err.code!r}) {where}"
    elif isinstance(err, OSError) and err.filename and err.strerror:
        message = f"cannot write {err.filename}: {err.strerror} ({where})"
    else:
        text = " ".join(str(err).split())
        message = f"{type(err).__name__}{': ' + text if text else ''} ({where})"
    with contextlib.suppress(OSError):
        (folder.path / "error.log").write_text(f"{message}\n\n{traceback.format_exc()}")
    with contextlib.suppress(OSError):
        folder.set_status("failed", error=message)
    return RunCrashedError(f"run failed: {message}; see {folder.path / 'error.log'}")


def _train_on(folder: RunFolder, config: ExperimentConfig, experiment: Experiment, simulator: Simulator,
              show: bool, label: str | None, resume: bool, start: float) -> dict[str, Any]:
    rounds = config.federation.rounds
    try:
        if resume and folder.has_checkpoint():
            folder.load_checkpoint(simulator)
        folder.discard_results()  # what an earlier attempt's cut-short write-up left: this run is not complete
        folder.remove_temporaries()  # and its half-written files (a write killed before its rename)
        folder.rewrite_metrics(simulator.state.history)
    except KeyboardInterrupt:  # the checkpoint on disk is untouched: it stands
        done = folder.read_status().get("round", 0)
        folder.set_status("interrupted", round=done)
        raise RunInterrupted(folder.path, done, rounds, "while the run was being set up") from None
    checkpointed = simulator.state.round
    seconds_before = simulator.state.seconds  # the rounds' time in the sittings before this one (0 for a new run)
    bar = progress_bar(config, label, simulator.state.round) if show else None
    every = config.runtime.checkpoint_every
    trackers = Trackers(folder.path, config)  # runtime.loggers (TensorBoard, MLflow)
    if bar is not None:
        simulator.on_phase = lambda note: bar.set_postfix_str(note, refresh=True)

    stage = ""  # what the loop was doing after a round's training, for a failure's message

    def on_round(r: int, record: dict[str, Any], sim: Simulator) -> None:
        nonlocal checkpointed, stage
        stage = f"while recording round {r} of {rounds}"
        folder.append_metrics(record)
        trackers.log_round(r, record)
        if every and (r % every == 0 or r == rounds):
            stage = f"while checkpointing round {r} of {rounds}"
            with interrupts_deferred():
                folder.save_checkpoint(sim)
                checkpointed = r
        folder.set_status("running", round=r)
        stage = ""
        if record.get("no_training") and sim.algorithm.trains:
            logger.warning("round %d: no client trained (every client asked sat out or failed)", r)
        if bar is not None:
            shown = {k.replace("train_", ""): f"{v:.3f}" for k, v in record.items()
                     if k in ("train_loss", "train_accuracy", "val_accuracy", "test_accuracy")}
            bar.set_postfix(shown, refresh=False)
            bar.update(1)

    def interrupted(stage: str = "") -> RunInterrupted:
        folder.discard_results()
        with interrupts_deferred():
            if every and checkpointed != simulator.state.round:
                folder.save_checkpoint(simulator)
            folder.set_status("interrupted", round=simulator.state.round)
        return RunInterrupted(folder.path, simulator.state.round, rounds, stage)

    trained = False
    try:
        guard = LossGuard(**config.runtime.divergence.model_dump())
        outcome = simulator.run(rounds, config.federation.clients_per_round, config.eval.every,
                                config.eval.track_test, on_round, selection=config.eval.selection, guard=guard,
                                initial=scores_round_zero(config, simulator))
        trained = True
    except KeyboardInterrupt:
        raise interrupted("during the final evaluation" if simulator.state.round >= rounds else "") from None
    except DivergedError as err:
        with contextlib.suppress(OSError):
            folder.append_metrics(err.record)  # the diverged round, for the record (never checkpointed)
        folder.set_status("failed", error=str(err))
        raise
    except NothingTrainedError as err:
        folder.set_status("failed", error=str(err))
        raise
    except FedfewError as err:
        with contextlib.suppress(OSError):
            (folder.path / "error.log").write_text(traceback.format_exc())
        folder.set_status("failed", error=str(err))
        raise
    except (Exception, SystemExit) as err:
        where = stage or f"in round {simulator.state.round + 1} of {rounds}"
        resumes = f"the last checkpoint is round {checkpointed}, where resume starts" if checkpointed else \
            "no round was checkpointed: resume starts from the beginning"
        raise _failed(folder, err, f"{where}; {resumes}") from err
    finally:
        if bar is not None:
            bar.close()
        if not trained:
            trackers.close(failed=True)
    try:
        model_sha256 = folder.save_model(simulator, outcome["selected_round"])
        # This sitting's time and the earlier sittings' rounds: simulator.state.seconds now holds this
        # sitting's rounds too, so it is read at the checkpoint (seconds_before), not here.
        seconds = time.perf_counter() - start + seconds_before
        summary = summarise(config, outcome, seconds, experiment.context)
        summary["data_seconds"] = round(experiment.data_seconds, 2)
        chosen = simulator.engine.compute.chosen
        if chosen is not None and chosen.asked != "fp32":  # which precision ran and why (auto: the hardware's)
            summary["precision"] = chosen.to_json()
        if resume:  # also tells fedfew.study.run_readback.run_seconds that these seconds count each sitting once
            summary["seconds_resumed_from"] = round(seconds_before, 2)
        attack = config.eval.membership_inference  # opt-in: the selected model against its members
        if attack is not None:
            summary["membership"] = membership_inference(
                simulator.algorithm, simulator.best_server, experiment.dataset, experiment.context.participant_positions,
                experiment.membership_rows, config.episodes.n_way, config.episodes.k_shot, attack.bootstrap, config.seed)
        if outcome.get("initial") is None and config.eval.initial != "always":
            summary["initial_scored"] = False  # eval.initial: auto left round 0 unscored (no selection reads it)
        mixed = folder.read_status().get("other_version")  # resumed with --allow-other-version
        if mixed:
            summary["other_version"] = mixed
        if summary.get("at_chance") and not summary.get("control"):
            logger.warning("%s: test accuracy %.2f%% is at chance (%.1f%%): the model learned nothing measurable at "
                           "this budget", config.name, 100 * summary["test"]["accuracy"], 100 * summary["chance"])
        summary.update(participation(outcome["history"], [c.client_id for c in experiment.clients],
                                     simulator.best_client_states if simulator.algorithm.evaluates_clients else None))
        if simulator.algorithm.trains:
            _warn_participation(config, summary)
        if summary.get("below_initial"):
            logger.warning("%s", below_initial_message(summary))
        summary_sha256 = _write_results(folder, config, outcome, summary)
        trackers.finish(summary)
        trackers.close()
        folder.set_status("complete", round=rounds, selected_round=outcome["selected_round"],
                          summary_sha256=summary_sha256, model_sha256=model_sha256)
    except KeyboardInterrupt:
        trackers.close(failed=True)
        raise interrupted("while the results were being written") from None
    except (Exception, SystemExit) as err:
        trackers.close(failed=True)
        folder.discard_results()
        raise _failed(folder, err, "while the results were being written") from err
    summary.update({"history": outcome["history"], "folder": str(folder.path), "label": label or config.name})
    summary["_simulator"] = simulator
    return summary


def scores_round_zero(config: ExperimentConfig, simulator: Simulator) -> bool:
    """Whether round 0 (the initial model's score) is computed: always with ``eval.initial: always``;
    with "auto" only where something reads it: the best-round selection on validation (round 0 is a
    candidate) or a run of 0 rounds (the untrained control, whose test score it is)."""
    if config.eval.initial == "always" or config.federation.rounds == 0:
        return True
    return simulator.val is not None and config.eval.selection == "best"


def _warn_participation(config: ExperimentConfig, summary: dict[str, Any]) -> None:
    never = summary.get("clients_never_trained")  # absent where the sample is a secret (counts only)
    if not never or summary.get("rounds") == 0:  # the untrained control trains nobody by design
        return
    total = len(summary["rounds_trained"])
    shown = ", ".join(map(str, never[:10])) + (", ..." if len(never) > 10 else "")
    message = (f"{config.name}: {len(never)} of {total} clients never trained (clients {shown}): too few samples "
               "per class for the episodes, never selected, or always failed; the result describes the others")
    personal = summary.get("personalised")
    if personal:
        message += (f"; the personalised score averages {personal['models']} private models, of which only "
                    f"{personal['trained']} were ever trained")
    logger.warning(message)


_progress_bar = progress_bar  # the old name


def _write_results(folder: RunFolder, config: ExperimentConfig, outcome: dict[str, Any],
                   summary: dict[str, Any]) -> str:
    """The complete-run files, summary.json first: results.md, accuracy.png and model/ are made under
    hidden names and renamed after it, so a run cut short at any instant leaves no results.md or
    model/ without a summary (and status.json says complete only after all of them). Returns the
    SHA-256 of summary.json, which status.json records."""
    line = privacy_line(summary)  # a private run's guarantee under its table
    pending_md, pending_png = (folder.path / PENDING_RESULTS[name] for name in ("results.md", "accuracy.png"))
    serialize.atomic_write_text(pending_md, f"# {config.name}\n\n" + markdown_table([summary]) +
                                (f"\n{line}\n" if line else ""))
    plot_curves({config.algorithm.name: outcome["history"]}, pending_png, config.name)
    text = strict_json(summary, indent=2) + "\n"
    serialize.atomic_write_text(folder.path / "summary.json", text)
    os.replace(pending_md, folder.path / "results.md")
    if pending_png.is_file():
        os.replace(pending_png, folder.path / "accuracy.png")
    folder.publish_model()
    return sha256_bytes(text.encode())
