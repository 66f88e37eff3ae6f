"""runtime.loggers: TensorBoard event files and MLflow's local file store in the run folder, read back
with TensorBoard's event reader and MLflow's client; an unknown logger is a one-line error, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedfew.config.validation import load_config
from fedfew.run.runner import run_experiment
from tests.tiny import tiny_config

REPO = Path(__file__).resolve().parents[2]


def test_tensorboard_and_mlflow_hold_the_runs_metrics_config_and_artifacts(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = load_config(tiny_config("fl-proto", runtime={"loggers": ["tensorboard", "mlflow"]}))
    summary = run_experiment(config, tmp_path, progress=False)
    folder = Path(summary["folder"])
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]

    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("train_loss")]
    assert loss == [(r["round"], pytest.approx(r["train_loss"], rel=1e-6)) for r in rows]
    assert [e.value for e in events.Scalars("bytes_down")] == [float(r["bytes_down"]) for r in rows]
    assert events.Scalars("final_test/accuracy")[0].value == pytest.approx(summary["test"]["accuracy"], rel=1e-6)

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name(config.name).experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.name"] == "fl-proto" and run.data.params["seed"] == "0"
    assert run.data.params["federation.rounds"] == "2"
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(r["round"], pytest.approx(r["train_loss"])) for r in rows]
    assert run.data.metrics["final_test/accuracy"] == pytest.approx(summary["test"]["accuracy"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"results.md", "summary.json", "model"} <= artifacts
    assert client.list_artifacts(run.info.run_id, "model")  # the final model's files


def test_an_unknown_logger_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    done = subprocess.run([sys.executable, "-m", "fedfew.cli.main", "run", str(path), "--set", "runtime.loggers=[wandb]",
                           "--out", str(tmp_path / "out"), "--quiet"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "runtime.loggers" in lines[0] and "wandb" in lines[0], done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_final_test_metrics_are_at_the_last_rounds_step_in_both(tmp_path: Path) -> None:
    """One convention: ``final_test/*`` at the step of the run's last round, in TensorBoard and in MLflow,
    read back from the event file and from MLflow's local store."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = load_config(tiny_config("fl-proto", federation={"rounds": 3},
                                     runtime={"loggers": ["tensorboard", "mlflow"]}))
    summary = run_experiment(config, tmp_path, progress=False)
    folder = Path(summary["folder"])
    last = json.loads((folder / "metrics.jsonl").read_text().splitlines()[-1])["round"]
    assert last == 3

    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    final_tags = sorted(t for t in events.Tags()["scalars"] if t.startswith("final_test/"))
    assert "final_test/accuracy" in final_tags
    for tag in final_tags:
        assert [e.step for e in events.Scalars(tag)] == [last], tag

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name(config.name).experiment_id])
    mlflow_tags = sorted(k for k in run.data.metrics if k.startswith("final_test/"))
    assert mlflow_tags == final_tags
    for tag in mlflow_tags:
        history = client.get_metric_history(run.info.run_id, tag)
        assert [m.step for m in history] == [last], tag
    tb = events.Scalars("final_test/accuracy")[0].value
    assert client.get_metric_history(run.info.run_id, "final_test/accuracy")[0].value == pytest.approx(tb, rel=1e-6)
