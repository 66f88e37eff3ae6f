"""The handlers of ``fedfew run`` (fedfew.cli.commands): one folder with every promised file, and a
batch of configs checked whole before the first runs, the bad one named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedfew.cli.main import demo_config_path, main
from tests.cli.common import cli_lines
from tests.run.common import write
from tests.tiny import tiny_config


def test_a_bad_second_config_stops_the_batch_before_the_first_runs(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(tiny_config("fl-proto", episodes={"k_shot": 500})))
    assert main(["run", str(good), str(bad), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "k_shot" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# -- which config of a batch ---------------------------------------------------------------------------
def test_a_bad_second_config_of_a_batch_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path / "good.yaml", tiny_config("fl-proto"))
    bad = write(tmp_path / "bad.yaml", tiny_config("fl-proto", federation={"rounds": -1}))
    code, lines = cli_lines(capsys, "run", str(good), str(bad), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and str(bad) in lines[0] and "federation.rounds" in lines[0]
    assert str(good) not in lines[0]


TINY = [
    "federation.rounds=2", "partition.num_clients=4", "federation.clients_per_round=4",
    "episodes.test_episodes=10", "eval.every=1", "model.options={hidden: 8}",
    "algorithm.options.local_steps=1", "runtime.threads=1",
]


def test_run_writes_a_complete_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", str(demo_config_path()), "--out", str(tmp_path), "--quiet"]
    for item in TINY:
        args += ["--set", item]
    assert main(args) == 0
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "results.md", "accuracy.png"):
        assert (folder / name).is_file(), name
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]
    summary = json.loads((folder / "summary.json").read_text())
    assert 0 <= summary["test"]["accuracy"] <= 1 and summary["bytes_up"] > 0
