"""Claims on a study's cells between ``fedfew study run`` processes that share a study: a process holds
a cell's claim while it runs the cell, and a cell another live process holds is left to that process.

A claim is a :mod:`filelock` lock on the cell folder's :data:`CLAIM_FILE`, with the holder's pid written
inside, so that the others (and ``fedfew study status``) can name it. The OS drops the lock however its
holder ends (kill -9 too), so a stopped process leaves no stale claim: the next run takes the cell over."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from fedfew.core.processes import alive

#: The file in a cell's folder whose lock a `fedfew study run` process holds while it runs the cell.
CLAIM_FILE = ".claim"
#: How long to wait for a held claim before taking it as another run's: `fedfew study status` holds a
#: claim for a moment to look, a run for its whole cell.
LOOK_AGAIN = 0.5

#: Who holds a claim: a pid, or "unknown" when the file names no live process.
Owner = int | str


def _write_pid(fd: int) -> None:
    """Put this process's pid in the claim file just locked (``fd``: filelock's descriptor)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


def _lock(path: Path, record_pid: bool) -> FileLock:
    # preserve_lock_file: the file (and the pid in it) stays where the others read it; it also refuses
    # filelock's soft fallback, a marker file that a killed holder would leave behind.
    return FileLock(path, preserve_lock_file=True, on_acquired=_write_pid if record_pid else None)


def _owner(path: Path) -> Owner:
    """The pid the claim's holder wrote into it, when that process is alive; "unknown" when the file
    names none (a holder that has not yet written it, or a look by `fedfew study status`)."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return "unknown"
    return int(text) if text.isdigit() and alive(int(text)) else "unknown"


@contextlib.contextmanager
def claim_cell(folder: Path) -> Iterator[Owner | None]:
    """Hold the cell's claim for the ``with`` block: yields None when this process holds it, or the pid
    of the live process that does (another `fedfew study run` sharing the study)."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = _lock(folder / CLAIM_FILE, record_pid=True)
    try:
        lock.acquire(timeout=LOOK_AGAIN)
    except Timeout:
        owner: Owner | None = _owner(folder / CLAIM_FILE)
    else:
        owner = None
    if owner is not None:
        yield owner
        return
    try:
        yield None
    finally:
        lock.release()


def claim_owner(folder: Path) -> Owner | None:
    """The pid of the live process holding the cell's claim (``fedfew study status``), or None. It holds
    the claim only for the moment of the look (:func:`claim_cell` waits that out) and makes no folder or
    file."""
    path = folder / CLAIM_FILE
    if not path.is_file():
        return None
    lock = _lock(path, record_pid=False)
    for wait in (0.0, LOOK_AGAIN):  # a holder that names no live process: another look, or one just begun
        try:
            lock.acquire(timeout=wait)
        except Timeout:
            owner = _owner(path)
            if owner != "unknown":
                return owner
            continue
        lock.release()
        return None
    return "unknown"
