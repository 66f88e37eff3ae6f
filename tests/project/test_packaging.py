"""Packaging: the Python versions fedfew claims are those its pinned dependencies
install on. Every flwr from 1.31 (the flower extras pin 1.42) needs Python 3.11, and so do the wheels
constraints.txt pins; a claim of 3.10 let pip start an install that could not finish."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
OURS = SpecifierSet(PYPROJECT["project"]["requires-python"])
#: Python versions a claim could be about.
PYTHONS = [Version(f"3.{minor}") for minor in range(8, 16)]


def lowest(specifier: SpecifierSet) -> Version:
    return next(v for v in PYTHONS if v in specifier)


def test_requires_python_is_no_lower_than_the_pinned_flwr_needs() -> None:
    try:
        theirs = importlib.metadata.metadata("flwr")["Requires-Python"]
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("flwr (the flower extra) is not installed")
    pinned = re.search(r"flwr(?:\[[a-z]+\])?==([0-9.*]+)", " ".join(PYPROJECT["project"]["optional-dependencies"]["flower"]))
    assert pinned is not None and importlib.metadata.version("flwr") in SpecifierSet(f"=={pinned.group(1)}")
    assert lowest(OURS) >= lowest(SpecifierSet(theirs)), (OURS, theirs)


def test_requires_python_starts_at_3_11_and_tools_check_the_same_version() -> None:
    assert lowest(OURS) == Version("3.11")
    assert PYPROJECT["tool"]["mypy"]["python_version"] == "3.11"
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py311"


def test_the_readme_says_which_python_versions_are_supported() -> None:
    text = (REPO / "README.md").read_text()
    assert "Python 3.11 and later" in text
