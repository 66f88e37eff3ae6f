"""Studies (issue 43): a study file is as strict as a config (duplicate keys, seeds, empty lists), store
records are checked on read (a damaged one is named, left out and run again), the report's commands and
markers say what was run and how (the store, round 0 selected), and `study run` / `study status` count
what other processes did and what is really left."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fedfew.study.grid import cells
from fedfew.study.store import CodeVersion, ResultStore, make_record
from fedfew.study.study_file import load_study
from fedfew.study.study_sections import CONTROL
from tests.test_study import DIGITS_STUDY, HOLD_CLAIM, REPO, dumped, run_cli, write_study

#: The digits study cut to one row, one column and no control: one cell per seed, seconds each.
ONE_ROW = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [], "seeds": [0],
           "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}
HANDMADE = CodeVersion("0.0.0", "handmade0000", None)


def _store_args(tmp_path: Path) -> list[str]:
    return ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]


def _errors(err: str) -> list[str]:
    return [line for line in err.strip().splitlines() if not line.startswith("fedfew: warning:")]


# -- item 4: the study file is as strict as a config ----------------------------------------------------
STUDY_WITH_TWICE = """\
name: twice
config: {config}
methods:
  fl-proto: {{algorithm.name: fl-proto}}
settings:
  IID: {{partition.name: iid, partition.name: dirichlet}}
seeds: [0]
budgets:
  smoke: {{}}
  smoke: {{set: {{federation.rounds: 1}}}}
"""


def test_a_key_given_twice_anywhere_in_a_study_file_is_refused(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = REPO / "src/fedfew/configs/demo.yaml"
    for name, text, key in (
            ("nested.yaml", STUDY_WITH_TWICE.replace("  smoke: {{}}\n", ""), "'partition.name'"),
            ("top.yaml", STUDY_WITH_TWICE.replace("partition.name: dirichlet", "k_shot: 1"), "'smoke'")):
        path = tmp_path / name
        path.write_text(text.format(config=config))
        code, _, err = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store")], capsys)
        assert code == 2 and key in err and "twice" in err and str(path) in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("change, expected", [
    ({"seeds": [0, 0]}, "seeds: seed 0 is given twice"),
    ({"budgets": {"smoke": {"seeds": [1, 2, 1]}, "cpu": {}}}, "budgets.smoke.seeds: seed 1 is given twice"),
    ({"budgets": {"smoke": {"seeds": []}, "cpu": {}}}, "budgets.smoke.seeds"),
    ({"budgets": {"smoke": {"methods": []}, "cpu": {}}}, "budgets.smoke.methods"),
    ({"budgets": {"smoke": {"settings": []}, "cpu": {}}}, "budgets.smoke.settings"),
    ({"budgets": {"smoke": {"methods": ["fl-proto", "fl-proto"]}, "cpu": {}}},
     "budgets.smoke.methods: 'fl-proto' is given twice"),
    ({"settings": {}, "budgets": {"smoke": {}, "cpu": {}}}, "settings"),
    ({"methods": []}, "methods"),
    ({"tables": [{"metric": "test.x", "title": "x", "methods": []}]}, "tables.0.methods"),
])
def test_duplicate_seeds_and_empty_lists_are_refused(change: dict[str, Any], expected: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, **change})
    code, _, err = run_cli(["study", "run", str(path), *_store_args(tmp_path)], capsys)
    assert code == 2 and expected in err and str(path) in err and len(_errors(err)) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("seeds, expected", [("0,0", "--seeds '0,0'"), ("", "--seeds ''"), (" , ", "--seeds ' , '")])
def test_duplicate_or_no_seeds_on_the_command_line_are_refused(seeds: str, expected: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, ONE_ROW)
    code, _, err = run_cli(["study", "run", str(path), *_store_args(tmp_path), "--seeds", seeds], capsys)
    assert code == 2 and expected in err and len(_errors(err)) == 1, err
    assert not (tmp_path / "runs").exists()


# -- items 4 and 5: damaged store records ---------------------------------------------------------------
def test_a_damaged_record_is_named_left_out_and_run_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record whose ``metrics`` was deleted (or any required field missing or of the wrong type, or
    no JSON at all) is not a result: `study status`, `study report` and `study run` each name its path
    in a warning; the report and the status leave it out, and `study run` runs the cell again and
    overwrites the record."""
    budgets = {**ONE_ROW["budgets"], "cpu-again": {"set": {"federation.rounds": 3}}}
    path = write_study(tmp_path, {**ONE_ROW, "seeds": [0, 1], "budgets": budgets})
    args = _store_args(tmp_path)
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    files = sorted(store.folder.glob("*.json"))
    assert len(files) == 2
    for damage in ("no metrics", "seed as text", "not JSON"):
        victim = files[0]
        record = json.loads(victim.read_text())
        if damage == "no metrics":
            del record["metrics"]
            victim.write_text(json.dumps(record))
        elif damage == "seed as text":
            victim.write_text(json.dumps({**record, "seed": "zero"}))
        else:
            victim.write_text(victim.read_text()[:40])

        code, out, err = run_cli(["study", "status", str(path), *args], capsys)
        assert code == 0 and str(victim) in err and "damaged" in err, (damage, err)
        assert "digits-check @ smoke: 1/2 runs stored; 1 to go" in out, (damage, out)
        code, out, err = run_cli(["study", "status", str(path), *args[:4]], capsys)  # cpu and cpu-again
        assert code == 0 and err.count(str(victim)) == 1 and "cpu-again" in out, err  # named once, not per budget

        code, out, err = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"),
                                  "--budget", "smoke"], capsys)
        assert code == 0 and str(victim) in err and "damaged" in err and "unexpected" not in err, (damage, err)
        assert "1/2 cells in the store" in out and "(1 seed)" in out, (damage, out)

        code, out, err = run_cli(["study", "run", str(path), *args], capsys)
        assert code == 0 and str(victim) in err and "damaged" in err, (damage, err)
        assert "1 already in" in err and "1 cells run" in out, (damage, out)
        repaired = json.loads(victim.read_text())
        assert isinstance(repaired["metrics"]["test"]["accuracy"], float) and repaired["seed"] in (0, 1)
        code, out, err = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"),
                                  "--budget", "smoke"], capsys)
        assert code == 0 and "damaged" not in err and "2/2 cells in the store" in out


# -- item 12: a curve of a key no record has ------------------------------------------------------------
def _put(store_dir: Path, study_path: Path, budget: str, values: dict[tuple[str, str, int], float],
         summary: dict[str, Any] | None = None, history: bool = False,
         selected: dict[tuple[str, str, int], int] | None = None) -> None:
    """Hand-made records (test accuracy as a fraction, the selected round) for cells of ``budget``."""
    study, root = load_study(study_path)
    store = ResultStore(store_dir, study.name)
    for cell in cells(study, root, budget):
        key = (cell.method, cell.setting, cell.seed)
        if key not in values:
            continue
        rounds = cell.config.federation.rounds
        made = {"test": {"accuracy": values[key]}, "rounds": rounds,
                "selected_round": (selected or {}).get(key, rounds), **(summary or {})}
        rows = [{"round": rounds, "test_accuracy": values[key], "train_loss": 1.0}] if history and rounds else None
        store.put(make_record(study.name, budget, cell.method, cell.setting, cell.seed, cell.config_hash, dumped(cell),
                              HANDMADE, made, 60.0, rows))


def test_a_curve_of_a_key_no_record_keeps_is_one_line_naming_it(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    store = tmp_path / "store"
    _put(store, path, "smoke", {("fl-proto", "IID 1-shot", 0): 0.6, ("fl-proto", "IID 1-shot", 1): 0.7}, history=True)
    png = tmp_path / "c.png"
    code, out, err = run_cli(["study", "report", str(path), "--store", str(store), "--budget", "smoke",
                              "--curve", "nosuchkey", str(png)], capsys)
    assert code == 2 and "nosuchkey" in err and "test_accuracy, train_loss" in err and len(_errors(err)) == 1, err
    assert not png.exists()
    code, out, err = run_cli(["study", "report", str(path), "--store", str(store), "--budget", "smoke",
                              "--curve", "train_loss", str(png)], capsys)
    assert code == 0 and png.is_file(), err


# -- item 18: a trained row that selected round 0 --------------------------------------------------------
def test_a_cell_whose_runs_selected_round_0_is_marked_in_tables_and_claims(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """fl-proto's runs selected round 0 on both seeds (the untrained model scored best on validation):
    its cell is the untrained model's number, so the table marks it, a legend under the table says
    what the mark means, and the claim that uses the cell says so; FL-MAML's seed 1 alone did: "1/2"."""
    path = write_study(tmp_path, DIGITS_STUDY)
    store = tmp_path / "store"
    cell = ("IID 1-shot",)
    values = {(m, *cell, s): v for m, v in (("fl-proto", 0.6), ("fl-maml", 0.55), (CONTROL, 0.5)) for s in (0, 1)}
    values[("fl-proto", "IID 1-shot", 1)] = 0.62
    _put(store, path, "smoke", values, selected={("fl-proto", "IID 1-shot", 0): 0, ("fl-proto", "IID 1-shot", 1): 0,
                                                 ("fl-maml", "IID 1-shot", 1): 0})
    code, out, err = run_cli(["study", "report", str(path), "--store", str(store), "--budget", "smoke"], capsys)
    assert code == 0, err
    assert "| fl-proto | 61.00 [48.07, 73.19] † | 63.40 |" in out  # the interval over seeds, inside [0, 100]
    assert "| FL-MAML | 55.00 [55.00, 55.00] †1/2 | — |" in out
    assert "| (control) untrained, round 0 | 50.00 [50.00, 50.00] | — |" in out  # the control is untrained by design
    assert "† round 0 selected: the untrained model scored best on validation" in out
    claim = next(line for line in out.splitlines() if "**" in line)  # the claim's row: fl-proto > control
    assert claim.startswith("| fl-proto † > (control) untrained, round 0 | IID 1-shot |"), out


# -- item 19: the commands a report names ----------------------------------------------------------------
def test_the_report_names_the_store_it_was_made_from(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    store = tmp_path / "elsewhere"
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(store), "--budget", "smoke"], capsys)
    assert code == 0
    # not yet run, outside a repository's studies/: `study docs` does not apply; the report does
    assert f"`fedfew study run {path} --budget smoke --store {store}`" in out
    assert f"then `fedfew study report {path} --budget smoke --store {store}`" in out and "study docs" not in out
    _put(store, path, "smoke", {("fl-proto", "IID 1-shot", 0): 0.6})
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(store), "--budget", "smoke"], capsys)
    assert code == 0
    assert (f"Made by `fedfew study run {path} --budget smoke --store {store}` and "
            f"`fedfew study report {path} --budget smoke --store {store}`") in out
    # the default store (beside the study): no --store to give
    default = tmp_path / "studies" / "store"
    _put(default, path, "smoke", {("fl-proto", "IID 1-shot", 0): 0.6})
    code, out, _ = run_cli(["study", "report", str(path), "--budget", "smoke"], capsys)
    assert code == 0 and f"Made by `fedfew study run {path} --budget smoke` and" in out and "--store" not in out
    # a repository's study: its blocks come from `study docs`, whose --store the blocks name too
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "studies").mkdir()
    write_study(repo / "studies", DIGITS_STUDY, "digits.yaml")
    page = repo / "docs" / "page.md"
    page.write_text("<!-- study:digits-check begin -->\n<!-- study:digits-check end -->\n")
    assert run_cli(["study", "docs", "--root", str(repo), "--store", str(store)], capsys)[0] == 0
    assert (f"`fedfew study run studies/digits.yaml --budget cpu --store {store}`, then "
            f"`fedfew study docs --store {store}`") in page.read_text()


# -- item 23: where a study's relative paths start --------------------------------------------------------
def test_relative_paths_start_from_the_studys_root_and_the_docs_say_so(tmp_path: Path) -> None:
    """A study in a folder named ``studies`` takes its paths from the folder above (the repository);
    any other study from its own folder. Its default store is ``<root>/studies/store`` either way."""
    demo = (REPO / "src/fedfew/configs/demo.yaml").read_text()
    for folder, root in ((tmp_path / "repo" / "studies", tmp_path / "repo"), (tmp_path / "mine", tmp_path / "mine")):
        folder.mkdir(parents=True)
        (root / "configs").mkdir(exist_ok=True)
        (root / "configs" / "base.yaml").write_text(demo)
        study, found = load_study(write_study(folder, {**DIGITS_STUDY, "config": "configs/base.yaml"}))
        assert found == root and cells(study, found, "smoke")
    text = " ".join((REPO / "docs/studies.md").read_text().split())
    assert "relative to the repository root" not in text
    assert ("the folder above `studies/` for a study file in a folder named `studies`, else the study file's own "
            "folder") in text
    assert "`<root>/studies/store`" in text


# -- issue 39 item 7: workers are not part of a cell's key ---------------------------------------------
def test_workers_on_the_command_line_keep_the_cells_keys(tmp_path: Path) -> None:
    study, root = load_study(write_study(tmp_path, ONE_ROW))
    plain = [c.config_hash for c in cells(study, root, "cpu")]
    for workers in ("1", "2", "0"):
        assert [c.config_hash for c in cells(study, root, "cpu", extra=[f"runtime.workers={workers}"])] == plain
    assert [c.config_hash for c in cells(study, root, "cpu", extra=["runtime.engine=workers",
                                                                     "runtime.engine_options.workers=3"])] == plain


# -- items 13 and 20: what other processes did, and the time left ---------------------------------------
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


def test_the_time_left_is_not_extrapolated_from_the_first_cell(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The first cell of a sitting carries one-off start-up (a sentence encoder, the data cache): with no
    stored time of the method, no estimate is made from it alone; from the second cell on, the cells
    after the first give it."""
    path = write_study(tmp_path, {**ONE_ROW, "seeds": [0, 1, 2]})
    code, _, err = run_cli(["study", "run", str(path), *_store_args(tmp_path)], capsys)
    assert code == 0, err
    first = next(line for line in err.splitlines() if line.startswith("[1/3]"))
    second = next(line for line in err.splitlines() if line.startswith("[2/3]"))
    assert "left" not in first and "left" in second, err


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
