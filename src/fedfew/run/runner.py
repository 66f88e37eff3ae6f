"""``fedfew run`` and ``fedfew resume``: validation before any work, a live run folder, checkpoints,
resume and interrupts. The other commands have their own modules: re-scoring a finished run
(:mod:`fedfew.run.rescore`), sweeps and comparisons (:mod:`fedfew.run.sweep`), runs on Flower
(:mod:`fedfew.flower`)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from fedfew.config.engines import ENGINES
from fedfew.config.validation import ConfigError, ExperimentConfig, load_config
from fedfew.core.codeversion import numbers_version, package_version
from fedfew.core.errors import RunInterrupted
from fedfew.core.integrity import (
    RESUME_CHANGEABLE,
    config_digest,
    data_changed,
    note_not_recorded,
    sha256_bytes,
)
from fedfew.core.jsontypes import JSONObject
from fedfew.core.progress import ProgressBar, progress_bar
from fedfew.core.tracking import Trackers
from fedfew.engine.base import Launch
from fedfew.engine.guard import LossGuard
from fedfew.engine.simulator import Simulator
from fedfew.interface import serialize
from fedfew.interface.serialize import named_parts
from fedfew.privacy.membership import member_pool, membership_inference
from fedfew.run.datarecord import data_record
from fedfew.run.experiment import EngineFactory, Experiment, build_experiment, dataset_cache
from fedfew.run.folder import (
    PENDING_RESULTS,
    STATUSES,
    DataChangedError,
    RunFolder,
    RunFolderError,
    RunLife,
    check_output_base,
    new_run_path,
    strict_json,
)
from fedfew.run.model_check import check_model_runs
from fedfew.run.results import (
    RunSummary,
    as_json,
    below_initial_message,
    markdown_table,
    participation,
    plot_curves,
    privacy_line,
    summarise,
)

logger = logging.getLogger(__name__)


#: RunInterrupted and DataChangedError: what a run raises that its callers catch (they live below).
__all__ = ["DataChangedError", "RunInterrupted", "check_config_unchanged", "check_run_folder", "check_same_data",
           "new_run", "other_version", "preflight", "resume_run", "run_experiment", "scores_round_zero",
           "train_in_folder", "validate_all", "with_resolved_root"]


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
                   label: str | None = None) -> RunSummary:
    """Build and run ``config`` in a new run folder under ``out_base`` (default runtime.output_dir).
    Returns the summary with the run's history and folder."""
    folder = new_run(config, out_base)
    config = load_config(folder.path / "config.yaml")
    engine = ENGINES.get(config.runtime.engine)
    if engine.runs_elsewhere:  # the summary it read back from summary.json, with the history and folder
        return cast(RunSummary, engine.launch(Launch(folder, config, progress, label)))
    with folder.held():
        return train_in_folder(folder, config, progress, label)


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
    folder.begin(rounds=config.federation.rounds, name=config.name, algorithm=config.algorithm.name,
                 engine=engine or config.runtime.engine, config_sha256=config_digest(written.model_dump(mode="json")))
    return folder


def check_run_folder(folder: RunFolder, command: str) -> JSONObject:
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


def check_config_unchanged(folder: RunFolder, recorded: Mapping[str, object], command: str) -> None:
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
               allow_other_version: bool = False) -> RunSummary:
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
        folder.note_status(other_version=other)
    bad = [o for o in overrides or [] if not o.split("=", 1)[0].strip().startswith("runtime.")]
    if bad:
        raise ConfigError(f"fedfew resume takes only runtime.* overrides (the run's config is fixed); got {bad[0]!r}")
    check_config_unchanged(folder, recorded, "fedfew resume")
    config = load_config(folder.path / "config.yaml", overrides)
    engine = ENGINES.get(config.runtime.engine)
    if engine.runs_elsewhere:
        folder.resuming()
        return cast(RunSummary, engine.launch(Launch(folder, config, progress, None, resume=True)))
    with folder.held():
        folder.resuming()
        return train_in_folder(folder, config, progress, None, resume=True)


def other_version(status: Mapping[str, object]) -> dict[str, dict[str, object]] | None:
    """{written_by, resumed_by} when the run of ``status`` was written by another fedfew version or other
    number code (:func:`fedfew.core.codeversion.numbers_version`) than this one; None when the same. A folder
    older than the code record (no ``code``) is judged by its package version alone."""
    now: dict[str, object] = {"fedfew": package_version(), "code": numbers_version()}
    then = {"fedfew": status.get("fedfew"), "code": status.get("code")}
    if then["fedfew"] is None:
        return None  # not written by a run (no status.json yet): nothing was computed to mix with
    same = then["fedfew"] == now["fedfew"] and then["code"] in (None, now["code"])
    return None if same else {"written_by": then, "resumed_by": now}


def _described(version: Mapping[str, object]) -> str:
    code = version.get("code")
    return f"fedfew {version.get('fedfew')}" + (f" (number code {code})" if code else " (number code not recorded)")


def train_in_folder(folder: RunFolder, config: ExperimentConfig, progress: bool | None = None,
                    label: str | None = None, resume: bool = False,
                    engine_factory: EngineFactory | None = None) -> RunSummary:
    """Train ``config`` in ``folder`` (made by :func:`new_run`, held by the caller: :meth:`RunFolder.held`)
    and write its results: the run of ``fedfew run`` and ``fedfew resume`` (``resume``: from the folder's
    checkpoint, on the data it recorded), and of Flower's ServerApp (``engine_factory``: the engine its
    rounds run on). The folder records the status as it goes (:meth:`RunFolder.lifecycle`). Returns the
    summary with the run's history, folder and label."""
    show = config.runtime.progress if progress is None else progress
    start = time.perf_counter()
    with folder.lifecycle(config.federation.rounds, config.runtime.checkpoint_every) as run:
        experiment = build_experiment(config)
        record = data_record(experiment)
        if resume:
            check_same_data(folder, record)
        folder.write_data(record)  # what data the run used: RUN/data.json
        simulator = run.built(experiment.simulator(states_dir=folder.states_dir, engine_factory=engine_factory))
        if resume and folder.has_checkpoint():
            folder.load_checkpoint(simulator)
        folder.discard_results()  # what an earlier attempt's cut-short write-up left: this run is not complete
        folder.remove_temporaries()  # and its half-written files (a write killed before its rename)
        folder.rewrite_metrics(simulator.state.history)
        seconds_before = simulator.state.seconds  # the rounds' time in the sittings before this one (0 for a new run)
        bar = progress_bar(config, label, simulator.state.round) if show else None
        trackers = Trackers(folder.path, config)  # runtime.loggers (TensorBoard, MLflow)
        try:
            outcome = _train_rounds(run, config, simulator, trackers, bar)
            run.writing_up()
            model_sha256 = folder.save_model(simulator, outcome["selected_round"])
            # This sitting's time and the earlier sittings' rounds: simulator.state.seconds now holds this
            # sitting's rounds too, so it is read at the checkpoint (seconds_before), not here.
            seconds = time.perf_counter() - start + seconds_before
            summary = _summary(config, experiment, simulator, outcome, seconds,
                               seconds_before if resume else None, folder.read_status().get("other_version"))
            _warn_about(config, simulator, summary)
            summary_sha256 = _write_results(folder, config, outcome, summary)
            trackers.finish(as_json(summary))
            trackers.close()
            run.complete(outcome["selected_round"], summary_sha256, model_sha256)
        except BaseException:
            trackers.close(failed=True)
            raise
    return {**summary, "history": outcome["history"], "folder": str(folder.path), "label": label or config.name}


def check_same_data(folder: RunFolder, record: Mapping[str, object]) -> None:
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


def _train_rounds(run: RunLife, config: ExperimentConfig, simulator: Simulator, trackers: Trackers,
                  bar: ProgressBar | None) -> dict[str, Any]:
    """Every round from where ``simulator`` stands (:meth:`Simulator.run`, the one round loop), each
    recorded as it ends (:meth:`RunLife.round_finished`); the outcome: the selected round and its scores."""
    if bar is not None:
        simulator.on_phase = lambda note: bar.set_postfix_str(note, refresh=True)

    def on_round(r: int, record: dict[str, Any], sim: Simulator) -> None:
        run.round_finished(r, record, trackers.log_round)  # metrics.jsonl, the trackers, the checkpoint, the status
        if record.get("no_training") and sim.algorithm.trains:
            logger.warning("round %d: no client trained (every client asked sat out or failed)", r)
        if bar is not None:
            shown = {k.replace("train_", ""): f"{v:.3f}" for k, v in record.items()
                     if k in ("train_loss", "train_accuracy", "val_accuracy", "test_accuracy")}
            bar.set_postfix(shown, refresh=False)
            bar.update(1)

    run.training()
    try:
        guard = LossGuard(**config.runtime.divergence.model_dump())
        return simulator.run(config.federation.rounds, config.federation.clients_per_round, config.eval.every,
                             config.eval.track_test, on_round, selection=config.eval.selection, guard=guard,
                             initial=scores_round_zero(config, simulator))
    finally:
        if bar is not None:
            bar.close()


def _summary(config: ExperimentConfig, experiment: Experiment, simulator: Simulator, outcome: dict[str, Any],
             seconds: float, seconds_before: float | None, other: JSONObject | None) -> RunSummary:
    """The run's summary (:func:`~fedfew.run.results.summarise`) from what ran: the precision (where fp32
    was not asked for), the membership attack (opt-in: the selected model against its members) and who
    trained; ``seconds_before``: a resumed run's earlier sittings; ``other``: the versions of a run
    resumed with --allow-other-version."""
    chosen = simulator.engine.compute.chosen
    attack = config.eval.membership_inference
    membership = None
    if attack is not None:
        selected = outcome["selected_round"]
        members, pool = member_pool(simulator.rows_used_until(selected), selected,
                                    experiment.context.participant_positions)
        membership = membership_inference(
            simulator.algorithm, named_parts(simulator.best_server, "the selected server state"), experiment.dataset,
            members, experiment.membership_rows, config.episodes.n_way, config.episodes.k_shot, attack.bootstrap,
            config.seed)
        membership = {**membership, "member_pool": pool, "member_pool_size": 0 if members is None else len(members)}
    participants = participation(outcome["history"], [c.client_id for c in experiment.clients],
                                 simulator.best_client_states if simulator.algorithm.evaluates_clients else None)
    return summarise(config, outcome, seconds, experiment.context, data_seconds=experiment.data_seconds,
                     participants=participants,
                     precision=chosen.to_json() if chosen is not None and chosen.asked != "fp32" else None,
                     seconds_resumed_from=seconds_before, membership=membership, other_version=other or None)


def _warn_about(config: ExperimentConfig, simulator: Simulator, summary: RunSummary) -> None:
    """The warnings a finished run's numbers call for: at chance, clients that never trained, a trained
    model below the untrained one."""
    chance = summary["chance"]
    if summary.get("at_chance") and not summary.get("control") and chance is not None:  # at_chance: chance known
        logger.warning("%s: test accuracy %.2f%% is at chance (%.1f%%): the model learned nothing measurable at "
                       "this budget", config.name, 100 * summary["test"]["accuracy"], 100 * chance)
    if simulator.algorithm.trains:
        _warn_participation(config, summary)
    if summary.get("below_initial"):
        logger.warning("%s", below_initial_message(summary))


def scores_round_zero(config: ExperimentConfig, simulator: Simulator) -> bool:
    """Whether round 0 (the initial model's score) is computed: always with ``eval.initial: always``;
    with "auto" only where something reads it: the best-round selection on validation (round 0 is a
    candidate) or a run of 0 rounds (the untrained control, whose test score it is)."""
    if config.eval.initial == "always" or config.federation.rounds == 0:
        return True
    return simulator.val is not None and config.eval.selection == "best"


def _warn_participation(config: ExperimentConfig, summary: RunSummary) -> None:
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


def _write_results(folder: RunFolder, config: ExperimentConfig, outcome: dict[str, Any],
                   summary: RunSummary) -> str:
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
