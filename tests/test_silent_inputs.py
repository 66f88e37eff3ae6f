"""Issue 43's inputs that ran silently, crashed or were explained wrongly: each is now one clear line
(exit 2), a failed run (exit 1, status failed), or quiet where quiet is right. Numbered as in the issue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from tiny import tiny_config

from fedfew.cli.main import demo_config_path, main
from fedfew.engine.guard import LossGuard
from fedfew.engine.round import RoundOutcome
from fedfew.interface.algorithm import ClientResult
from fedfew.run.results import below_initial_message

REPO = Path(__file__).resolve().parents[1]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unexpected" not in err, err
    return code, [line for line in err.splitlines() if line.strip() and "warning" not in line]


def write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def status(out: Path) -> dict[str, Any]:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return dict(json.loads((folder / "status.json").read_text()))


# -- 1: a config must say what it runs -----------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "# only a comment\n", "\n\n"])
def test_an_empty_config_file_is_an_error_naming_the_file(text: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    code, lines = run_cli(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and str(path) in lines[0] and "empty" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_config_without_task_dataset_or_algorithm_names_what_is_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tiny_config("fl-proto")
    del config["task"], config["algorithm"]["name"]
    path = write(tmp_path / "partial.yaml", config)
    code, lines = run_cli(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and str(path) in lines[0]
    assert "task" in lines[0] and "algorithm.name" in lines[0] and "dataset.name" not in lines[0]
    # --set may supply what the file leaves out: the command line is part of the config.
    assert run_cli(capsys, "run", str(path), "--out", str(tmp_path / "out"), "--quiet",
                   "--set", "task=fewshot", "--set", "algorithm.name=fl-proto")[0] == 0


def test_every_committed_config_names_its_task_dataset_and_algorithm() -> None:
    from fedfew.config.loading import REQUIRED_KEYS

    checked = 0
    for path in [*(REPO / "configs").rglob("*.yaml"), *(REPO / "src/fedfew/configs").glob("*.yaml"),
                 REPO / "benchmarks/peers.yaml"]:
        data = yaml.safe_load(path.read_text())
        if not {"dataset", "federation", "episodes"} & set(data):
            continue  # a table of algorithm blocks (configs/f2l/methods.yaml), not a config
        checked += 1
        for key in REQUIRED_KEYS:
            node: Any = data
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            assert node is not None, f"{path} does not set {key}"
    assert checked > 50


# -- 2: divergence that stays finite -------------------------------------------------------------------
@pytest.mark.parametrize("algorithm,options", [("fl-proto", {"lr": 1.0e8}), ("fl-maml", {"inner_lr": 1.0e8})])
def test_a_finite_explosion_fails_the_run_naming_round_and_client(
        algorithm: str, options: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tiny_config(algorithm)
    config["algorithm"]["options"].update(options)  # Adam's lr (fl-proto) and MAML's inner step, both at 1e8
    out = tmp_path / "out"
    code, lines = run_cli(capsys, "run", str(write(tmp_path / "c.yaml", config)), "--out", str(out), "--quiet")
    assert code == 1 and len(lines) == 1, lines
    assert "round 1" in lines[0] and "client" in lines[0] and "diverged" in lines[0], lines[0]
    recorded = status(out)
    assert recorded["status"] == "failed" and "max_loss" in recorded["error"]
    assert not list(out.glob("*/summary.json"))  # no accuracy is reported
    # A failed run is resumable (runtime.* may change, here the guard itself): nothing refuses it.
    (folder,) = list(out.iterdir())
    assert run_cli(capsys, "resume", str(folder), "--quiet", "--set", "runtime.divergence.max_loss=1e300",
                   "--set", "runtime.divergence.loss_factor=0")[0] in (0, 1)
    assert status(out)["status"] in ("complete", "failed")


def outcome_with_losses(losses: dict[int, float]) -> RoundOutcome:
    results = {cid: ClientResult(upload={}, metrics={"loss": loss}) for cid, loss in losses.items()}
    return RoundOutcome(server=None, results=results, bytes_down=0, bytes_up=0, asked=sorted(losses))


def test_the_loss_guard_rule_absolute_and_relative_with_patience() -> None:
    guard = LossGuard(max_loss=1e6, loss_factor=100.0, patience=3)
    assert guard.exploded(outcome_with_losses({0: 1.0, 1: 2e6}), []) is not None  # client 1 above max_loss
    assert "client 1" in str(guard.exploded(outcome_with_losses({0: 1.0, 1: 2e6}), []))
    first = {"round": 1, "train_loss": 1.5}
    high = {"round": 2, "train_loss": 400.0}
    # 400 > 100 x 1.5 but only once, then twice: not yet; the third round in a row trips it.
    assert guard.exploded(outcome_with_losses({0: 400.0}), [first]) is None
    assert guard.exploded(outcome_with_losses({0: 400.0}), [first, high]) is None
    assert guard.exploded(outcome_with_losses({0: 400.0}), [first, high, {**high, "round": 3}]) is not None
    # One calm round in between resets it.
    assert guard.exploded(outcome_with_losses({0: 400.0}), [first, high, {"round": 3, "train_loss": 2.0}]) is None
    # A near-zero first loss is no yardstick: the limit is 100 x max(first, 1).
    assert guard.exploded(outcome_with_losses({0: 50.0}), [{"round": 1, "train_loss": 0.01}] * 3) is None
    assert LossGuard(loss_factor=0).exploded(outcome_with_losses({0: 1e5}), [first] * 5) is None


def test_no_committed_study_run_would_have_tripped_the_guard() -> None:
    """Every stored cell of the committed store (each a committed config or study run) stays within the
    default rule on the rounds it recorded."""
    from fedfew.config.validation import DivergenceConfig

    rule = DivergenceConfig()
    checked = 0
    for path in (REPO / "studies/store").glob("*/*.json"):
        history = json.loads(path.read_text()).get("history") or []
        for key in {k for row in history for k in row if k.startswith("train_") and k.endswith("loss")}:
            values = [row[key] for row in history if isinstance(row.get(key), (int, float))]
            if not values:
                continue
            checked += 1
            assert max(values) < rule.max_loss, path
            limit = rule.loss_factor * max(values[0], 1.0)
            assert max(values) < limit, f"{path}: {key} reaches {max(values)} against a limit of {limit}"
    assert checked > 1000


# -- 6: evaluate checks the model file -----------------------------------------------------------------
def test_evaluate_refuses_a_model_file_of_another_architecture(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = tiny_config("fl-proto", federation={"rounds": 1})
    out = tmp_path / "out"
    assert run_cli(capsys, "run", str(write(tmp_path / "a.yaml", {**config, "name": "a"})), "--out", str(out))[0] == 0
    other = {**config, "name": "b", "model": {"name": "conv4", "options": {"hidden": 4}}}
    assert run_cli(capsys, "run", str(write(tmp_path / "b.yaml", other)), "--out", str(out))[0] == 0
    (a,) = out.glob("a-*")
    (b,) = out.glob("b-*")
    (a / "model/server.safetensors").write_bytes((b / "model/server.safetensors").read_bytes())
    code, lines = run_cli(capsys, "evaluate", str(a))
    assert code == 2 and len(lines) == 1 and "server.safetensors" in lines[0] and "(4,)" in lines[0], lines


# -- 7: a closed pipe ----------------------------------------------------------------------------------
def test_a_closed_stdout_pipe_exits_quietly() -> None:
    process = subprocess.Popen([sys.executable, "-m", "fedfew.cli.main", "list"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None and process.stderr is not None
    process.stdout.readline()
    process.stdout.close()  # `| head -1`
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0 and err == "", err


# -- 8: bounds on what sizes a run before its first round ----------------------------------------------
@pytest.mark.parametrize("assignment,key", [("federation.rounds=99999999999999999999999", "federation.rounds"),
                                            ("federation.rounds=100000000", "federation.rounds"),
                                            ("partition.num_clients=100000000", "partition.num_clients"),
                                            ("episodes.test_episodes=1000000000", "episodes.test_episodes")])
def test_huge_counts_are_refused_at_once(assignment: str, key: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run_cli(capsys, "run", str(demo_config_path()), "--out", str(tmp_path), "--set", assignment)
    assert code == 2 and len(lines) == 1 and key in lines[0] and "1000000" in lines[0], lines


# -- 9: a text file where an .npz should be ------------------------------------------------------------
def test_a_text_file_named_npz_is_called_text_not_python_objects(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data.npz").write_text("x,y\n1,2\n")
    config = {**tiny_config("fl-proto"), "dataset": {"name": "arrays", "options": {"path": str(tmp_path / "data.npz")}}}
    code, lines = run_cli(capsys, "run", str(write(tmp_path / "c.yaml", config)), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and "not a numpy file" in lines[0] and "Python objects" not in lines[0]
    import pickle

    (tmp_path / "data.npz").write_bytes(pickle.dumps({"x": 1}))
    code, lines = run_cli(capsys, "run", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"))
    assert code == 2 and "pickled Python objects" in lines[0]


# -- 10: a plugin folder -------------------------------------------------------------------------------
def test_a_plugin_folder_is_called_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine.py").write_text("x = 1\n")
    code, lines = run_cli(capsys, "list", "--plugin", str(tmp_path))
    assert code == 2 and len(lines) == 1 and "is a folder" in lines[0] and "mine.py" in lines[0]
    assert "no such file" not in lines[0]


# -- 11: which config of a batch -----------------------------------------------------------------------
def test_a_bad_second_config_of_a_batch_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path / "good.yaml", tiny_config("fl-proto"))
    bad = write(tmp_path / "bad.yaml", tiny_config("fl-proto", federation={"rounds": -1}))
    code, lines = run_cli(capsys, "run", str(good), str(bad), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and str(bad) in lines[0] and "federation.rounds" in lines[0]
    assert str(good) not in lines[0]


# -- 13: model-build errors name the model, not the algorithm; a resume leaves no half-written file ----
@pytest.mark.parametrize("hidden", [0, -5])
def test_a_model_that_cannot_be_built_names_model_options_and_the_inputs(
        hidden: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tiny_config("fl-proto", model={"name": "conv4", "options": {"hidden": hidden}})
    code, lines = run_cli(capsys, "run", str(write(tmp_path / "c.yaml", config)), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and "model.options" in lines[0] and "(1, 8, 8)" in lines[0]
    assert "algorithm.name" not in lines[0]


def test_one_dimensional_data_names_the_data_shape_not_the_algorithm(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "flat.npz", x=np.linspace(0, 1, 300, dtype=np.float32), y=np.repeat(np.arange(30), 10))
    config = {**tiny_config("fl-proto"), "dataset": {"name": "arrays", "options": {
        "path": str(tmp_path / "flat.npz"), "class_split": {"base": 0.6, "val": 0.2, "novel": 0.2, "seed": 0}}},
        "splits": {"train": "base", "val": "val", "test": "novel"}}
    code, lines = run_cli(capsys, "run", str(write(tmp_path / "c.yaml", config)), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and "(1,)" in lines[0] and "algorithm.name" not in lines[0], lines


def test_resume_removes_the_half_written_files_an_interrupted_write_left(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    config = write(tmp_path / "c.yaml", tiny_config("fl-proto"))
    assert run_cli(capsys, "run", str(config), "--out", str(out), "--quiet")[0] == 0
    (folder,) = list(out.iterdir())
    # What a write-up killed between write and rename leaves, as status "interrupted".
    (folder / f".summary.json.tmp-{os.getpid() + 1}").write_text("{")
    (folder / "checkpoint" / ".run.json.tmp-99999").write_text("{")
    data = json.loads((folder / "status.json").read_text())
    (folder / "status.json").write_text(json.dumps({**data, "status": "interrupted"}))
    assert run_cli(capsys, "resume", str(folder), "--quiet")[0] == 0
    assert not list(folder.rglob(".*.tmp-*"))


# -- 21: a warning whose two numbers print the same ----------------------------------------------------
def test_below_the_initial_model_shows_the_two_scores_apart() -> None:
    summary = {"name": "x", "initial_score": {"split": "test", "accuracy": 0.49170}, "final_score": 0.491667,
               "selected_round": 3}
    text = below_initial_message(summary)
    assert "49.167%" in text and "49.170%" in text, text
    summary = {**summary, "final_score": 0.40}
    assert "40.00%" in below_initial_message(summary) and "49.17%" in below_initial_message(summary)


# -- 3: resume with another version --------------------------------------------------------------------
def test_resume_refuses_a_run_of_another_version_unless_allowed_and_the_summary_records_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.core.codeversion import numbers_version, package_version

    out = tmp_path / "out"
    config = write(tmp_path / "c.yaml", tiny_config("fl-proto"))
    assert run_cli(capsys, "run", str(config), "--out", str(out), "--quiet")[0] == 0
    (folder,) = list(out.iterdir())
    written = json.loads((folder / "status.json").read_text())
    assert written["fedfew"] == package_version() and written["code"] == numbers_version()
    (folder / "status.json").write_text(json.dumps({**written, "status": "interrupted", "fedfew": "0.0.1"}))
    code, lines = run_cli(capsys, "resume", str(folder), "--quiet")
    assert code == 2 and len(lines) == 1 and "fedfew 0.0.1" in lines[0] and "--allow-other-version" in lines[0]
    assert json.loads((folder / "status.json").read_text())["fedfew"] == "0.0.1"  # the stamp is untouched
    # The same package with other number code is refused too.
    (folder / "status.json").write_text(json.dumps({**written, "status": "interrupted", "code": "000000000000"}))
    code, lines = run_cli(capsys, "resume", str(folder), "--quiet")
    assert code == 2 and "number code 000000000000" in lines[0]
    assert run_cli(capsys, "resume", str(folder), "--quiet", "--allow-other-version")[0] == 0
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["other_version"]["written_by"]["code"] == "000000000000"
    assert summary["other_version"]["resumed_by"] == {"fedfew": package_version(), "code": numbers_version()}


def test_fedfew_list_privacy_says_which_algorithms_dp_covers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "privacy"]) == 0
    out = capsys.readouterr().out
    assert "central-dp" in out and "local-dp" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "covered" in lines["fl-proto"] and lines["local"].split()[1] == "refused:"
    assert "depends on its options" in lines["frl"] and "our extension" in lines["frl"]
    assert lines["fml"].split()[1] == "covered:" and "depends on its options" in lines["f2l"]
    assert "depends on its options" in lines["fedavg"]
