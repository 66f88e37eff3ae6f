"""Running the command line in a test: its exit code and the lines it wrote on stderr, and the
checks a refused input must pass (one line, exit 2, no traceback, no run started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.cli.main import main


def cli_lines(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unexpected" not in err, err
    return code, [line for line in err.splitlines() if line.strip() and "warning" not in line]


def one_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unexpected" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and "warning" not in line]
    assert code == 2 and len(lines) == 1, (code, err)
    return lines[0]


def cli_all_lines(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [line for line in err.splitlines() if line.strip()]


def refused(capsys: pytest.CaptureFixture[str], out: Path, *args: str) -> str:
    code, lines = cli_lines(capsys, *args)
    assert code == 2 and len(lines) == 1, lines
    assert not out.exists() or not any(out.rglob("status.json")), "a run started"
    return lines[0]
