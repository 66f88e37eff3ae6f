"""``fedfew study status`` (fedfew.study.status): what each run still to go is doing, and a budget's pieces
and their runs counted once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedfew.study.claims import claim_owner
from fedfew.study.store import ResultStore, current_code
from fedfew.study.study_file import load_study
from tests.study.common import DIGITS_STUDY, HOLD_CLAIM, run_cli, write_study


def test_status_says_what_each_run_still_to_go_is_doing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`fedfew study status` from the store and the run folders: a stored run counts as stored; a run
    folder that finished but has no record is "finished", one stopped part-way "interrupted at round r",
    one whose claim a live process holds "running" with that pid; a run another study's store holds is
    "copyable". The compute left is, per run, the stored runs' median time times the rounds not done."""
    from fedfew.study.status import budget_status

    study_data = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [], "seeds": [0, 1, 2, 3],
                  "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]},
                  "budgets": {**DIGITS_STUDY["budgets"],
                              "two": {"set": {"federation.rounds": 2, "eval.every": 1}, "settings": ["IID 1-shot"]}}}
    path = write_study(tmp_path, study_data)
    store_dir, runs = tmp_path / "store", tmp_path / "runs"
    args = ["--store", str(store_dir), "--runs", str(runs)]
    assert run_cli(["study", "run", str(path), "--budget", "two", *args], capsys)[0] == 0
    store = ResultStore(store_dir, "digits-check")
    by_seed = {r["seed"]: r for r in store.records()}
    folders = {}
    for seed in (1, 2, 3):  # seed 0 stays stored; the others lose their records
        record = by_seed[seed]
        (store.folder / f"{record['config_hash']}-{record['code']['source']}.json").unlink()
        [folders[seed]] = [p for p in (runs / "digits-check").iterdir() if p.name.startswith(record["config_hash"])]
    for seed, kept_rounds in ((2, 1), (3, 0)):  # stopped after round 1; stopped before round 1
        [run_folder] = [p for p in folders[seed].iterdir() if p.is_dir()]
        metrics = run_folder / "metrics.jsonl"
        lines = [line for line in metrics.read_text().splitlines() if json.loads(line)["round"] <= kept_rounds]
        metrics.write_text("\n".join(lines) + "\n")
        status_file = run_folder / "status.json"
        status_file.write_text(json.dumps({**json.loads(status_file.read_text()), "status": "interrupted"}))
    copy = write_study(tmp_path, {**study_data, "name": "digits-copy"}, "copy.yaml")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(folders[3])],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        study, root = load_study(path)
        status = budget_status(study, root, "two", store_dir, runs, current_code())
        assert (status.runs, status.stored, status.other_code) == (4, 1, 0)
        states = {p.cell.seed: (p.state, p.rounds_done, p.owner) for p in status.pending}
        assert states == {1: ("finished", 2, None), 2: ("interrupted", 1, None), 3: ("running", 0, holder.pid)}
        typical = by_seed[0]["wall_seconds"]
        assert status.seconds_left == pytest.approx(typical * (0 + 0.5 + 1))
        code, out, err = run_cli(["study", "status", str(path), str(copy), "--budget", "two", "--cells", *args], capsys)
        assert code == 0, err
        assert "digits-check @ two: 1/4 runs stored; 3 to go: " in out
        assert f"fl-proto / IID 1-shot / seed 3: running (pid {holder.pid}), round 0/2" in out
        assert "seed 2: interrupted at round 1/2" in out and "seed 1: finished, not yet stored" in out
        assert "digits-copy @ two: 0/4 runs stored; 4 to go: 1 copyable, 3 not started" in out
        assert "0 of 2 study budgets complete" in out
    finally:
        holder.kill()
        holder.wait()
    assert claim_owner(folders[3]) is None  # the status left no claim behind; the dead holder's is gone too
    code, out, _ = run_cli(["study", "status", str(path), "--budget", "nope", *args], capsys)
    assert code == 2


def test_status_counts_a_budgets_pieces_and_their_runs_once(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``cpu-iid`` is a piece of ``cpu`` (its cells are some of cpu's): the total counts one budget (the
    piece named as such) and each run to go once."""
    data = {**DIGITS_STUDY, "budgets": {**DIGITS_STUDY["budgets"], "cpu-iid": {**DIGITS_STUDY["budgets"]["cpu"],
                                                                               "settings": ["IID 1-shot"]}}}
    path = write_study(tmp_path, data)
    code, out, err = run_cli(["study", "status", str(path), "--store", str(tmp_path / "store"),
                              "--runs", str(tmp_path / "runs")], capsys)
    assert code == 0, err
    assert "digits-check @ cpu: 0/12 runs stored; 12 to go" in out and "digits-check @ cpu-iid: 0/6 runs stored" in out
    assert "0 of 1 study budgets complete (1 more is a piece of one: counted in it); 12 runs to go" in out, out
