"""Run experiments end to end: validation before any work, a live run folder, checkpoints, resume,
interrupts, and re-scoring a finished run."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from fedfew.config import ConfigError, ExperimentConfig, load_config
from fedfew.datarecord import data_record
from fedfew.engine import serialize
from fedfew.engine.simulator import NothingTrainedError, Simulator
from fedfew.experiment import Experiment, build_experiment, dataset_cache
from fedfew.results import below_initial_message, markdown_table, plot_curves, summarise
from fedfew.runfolder import RunFolder, RunFolderError, check_output_base, new_run_path

logger = logging.getLogger(__name__)


class RunInterrupted(Exception):
    """Ctrl-C (or SIGTERM) stopped a run; it was checkpointed and can be resumed."""

    def __init__(self, folder: Path, round_done: int, rounds: int) -> None:
        super().__init__(f"interrupted after round {round_done}/{rounds}; resume with: fedfew resume {folder}")
        self.folder, self.round_done, self.rounds = folder, round_done, rounds


def warn(message: str) -> None:
    print(f"fedfew: warning: {message}", file=sys.stderr, flush=True)


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
    if config.runtime.engine == "flower":
        return _run_local_flower(folder, config, progress, label)
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


# -- Flower ---------------------------------------------------------------------------------------------
def _flower_settings(config: ExperimentConfig) -> Any:
    try:
        from fedfew.flower.local import FlowerSettings
    except ImportError:
        raise ConfigError("runtime.engine=flower needs Flower: pip install 'fedfew[flower]'") from None
    f = config.flower
    return FlowerSettings(f.round_timeout, f.startup_timeout, f.port, f.tls, f.node_auth)


def _run_local_flower(folder: RunFolder, config: ExperimentConfig, progress: bool | None, label: str | None,
                      resume: bool = False) -> dict[str, Any]:
    """``runtime.engine: flower`` on this machine: a SuperLink and a SuperNode per client as separate
    processes, the ServerApp (started by the SuperLink) training in ``folder``; every process stopped
    at the end, on error or Ctrl-C too."""
    from fedfew.flower.local import LocalFederation

    federation = LocalFederation(folder.path / "flower", config.partition.num_clients, _flower_settings(config),
                                 config.dataset.root)
    try:
        with federation:
            return run_on_federation(federation, folder, config, progress, label, resume)
    except KeyboardInterrupt:
        status = folder.read_status()
        if status.get("status") == "complete":
            raise
        folder.set_status("interrupted", round=status.get("round", 0))
        raise RunInterrupted(folder.path, status.get("round", 0), config.federation.rounds) from None


def new_run(config: ExperimentConfig, out_base: str | Path | None = None) -> RunFolder:
    """A new run folder for ``config`` with its config and a running status (no lock taken)."""
    config = with_resolved_root(config)
    folder = RunFolder(new_run_path(out_base or config.runtime.output_dir, config.name))
    folder.write_config(config)
    folder.set_status("running", round=0, rounds=config.federation.rounds, name=config.name,
                      algorithm=config.algorithm.name, engine=config.runtime.engine)
    return folder


def run_on_federation(federation: Any, folder: RunFolder, config: ExperimentConfig, progress: bool | None = False,
                      label: str | None = None, resume: bool = False) -> dict[str, Any]:
    """Run ``config`` in ``folder`` on a started :class:`~fedfew.flower.local.LocalFederation` (the
    ServerApp trains; this process follows the run folder) and return the summary."""
    import base64

    from fedfew.flower.engine import FlowerRunError

    show = config.runtime.progress if progress is None else progress
    bar = _progress_bar(config, label, folder.read_status().get("round", 0) if resume else 0) if show else None
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


def run_on_flower(grid: Any, config_data: dict[str, Any], run_dir: str | None) -> dict[str, Any]:
    """The ServerApp's work: run ``config_data`` with the Flower engine in the run folder ``run_dir``
    (made by ``fedfew run``; or a new run folder under it, or under runtime.output_dir)."""
    from fedfew.flower.engine import FlowerEngine

    config = load_config(config_data)
    if run_dir and (Path(run_dir) / "config.yaml").is_file():
        folder = RunFolder(run_dir)
    else:
        config = with_resolved_root(config)
        folder = RunFolder(new_run_path(run_dir or config.runtime.output_dir, config.name))
        folder.write_config(config)
        folder.set_status("running", round=0, rounds=config.federation.rounds, name=config.name,
                          algorithm=config.algorithm.name, engine="flower")
    (folder.path / "flower").mkdir(exist_ok=True)
    f = config.flower

    def engine(experiment: Experiment, states: Any, faults: Any, compute: Any) -> FlowerEngine:
        return FlowerEngine(grid, experiment.algorithm, config.seed, config_data, len(experiment.clients), faults,
                            compute, f.round_timeout, f.startup_timeout, folder.path / "flower" / "messages.jsonl")

    resume = folder.has_checkpoint()
    if resume:
        warn("resuming on Flower: the clients' private states were held by the nodes of the interrupted run and "
             "start again from their initial values")
    folder.lock()
    try:
        return _train(folder, config, False, None, resume=resume, engine_factory=engine)
    finally:
        folder.unlock()


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
    if config.runtime.engine == "flower":
        folder.set_status("running", resumed=folder.read_status().get("round", 0))
        return _run_local_flower(folder, config, progress, None, resume=True)
    folder.lock()
    try:
        folder.set_status("running", resumed=folder.read_status().get("round", 0))
        return _train(folder, config, progress, None, resume=True)
    finally:
        folder.unlock()


def _train(folder: RunFolder, config: ExperimentConfig, progress: bool | None, label: str | None,
           resume: bool = False, engine_factory: Any = None) -> dict[str, Any]:
    show = config.runtime.progress if progress is None else progress
    start = time.perf_counter()
    try:
        experiment = build_experiment(config)
    except Exception as err:
        folder.set_status("failed", error=str(err))
        raise
    folder.write_data(data_record(experiment))
    try:
        simulator = experiment.simulator(states_dir=folder.states_dir, engine_factory=engine_factory)
    except Exception as err:
        folder.set_status("failed", error=str(err))
        raise
    try:
        return _train_on(folder, config, experiment, simulator, show, label, resume, start)
    finally:
        simulator.engine.close()


def _train_on(folder: RunFolder, config: ExperimentConfig, experiment: Experiment, simulator: Simulator,
              show: bool, label: str | None, resume: bool, start: float) -> dict[str, Any]:
    rounds = config.federation.rounds
    if resume and folder.has_checkpoint():
        folder.load_checkpoint(simulator)
    folder.rewrite_metrics(simulator.state.history)
    checkpointed = simulator.state.round
    bar = _progress_bar(config, label, simulator.state.round) if show else None
    every = config.runtime.checkpoint_every
    if bar is not None:
        simulator.on_phase = lambda note: bar.set_postfix_str(note, refresh=True)

    def on_round(r: int, record: dict[str, Any], sim: Simulator) -> None:
        nonlocal checkpointed
        folder.append_metrics(record)
        if every and (r % every == 0 or r == rounds):
            with interrupts_deferred():
                folder.save_checkpoint(sim)
                checkpointed = r
        folder.set_status("running", round=r)
        if record.get("no_training") and sim.algorithm.trains:
            _write(bar, f"fedfew: warning: round {r}: no client trained (every client asked sat out or failed)")
        if bar is not None:
            shown = {k.replace("train_", ""): f"{v:.3f}" for k, v in record.items()
                     if k in ("train_loss", "train_accuracy", "val_accuracy", "test_accuracy")}
            bar.set_postfix(shown, refresh=False)
            bar.update(1)

    try:
        outcome = simulator.run(rounds, config.federation.clients_per_round, config.eval.every,
                                config.eval.track_test, on_round)
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
        summary["data_seconds"] = round(experiment.data_seconds, 2)
        if summary.get("at_chance") and not summary.get("control"):
            warn(f"{config.name}: test accuracy {100 * summary['test']['accuracy']:.2f}% is at chance "
                 f"({100 * summary['chance']:.1f}%): the model learned nothing measurable at this budget")
        if summary.get("below_initial"):
            logger.warning(below_initial_message(summary))
        _write_results(folder, config, outcome, summary)
    except Exception as err:
        (folder.path / "error.log").write_text(traceback.format_exc())
        folder.set_status("failed", error=f"{type(err).__name__}: {err}")
        raise
    folder.set_status("complete", round=rounds, selected_round=outcome["selected_round"])
    summary.update({"history": outcome["history"], "folder": str(folder.path), "label": label or config.name})
    summary["_simulator"] = simulator
    return summary


def _write(bar: Any, line: str) -> None:
    if bar is not None:
        bar.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)


def _progress_bar(config: ExperimentConfig, label: str | None, done: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=config.federation.rounds, initial=done, desc=label or config.algorithm.name, unit="round",
                leave=True, dynamic_ncols=True)


def _write_results(folder: RunFolder, config: ExperimentConfig, outcome: dict[str, Any],
                   summary: dict[str, Any]) -> None:
    (folder.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (folder.path / "results.md").write_text(f"# {config.name}\n\n" + markdown_table([summary]))
    plot_curves({config.algorithm.name: outcome["history"]}, folder.path / "accuracy.png", config.name)


# -- re-scoring a finished run ------------------------------------------------------------------
#: What ``fedfew evaluate`` may change: how the trained model is scored, never what was trained.
EVALUATE_KEYS = ("episodes.", "eval.", "runtime.", "classification.test_fraction", "algorithm.options.test_",
                 "algorithm.options.deployment")


def evaluate_run(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """Score a complete run's saved model(s) on the test data again (with changed evaluation settings,
    e.g. ``episodes.test_episodes``), without training. Appends the result to
    ``RUN/evaluations.jsonl`` and returns it."""
    folder = RunFolder(path)
    if not (folder.path / "config.yaml").is_file():
        raise RunFolderError(f"{folder.path} is not a fedfew run folder (no config.yaml)")
    bad = [o for o in overrides or [] if not o.split("=", 1)[0].strip().startswith(EVALUATE_KEYS)]
    if bad:
        raise ConfigError(f"fedfew evaluate changes only how the model is scored ({', '.join(EVALUATE_KEYS)}); "
                          f"got {bad[0]!r}")
    config = load_config(folder.path / "config.yaml", overrides)
    server, client_states, meta = folder.load_model()
    experiment: Experiment = build_experiment(config)
    simulator = experiment.simulator()
    states = {cid: client_states.get(cid) for cid in (c.client_id for c in experiment.clients)}
    start = time.perf_counter()
    device = simulator.engine.compute.device
    server = serialize.to_device(server, device)
    states = {cid: serialize.to_device(state, device) for cid, state in states.items()}
    try:
        test = simulator.evaluate(experiment.test, server, states)
    finally:
        simulator.engine.close()
    result = {"round": meta.get("round"), "overrides": list(overrides or []), "test": test,
              "seconds": round(time.perf_counter() - start, 2)}
    with open(folder.path / "evaluations.jsonl", "a") as f:
        f.write(json.dumps(result) + "\n")
    return result


# -- several runs ---------------------------------------------------------------------------------
def parse_grid(items: list[str]) -> list[tuple[str, list[Any]]]:
    """``key=v1,v2`` items -> [(key, [v1, v2])], values parsed as YAML."""
    grid = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid {item!r} must look like key=v1,v2,...")
        key, values = item.split("=", 1)
        try:
            grid.append((key.strip(), [yaml.safe_load(v) for v in values.split(",")]))
        except yaml.YAMLError:
            raise ConfigError(f"--grid {key.strip()}: values {values!r} are not valid YAML") from None
    return grid


def sweep_configs(config_path: str | Path | dict[str, Any], grid: list[tuple[str, list[Any]]],
                  overrides: list[str]) -> list[tuple[str, ExperimentConfig]]:
    """(label, config) for every point of the grid, all validated."""
    keys = [k for k, _ in grid]
    points = []
    for combo in itertools.product(*[v for _, v in grid]):
        assignments = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                       for k, v in zip(keys, combo)]
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, combo))
        try:
            points.append((label, load_config(config_path, overrides + assignments)))
        except ConfigError as err:  # name the grid point: the other points may be fine
            raise ConfigError(f"grid point {', '.join(assignments)}: {err}") from None
    return points


def sweep(config_path: str | Path | dict[str, Any], grid: list[tuple[str, list[Any]]], overrides: list[str],
          out_base: str | Path, progress: bool = True) -> list[dict[str, Any]]:
    """Run every combination of the grid (each validated first); write a combined table and plot
    under ``out_base``."""
    points = sweep_configs(config_path, grid, overrides)
    validate_all([c for _, c in points], Path(out_base) / "runs")
    summaries = []
    with dataset_cache():
        for label, config in points:
            summaries.append(run_experiment(config, Path(out_base) / "runs", progress, label=label))
    write_comparison(summaries, Path(out_base), "sweep")
    return summaries


def write_comparison(summaries: list[dict[str, Any]], folder: Path, title: str) -> str:
    check_output_base(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table = markdown_table(summaries, label_key="label")
    (folder / "results.md").write_text(f"# {title}\n\n{table}")
    plot_curves({s["label"]: s["history"] for s in summaries}, folder / "accuracy.png", title)
    with (folder / "summaries.jsonl").open("w") as f:
        for s in summaries:
            f.write(json.dumps({k: v for k, v in s.items() if k not in ("history", "_simulator")}) + "\n")
    return table
