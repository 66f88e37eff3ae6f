"""``fedfew study`` on the command line (fedfew.cli.study): bad command-line input is exit 2 with one
line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.study.common import DIGITS_STUDY, run_cli, write_study


def test_bad_command_line_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    store = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs")]
    for argv, expected in (
        (["study", "run", str(tmp_path / "nope.yaml")], "does not exist"),
        (["study", "run", str(path), "--budget", "huge", *store], "budget 'huge' does not exist"),
        (["study", "run", str(path), "--seeds", "0,one", *store], "--seeds '0,one'"),
        (["study", "run", str(path), "--set", "federation.rouns=2", *store], "federation.rouns"),
        (["study", "run", str(path), "--set", "model.name=nonet", "--budget", "smoke", *store], "cell fl-proto"),
    ):
        code, _, err = run_cli(argv, capsys)
        errors = [line for line in err.strip().splitlines() if not line.startswith("fedfew: warning:")]
        assert code == 2 and expected in err and len(errors) == 1 and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "store").exists() and not (tmp_path / "runs").exists()  # nothing ran
