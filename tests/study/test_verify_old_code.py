"""``fedfew study verify --old-code CHECKOUT`` (fedfew.study.verify_tree): records made on another machine
verified exactly by running the older code itself here too. The "older code" is a copy of this source
tree with one hashed module edited: neutrally (another version, the same numbers) or so that episodes
draw other classes (another version, other numbers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedfew.study.store import ResultStore
from fedfew.study.verify_tree import tree_code
from tests.study.common import DIGITS_STUDY, REPO, run_cli, write_study

ONE_CELL = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [],
            "seeds": [0], "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}

#: Where an episode draws its classes (fewshot/episodes.py): a statement after it changes the code version
#: and no number; drawing from the reversed permutation changes every episode, so every number.
DRAW = "generator=generator, device=generator.device)[: self.n_way]"
NEUTRAL = (DRAW, DRAW + "\n        _older = True")
OTHER_NUMBERS = (DRAW, DRAW.replace(")[", ").flip(0)["))


def older_checkout(folder: Path, edit: tuple[str, str]) -> Path:
    """A copy of this tree's ``src/fedfew`` with ``fewshot/episodes.py`` edited (``edit``: old, new text):
    a checkout of "older" code, as `git worktree add` would make one."""
    shutil.copytree(REPO / "src" / "fedfew", folder / "src" / "fedfew",
                    ignore=shutil.ignore_patterns("__pycache__"))
    episodes = folder / "src" / "fedfew" / "fewshot" / "episodes.py"
    text = episodes.read_text()
    assert text.count(edit[0]) == 1, "the edit no longer matches fewshot/episodes.py"
    episodes.write_text(text.replace(edit[0], edit[1]))
    return folder


def stored_elsewhere(tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str) -> tuple[Path, list[str], ResultStore, dict]:
    """One cell run and stored, then relabelled as written by sources ``source`` on another machine (another
    CPU, so its accuracy is a little off, within its interval)."""
    path = write_study(tmp_path, ONE_CELL)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    (record_path,) = store.folder.glob("*.json")
    record = json.loads(record_path.read_text())
    record_path.unlink()
    test = record["metrics"]["test"]
    elsewhere = {**record, "code": {**record["code"], "source": source, "commit": "0123456789abcdef"},
                 "environment": {**record["environment"], "cpu": "Another CPU", "cpu_capability": "AVX2"},
                 "metrics": {**record["metrics"], "test": {**test, "accuracy": test["accuracy"] + 0.25 * test["ci95"]}}}
    store.put(elsewhere)
    return path, args, store, elsewhere


def test_verify_old_code_compares_exactly_on_this_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = older_checkout(tmp_path / "older", NEUTRAL)
    older = tree_code(tree)
    path, args, store, stored = stored_elsewhere(tmp_path, capsys, older.source)
    again = ["--runs", str(tmp_path / "again")]

    # a checkout of other code than the records': refused before anything runs, naming their commit
    wrong = older_checkout(tmp_path / "wrong", OTHER_NUMBERS)
    code, _, err = run_cli(["study", "verify", str(path), *args, *again, "--old-code", str(wrong)], capsys)
    assert code == 2 and f"--old-code {wrong}: its sources are" in err and "0123456789" in err
    assert store.equivalences() == []
    code, _, err = run_cli(["study", "verify", str(path), *args, "--old-code", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "no fedfew checkout there" in err

    # the records' own code, run here: the same numbers exactly, in one environment, though the record
    # (another CPU) is off by a quarter of its interval
    code, out, err = run_cli(["study", "verify", str(path), *args, *again, "--old-code", str(tree)], capsys)
    assert code == 0, err
    assert "older code here: " in err and "the same" in err
    row = next(line for line in out.splitlines() if line.startswith("| fl-proto / IID 1-shot / seed 0 |"))
    assert "| E1 → E1 | the same |" in row
    assert f"{100 * stored['metrics']['test']['accuracy']:.4f} |" in row  # the record's own value, beside
    assert f"against the older code's own runs on this machine (sources {older.source})" in out
    (equivalence,) = store.equivalences()
    assert equivalence["exact"] is True and equivalence["equal_to"]["source"] == older.source
    assert equivalence["older_code_run_here"]["source"] == older.source
    assert equivalence["older_code_run_here"]["checkout"] == str(tree)
    (cell,) = equivalence["cells"]
    assert cell["recorded"] == stored["metrics"]["test"]["accuracy"] and cell["difference"] == 0.0


def test_verify_old_code_fails_when_the_older_code_computes_other_numbers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = older_checkout(tmp_path / "older", OTHER_NUMBERS)
    path, args, store, _ = stored_elsewhere(tmp_path, capsys, tree_code(tree).source)
    code, out, err = run_cli(["study", "verify", str(path), *args, "--runs", str(tmp_path / "again"),
                              "--old-code", str(tree)], capsys)
    assert code == 1 and "DIFFERENT" in out and "1 different in the same environment" in err
    assert store.equivalences() == [] and len(store.records()) == 1  # nothing written
