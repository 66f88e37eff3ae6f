"""What the run tests read back from a run folder (metrics without the wall clock, strictly parsed;
its status) and how they make one: a tiny fl-proto run, interrupted with Ctrl-C mid-run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedfew.algorithms.fl_proto import FLProto
from fedfew.config.validation import ExperimentConfig, load_config
from fedfew.run.runner import RunInterrupted, run_experiment
from tests.tiny import tiny_config


def metrics(folder: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without the wall-clock field (the only thing an interruption may change)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("seconds")
    return rows


def status(folder: Path) -> str:
    return json.loads((folder / "status.json").read_text())["status"]


def only_run(base: Path) -> Path:
    (folder,) = [p for p in base.iterdir() if p.is_dir()]
    return folder


def strict_rows(folder: Path) -> list[dict[str, Any]]:
    """metrics.jsonl parsed by a strict parser: bare NaN or Infinity is an error."""
    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return [json.loads(line, parse_constant=refuse) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def strict_metrics(folder: Path) -> list[dict[str, Any]]:
    rows = strict_rows(folder)
    for row in rows:
        row.pop("seconds")
    return rows


def status_record(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "status.json").read_text())


def interrupted_run(config: ExperimentConfig, out: Path, monkeypatch: pytest.MonkeyPatch, after_round: int = 2,
                    algorithm: type = FLProto) -> Path:
    """The folder of ``config``'s run, interrupted (Ctrl-C) in the round after ``after_round``."""
    calls = {"n": 0}
    original = algorithm.client_update  # type: ignore[attr-defined]
    clients = config.federation.clients_per_round

    def client_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == after_round * clients + 1:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(algorithm, "client_update", client_update)
        with pytest.raises(RunInterrupted) as cut:
            run_experiment(config, out, progress=False)
    return Path(cut.value.folder)


def config_of(rounds: int = 4, **sections: Any) -> ExperimentConfig:
    return load_config(config_dict(rounds, **sections))


def config_dict(rounds: int = 4, **sections: Any) -> dict[str, Any]:
    return tiny_config("fl-proto", federation={"rounds": rounds, "clients_per_round": 4}, **sections)


def flip_tail(path: Path, n: int = 16) -> None:
    """Change the last ``n`` bytes of a file (tensor data in a safetensors file), keeping its size."""
    data = bytearray(path.read_bytes())
    for i in range(1, n + 1):
        data[-i] ^= 0x40
    path.write_bytes(bytes(data))


def write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def only_status(out: Path) -> dict[str, Any]:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return dict(json.loads((folder / "status.json").read_text()))
