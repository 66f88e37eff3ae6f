"""``fedfew study report``'s text (fedfew.study.report): budgets side by side, the store it was made from,
and a block without a control says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.study.collect import collect
from fedfew.study.docs import render_pages
from fedfew.study.report import markdown
from fedfew.study.study_file import load_study
from fedfew.study.study_sections import CONTROL
from fedfew.study.summary import summary_line
from tests.study.common import (
    DIGITS_STUDY,
    T1,
    _put,
    angular,
    budgets_study,
    put_values,
    run_cli,
    write_study,
)


def test_a_report_over_budgets_puts_them_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hand-made store: smoke (IID 1-shot only), cpu (both settings) and x2 (fl-proto alone, no control).
    Columns: per budget its settings; then the paper's numbers once per setting. A row a budget does
    not run is n/a there; a cell of that budget not in the store is —. Each budget judges its own claims."""
    (tmp_path / "studies").mkdir()
    (tmp_path / "docs").mkdir()
    path = write_study(tmp_path / "studies", budgets_study(), "digits.yaml")
    store_dir = tmp_path / "studies" / "store"
    put_values(store_dir, path, "smoke", {("fl-proto", "IID 1-shot", 0): 0.60, ("fl-proto", "IID 1-shot", 1): 0.62,
                                          (CONTROL, "IID 1-shot", 0): 0.50, (CONTROL, "IID 1-shot", 1): 0.51})
    put_values(store_dir, path, "cpu", {("fl-proto", "IID 1-shot", 0): 0.70, ("fl-proto", "IID 1-shot", 1): 0.70})
    put_values(store_dir, path, "x2", {("fl-proto", "IID 1-shot", 0): 0.80})
    code, out, err = run_cli(["study", "report", str(path), "--store", str(store_dir), "--budgets", "smoke,cpu,x2"],
                             capsys)
    assert code == 0, err
    header = ("| method | IID 1-shot, smoke: ours | non-IID 1-shot, cpu: ours | IID 1-shot, cpu: ours | "
              "IID 1-shot, x2: ours | non-IID 1-shot: paper (Table 9 (made up for the test)) | "
              "IID 1-shot: paper (Table 9 (made up for the test)) |")
    assert header in out
    # smoke: mean 61 and Student's t(0.975, 1) on the angular scale; cpu: no spread; x2: one seed
    assert f"| fl-proto | {angular([60, 62], T1)} | — | 70.00 [70.00, 70.00] | 80.00 (1 seed) | — | 63.40 |" in out
    assert "| FL-MAML | — | — | — | n/a | — | — |" in out
    # the control is the round-0 cell, the same config at smoke and cpu: stored once, shown at both
    control = angular([50, 51], T1)
    assert f"| (control) untrained, round 0 | {control} | — | {control} | n/a | — | — |" in out
    assert "- **smoke**: 4/6 cells, seeds 0, 1, 4.0 min of runs, sources handmade0000" in out
    assert "- **cpu**: 4/12 cells, seeds 0, 1, 4.0 min of runs, sources handmade0000" in out
    assert "- **x2**: 1/2 cells, seeds 0, 1.0 min of runs, sources handmade0000: fl-proto at twice cpu" in out
    # the claim fl-proto > control: at smoke d = 10, 11, at cpu d = 20, 19 (both hold, alone in their
    # family at each budget: Holm is the raw test); x2 has no control
    assert ("| smoke | fl-proto > (control) untrained, round 0 | IID 1-shot | — | **holds** | **holds** | "
            "fl-proto − (control) untrained, round 0: 10.50 ± 6.35 (p ") in out
    assert ("| cpu | fl-proto > (control) untrained, round 0 | IID 1-shot | — | **holds** | **holds** | "
            "fl-proto − (control) untrained, round 0: 19.50 ± 6.35 (p ") in out
    assert "| x2 |" not in out

    # the same in a docs page: study:NAME@a+b+c
    page = tmp_path / "docs" / "page.md"
    page.write_text("<!-- study:digits-check@smoke+cpu+x2 begin -->\n<!-- study:digits-check@smoke+cpu+x2 end -->\n")
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    text = page.read_text()
    assert header in text and "`fedfew study report studies/digits.yaml --budgets smoke,cpu,x2`" in text
    assert render_pages(tmp_path)[page] == text
    # one summary line over both budgets' settings, each budget's cells named
    page.write_text("<!-- study:digits-check@smoke+cpu:summary begin -->\n<!-- study:digits-check@smoke+cpu:summary end -->\n")
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    line = page.read_text().splitlines()[1]
    study, _ = load_study(path)
    assert line == summary_line([collect(study, tmp_path, store_dir, b) for b in ("smoke", "cpu")],
                                "studies/digits.yaml").rstrip("\n")
    # no setting complete at either budget (smoke lacks fl-maml, cpu the control): nothing judged, each named
    assert line.endswith("(`studies/digits.yaml`, budgets smoke (4/6 cells) and cpu (4/12 cells), seeds 0, 1; "
                         "2 methods compared): no setting complete in the store yet; not yet judged (cells still "
                         "to run): IID 1-shot at smoke (2 to go), non-IID 1-shot (6 to go), IID 1-shot at cpu (2 to go).")
    for marker, expected in (("digits-check@smoke+nonesuch", "names no budget 'nonesuch'"),
                             ("digits-check@smoke+cpu:claims", "several budgets take the table and summary views only")):
        page.write_text(f"<!-- study:{marker} begin -->\n<!-- study:{marker} end -->\n")
        code, _, err = run_cli(["study", "docs", "--root", str(tmp_path)], capsys)
        assert code == 2 and expected in err and len(err.strip().splitlines()) == 1
    for argv, expected in ((["--budgets", "smoke"], "two or more distinct budgets"),
                           (["--budgets", "smoke,huge"], "budget 'huge' does not exist"),
                           (["--budgets", "smoke,cpu", "--figure", "x.png"], "prints the table over budgets only")):
        code, _, err = run_cli(["study", "report", str(path), "--store", str(store_dir), *argv], capsys)
        assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, (argv, err)


# -- the commands a report names -------------------------------------------------------------------------
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


def test_a_block_without_a_control_says_why(tmp_path: Path) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, "control": None, "claims": [],
                                  "no_control": "the rows are untrained models themselves"})
    study, root = load_study(path)
    text = markdown(collect(study, root, tmp_path / "store", "smoke"), str(path))
    assert "not yet run" in text.lower()  # nothing stored: the command line, not a table
    study.budgets["smoke"] = study.budgets["smoke"].model_copy()
    assert study.no_control_reason("smoke") == "the rows are untrained models themselves"
