"""Experiment tracking: ``runtime.loggers: [tensorboard, mlflow]``, both offline, both in the run folder.

* ``tensorboard``: event files in ``RUN/tensorboard`` (every numeric per-round metric, by round; the
  final test metrics as ``final_test/*``). ``tensorboard --logdir RUN/tensorboard`` shows them.
* ``mlflow``: MLflow's local store in the run folder (``RUN/mlflow.db``, a SQLite file: MLflow 3 refuses
  its plain-file store; artifacts in ``RUN/mlartifacts``): one MLflow run per fedfew run with the
  resolved config as parameters (flattened keys), every numeric per-round metric by round, the final
  test metrics as ``final_test/*``, and ``results.md``, ``summary.json`` and the final model
  (``model/``) as artifacts. ``mlflow ui --backend-store-uri sqlite:///RUN/mlflow.db`` shows them.

One step convention for both: a per-round metric is logged at its round's number (1..R), and the
final test metrics ``final_test/*`` at the step of the run's **last round** (R, the round after which
the test runs; :func:`final_step`), whichever round was selected for the test (``selected_round`` in
``summary.json``). A resumed run logs them at its last round too.

Both are optional extras (``pip install 'fedfew[tracking]'``). A tracker never changes what is run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from fedfew.core.config_schema import ExperimentSchema
from fedfew.core.errors import ConfigError
from fedfew.core.jsontypes import JSONValue
from fedfew.core.registry import Registry


class Tracker:
    """One logger of one run."""

    def __init__(self, folder: Path, config: ExperimentSchema) -> None:
        self.folder, self.config = folder, config

    def log_round(self, round_index: int, record: Mapping[str, object]) -> None:
        raise NotImplementedError

    def finish(self, summary: Mapping[str, JSONValue]) -> None:
        """The run is complete: final metrics and artifacts."""

    def close(self, failed: bool = False) -> None:
        """Flush and release (after :meth:`finish`, or when the run failed or was interrupted)."""


LOGGERS: Registry[type[Tracker]] = Registry("logger")


def numeric(record: Mapping[str, object], prefix: str = "") -> dict[str, float]:
    """The finite numbers of ``record`` (nested dicts flattened with '/'), bools and lists left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(numeric(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[f"{prefix}{key}"] = float(value)
    return out


def final_step(summary: Mapping[str, JSONValue]) -> int:
    """The step of the final test metrics: the run's last round (``summary["rounds"]``: a run that
    reaches :meth:`Tracker.finish` ran every round; 0 for the untrained control)."""
    history, rounds = summary.get("history"), summary.get("rounds")
    if isinstance(history, list) and history and isinstance(history[-1], dict):
        last = history[-1]["round"]
        if isinstance(last, (int, float)):
            return int(last)
    return int(rounds) if isinstance(rounds, (int, float)) else 0


def test_scores(summary: Mapping[str, JSONValue]) -> Mapping[str, JSONValue]:
    """The summary's final test metrics (``summary["test"]``), empty where it has none."""
    test = summary.get("test")
    return test if isinstance(test, dict) else {}


def flat_params(data: object, prefix: str = "") -> dict[str, str]:
    if isinstance(data, dict):
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(flat_params(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): str(data)[:6000]}


@LOGGERS.register("tensorboard", help="TensorBoard event files in RUN/tensorboard (pip install 'fedfew[tracking]')")
class TensorBoardTracker(Tracker):
    def __init__(self, folder: Path, config: ExperimentSchema) -> None:
        super().__init__(folder, config)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("runtime.loggers: tensorboard needs the tensorboard package: "
                              "pip install 'fedfew[tracking]'") from None
        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"))

    def log_round(self, round_index: int, record: Mapping[str, object]) -> None:
        for key, value in numeric({k: v for k, v in record.items() if k != "round"}).items():
            self.writer.add_scalar(key, value, round_index)
        self.writer.flush()

    def finish(self, summary: Mapping[str, JSONValue]) -> None:
        step = final_step(summary)
        for key, value in numeric(test_scores(summary), "final_test/").items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.close()


@LOGGERS.register("mlflow", help="MLflow's local store RUN/mlflow.db (pip install 'fedfew[tracking]')")
class MLflowTracker(Tracker):
    def __init__(self, folder: Path, config: ExperimentSchema) -> None:
        super().__init__(folder, config)
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ConfigError("runtime.loggers: mlflow needs the mlflow package: pip install 'fedfew[tracking]'") from None
        # MLflow 3 refuses its plain-file store (maintenance mode); a SQLite file is its local store now.
        self.uri = tracking_uri(folder)
        self.client = MlflowClient(tracking_uri=self.uri)
        experiment = self.client.get_experiment_by_name(config.name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(
            config.name, artifact_location=(folder / "mlartifacts").resolve().as_uri())
        self.run_id = self.client.create_run(experiment_id, run_name=folder.name,
                                             tags={"fedfew.algorithm": config.algorithm.name,
                                                   "fedfew.engine": config.runtime.engine}).info.run_id
        from mlflow.entities import Param

        params = flat_params(config.model_dump(mode="json"))
        items = [Param(k, v) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters a batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_round(self, round_index: int, record: Mapping[str, object]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, round_index) for k, v in
                   numeric({k: v for k, v in record.items() if k != "round"}).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, summary: Mapping[str, JSONValue]) -> None:
        import time

        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), final_step(summary)
        metrics = [Metric(k, v, now, step) for k, v in numeric(test_scores(summary), "final_test/").items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)
        for name in ("results.md", "summary.json"):
            if (self.folder / name).is_file():
                self.client.log_artifact(self.run_id, str(self.folder / name))
        if (self.folder / "model").is_dir():
            self.client.log_artifacts(self.run_id, str(self.folder / "model"), artifact_path="model")

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def tracking_uri(folder: Path) -> str:
    """The MLflow tracking URI of a run folder's store (``mlflow ui --backend-store-uri URI``)."""
    return f"sqlite:///{(folder / 'mlflow.db').resolve()}"


def check_loggers(names: list[str]) -> list[str]:
    """``names`` when each is a registered logger; raises ValueError naming the first that is not."""
    from fedfew.core.registry import RegistryError

    for name in names:
        try:
            LOGGERS.get(name)
        except RegistryError as err:
            raise ValueError(f"runtime.loggers: {err}") from None
    return names


class Trackers:
    """Every logger the config names, for one run."""

    def __init__(self, folder: Path, config: ExperimentSchema) -> None:
        self.trackers: list[Tracker] = []
        try:
            for name in config.runtime.loggers:
                self.trackers.append(LOGGERS.get(name)(folder, config))
        except BaseException:
            self.close(failed=True)
            raise

    def log_round(self, round_index: int, record: Mapping[str, object]) -> None:
        for tracker in self.trackers:
            tracker.log_round(round_index, record)

    def finish(self, summary: Mapping[str, JSONValue]) -> None:
        for tracker in self.trackers:
            tracker.finish(summary)

    def close(self, failed: bool = False) -> None:
        for tracker in self.trackers:
            tracker.close(failed)
        self.trackers = []
