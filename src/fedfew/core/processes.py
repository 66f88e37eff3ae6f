"""Questions about the machine's processes, asked through psutil rather than by reading /proc by hand:
whether a process is alive, which processes run below one, which carry a marker in their environment,
and ending a process only while it is still the one we started.

A process we mean to end later is named by its :data:`Identity`, its pid and start time: a pid alone
may by then belong to a newer process that reused it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

import psutil

#: (pid, start time in seconds since the epoch): one process, never a later one with the same pid.
Identity = tuple[int, float]


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it exists
        return True


def _identity(process: psutil.Process) -> Identity | None:
    try:
        if process.status() == psutil.STATUS_ZOMBIE:  # ended, waiting for its parent to reap it: not running
            return None
        return process.pid, process.create_time()
    except psutil.Error:  # gone meanwhile
        return None


def descendants(pid: int) -> list[Identity]:
    """Every running process below ``pid`` (children, grandchildren, ...), whatever its session; a
    zombie (ended, not yet reaped by its parent) is not counted."""
    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [found for found in map(_identity, below) if found is not None]


def descendant_pids(pid: int) -> set[int]:
    """The pids of :func:`descendants`."""
    return {found_pid for found_pid, _ in descendants(pid)}


def marked(name: str, value: str) -> list[Identity]:
    """Processes other than this one whose environment has ``name=value`` (a marker a launcher set on
    everything it started, which children inherit whatever their parent)."""
    found = []
    for process in psutil.process_iter(["environ", "create_time"]):
        environ = process.info["environ"]  # None where it cannot be read (another user's process)
        if process.pid != os.getpid() and environ and environ.get(name) == value:
            found.append((process.pid, process.info["create_time"]))
    return found


def exists(identity: Identity) -> bool:
    """Whether that very process is still there, a zombie not yet reaped included."""
    pid, started = identity
    try:
        return bool(psutil.Process(pid).create_time() == started)
    except psutil.NoSuchProcess:
        return False


def running(identity: Identity) -> bool:
    """Whether that very process is still there and not a zombie."""
    return exists(identity) and alive(identity[0])


def terminate(identity: Identity, grace: float = 5.0) -> None:
    """End that very process if it still runs: SIGTERM, then SIGKILL after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not running(identity):
            return
        try:
            os.kill(identity[0], sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not running(identity):
                return
            time.sleep(0.05)


def end(pids: Iterable[int], grace: float = 5.0) -> None:
    """SIGTERM every one of ``pids``, then SIGKILL those still alive after ``grace`` seconds."""
    pids = set(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(pid) for pid in pids):
            time.sleep(0.1)
