"""``fedfew run`` and ``fedfew resume`` (fedfew.run.runner): resume equals the run never stopped, for every
algorithm, after Ctrl-C, kill -9, SIGTERM, an interrupt during the write-up or from an older
checkpoint; a 0-round run is the untrained control; what resume refuses (an edited config, changed
data, another version, a folder that is not a run) and what it allows (runtime edits, older folders);
the warnings of a finished run."""

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

import numpy as np
import pytest
import yaml

from fedfew.cli.main import main
from fedfew.config.validation import load_config
from fedfew.interface.registration import ALGORITHMS
from fedfew.run.experiment import build_experiment
from fedfew.run.folder import RunFolder
from fedfew.run.runner import RunInterrupted, resume_run, run_experiment
from fedfew.study.run_readback import run_seconds
from tests.cli.common import cli_lines
from tests.helpers import wait_for
from tests.run.common import (
    config_dict,
    config_of,
    interrupted_run,
    metrics,
    only_run,
    status,
    status_record,
    strict_metrics,
    write,
)
from tests.tiny import ALGORITHM_SETUPS, tiny_config


def test_an_older_folder_without_checksums_still_resumes_and_evaluates(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = interrupted_run(config_of(), tmp_path, monkeypatch)
    manifest_path = folder / "checkpoint" / "run.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["sha256"]
    manifest_path.write_text(json.dumps(manifest))
    status_path = folder / "status.json"
    status = json.loads(status_path.read_text())
    del status["config_sha256"]
    status_path.write_text(json.dumps(status))
    resumed = resume_run(folder, progress=False)
    whole = run_experiment(config_of(), tmp_path / "whole", progress=False)
    assert resumed["test"] == whole["test"]
    status = json.loads(status_path.read_text())
    del status["model_sha256"]
    status_path.write_text(json.dumps(status))
    assert main(["evaluate", str(folder)]) == 0


# -- a hand-edited config is refused on resume ------------------------------------------------------
@pytest.mark.parametrize("edit", [("federation", "rounds", 9), ("algorithm", "options", {"local_steps": 3})])
def test_an_edited_config_is_refused_on_resume(edit: tuple[str, str, Any], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    folder = interrupted_run(config_of(), tmp_path, monkeypatch)
    data = yaml.safe_load((folder / "config.yaml").read_text())
    section, key, value = edit
    data[section][key] = value
    (folder / "config.yaml").write_text(yaml.safe_dump(data))
    code, lines = cli_lines(capsys, "resume", str(folder))
    assert code == 2 and len(lines) == 1 and "config.yaml" in lines[0] and "changed" in lines[0], lines
    assert "runtime" in lines[0]  # what may change is said


def test_a_runtime_edit_of_the_config_is_allowed_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = interrupted_run(config_of(), tmp_path, monkeypatch)
    data = yaml.safe_load((folder / "config.yaml").read_text())
    data["runtime"]["threads"] = 2
    (folder / "config.yaml").write_text(yaml.safe_dump(data))
    resumed = resume_run(folder, progress=False)
    assert resumed["rounds"] == 4


# -- the data cannot change under a run -------------------------------------------------------------
def arrays_config(path: Path) -> dict[str, Any]:
    return config_of(dataset={"name": "arrays", "options": {
        "path": str(path), "class_split": {"base": 0.5, "val": 0.0, "novel": 0.5, "seed": 0}}})


def save_arrays(path: Path, seed: int = 0, shuffle: bool = False) -> None:
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(10), 12)
    x = (rng.normal(size=(120, 1, 8, 8)) + y[:, None, None, None]).astype(np.float32)
    if shuffle:
        y = rng.permutation(y)
    np.savez(path, x=x, y=y)


def test_changed_data_is_refused_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data.npz"
    save_arrays(data)
    folder = interrupted_run(arrays_config(data), tmp_path / "out", monkeypatch)
    record = json.loads((folder / "data.json").read_text())
    assert record["fingerprint"]["kind"] == "sha256"
    size = data.stat().st_size
    save_arrays(data, shuffle=True)  # the same size, other labels
    assert data.stat().st_size == size
    code, lines = cli_lines(capsys, "resume", str(folder))
    assert code == 2 and len(lines) == 1 and str(data) in lines[0] and "changed" in lines[0], lines
    save_arrays(data)  # put back: the run resumes
    assert main(["resume", str(folder)]) == 0


# -- results.md and model/ only after summary.json -------------------------------------------------
def test_results_and_model_appear_only_after_the_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fedfew.run.runner as runner

    seen: list[tuple[str, bool]] = []
    original = runner.plot_curves

    def plot_curves(*args: Any, **kwargs: Any) -> Any:  # where results.md once came before summary.json
        run_folder = Path(args[1]).parent
        seen.append(("results.md", (run_folder / "results.md").exists()))
        seen.append(("model", (run_folder / "model").exists()))
        seen.append(("summary.json", (run_folder / "summary.json").exists()))
        return original(*args, **kwargs)

    monkeypatch.setattr(runner, "plot_curves", plot_curves)
    summary = run_experiment(config_of(rounds=2), tmp_path, progress=False)
    assert seen == [("results.md", False), ("model", False), ("summary.json", False)]
    folder = Path(summary["folder"])
    assert {p.name for p in folder.iterdir()} >= {"results.md", "accuracy.png", "summary.json", "model"}
    assert not list(folder.glob(".*pending*"))


# -- resume of what is not a run --------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["deleted", "unreadable", "only-config"])
def test_resume_of_a_folder_without_a_readable_status_is_refused(damage: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    if damage == "only-config":
        folder = tmp_path / "run"
        folder.mkdir()
        (folder / "config.yaml").write_text(yaml.safe_dump(config_dict()))
    else:
        folder = interrupted_run(config_of(), tmp_path, monkeypatch)
        if damage == "deleted":
            (folder / "status.json").unlink()
        else:
            (folder / "status.json").write_text("{not json")
    code, lines = cli_lines(capsys, "resume", str(folder))
    assert code == 2 and len(lines) == 1 and "status.json" in lines[0], lines
    assert not (folder / "metrics.jsonl").exists() or damage != "only-config"


REPO = Path(__file__).resolve().parents[2]
FEDFEW = [sys.executable, "-m", "fedfew.cli.main"]


# -- resume equals never interrupted, for every algorithm --------------------------------------------
def interrupt_during(algorithm_cls: type, monkeypatch: pytest.MonkeyPatch, at_call: int) -> None:
    """Make the ``at_call``-th client update raise KeyboardInterrupt (Ctrl-C in the middle of a round)."""
    original = algorithm_cls.client_update
    calls = {"n": 0}

    def client_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == at_call:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(algorithm_cls, "client_update", client_update)


@pytest.mark.parametrize("name", sorted(ALGORITHM_SETUPS))
def test_resume_equals_uninterrupted_for_every_algorithm(name: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(tiny_config(name, federation={"rounds": 3}))
    whole = run_experiment(config, tmp_path / "whole", progress=False)

    calls_per_round = len(whole["history"][0]["clients"]["asked"])
    with monkeypatch.context() as patch:
        if name == "frl-scratch":  # its rounds run no client update: interrupt between rounds instead
            from fedfew.run.folder import RunFolder

            original = RunFolder.append_metrics

            def append_then_stop(self: RunFolder, record: dict[str, Any]) -> None:
                original(self, record)
                raise KeyboardInterrupt

            patch.setattr(RunFolder, "append_metrics", append_then_stop)
        else:  # Ctrl-C in the middle of round 2 (FRL: in its second episode's meta-update)
            interrupt_during(ALGORITHMS.get(name), patch, at_call=calls_per_round + 2)
        with pytest.raises(RunInterrupted) as info:
            run_experiment(config, tmp_path / "cut", progress=False)
    folder = info.value.folder
    assert status(folder) == "interrupted" and info.value.round_done >= 1
    assert not (folder / "summary.json").exists() and not (folder / "results.md").exists()
    resumed = resume_run(folder, progress=False)
    assert metrics(folder) == metrics(Path(whole["folder"]))
    assert resumed["test"] == whole["test"] and resumed["selected_round"] == whole["selected_round"]
    assert status(folder) == "complete"


# -- real processes: kill -9 and Ctrl-C ------------------------------------------------------------
def _ctrl_c_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT back to its default. A suite started in the background by a
    non-interactive shell inherits SIGINT ignored, and a program started so rightly keeps ignoring
    it, so without this the Ctrl-C test would test how the suite was launched."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_run(config_path: Path, out: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([*FEDFEW, "run", str(config_path), "--out", str(out), "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)


def wait_for_rounds(out: Path, rounds: int, process: subprocess.Popen[str], timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        folders = [p for p in out.glob("*") if p.is_dir()] if out.exists() else []
        if folders and (folders[0] / "metrics.jsonl").is_file():
            if len((folders[0] / "metrics.jsonl").read_text().splitlines()) >= rounds:
                return folders[0]
        if process.poll() is not None:
            raise AssertionError(f"the run ended before round {rounds}: {process.communicate()}")
        time.sleep(0.05)
    process.kill()
    raise AssertionError("timed out waiting for rounds")


@pytest.fixture(scope="module")
def long_f2l(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 60-round F2L run (private client-models with their Adam moments) and its uninterrupted folder.
    Long enough that a signal sent after round 2 or 3 lands mid-run on a loaded machine (with 12 tiny
    rounds a starved test process once saw round 2 only after the run had finished; with 30, under a
    load of two study processes beside the whole suite on 2 cores, once more)."""
    base = tmp_path_factory.mktemp("long")
    config = tiny_config("f2l", federation={"rounds": 60, "clients_per_round": 3}, partition={"num_clients": 3})
    path = base / "f2l.yaml"
    path.write_text(yaml.safe_dump(config))
    whole = run_experiment(load_config(path), base / "whole", progress=False)
    return path, Path(whole["folder"])


def test_kill_9_then_resume_equals_uninterrupted(long_f2l: tuple[Path, Path], tmp_path: Path) -> None:
    path, whole = long_f2l
    process = start_run(path, tmp_path)
    folder = wait_for_rounds(tmp_path, 3, process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert status(folder) == "running"  # a dead run: not complete, and not mistaken for one
    assert not (folder / "summary.json").exists()
    done = subprocess.run([*FEDFEW, "resume", str(folder), "--quiet"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert metrics(folder) == metrics(whole)
    assert json.loads((folder / "summary.json").read_text())["test"] == json.loads(
        (whole / "summary.json").read_text())["test"]


def test_ctrl_c_checkpoints_and_exits_130(long_f2l: tuple[Path, Path], tmp_path: Path) -> None:
    path, whole = long_f2l
    process = start_run(path, tmp_path)
    folder = wait_for_rounds(tmp_path, 2, process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"fedfew resume {folder}" in lines[0] and "Traceback" not in err
    assert status(folder) == "interrupted"
    assert main(["resume", str(folder), "--quiet"]) == 0
    assert metrics(folder) == metrics(whole)


def test_a_run_at_chance_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No learning (a vanishing learning rate) and no adaptation at test time: a random 3-way head.
    config = tiny_config("fl-maml", federation={"rounds": 1}, episodes={"test_episodes": 60})
    config["algorithm"]["options"].update(lr=1e-12, test_inner_steps=0)
    path = tmp_path / "chance.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert "at chance (33.3%)" in capsys.readouterr().err
    summary = json.loads((only_run(tmp_path / "out") / "summary.json").read_text())
    assert summary["at_chance"] is True and summary["chance"] == pytest.approx(1 / 3)




# -- interrupts during the write-up -------------------------------------------------------------------
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
    assert status_record(folder)["status"] == "interrupted" and status_record(folder)["round"] == 2
    for name in ("summary.json", "results.md", "accuracy.png", "model"):
        assert not (folder / name).exists(), name
    resumed = resume_run(folder, progress=False)
    assert status_record(folder)["status"] == "complete" and (folder / "summary.json").is_file()
    assert resumed["test"] == proto_whole["test"]
    assert strict_metrics(folder) == strict_metrics(Path(proto_whole["folder"]))


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
    assert status_record(folder)["status"] == "interrupted"
    assert not (folder / "summary.json").exists() and not (folder / "results.md").exists()
    assert main(["resume", str(folder), "--quiet"]) == 0
    assert json.loads((folder / "summary.json").read_text())["test"] == proto_whole["test"]


# -- clients that never train -------------------------------------------------------------------------
def test_clients_that_never_train_are_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = load_config(tiny_config("local", partition={"num_clients": 10, "options": {"alpha": 0.05}},
                                     federation={"rounds": 2, "clients_per_round": 10}))
    with caplog.at_level(logging.WARNING):
        summary = run_experiment(config, tmp_path, progress=False)
    rows = strict_metrics(Path(summary["folder"]))
    expected = {str(c): sum(c in row["clients"]["trained"] for row in rows) for c in range(10)}
    saved = json.loads((Path(summary["folder"]) / "summary.json").read_text())
    assert saved["rounds_trained"] == expected
    never = [c for c in range(10) if expected[str(c)] == 0]
    assert never and saved["clients_never_trained"] == never  # alpha 0.05: some clients cannot form an episode
    assert saved["personalised"] == {"models": 10, "trained": 10 - len(never)}
    warning = [r.getMessage() for r in caplog.records if "never trained" in r.getMessage()]
    assert len(warning) == 1 and f"{len(never)} of 10 clients never trained" in warning[0]
    assert f"only {10 - len(never)} were ever trained" in warning[0]


# -- resume with another version -----------------------------------------------------------------------
def test_resume_refuses_a_run_of_another_version_unless_allowed_and_the_summary_records_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.core.codeversion import numbers_version, package_version

    out = tmp_path / "out"
    config = write(tmp_path / "c.yaml", tiny_config("fl-proto"))
    assert cli_lines(capsys, "run", str(config), "--out", str(out), "--quiet")[0] == 0
    (folder,) = list(out.iterdir())
    written = json.loads((folder / "status.json").read_text())
    assert written["fedfew"] == package_version() and written["code"] == numbers_version()
    (folder / "status.json").write_text(json.dumps({**written, "status": "interrupted", "fedfew": "0.0.1"}))
    code, lines = cli_lines(capsys, "resume", str(folder), "--quiet")
    assert code == 2 and len(lines) == 1 and "fedfew 0.0.1" in lines[0] and "--allow-other-version" in lines[0]
    assert json.loads((folder / "status.json").read_text())["fedfew"] == "0.0.1"  # the stamp is untouched
    # The same package with other number code is refused too.
    (folder / "status.json").write_text(json.dumps({**written, "status": "interrupted", "code": "000000000000"}))
    code, lines = cli_lines(capsys, "resume", str(folder), "--quiet")
    assert code == 2 and "number code 000000000000" in lines[0]
    assert cli_lines(capsys, "resume", str(folder), "--quiet", "--allow-other-version")[0] == 0
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["other_version"]["written_by"]["code"] == "000000000000"
    assert summary["other_version"]["resumed_by"] == {"fedfew": package_version(), "code": numbers_version()}


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


def test_the_longest_names_allowed_still_make_folders(tmp_path: Path) -> None:
    config = load_config(tiny_config("fl-proto", name="n" * 200))
    from fedfew.run.runner import new_run

    folder = new_run(config, tmp_path)
    assert folder.path.is_dir() and folder.path.name.startswith("n" * 200)


def rows_without_seconds(folder: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("seconds")
    return rows


# -- resume from an older checkpoint ----------------------------------------------------------------------
def test_resume_from_a_checkpoint_two_rounds_back_equals_uninterrupted(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """checkpoint_every: 2 and the process lost after round 3 (no checkpoint written at the end, as
    with kill -9): the resume starts again from round 2, drops round 3's line and ends where a run
    that was never stopped ends."""
    config = load_config(tiny_config("f2l", federation={"rounds": 5, "clients_per_round": 3},
                                     partition={"num_clients": 3}), ["runtime.checkpoint_every=2"])
    whole = run_experiment(config, tmp_path / "whole", progress=False)
    original = RunFolder.append_metrics

    class MachineLost(BaseException):
        """Neither an Exception nor SystemExit (which a run records as a crash): nothing runs on the way out."""

    def lost_after_round_3(self: RunFolder, record: dict[str, Any]) -> None:
        original(self, record)
        if record["round"] == 3:
            raise MachineLost("the machine went away")

    with monkeypatch.context() as patch:
        patch.setattr(RunFolder, "append_metrics", lost_after_round_3)
        with pytest.raises(MachineLost):
            run_experiment(config, tmp_path / "cut", progress=False)
    (folder,) = (tmp_path / "cut").iterdir()
    assert len(rows_without_seconds(folder)) == 3
    assert json.loads((RunFolder(folder).checkpoint_dir / "run.json").read_text())["round"] == 2
    started = time.perf_counter()
    resumed = resume_run(folder, progress=False)
    sitting = time.perf_counter() - started
    assert rows_without_seconds(folder) == rows_without_seconds(Path(whole["folder"]))
    assert resumed["test"] == whole["test"] and resumed["selected_round"] == whole["selected_round"]
    # Its time: this sitting's plus the rounds' seconds at the checkpoint (round 2), each counted once.
    round_2 = json.loads((folder / "metrics.jsonl").read_text().splitlines()[1])
    assert round_2["round"] == 2 and resumed["seconds_resumed_from"] == round(round_2["seconds"], 2)
    assert resumed["seconds"] <= resumed["seconds_resumed_from"] + sitting + 0.01  # 0.01: both rounded
    assert run_seconds(folder, resumed) == resumed["seconds"]  # the study's correction is for older summaries
    assert "seconds_resumed_from" not in whole
