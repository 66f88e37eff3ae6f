"""The live run folder (fedfew.run.folder): its lock (a forked worker holds no copy; an orphaned one is
taken once), strict JSON metrics, checksums of what a resume or evaluate reads back, half-written
files, a full disk, a run that calls sys.exit, and output folders (and --table) checked before any
work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedfew.algorithms.local import Local
from fedfew.cli.main import demo_config_path, main
from fedfew.config.validation import load_config
from fedfew.run.folder import RunFolder, RunFolderError
from fedfew.run.runner import run_experiment
from tests.cli.common import cli_all_lines, cli_lines, one_line
from tests.run.common import (
    config_of,
    flip_tail,
    interrupted_run,
    status_record,
    strict_metrics,
    strict_rows,
    write,
)
from tests.tiny import tiny_config


def test_output_folder_that_is_a_file_is_found_before_training(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "taken"
    target.write_text("a file")
    started = time.perf_counter()
    assert main(["run", str(demo_config_path()), "--out", str(target), "--quiet"]) == 2
    assert "is a file" in capsys.readouterr().err and time.perf_counter() - started < 20


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
    record = status_record(tmp_path)
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


def test_metrics_files_are_strict_json(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.append_metrics({"round": 1, "train_loss": float("nan"), "ci95": float("inf"), "nested": [float("-inf")]})
    folder.rewrite_metrics([{"round": 1, "x": float("nan")}, {"round": 2, "x": 0.5}])
    assert strict_rows(tmp_path) == [{"round": 1, "x": None}, {"round": 2, "x": 0.5}]


# -- a full disk ---------------------------------------------------------------------------------------
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
    recorded = status_record(folder)
    assert recorded["status"] == "failed" and "No space left on device" in recorded["error"]
    assert str(folder) in recorded["error"]  # the file that could not be written
    # The message and status.json tell one story: the round it failed in, and the round resume starts from.
    assert f"the last checkpoint is round {recorded['round']}" in lines[0], (lines[0], recorded["round"])
    assert str(folder) in (folder / "error.log").read_text()
    subprocess.run(["mount", "-o", "remount,size=40m", str(small_tmpfs)], check=True)
    assert main(["resume", str(folder), "--quiet"]) == 0
    whole = run_experiment(load_config(path), tmp_path / "whole", progress=False)
    assert strict_metrics(folder) == strict_metrics(Path(whole["folder"]))


# -- checkpoints and models carry a checksum -------------------------------------------------------
def test_a_changed_checkpoint_file_is_refused_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    folder = interrupted_run(config_of(), tmp_path, monkeypatch)
    server = folder / "checkpoint" / "server-r2.safetensors"
    size = server.stat().st_size
    flip_tail(server)
    assert server.stat().st_size == size
    code, lines = cli_lines(capsys, "resume", str(folder))
    assert code == 2 and len(lines) == 1 and str(server) in lines[0] and "changed" in lines[0], lines


def test_a_changed_client_state_file_is_refused_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = load_config(tiny_config("local", federation={"rounds": 4, "clients_per_round": 4}))
    folder = interrupted_run(config, tmp_path, monkeypatch, algorithm=Local)
    manifest = json.loads((folder / "checkpoint" / "run.json").read_text())
    states = sorted(k for k in manifest["sha256"] if k.startswith("states/"))
    assert states, manifest["sha256"]
    flip_tail(folder / states[0])
    code, lines = cli_lines(capsys, "resume", str(folder))
    assert code == 2 and len(lines) == 1 and states[0] in lines[0], lines


def test_a_changed_model_file_is_refused_by_evaluate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = run_experiment(config_of(rounds=2), tmp_path, progress=False)
    model = Path(summary["folder"]) / "model" / "server.safetensors"
    flip_tail(model)
    code, lines = cli_lines(capsys, "evaluate", summary["folder"])
    assert code == 2 and len(lines) == 1 and str(model) in lines[0], lines
    assert not (Path(summary["folder"]) / "evaluations.jsonl").exists()


def test_a_model_file_the_run_did_not_write_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = run_experiment(config_of(rounds=2), tmp_path, progress=False)
    model = Path(summary["folder"]) / "model"
    (model / "clients").mkdir(exist_ok=True)
    (model / "clients" / "client-99.safetensors").write_bytes((model / "server.safetensors").read_bytes())
    code, lines = cli_lines(capsys, "evaluate", summary["folder"])
    assert code == 2 and len(lines) == 1 and "client-99" in lines[0], lines


def test_a_table_in_an_unwritable_place_names_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    line = one_line(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"),
                    "--table", str(tmp_path / "file" / "table"))
    assert "--table" in line and "--out" not in line, line


def test_resume_removes_the_half_written_files_an_interrupted_write_left(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    config = write(tmp_path / "c.yaml", tiny_config("fl-proto"))
    assert cli_lines(capsys, "run", str(config), "--out", str(out), "--quiet")[0] == 0
    (folder,) = list(out.iterdir())
    # What a write-up killed between write and rename leaves, as status "interrupted".
    (folder / f".summary.json.tmp-{os.getpid() + 1}").write_text("{")
    (folder / "checkpoint" / ".run.json.tmp-99999").write_text("{")
    data = json.loads((folder / "status.json").read_text())
    (folder / "status.json").write_text(json.dumps({**data, "status": "interrupted"}))
    assert cli_lines(capsys, "resume", str(folder), "--quiet")[0] == 0
    assert not list(folder.rglob(".*.tmp-*"))


QUICK = ["--set", "federation.rounds=1", "--set", "episodes.test_episodes=5"]
PLUGIN_EXITS_IN_TRAINING = '''
import sys
from torch import nn
from fedfew.models import MODELS, FewShotModel


class ExitsWhenTraining(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 4)

    def forward(self, x):
        if self.training:
            sys.exit(3)
        return self.linear(x.flatten(1))


@MODELS.register("exits-in-training")
def exits(input_shape, num_classes):
    return FewShotModel(ExitsWhenTraining(), 4, None if num_classes is None else nn.Linear(4, num_classes))
'''


def test_a_plugin_calling_sys_exit_during_training_fails_the_run(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "exits_training.py"
    plugin.write_text(PLUGIN_EXITS_IN_TRAINING)
    code, lines = cli_all_lines(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                          "--plugin", str(plugin), "--set", "model.name=exits-in-training", "--set",
                          "model.options={}", *QUICK)
    assert code == 1 and len(lines) == 1 and "sys.exit(3)" in lines[0], lines
    (folder,) = list((tmp_path / "out").iterdir())
    status = json.loads((folder / "status.json").read_text())
    assert status["status"] == "failed" and "sys.exit(3)" in status["error"]
    assert "SystemExit" in (folder / "error.log").read_text()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_an_output_folder_that_cannot_be_created_is_found_in_preflight(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    code, lines = cli_all_lines(capsys, "run", str(good), "--out", "/proc/x", "--quiet")
    assert code == 2 and len(lines) == 1 and "/proc/x" in lines[0] and "output folder" in lines[0], lines
    assert "[Errno" not in lines[0].split("(")[0]  # the message leads with what is wrong, not an errno
