"""Modules of one job: no module of src/fedfew is over 450 lines, except an algorithm file that reads as
its paper's algorithm box (its docstring names the paper with its year and writes the algorithm out), the
one kind of file where the length is the paper's (DEVELOPERS.md, "Style")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import fedfew

SRC = Path(fedfew.__file__).resolve().parent
MAX_LINES = 450
#: A paper's year as a citation writes it: "2020", "KDD'23".
CITED_YEAR = re.compile(r"(19|20)\d\d|'\d\d")


def maps_to_its_paper(path: Path) -> bool:
    """An algorithm module whose docstring cites its paper in the first paragraph and has an
    "Algorithm ..." block (the paper's box, written out)."""
    if path.parent.name != "algorithms":
        return False
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first_paragraph = docstring.split("\n\n")[0]
    has_box = any(line.startswith("Algorithm") for line in docstring.splitlines())
    return bool(CITED_YEAR.search(first_paragraph)) and has_box


def test_no_module_is_over_450_lines_unless_it_is_an_algorithm_mapped_to_its_paper() -> None:
    long_modules = {path.relative_to(SRC).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
                    for path in sorted(SRC.rglob("*.py"))}
    too_long = {name: lines for name, lines in long_modules.items()
                if lines > MAX_LINES and not maps_to_its_paper(SRC / name)}
    assert too_long == {}, f"modules over {MAX_LINES} lines (split them by job): {too_long}"


def test_the_exception_is_narrow(tmp_path: Path) -> None:
    """A long module outside algorithms/, or one whose docstring has no box, gets no pass."""
    boxed = '"""X (Someone et al., 2020).\n\nAlgorithm 1::\n\n    step\n"""\n'
    (tmp_path / "algorithms").mkdir()
    (tmp_path / "engine").mkdir()
    (tmp_path / "algorithms" / "boxed.py").write_text(boxed)
    (tmp_path / "algorithms" / "unboxed.py").write_text('"""X (Someone et al., 2020): a method."""\n')
    (tmp_path / "engine" / "boxed.py").write_text(boxed)
    assert maps_to_its_paper(tmp_path / "algorithms" / "boxed.py")
    assert not maps_to_its_paper(tmp_path / "algorithms" / "unboxed.py")
    assert not maps_to_its_paper(tmp_path / "engine" / "boxed.py")
