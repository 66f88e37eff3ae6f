"""``runtime.engine: workers`` (fedfew.engine.workers): the worker processes die with their run (kill -9),
and the run resumes to the numbers of the run never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedfew.config.validation import load_config
from fedfew.run.runner import run_experiment
from tests.helpers import wait_for
from tests.run.common import strict_metrics
from tests.tiny import tiny_config

REPO = Path(__file__).resolve().parents[2]
FEDFEW = [sys.executable, "-m", "fedfew.cli.main"]


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"




# -- kill -9 of a run with worker processes -----------------------------------------------------------
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux /proc")
def test_kill_9_of_a_run_with_workers_leaves_no_process_and_resumes_identically(tmp_path: Path) -> None:
    config = tiny_config("f2l", federation={"rounds": 5, "clients_per_round": 3}, partition={"num_clients": 3},
                         runtime={"threads": 1, "progress": False, "workers": 2})
    path = tmp_path / "f2l.yaml"
    path.write_text(yaml.safe_dump(config))
    whole = Path(run_experiment(load_config(path, ["runtime.workers=0"]), tmp_path / "whole", progress=False)["folder"])

    process = subprocess.Popen([*FEDFEW, "run", str(path), "--out", str(tmp_path / "cut"), "--quiet"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        def two_rounds_logged() -> bool:
            runs = list((tmp_path / "cut").glob("*/metrics.jsonl"))
            return bool(runs) and len(runs[0].read_text().splitlines()) >= 2

        wait_for(two_rounds_logged, 180, process)
        workers = children_of(process.pid)
        assert len(workers) == 2
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        (folder,) = list((tmp_path / "cut").iterdir())
        wait_for(lambda: not any(alive(w) for w in workers), 5)  # they die with their parent, at once
        done = subprocess.run([*FEDFEW, "resume", str(folder), "--quiet"], cwd=REPO, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
    finally:
        for pid in workers:  # never leave an orphan behind, whatever failed above
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert strict_metrics(folder) == strict_metrics(whole)
    assert json.loads((folder / "summary.json").read_text())["test"] == json.loads(
        (whole / "summary.json").read_text())["test"]
