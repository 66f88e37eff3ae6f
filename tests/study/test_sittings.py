"""The notes of each sitting of a cell's run (fedfew.study.sittings): a resumed run's CPU seconds are its
sittings', never guessed, and count child processes that ended."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fedfew.run.environment import NOT_RECORDED, describe, describe_environments
from fedfew.study.sittings import SITTINGS_FILE, cpu_seconds, run_usage


def _notes(folder: Path, *sittings: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SITTINGS_FILE).write_text("".join(json.dumps(s) + "\n" for s in sittings))
    return folder


ENV = {"python": "3.11.7", "torch": "2.13.0+cpu", "numpy": "2.2.1", "fedfew": "0.1.0", "platform": "Linux x86_64",
       "cpu": "Some CPU", "cpu_capability": "AVX512", "device": "cpu", "gpu": None, "cuda": None, "threads": 1,
       "precision": "fp32"}


def _sitting(fresh: bool, cpu: float, env: dict | None = None) -> dict:
    return {"fresh": fresh, "started": "2026-01-01T00:00:00Z", "environment": env or ENV, "wall_seconds": 2 * cpu,
            "cpu_seconds": cpu, "load_average": [0.5, 1.5]}


def test_a_resumed_runs_cpu_seconds_are_its_sittings_and_never_guessed(tmp_path: Path) -> None:
    both = run_usage(_notes(tmp_path / "a", _sitting(True, 10.0), _sitting(False, 5.5, {**ENV, "fedfew": "0.2.0"})))
    assert both["cpu_seconds"] == 15.5 and both["environment"]["fedfew"] == "0.2.0" and len(both["sittings"]) == 2
    # the first sittings not noted (an older fedfew ran them): no total, no environment, and why
    partial = run_usage(_notes(tmp_path / "b", _sitting(False, 5.0)))
    assert "cpu_seconds" not in partial and "environment" not in partial
    assert partial["environment_note"].startswith("not recorded: the run's first sittings were not noted")
    # sittings on two machines: the CPU time is known, the environment is not one
    mixed = run_usage(_notes(tmp_path / "c", _sitting(True, 1.0), _sitting(False, 1.0, {**ENV, "cpu": "Other"})))
    assert mixed["cpu_seconds"] == 2.0 and "environment" not in mixed and "Other" in mixed["environment_note"]
    assert "environment" not in run_usage(tmp_path / "d") and "not recorded" in run_usage(tmp_path / "d")[
        "environment_note"]
    # the report counts both as not recorded, never as either environment
    assert describe_environments([mixed, partial, {"environment": ENV}]) == (
        f"Environments: 1 run on {describe(ENV)}; 2 runs: {NOT_RECORDED}.")


def test_cpu_seconds_count_child_processes_that_ended() -> None:
    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: "
                    "pass"], check=True)
    assert cpu_seconds() - before >= 0.4
