"""The folder and file options of ``fedfew study`` checked before any work, as ``fedfew run --out`` is:
a ``--store`` or ``--runs`` that is a file, a ``--root`` that holds no studies, or a ``--figure`` of a
type nothing can write is one line naming the option, never an error from deep inside a command or a
report that says "not yet run" of a store it could not read."""

from __future__ import annotations

import os
from pathlib import Path

from fedfew.study.study_sections import StudyError

#: The figure types ``--figure`` and ``--curve`` write (matplotlib's, without its backends' rarer ones).
FIGURE_TYPES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")


def check_folder(path: Path, option: str, write: bool) -> None:
    """``path`` must be a folder, or (to ``write``) creatable in a writable folder."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        if not write:
            return  # a folder that does not exist yet holds nothing: the command says so itself
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        where = "" if probe == path else f" ({probe} is a file)"
        raise StudyError(f"{option} {path} is not a folder{where}: give a folder")
    if write and not os.access(probe, os.W_OK | os.X_OK):
        raise StudyError(f"{option} {path}: {probe} is not writable; give a folder you can write")


def check_store(store: Path, study: str, write: bool) -> None:
    """A ``--store`` (or the default store) and the study's folder in it."""
    check_folder(store, "--store", write)
    check_folder(store / study, f"--store's folder of study {study}:", write)


def check_root(root: Path) -> None:
    """``--root``: a folder holding ``studies/``."""
    if not root.is_dir():
        raise StudyError(f"--root {root} is not a folder: give the repository root that holds studies/")
    if not (root / "studies").is_dir() or not any((root / "studies").glob("*.yaml")):
        raise StudyError(f"--root {root} holds no study files (no studies/*.yaml): give the repository root")


def check_figure(path: str, option: str) -> None:
    """A figure's file name must say its type (matplotlib writes ``st`` as ``st.png``, or fails on ``.xyz``)."""
    suffix = Path(path).suffix.lower()
    if suffix not in FIGURE_TYPES:
        said = f"type {suffix!r}" if suffix else "no type"
        raise StudyError(f"{option} {path}: {said}; end the name with one of {', '.join(FIGURE_TYPES)}")
    check_folder(Path(path).parent if str(Path(path).parent) else Path("."), f"{option} {path}: the folder", True)
