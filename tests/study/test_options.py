"""The folder and file options of ``fedfew study`` (fedfew.study.options): a --store or --runs that is a
file, a --root without studies and a --figure of no type matplotlib writes are one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.common import one_line
from tests.study.common import DIGITS_STUDY, put, write_study


# -- internal errors become one line --------------------------------------------------------------------
@pytest.mark.parametrize("which", ["--store", "--store/study", "--runs"])
def test_study_run_with_a_file_for_a_folder_is_one_line(which: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    store, runs = tmp_path / "store", tmp_path / "runs"
    target = {"--store": store, "--store/study": store / "digits-check", "--runs": runs}[which]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("a file")
    line = one_line(capsys, "study", "run", str(path), "--store", str(store), "--runs", str(runs), "--budget", "smoke")
    assert str(target) in line and which.split("/")[0] in line, line


@pytest.mark.parametrize("figure", ["x.xyz", "st"])
def test_a_figure_of_no_type_matplotlib_writes_is_one_line(figure: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    put(tmp_path / "store", path)
    line = one_line(capsys, "study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke",
                    "--figure", str(tmp_path / figure))
    assert "--figure" in line and figure in line, line
    assert not list(tmp_path.glob("st*.png"))


@pytest.mark.parametrize("command", ["report", "status"])
def test_a_store_that_is_a_file_is_one_line_not_not_yet_run(command: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    (tmp_path / "store").write_text("a file")
    line = one_line(capsys, "study", command, str(path), "--store", str(tmp_path / "store"))
    assert "--store" in line and str(tmp_path / "store") in line, line


@pytest.mark.parametrize("make", ["missing", "empty", "file"])
def test_study_docs_and_status_of_a_root_without_studies_are_one_line(make: str, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    if make == "empty":
        root.mkdir()
    elif make == "file":
        root.write_text("x")
    for command in ("docs", "status"):
        line = one_line(capsys, "study", command, "--root", str(root))
        assert "--root" in line and str(root) in line, line
