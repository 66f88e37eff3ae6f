"""Runs that never lie, part 2 (issue 25): worker processes die with their run, interrupts during the
write-up leave a resumable run, clients that never trained are reported, a diverged model fails the
run, metrics are strict JSON, fault settings that leave no reply are refused, and a full disk fails
the run with the path."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedfew.cli.main import demo_config_path, main
from fedfew.config.validation import ConfigError, load_config
from fedfew.engine.base import Faults
from fedfew.run.folder import RunFolder, RunFolderError
from fedfew.run.runner import RunInterrupted, resume_run, run_experiment
from tests.tiny import tiny_config

REPO = Path(__file__).resolve().parents[1]
FEDFEW = [sys.executable, "-m", "fedfew.cli.main"]


def strict_rows(folder: Path) -> list[dict[str, Any]]:
    """metrics.jsonl parsed by a strict parser: bare NaN or Infinity is an error."""
    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return [json.loads(line, parse_constant=refuse) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def metrics(folder: Path) -> list[dict[str, Any]]:
    rows = strict_rows(folder)
    for row in rows:
        row.pop("seconds")
    return rows


def status(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "status.json").read_text())


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


def wait_for(predicate: Any, timeout: float, process: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the run ended first: {process.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


# -- item 1: kill -9 of a run with worker processes ---------------------------------------------------
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
    assert metrics(folder) == metrics(whole)
    assert json.loads((folder / "summary.json").read_text())["test"] == json.loads(
        (whole / "summary.json").read_text())["test"]


def test_a_forked_worker_holds_no_copy_of_the_lock(tmp_path: Path) -> None:
    first, second = RunFolder(tmp_path), RunFolder(tmp_path)
    first.set_status("running")
    first.lock()
    try:
        pid = os.fork()
        if pid == 0:  # as a worker: its copy of the lock is closed, and the folder is still the parent's
            code = 0
            try:
                os.fstat(first._lock_fd)  # type: ignore[arg-type]
                code |= 1
            except OSError:
                pass
            try:
                second.lock(orphans_grace=0)
                code |= 2
            except Exception as err:
                code |= 0 if "live run" in str(err) else 4
            os._exit(code)
        _, code = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(code) == 0
    finally:
        first.unlock()
    second.lock(orphans_grace=0)  # free once the owner lets go
    second.unlock()


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_lock_whose_owner_died_is_taken_only_once_no_process_of_the_run_holds_it(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folder.set_status("running")
    record = status(tmp_path)
    (tmp_path / "status.json").write_text(json.dumps({**record, "pid": int(gone.stdout)}))  # the owner: dead
    (tmp_path / ".lock").touch()

    def orphan(seconds: float) -> subprocess.Popen[str]:  # one of the dead owner's processes, still holding it
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / ".lock"), str(seconds)],
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        return holder

    holder = orphan(60)
    try:
        with pytest.raises(RunFolderError, match=rf"main process \(pid {int(gone.stdout)}\) is gone: {holder.pid}"):
            folder.lock(orphans_grace=0.3)
    finally:
        holder.kill()
        holder.wait()
    holder = orphan(1.0)  # it exits within the grace period: then, and only then, the lock is taken
    folder.lock(orphans_grace=30)
    assert holder.poll() is not None
    folder.unlock()


# -- item 2: interrupts during the write-up -----------------------------------------------------------
WRITE_UP_STAGES = [
    ("fedfew.run.folder.RunFolder.save_model", "model"),
    ("fedfew.run.runner.summarise", "summary"),
    ("fedfew.run.runner.plot_curves", "plot"),
    ("fedfew.run.runner.markdown_table", "table"),
]


@pytest.fixture(scope="module")
def proto_whole(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config = load_config(tiny_config("fl-proto", federation={"rounds": 2}))
    return run_experiment(config, tmp_path_factory.mktemp("whole"), progress=False)


@pytest.mark.parametrize("target,stage", WRITE_UP_STAGES)
def test_an_interrupt_during_the_write_up_is_resumable_and_leaves_no_result(
        target: str, stage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, proto_whole: dict[str, Any]) -> None:
    def interrupt(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    config = load_config(tiny_config("fl-proto", federation={"rounds": 2}))
    with monkeypatch.context() as patch:
        patch.setattr(target, interrupt)
        with pytest.raises(RunInterrupted) as info:
            run_experiment(config, tmp_path, progress=False)
    folder = info.value.folder
    message = str(info.value)
    assert "all 2 rounds finished" in message and f"fedfew resume {folder}" in message
    assert status(folder)["status"] == "interrupted" and status(folder)["round"] == 2
    for name in ("summary.json", "results.md", "accuracy.png", "model"):
        assert not (folder / name).exists(), name
    resumed = resume_run(folder, progress=False)
    assert status(folder)["status"] == "complete" and (folder / "summary.json").is_file()
    assert resumed["test"] == proto_whole["test"]
    assert metrics(folder) == metrics(Path(proto_whole["folder"]))


def test_sigterm_when_the_model_appears_then_resume(tmp_path: Path, proto_whole: dict[str, Any]) -> None:
    # The model is written under its pending name first and becomes model/ only after summary.json
    # (fedfew.run.folder.PENDING_MODEL): its appearance there is the write-up's start.
    from fedfew.run.folder import PENDING_MODEL

    path = tmp_path / "proto.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fl-proto", federation={"rounds": 2})))
    process = subprocess.Popen([*FEDFEW, "run", str(path), "--out", str(tmp_path / "out"), "--quiet"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any((tmp_path / "out").glob(f"*/{PENDING_MODEL}/server.safetensors")), 180, process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    (folder,) = list((tmp_path / "out").iterdir())
    lines = [line for line in err.splitlines() if line.strip()]
    assert process.returncode == 130, err
    assert len(lines) == 1 and "all 2 rounds finished" in lines[0] and f"fedfew resume {folder}" in lines[0]
    assert status(folder)["status"] == "interrupted"
    assert not (folder / "summary.json").exists() and not (folder / "results.md").exists()
    assert main(["resume", str(folder), "--quiet"]) == 0
    assert json.loads((folder / "summary.json").read_text())["test"] == proto_whole["test"]


# -- item 3: clients that never train -----------------------------------------------------------------
def test_clients_that_never_train_are_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(tiny_config("local", partition={"num_clients": 10, "options": {"alpha": 0.05}},
                                     federation={"rounds": 2, "clients_per_round": 10}))
    with caplog.at_level(logging.WARNING):
        summary = run_experiment(config, tmp_path, progress=False)
    rows = metrics(Path(summary["folder"]))
    expected = {str(c): sum(c in row["clients"]["trained"] for row in rows) for c in range(10)}
    saved = json.loads((Path(summary["folder"]) / "summary.json").read_text())
    assert saved["rounds_trained"] == expected
    never = [c for c in range(10) if expected[str(c)] == 0]
    assert never and saved["clients_never_trained"] == never  # alpha 0.05: some clients cannot form an episode
    assert saved["personalised"] == {"models": 10, "trained": 10 - len(never)}
    warning = [r.getMessage() for r in caplog.records if "never trained" in r.getMessage()]
    assert len(warning) == 1 and f"{len(never)} of 10 clients never trained" in warning[0]
    assert f"only {10 - len(never)} were ever trained" in warning[0]


# -- item 4: divergence is a failure, metrics are strict JSON ------------------------------------------
NAN_MODEL = '''
import torch
from torch import nn
from fedfew.models import MODELS, FewShotModel


class NaNAfterTraining(nn.Module):
    """Finite in eval mode (the preflight check passes), NaN features once training starts."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 8)

    def forward(self, x):
        out = self.linear(x.flatten(1))
        return out * float("nan") if self.training else out


@MODELS.register("nan-after-training")
def nan_model(input_shape, num_classes):
    return FewShotModel(NaNAfterTraining(), 8, None if num_classes is None else nn.Linear(8, num_classes))
'''


def test_a_model_that_outputs_nan_fails_the_run_naming_round_and_client(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "nan_model.py"
    plugin.write_text(NAN_MODEL)
    code = main(["run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet", "--plugin", str(plugin),
                 "--set", "model.name=nan-after-training", "--set", "model.options={}",
                 "--set", "algorithm.name=fl-proto", "--set", "algorithm.options={local_steps: 1}",
                 "--set", "federation.rounds=3", "--set", "episodes.test_episodes=5"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert "round 1" in lines[0] and "client 0" in lines[0] and "diverged" in lines[0]
    (folder,) = list((tmp_path / "out").iterdir())
    assert status(folder)["status"] == "failed" and "round 1" in status(folder)["error"]
    assert not (folder / "summary.json").exists()
    rows = strict_rows(folder)  # strict JSON: the NaN loss is null
    assert len(rows) == 1 and rows[0]["train_loss"] is None and "client 0" in rows[0]["diverged"]


def test_a_huge_learning_rate_fails_the_run(tmp_path: Path) -> None:
    config = load_config(tiny_config("fedavg", federation={"rounds": 3}))
    config = load_config(config.model_dump(mode="json"), ["algorithm.options.lr=1e30"])
    from fedfew.engine.guard import DivergedError

    with pytest.raises(DivergedError, match=r"round \d: client \d"):
        run_experiment(config, tmp_path, progress=False)
    (folder,) = list(tmp_path.iterdir())
    assert status(folder)["status"] == "failed"
    strict_rows(folder)


def test_metrics_files_are_strict_json(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.append_metrics({"round": 1, "train_loss": float("nan"), "ci95": float("inf"), "nested": [float("-inf")]})
    folder.rewrite_metrics([{"round": 1, "x": float("nan")}, {"round": 2, "x": 0.5}])
    assert strict_rows(tmp_path) == [{"round": 1, "x": None}, {"round": 2, "x": 0.5}]


# -- item 6: fault settings that leave no reply --------------------------------------------------------
def test_fault_settings_that_leave_no_reply_are_refused_with_the_draws_rounding() -> None:
    with pytest.raises(ConfigError, match=r"federation\.dropout.*federation\.stragglers.*no client to reply"):
        load_config(demo_config_path(), ["federation.dropout=0.9", "federation.stragglers=0.09"])  # 9 + 1 of 10
    with pytest.raises(ConfigError, match="round of 3"):  # round(1.5) = 2 fail, round(0.9) = 1 late, of 3
        load_config(demo_config_path(), ["federation.clients_per_round=3", "federation.dropout=0.5",
                                         "federation.stragglers=0.3"])
    # Accepted exactly where the draw leaves a reply (Python's round: round(0.5) = 0 of 1 fails).
    load_config(demo_config_path(), ["federation.clients_per_round=1", "federation.dropout=0.5"])
    assert Faults(0.5, 0.0).counts(1) == (0, 0)
    assert load_config(demo_config_path(), ["federation.dropout=0.5", "federation.stragglers=0.4"])
    assert Faults(0.5, 0.4).counts(10) == (5, 4)


def test_fault_settings_that_leave_no_reply_stop_before_any_work(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                 "--set", "federation.dropout=0.9", "--set", "federation.stragglers=0.09"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "federation.dropout" in lines[0]
    assert not (tmp_path / "out").exists()


# -- item 9: a full disk -------------------------------------------------------------------------------
@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Any:
    """A 7 MiB tmpfs (root only): a real full disk. Unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=7m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_the_run_with_the_path_and_resumes_once_there_is_space(
        small_tmpfs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # F2L keeps a 1.6 MB private state per client: 3 clients x 2 versions do not fit in 7 MiB.
    config = tiny_config("f2l", federation={"rounds": 3, "clients_per_round": 3}, partition={"num_clients": 3})
    path = tmp_path / "f2l.yaml"
    path.write_text(yaml.safe_dump(config))
    code = main(["run", str(path), "--out", str(small_tmpfs), "--quiet"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "warning" not in line]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert "No space left on device" in lines[0] and str(small_tmpfs) in lines[0]
    (folder,) = [p for p in small_tmpfs.iterdir() if p.is_dir()]
    recorded = status(folder)
    assert recorded["status"] == "failed" and "No space left on device" in recorded["error"]
    assert str(folder) in recorded["error"]  # the file that could not be written
    # The message and status.json tell one story: the round it failed in, and the round resume starts from.
    assert f"the last checkpoint is round {recorded['round']}" in lines[0], (lines[0], recorded["round"])
    assert str(folder) in (folder / "error.log").read_text()
    subprocess.run(["mount", "-o", "remount,size=40m", str(small_tmpfs)], check=True)
    assert main(["resume", str(folder), "--quiet"]) == 0
    whole = run_experiment(load_config(path), tmp_path / "whole", progress=False)
    assert metrics(folder) == metrics(Path(whole["folder"]))
