"""A newcomer's first hour (issue 24): the untrained control as a run, round 0 as a selection
candidate, what a run records about its data, intervals for every accuracy, the demo and README."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedfew.cli import main
from fedfew.config import load_config
from fedfew.experiment import build_experiment
from fedfew.runner import run_experiment
from tests.tiny import ALGORITHM_SETUPS, tiny_config


# -- the untrained control: federation.rounds = 0 --------------------------------------------------
@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_SETUPS))
def test_zero_rounds_is_the_untrained_control(algorithm: str, tmp_path: Path) -> None:
    config = load_config(tiny_config(algorithm, federation={"rounds": 0}))
    summary = run_experiment(config, tmp_path, progress=False)
    folder = Path(summary["folder"])
    for name in ("config.yaml", "status.json", "metrics.jsonl", "summary.json", "results.md"):
        assert (folder / name).is_file(), name
    status = json.loads((folder / "status.json").read_text())
    assert status["status"] == "complete"
    written = json.loads((folder / "summary.json").read_text())
    assert written["control"] == "untrained" and written["selected_round"] == 0 and written["rounds"] == 0
    assert written["bytes_down"] == written["bytes_up"] == 0
    # The same evaluation of the same initial model, built afresh.
    experiment = build_experiment(config)
    simulator = experiment.simulator()
    try:
        expected = simulator.evaluate(experiment.test)
    finally:
        simulator.engine.close()
    assert written["test"]["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-12)


def test_zero_rounds_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    assert main(["run", str(config), "--set", "federation.rounds=0", "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (folder,) = (tmp_path / "runs").iterdir()
    assert json.loads((folder / "summary.json").read_text())["control"] == "untrained"
    assert "run failed" not in capsys.readouterr().err
