"""Runs that never lie, part 4 (issue 53): what a run reads back is checked against what it wrote.
A changed checkpoint, model, config or data source is refused in one line naming the file (exit 2);
results.md and model/ appear only after summary.json; a folder that is not a run is not resumed.
Older folders (no checksums) still resume and evaluate: "not recorded" is never damage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fedfew.algorithms.fl_proto import FLProto
from fedfew.algorithms.local import Local
from fedfew.cli.main import main
from fedfew.config.validation import ExperimentConfig, load_config
from fedfew.run.runner import RunInterrupted, resume_run, run_experiment
from tests.tiny import tiny_config


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unexpected" not in err, err
    return code, [line for line in err.splitlines() if line.strip() and "warning" not in line]


def interrupted_run(config: ExperimentConfig, out: Path, monkeypatch: pytest.MonkeyPatch, after_round: int = 2,
                    algorithm: type = FLProto) -> Path:
    """The folder of ``config``'s run, interrupted (Ctrl-C) in the round after ``after_round``."""
    calls = {"n": 0}
    original = algorithm.client_update  # type: ignore[attr-defined]
    clients = config.federation.clients_per_round

    def client_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == after_round * clients + 1:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(algorithm, "client_update", client_update)
        with pytest.raises(RunInterrupted) as cut:
            run_experiment(config, out, progress=False)
    return Path(cut.value.folder)


def config_of(rounds: int = 4, **sections: Any) -> ExperimentConfig:
    return load_config(config_dict(rounds, **sections))


def config_dict(rounds: int = 4, **sections: Any) -> dict[str, Any]:
    return tiny_config("fl-proto", federation={"rounds": rounds, "clients_per_round": 4}, **sections)


def flip_tail(path: Path, n: int = 16) -> None:
    """Change the last ``n`` bytes of a file (tensor data in a safetensors file), keeping its size."""
    data = bytearray(path.read_bytes())
    for i in range(1, n + 1):
        data[-i] ^= 0x40
    path.write_bytes(bytes(data))


# -- 1: checkpoints and models carry a checksum ----------------------------------------------------
def test_a_changed_checkpoint_file_is_refused_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    folder = interrupted_run(config_of(), tmp_path, monkeypatch)
    server = folder / "checkpoint" / "server-r2.safetensors"
    size = server.stat().st_size
    flip_tail(server)
    assert server.stat().st_size == size
    code, lines = run_cli(capsys, "resume", str(folder))
    assert code == 2 and len(lines) == 1 and str(server) in lines[0] and "changed" in lines[0], lines


def test_a_changed_client_state_file_is_refused_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = load_config(tiny_config("local", federation={"rounds": 4, "clients_per_round": 4}))
    folder = interrupted_run(config, tmp_path, monkeypatch, algorithm=Local)
    manifest = json.loads((folder / "checkpoint" / "run.json").read_text())
    states = sorted(k for k in manifest["sha256"] if k.startswith("states/"))
    assert states, manifest["sha256"]
    flip_tail(folder / states[0])
    code, lines = run_cli(capsys, "resume", str(folder))
    assert code == 2 and len(lines) == 1 and states[0] in lines[0], lines


def test_a_changed_model_file_is_refused_by_evaluate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = run_experiment(config_of(rounds=2), tmp_path, progress=False)
    model = Path(summary["folder"]) / "model" / "server.safetensors"
    flip_tail(model)
    code, lines = run_cli(capsys, "evaluate", summary["folder"])
    assert code == 2 and len(lines) == 1 and str(model) in lines[0], lines
    assert not (Path(summary["folder"]) / "evaluations.jsonl").exists()


def test_a_model_file_the_run_did_not_write_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = run_experiment(config_of(rounds=2), tmp_path, progress=False)
    model = Path(summary["folder"]) / "model"
    (model / "clients").mkdir(exist_ok=True)
    (model / "clients" / "client-99.safetensors").write_bytes((model / "server.safetensors").read_bytes())
    code, lines = run_cli(capsys, "evaluate", summary["folder"])
    assert code == 2 and len(lines) == 1 and "client-99" in lines[0], lines


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


# -- 2: a hand-edited config is refused on resume ---------------------------------------------------
@pytest.mark.parametrize("edit", [("federation", "rounds", 9), ("algorithm", "options", {"local_steps": 3})])
def test_an_edited_config_is_refused_on_resume(edit: tuple[str, str, Any], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    folder = interrupted_run(config_of(), tmp_path, monkeypatch)
    data = yaml.safe_load((folder / "config.yaml").read_text())
    section, key, value = edit
    data[section][key] = value
    (folder / "config.yaml").write_text(yaml.safe_dump(data))
    code, lines = run_cli(capsys, "resume", str(folder))
    assert code == 2 and len(lines) == 1 and "config.yaml" in lines[0] and "changed" in lines[0], lines
    assert "runtime" in lines[0]  # what may change is said


def test_a_runtime_edit_of_the_config_is_allowed_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = interrupted_run(config_of(), tmp_path, monkeypatch)
    data = yaml.safe_load((folder / "config.yaml").read_text())
    data["runtime"]["threads"] = 2
    (folder / "config.yaml").write_text(yaml.safe_dump(data))
    resumed = resume_run(folder, progress=False)
    assert resumed["rounds"] == 4


# -- 3: the data cannot change under a run ----------------------------------------------------------
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
    code, lines = run_cli(capsys, "resume", str(folder))
    assert code == 2 and len(lines) == 1 and str(data) in lines[0] and "changed" in lines[0], lines
    save_arrays(data)  # put back: the run resumes
    assert main(["resume", str(folder)]) == 0


# -- 4: store records (tests/test_study_records.py); 5: results.md only after summary.json ------------
def test_results_and_model_appear_only_after_the_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fedfew.run.runner as runner

    seen: list[tuple[str, bool]] = []
    original = runner.plot_curves

    def plot_curves(*args: Any, **kwargs: Any) -> Any:  # the moment between results.md and summary.json on main
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


# -- 8: resume of what is not a run -----------------------------------------------------------------
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
    code, lines = run_cli(capsys, "resume", str(folder))
    assert code == 2 and len(lines) == 1 and "status.json" in lines[0], lines
    assert not (folder / "metrics.jsonl").exists() or damage != "only-config"
