"""``fedfew study run`` (fedfew.study.run): store, skip, resume and report; a cell that cannot run leaves
the others running; a run another study stored is copied; other processes' cells are counted as
theirs; every committed study runs at its smoke budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fedfew.study.docs import study_files
from fedfew.study.grid import cells
from fedfew.study.store import ResultStore, current_code, make_record, stored_elsewhere
from fedfew.study.study_file import load_study
from fedfew.study.study_sections import CONTROL
from tests.study.common import (
    DIGITS_STUDY,
    HOLD_CLAIM,
    ONE_ROW,
    REPO,
    T1,
    _store_args,
    angular,
    dumped,
    run_cli,
    write_study,
)


# -- a whole study through the command line -----------------------------------------------------------
def test_study_run_stores_skips_resumes_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    store_dir, runs = tmp_path / "store", tmp_path / "runs"
    args = ["--store", str(store_dir), "--runs", str(runs), "--budget", "smoke"]
    code, out, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0, err
    assert "[6/6]" in err and "left" in err  # progress: cells done / total and the time left
    store = ResultStore(store_dir, "digits-check")
    records = store.records()
    assert len(records) == 6  # 2 methods x 1 setting x 2 seeds + the control on 2 seeds
    assert {r["budget"] for r in records} == {"smoke"} and all(r["code"]["source"] for r in records)
    first = {r["config_hash"]: r["metrics"]["test"]["accuracy"] for r in records}
    folders = sorted(p for p in runs.rglob("status.json"))
    assert len(folders) == 6
    # each record keeps the evaluated rounds (a 1-round smoke run: round 1, its test score) and the
    # initial model's score; a control (round 0) has no rounds
    trained = [r for r in records if r["method"] != CONTROL]
    assert all([h["round"] for h in r["history"]] == [1] and "test_accuracy" in r["history"][0] for r in trained)
    assert all("clients" not in h and "bytes_down" not in h for r in trained for h in r["history"])
    assert all(r["metrics"]["initial_score"]["split"] == "test" for r in records)
    assert all("history" not in r for r in records if r["method"] == CONTROL)
    curve = tmp_path / "curve.png"
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(store_dir), "--budget", "smoke",
                            "--curve", "test_accuracy", str(curve)], capsys)
    assert code == 0 and f"curves of test_accuracy: {curve}" in out and curve.is_file()

    # again: everything is in the store, nothing runs
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0 and "6 already in" in err and len(sorted(runs.rglob("status.json"))) == 6

    # an interrupted study: a record never written, a run folder left 'interrupted' -> resumed, same numbers
    victim = next(r for r in records if r["method"] == "fl-proto")
    (store.folder / f"{victim['config_hash']}-{victim['code']['source']}.json").unlink()
    run_folder = next(p.parent for p in folders if json.loads((p.parent / "summary.json").read_text())["seed"]
                      == victim["seed"] and "fl-proto" in p.parent.name)
    status = json.loads((run_folder / "status.json").read_text())
    (run_folder / "status.json").write_text(json.dumps({**status, "status": "interrupted"}))
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0 and "5 already in" in err and "[6/6]" in err
    again = {r["config_hash"]: r["metrics"]["test"]["accuracy"] for r in store.records()}
    assert again == first

    # the report: our mean over the two seeds, the paper's number with its table, the control, the verdict
    figure = tmp_path / "bars.png"
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(store_dir), "--budget", "smoke",
                            "--figure", str(figure)], capsys)
    assert code == 0 and figure.is_file()
    proto = sorted(100 * r["metrics"]["test"]["accuracy"] for r in records if r["method"] == "fl-proto")
    mean, half = sum(proto) / 2, T1 * abs(proto[1] - proto[0]) / 2  # sd/sqrt(2) = |a - b| / 2
    assert f"| fl-proto | {angular(proto, T1)} | 63.40 |" in out
    assert "paper (Table 9 (made up for the test))" in out and "| FL-MAML |" in out
    assert "(control) untrained, round 0" in out
    assert "| fl-proto > (control) untrained, round 0 | IID 1-shot |" in out

    # a metric no stored run writes (a typo): one line naming it, not a table of "—"; one that
    # only some runs write is "—" where absent (the further tables below)
    other = write_study(tmp_path, {**DIGITS_STUDY, "metric": "test.nonesuch"}, name="other-metric.yaml")
    code, out, err = run_cli(["study", "report", str(other), "--store", str(store_dir), "--budget", "smoke"], capsys)
    assert code == 2 and "metric test.nonesuch: none of the 6 stored cells" in err and not out

    # further tables of the same cells (``tables``): another metric each, scaled as asked, "—" where absent
    tables = [{"metric": "test.accuracy", "title": "Accuracy as a fraction", "methods": ["fl-proto"]},
              {"metric": "test.nonesuch", "title": "Nothing", "scale": 100, "settings": ["IID 1-shot"]}]
    more = write_study(tmp_path, {**DIGITS_STUDY, "tables": tables}, name="more-tables.yaml")
    code, out, _ = run_cli(["study", "report", str(more), "--store", str(store_dir), "--budget", "smoke"], capsys)
    assert code == 0 and f"| fl-proto | {angular(proto, T1)} | 63.40 |" in out  # the main table as before
    assert "Accuracy as a fraction (`test.accuracy`; mean ± 95% interval over seeds):" in out
    assert f"| fl-proto | {mean / 100:.2f} ± {half / 100:.2f} |" in out 
    assert "| FL-MAML |" not in out.split("as a fraction")[1].split("Nothing")[0]  # only the rows asked for
    assert "Nothing (`test.nonesuch` x 100;" in out and "| FL-MAML | — |" in out


def test_a_cell_that_cannot_run_leaves_the_others_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An impossible partition in one method's cells (more shards than the digits hold): those cells fail
    with their one line each, the other method's cells run into the store, and the study exits 2 with
    one line; running it again retries only the failed cells."""
    study = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [], "seeds": [0],
             "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"],
                         "shards": {"algorithm.name": "fl-proto", "algorithm.options": {"local_steps": 1},
                                    "partition.name": "shards",
                                    "partition.options": {"shards_per_client": 500, "shard_size": 100}}},
             "settings": {"non-IID 1-shot": {}}, "budgets": {"smoke": {"set": {"federation.rounds": 1}}, "cpu": {}}}
    path = write_study(tmp_path, study)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and "1 of 2 cells failed (first: shards / non-IID 1-shot / seed 0: " in lines[-1]
    assert any(line.startswith("[1/2] fl-proto") or line.startswith("[2/2] fl-proto") for line in lines)
    assert any(": failed: " in line and "shards" in line for line in lines)
    assert len(ResultStore(tmp_path / "store", "digits-check").records()) == 1
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 2 and "1 already in" in err and "1 of 2 cells failed" in err


# -- every committed study at its smoke budget ---------------------------------------------------------
def _smoke_study(path: Path) -> object:
    """The study as a test parameter; one whose smoke cells read frozen sentence vectors is marked
    ``sentence_vectors``: its first run encodes every text of the dataset (HuffPost's 36,900 headlines:
    about 3.5 min on one thread, cached after), so the default suite leaves it to `make
    test-sentence-studies`, which CI runs."""
    study, root = load_study(path)
    encoders = {c.config.dataset.options.get("sentence_encoder") for c in cells(study, root, "smoke")} - {None}
    marks = [pytest.mark.sentence_vectors] if encoders else []
    return pytest.param(str(path.relative_to(REPO)), marks=marks)


@pytest.mark.parametrize("study_path", [_smoke_study(p) for p in study_files(REPO)])
def test_every_committed_study_runs_at_the_smoke_budget(study_path: str, tmp_path: Path, shared_data: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Each study's smoke budget runs end to end on the real data (skipped without ../shared/data) and
    its report holds every smoke cell; the committed store is not touched."""
    study, root = load_study(REPO / study_path)
    needed = {c.config.dataset.name for c in cells(study, root, "smoke")}
    missing = [name for name in needed if name in DATA_FOLDERS and not (shared_data / DATA_FOLDERS[name]).exists()]
    if missing:
        pytest.skip(f"{study_path}: no {', '.join(missing)} data in {shared_data}")
    monkeypatch.setenv("FEDFEW_DATA", str(shared_data))
    store = tmp_path / "store"
    code, _, err = run_cli(["study", "run", str(REPO / study_path), "--budget", "smoke", "--store", str(store),
                            "--runs", str(tmp_path / "runs")], capsys)
    assert code == 0, err
    code, out, _ = run_cli(["study", "report", str(REPO / study_path), "--budget", "smoke", "--store", str(store)],
                           capsys)
    total = len(cells(study, root, "smoke"))
    assert code == 0 and f"{total}/{total} cells in the store" in out


#: Where each dataset the studies use lives under the data folder (for a clean skip without it).
DATA_FOLDERS = {"omniglot": "omniglot", "femnist": "femnist", "mnist": "mnist", "huffpost": "text",
                "cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python", "fc100": "cifar-100-python",
                "miniimagenet": "miniimagenet", "20newsgroups": "20newsgroups", "reuters": "text"}


def test_columns_reading_other_numbers_of_the_same_runs_run_each_config_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {**DIGITS_STUDY, "settings": {"IID": {"partition.name": "iid"},
                                         "IID, its interval": {"set": {"partition.name": "iid"}, "metric": "test.ci95"}},
            "budgets": {"smoke": {"set": {"federation.rounds": 1}, "seeds": [0], "control": False, "no_control": "a test budget"}, "cpu": {}},
            "claims": [], "paper": [], "control": None, "no_control": "a test study of one row"}
    path = write_study(tmp_path, data)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0, err
    assert "4 cells (2 distinct runs)" in err
    records = ResultStore(tmp_path / "store", "digits-check").records()
    assert len(records) == 2 and len(list((tmp_path / "runs").rglob("status.json"))) == 2
    study, root = load_study(path)
    assert study.metric_of("fl-proto", "IID, its interval") == "test.ci95" and study.metric_of("fl-proto", "IID") \
        == "test.accuracy"
    from fedfew.study.collect import collect

    results = collect(study, root, tmp_path / "store", "smoke")
    by_method = {r["config"]["algorithm"]["name"]: r["metrics"]["test"] for r in records}
    assert results.values[("fl-proto", "IID")] == {0: 100 * by_method["fl-proto"]["accuracy"]}
    assert results.values[("fl-proto", "IID, its interval")] == {0: 100 * by_method["fl-proto"]["ci95"]}
    assert results.cells_found == 4 and results.wall_seconds == pytest.approx(sum(r["wall_seconds"] for r in records))


def test_a_run_another_study_stored_is_copied_not_run_again(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Two studies sharing a row (the same config and code under other labels): the second copies the
    first's record, names where it came from, and its compute counts only what it ran itself."""
    smoke = {"smoke": {"set": {"federation.rounds": 1}, "seeds": [0], "settings": ["IID 1-shot"], "control": False, "no_control": "a test budget"},
             "cpu": {}}
    first = write_study(tmp_path, {**DIGITS_STUDY, "budgets": smoke, "claims": [], "paper": [], "control": None, "no_control": "a test study of one row"},
                        name="first.yaml")
    proto = DIGITS_STUDY["methods"]["fl-proto"]
    second_data = {**DIGITS_STUDY, "name": "digits-second", "budgets": smoke, "claims": [], "paper": [], "control": None, "no_control": "a test study of one row",
                   "methods": {"the same proto": proto, "fl-maml 2 steps": {"set": {"algorithm.options.local_steps": 2}}}}
    second = write_study(tmp_path, second_data, name="second.yaml")
    store_dir, runs = tmp_path / "store", tmp_path / "runs"
    args = ["--store", str(store_dir), "--runs", str(runs), "--budget", "smoke"]
    assert run_cli(["study", "run", str(first), *args], capsys)[0] == 0
    code, out, err = run_cli(["study", "run", str(second), *args], capsys)
    assert code == 0, err
    assert "1 cells run, 0 already stored, 1 copied from other studies' stores" in out
    original = next(r for r in ResultStore(store_dir, "digits-check").records() if r["method"] == "fl-proto")
    copied = next(r for r in ResultStore(store_dir, "digits-second").records() if r["method"] == "the same proto")
    assert copied["reused_from"] == f"digits-check/{original['config_hash']}-{original['code']['source']}.json"
    assert copied["reused_from"] in err and "copied, not run again" in err
    assert copied["metrics"] == original["metrics"] and copied["study"] == "digits-second"
    assert not (runs / "digits-second" / f"{copied['config_hash']}-{copied['code']['source']}").exists()
    assert len(list((runs / "digits-second").rglob("status.json"))) == 1  # only the 2-step FL-MAML ran

    from fedfew.study.collect import collect
    from fedfew.study.report import markdown

    study, root = load_study(second)
    results = collect(study, root, store_dir, "smoke")
    ran = next(r for r in ResultStore(store_dir, "digits-second").records() if "reused_from" not in r)
    assert results.cells_found == 2 and results.reused == {"digits-check": 1}
    assert results.wall_seconds == pytest.approx(ran["wall_seconds"])
    assert results.reused_seconds == pytest.approx(original["wall_seconds"])
    assert "1 of its runs are another study's, the same config and code, copied from its store (1 from " \
           "digits-check" in markdown(results, "second.yaml")

    # --no-reuse runs every cell; a record that ran is preferred to a copy, and a copy of a copy names
    # the run that was made
    third = write_study(tmp_path, {**second_data, "name": "digits-third"}, name="third.yaml")
    code, out, err = run_cli(["study", "run", str(third), *args, "--no-reuse"], capsys)
    assert code == 0 and "2 cells run" in out and "copied" not in err
    (store_dir / "digits-check" / Path(copied["reused_from"]).name).unlink()  # digits-second's copy is first now
    found = stored_elsewhere(store_dir, "digits-fourth", copied["config_hash"], current_code())
    assert found is not None and found["reused_from"].startswith("digits-third/")
    (store_dir / "digits-third" / Path(found["reused_from"]).name).unlink()  # only the copy is left
    found = stored_elsewhere(store_dir, "digits-fourth", copied["config_hash"], current_code())
    assert found is not None and found["reused_from"] == copied["reused_from"] and found["metrics"] == original["metrics"]


def test_method_runs_only_the_named_rows_and_a_wrong_name_is_one_line(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    study = {**DIGITS_STUDY, "seeds": [0], "budgets": {"smoke": {"set": {"federation.rounds": 1}, "settings": ["IID 1-shot"]},
                                                      "cpu": {}}}
    path = write_study(tmp_path, study)
    args = ["study", "run", str(path), "--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"),
            "--budget", "smoke"]
    code, _, err = run_cli([*args, "--method", "fl-protto"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--method 'fl-protto'" in err and "did you mean 'fl-proto'?" in err
    code, _, _ = run_cli([*args, "--method", "fl-proto"], capsys)
    assert code == 0
    assert [r["method"] for r in ResultStore(tmp_path / "store", "digits-check").records()] == ["fl-proto"]
    code, _, err = run_cli(args, capsys)  # the other rows, the stored one skipped
    assert code == 0 and "1 already in" in err
    assert sorted(r["method"] for r in ResultStore(tmp_path / "store", "digits-check").records()) == \
        sorted(["fl-proto", "fl-maml", CONTROL])


# -- what other processes did, and the time left --------------------------------------------------------
def test_cells_stored_by_another_process_are_counted_as_such_and_not_in_the_time_left(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Four cells, seed 3's stored (100 s: the method's typical time). Another process holds seed 1's
    claim, and while this process runs seed 0 the other stores seeds 1 and 2. Seed 1 is listed as running
    elsewhere, seed 2 as stored by another process; at the end both are stored, so the closing line says
    they were stored by other processes (not "running"), the counts agree with the lines, and after seed 0
    no time is left for this process (the other's cells are not)."""
    import fedfew.study.cell as study_cell
    from fedfew.study.cell_paths import cell_folder
    from fedfew.study.store import current_code

    path = write_study(tmp_path, {**ONE_ROW, "seeds": [0, 1, 2, 3]})
    args = _store_args(tmp_path)
    study, root = load_study(path)
    grid = {c.seed: c for c in cells(study, root, "smoke")}
    store = ResultStore(tmp_path / "store", study.name)
    code = current_code()
    store.put(make_record(study.name, "smoke", "fl-proto", "IID 1-shot", 3, grid[3].config_hash, dumped(grid[3]), code,
                          {"test": {"accuracy": 0.5}}, 100.0))
    folder = cell_folder(tmp_path / "runs", study, grid[1], code)
    folder.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(folder)],
                              stdout=subprocess.PIPE, text=True)
    real = study_cell.run_cell

    def run_and_let_the_other_store(cell: Any, where: Path) -> Any:
        summary, run_folder = real(cell, where)
        for seed in (1, 2):  # the other process finishes its cells meanwhile
            other = grid[seed]
            store.put(make_record(study.name, "smoke", other.method, other.setting, seed, other.config_hash, dumped(other),
                                  code,
                                  summary, 1.0))
        return summary, run_folder

    monkeypatch.setattr(study_cell, "run_cell", run_and_let_the_other_store)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        status, out, err = run_cli(["study", "run", str(path), *args], capsys)
    finally:
        holder.kill()
        holder.wait()
    assert status == 0, err
    lines = err.strip().splitlines()
    # at the start: seeds 0 and 2 at the stored 100 s each; seed 1 is the other process's
    assert "3 runs to go (1 running in another process), about 3 min in one process" in err
    first = next(line for line in lines if line.startswith("[2/4]"))
    assert "left" not in first, first  # the other two are not this process's to run
    assert f"[3/4] fl-proto / IID 1-shot / seed 1: running in another process (pid {holder.pid}); left to it" in err
    assert "[4/4] fl-proto / IID 1-shot / seed 2: stored by another process meanwhile" in err
    assert "2 cells were stored by other processes" in err and "running in other processes" not in err
    assert "1 cells run, 1 already stored, 2 stored by other processes" in out and "left to other" not in out
