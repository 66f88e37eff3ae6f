"""Runs that survive and never lie: the state form, checkpoints and resume (in process, after kill -9
and after Ctrl-C), saved models, failing runs, clean errors for bad input, and client faults."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from fedfew.cli.main import demo_config_path, main
from fedfew.config.validation import load_config
from fedfew.interface import serialize
from fedfew.interface.algorithm import ALGORITHMS
from fedfew.run.runner import RunInterrupted, resume_run, run_experiment
from tests.tiny import ALGORITHM_SETUPS, tiny_config

REPO = Path(__file__).resolve().parents[1]
FEDFEW = [sys.executable, "-m", "fedfew.cli.main"]


def metrics(folder: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without the wall-clock field (the only thing an interruption may change)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("seconds")
    return rows


def status(folder: Path) -> str:
    return json.loads((folder / "status.json").read_text())["status"]


def only_run(base: Path) -> Path:
    (folder,) = [p for p in base.iterdir() if p.is_dir()]
    return folder


# -- the flat state form ---------------------------------------------------------------------------
def test_state_form_round_trips_every_kind_of_value(tmp_path: Path) -> None:
    model = torch.nn.Conv2d(2, 3, 3).to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(1, 2, 5, 5)).sum().backward()
    optimizer.step()
    shared = torch.arange(6.0)
    state = {
        "model": {k: v for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),  # integer keys, tuples (betas), None values
        "scores": {3: 0.5, 7: float("nan"), 9: float("-inf")},
        "members": [shared, shared, {"nested": (1, "two", None, True)}],
        "rounds": 4,
    }
    serialize.save(tmp_path / "s.safetensors", state, {"round": 4})
    back, meta = serialize.load(tmp_path / "s.safetensors")
    assert meta == {"round": 4}
    for k, v in state["model"].items():
        assert torch.equal(back["model"][k], v)
    assert back["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert set(back["optimizer"]["state"]) == {0, 1}
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    assert back["scores"][3] == 0.5 and math.isnan(back["scores"][7]) and back["scores"][9] == float("-inf")
    assert back["members"][2] == {"nested": (1, "two", None, True)} and back["rounds"] == 4
    assert torch.equal(back["members"][0], shared) and back["members"][0] is back["members"][1]
    with pytest.raises(serialize.StateFormatError, match="'bad'"):
        serialize.flatten({"bad": object()})


def test_state_files_from_elsewhere_are_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(os.urandom(300))
    with pytest.raises(serialize.StateFormatError, match="x.safetensors"):
        serialize.load(path)
    good = serialize.to_bytes({"a": torch.ones(3)})
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(serialize.StateFormatError, match="x.safetensors"):
        serialize.load(path)


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


# -- runs that must not report an accuracy ---------------------------------------------------------
def test_a_run_in_which_nothing_trained_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", str(demo_config_path()), "--out", str(tmp_path), "--quiet",
            "--set", "partition.name=shards",
            "--set", "partition.options={shards_per_client: 1, single_class_shards: true, shard_size: 40}",
            "--set", "federation.rounds=2", "--set", "episodes.test_episodes=5"]
    assert main(args) == 1  # a run that failed (not a usage error): exit 1
    err = capsys.readouterr().err
    assert "no client trained" in err
    folder = only_run(tmp_path)
    assert status(folder) == "failed" and not (folder / "summary.json").exists()
    assert all(row["no_training"] for row in metrics(folder))


# -- clean one-line errors for the inputs the issue lists -----------------------------------------------
BAD_SETS = [
    ("federation.rounds=[1", "federation.rounds"),
    ("model.options.hidden=big", "model.options.hidden"),
    ("partition.options.alpha=big", "partition.options.alpha"),
    ("partition.options.alpah=0.1", "partition.options.alpah"),
    ("algorithm.options.lr=-1", "algorithm.options.lr"),
    ("episodes.n_way=one", "episodes.n_way"),
]


@pytest.mark.parametrize("assignment,key", BAD_SETS)
def test_bad_values_are_one_line_errors_naming_the_key(assignment: str, key: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(demo_config_path()), "--out", str(tmp_path), "--quiet", "--set", assignment]) == 2
    err = capsys.readouterr().err
    assert key in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_bad_data_files_are_one_line_errors_naming_the_file(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "huffpost.json").write_text("")
    (tmp_path / "omniglot").mkdir()
    (tmp_path / "omniglot" / "images_background.npz").write_bytes(os.urandom(1000))
    for name, file in (("huffpost", "huffpost.json"), ("omniglot", "images_background.npz")):
        code = main(["run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                     "--set", f"dataset.name={name}", "--set", f"dataset.root={tmp_path}"])
        err = capsys.readouterr().err
        assert code == 2 and file in err and len(err.strip().splitlines()) == 1, err


def test_output_folder_that_is_a_file_is_found_before_training(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "taken"
    target.write_text("a file")
    started = time.perf_counter()
    assert main(["run", str(demo_config_path()), "--out", str(target), "--quiet"]) == 2
    assert "is a file" in capsys.readouterr().err and time.perf_counter() - started < 20


def test_a_bad_second_config_stops_the_batch_before_the_first_runs(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(tiny_config("fl-proto", episodes={"k_shot": 500})))
    assert main(["run", str(good), str(bad), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "k_shot" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_dataset_pickles_cannot_run_code(tmp_path: Path) -> None:
    import pickle

    from fedfew.data.dataset import DataError
    from fedfew.data.registry import load_dataset

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": Evil()}))
    with pytest.raises(DataError, match="batches.meta"):
        load_dataset("cifar10", tmp_path)
    assert not (tmp_path / "pwned").exists()


# -- client faults ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALGORITHM_SETUPS))
def test_thirty_percent_dropout_completes_and_records_who_replied(name: str, tmp_path: Path) -> None:
    config = load_config(tiny_config(name, federation={"rounds": 2, "clients_per_round": 4, "dropout": 0.3,
                                                       "stragglers": 0.25}))
    summary = run_experiment(config, tmp_path, progress=False)
    rows = metrics(Path(summary["folder"]))
    for row in rows:
        clients = row["clients"]
        if name == "frl-scratch":
            continue  # exchanges nothing in its rounds
        assert len(clients["failed"]) == 1 and len(clients["late"]) == 1  # round(0.3 * 4), round(0.25 * 4)
        assert set(clients["replied"]) == set(clients["asked"]) - set(clients["failed"]) - set(clients["late"])
    assert status(Path(summary["folder"])) == "complete"


def test_faults_are_seeded_and_aggregate_only_the_replies() -> None:
    from fedfew.engine.base import Faults

    faults = Faults(dropout=0.3, stragglers=0.2)
    first = faults.draw(list(range(10)), seed=1, round_key="4")
    assert first == faults.draw(list(range(10)), seed=1, round_key="4")
    assert len(first[0]) == 3 and len(first[1]) == 2 and not first[0] & first[1]
    assert first != faults.draw(list(range(10)), seed=1, round_key="5")


def test_npz_magic_check_names_the_file(tmp_path: Path) -> None:
    from fedfew.data.dataset import DataError
    from fedfew.data.omniglot import _read_npz

    path = tmp_path / "images_background.npz"
    np.savez(path, images=np.zeros((2, 2, 4, 4), bool), labels=np.zeros((2, 2), np.int64))
    assert zipfile.is_zipfile(path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DataError, match="images_background.npz"):
        _read_npz(path)


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
