"""The tests are laid out like the code (DEVELOPERS.md, "Tests"): every folder of tests/ that holds Python
is a package of src/fedfew at the same path (tests/engine for fedfew.engine, tests/algorithms/parts for
fedfew.algorithms.parts) or tests/project, the checks of the project as a whole; each is a package itself,
so test modules of the same name in two folders both import; and tests/ itself holds no test module, only
the shared helpers and fixtures."""

from __future__ import annotations

from pathlib import Path

import fedfew

TESTS = Path(__file__).resolve().parents[1]
SRC = Path(fedfew.__file__).resolve().parent
#: The one folder that mirrors no package: docs, README, site, packaging, architecture, notebook.
PROJECT = "project"


def python_folders() -> list[Path]:
    return sorted({p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts} - {TESTS})


def test_every_test_folder_is_a_package_of_src_fedfew_or_the_project_folder() -> None:
    stray = []
    for folder in python_folders():
        relative = folder.relative_to(TESTS)
        if relative == Path(PROJECT):
            continue
        if not (SRC / relative / "__init__.py").is_file():
            stray.append(str(relative))
    assert stray == [], f"tests/ folders that name no package of src/fedfew (nor {PROJECT!r}): {stray}"


def test_every_test_folder_is_a_package_and_the_top_holds_no_test_module() -> None:
    missing = [str(folder.relative_to(TESTS)) for folder in [TESTS, *python_folders()]
               if not (folder / "__init__.py").is_file()]
    assert missing == [], f"folders of tests/ without __init__.py: {missing}"
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == [], "a test module belongs in the folder of its unit"
