"""``fedfew evaluate``: re-score a finished run's saved model(s) on the test data, without training."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TypedDict

from fedfew.config.validation import ConfigError, load_config
from fedfew.interface import serialize
from fedfew.run.experiment import Experiment, build_experiment
from fedfew.run.folder import RunFolder, RunFolderError, strict_json

__all__ = ["EVALUATE_KEYS", "evaluate_run"]


#: What ``fedfew evaluate`` may change: how the trained model is scored, never what was trained.
EVALUATE_KEYS = ("episodes.", "eval.", "runtime.", "classification.test_fraction", "algorithm.options.test_",
                 "algorithm.options.deployment")


class Evaluation(TypedDict):
    """One line of a run folder's ``evaluations.jsonl`` (what :func:`evaluate_run` returns)."""

    round: int | None
    overrides: list[str]
    test: dict[str, float]
    seconds: float


def evaluate_run(path: str | Path, overrides: list[str] | None = None) -> Evaluation:
    """Score a complete run's saved model(s) on the test data again (with changed evaluation settings,
    e.g. ``episodes.test_episodes``), without training. Appends the result to
    ``RUN/evaluations.jsonl`` and returns it."""
    from fedfew.run.datarecord import data_record
    from fedfew.run.runner import check_config_unchanged, check_run_folder, check_same_data

    folder = RunFolder(path)
    recorded = check_run_folder(folder, "fedfew evaluate")
    bad = [o for o in overrides or [] if not o.split("=", 1)[0].strip().startswith(EVALUATE_KEYS)]
    if bad:
        raise ConfigError(f"fedfew evaluate changes only how the model is scored ({', '.join(EVALUATE_KEYS)}); "
                          f"got {bad[0]!r}")
    check_config_unchanged(folder, recorded, "fedfew evaluate")
    config = load_config(folder.path / "config.yaml", overrides)
    server, client_states, meta = folder.load_model(verify=False)  # verified below, after the form's check
    experiment: Experiment = build_experiment(config)
    check_same_data(folder, data_record(experiment))  # the model is scored on the data it was tested on
    simulator = experiment.simulator()
    different = serialize.mismatch(server, simulator.state.server)
    if different is not None:  # another model's file: say so, more than that its checksum differs
        simulator.engine.close()
        raise RunFolderError(f"{folder.model_dir / 'server.safetensors'} is not a model of this run's config "
                             f"({config.model.name}, {config.algorithm.name}): {different}")
    try:
        folder.verify_model()
    except BaseException:
        simulator.engine.close()
        raise
    states = {cid: client_states.get(cid) for cid in (c.client_id for c in experiment.clients)}
    start = time.perf_counter()
    device = simulator.engine.compute.device
    server = serialize.to_device(server, device)
    states = {cid: serialize.to_device(state, device) for cid, state in states.items()}
    try:
        test = simulator.evaluate(experiment.test, server, states)
    finally:
        simulator.engine.close()
    result: Evaluation = {"round": meta.get("round"), "overrides": list(overrides or []), "test": test,
              "seconds": round(time.perf_counter() - start, 2)}
    with open(folder.path / "evaluations.jsonl", "a") as f:
        f.write(strict_json(result) + "\n")
    return result
