"""Claims on a study's cells between processes (fedfew.study.claims): a claim names its holder and ends
with it, and a cell another process is running is left to it, not failed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedfew.study.claims import CLAIM_FILE, claim_cell, claim_owner
from fedfew.study.store import ResultStore
from tests.study.common import DIGITS_STUDY, HOLD_CLAIM, run_cli, write_study


def test_a_cell_another_process_is_running_is_left_to_it_not_failed(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Two `fedfew study run` processes sharing a study: a cell another live process has claimed (the
    flock on its cell folder's claim file, with its pid inside) is left to that process, neither run nor
    failed; once that process is gone (the OS drops its claim), the same command stores the cell."""
    study = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [], "seeds": [0, 1],
             "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}
    path = write_study(tmp_path, study)
    store_dir, runs = tmp_path / "store", tmp_path / "runs"
    args = ["--store", str(store_dir), "--runs", str(runs), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(store_dir, "digits-check")
    victim = next(r for r in store.records() if r["seed"] == 1)
    (store.folder / f"{victim['config_hash']}-{victim['code']['source']}.json").unlink()
    [cell_folder] = [p for p in (runs / "digits-check").iterdir() if p.name.startswith(victim["config_hash"])]
    holder = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(cell_folder)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        code, out, err = run_cli(["study", "run", str(path), *args], capsys)
        assert code == 0, err
        assert f"fl-proto / IID 1-shot / seed 1: running in another process (pid {holder.pid}); left to it" in err
        assert "1 cells were running in other processes" in err and "1 left to other processes" in out
        assert "failed" not in err and len(store.records()) == 1
    finally:
        holder.kill()
        holder.wait()
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0 and "[2/2]" in err and "other processes" not in err
    again = {r["config_hash"]: r["metrics"]["test"]["accuracy"] for r in store.records()}
    assert again[victim["config_hash"]] == victim["metrics"]["test"]["accuracy"]


def test_a_claim_names_its_holder_and_ends_with_it(tmp_path: Path) -> None:
    """A claim holds the holder's pid for the others to name; once released (or its holder gone) it is
    free again, whatever pid the file still names, and the next holder writes its own."""
    folder = tmp_path / "cell"
    assert claim_owner(folder) is None and not folder.exists()  # a look makes no folder
    with claim_cell(folder) as owner:
        assert owner is None and (folder / CLAIM_FILE).read_text() == str(os.getpid())
        assert claim_owner(folder) == os.getpid()  # another look (its own descriptor) finds it held
    assert claim_owner(folder) is None
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (folder / CLAIM_FILE).write_text(str(dead.pid))  # what a killed holder leaves: its pid, no lock
    with claim_cell(folder) as owner:
        assert owner is None and (folder / CLAIM_FILE).read_text() == str(os.getpid())
