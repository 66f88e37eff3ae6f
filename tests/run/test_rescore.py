"""``fedfew evaluate`` (fedfew.run.rescore): the saved model is re-scored on the same tasks, and a model
file of another architecture is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedfew.cli.main import main
from fedfew.config.validation import load_config
from fedfew.run.runner import run_experiment
from tests.cli.common import cli_lines
from tests.run.common import write
from tests.tiny import tiny_config


def test_saved_model_is_rescored_by_evaluate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = load_config(tiny_config("f2l"))
    summary = run_experiment(config, tmp_path, progress=False)
    folder = Path(summary["folder"])
    assert (folder / "model" / "server.safetensors").is_file()
    assert len(list((folder / "model" / "clients").glob("*.safetensors"))) == 4  # every private client-model
    assert main(["evaluate", str(folder)]) == 0
    again = json.loads((folder / "evaluations.jsonl").read_text().splitlines()[-1])
    assert again["test"] == summary["test"]  # the same model on the same tasks
    assert main(["evaluate", str(folder), "--set", "episodes.test_episodes=12"]) == 0
    more = json.loads((folder / "evaluations.jsonl").read_text().splitlines()[-1])
    assert more["overrides"] == ["episodes.test_episodes=12"] and more["test"] != summary["test"]
    assert main(["evaluate", str(folder), "--set", "federation.rounds=9"]) == 2
    assert "only how the model is scored" in capsys.readouterr().err


# -- evaluate checks the model file --------------------------------------------------------------------
def test_evaluate_refuses_a_model_file_of_another_architecture(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = tiny_config("fl-proto", federation={"rounds": 1})
    out = tmp_path / "out"
    assert cli_lines(capsys, "run", str(write(tmp_path / "a.yaml", {**config, "name": "a"})), "--out", str(out))[0] == 0
    other = {**config, "name": "b", "model": {"name": "conv4", "options": {"hidden": 4}}}
    assert cli_lines(capsys, "run", str(write(tmp_path / "b.yaml", other)), "--out", str(out))[0] == 0
    (a,) = out.glob("a-*")
    (b,) = out.glob("b-*")
    (a / "model/server.safetensors").write_bytes((b / "model/server.safetensors").read_bytes())
    code, lines = cli_lines(capsys, "evaluate", str(a))
    assert code == 2 and len(lines) == 1 and "server.safetensors" in lines[0] and "(4,)" in lines[0], lines
