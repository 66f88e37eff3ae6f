"""The live run folder: written from the first second of a run, checkpointed as it goes, and never
mistaken for a finished run.

::

    RUN/config.yaml           the resolved config (written before any work)
    RUN/data.json             the data: source and size, class split, per-client class counts
    RUN/status.json           {"status": running | interrupted | failed | complete, "round": k, ...}
    RUN/metrics.jsonl         one line per finished round, appended and flushed as it ends
    RUN/checkpoint/run.json   the commit point of the latest checkpoint (history, bytes, selection)
    RUN/checkpoint/*.safetensors   the server state (and the best round's) it names
    RUN/states/               clients' private states, one file per client and version
    RUN/model/                the selected round's trained model(s) (complete runs)
    RUN/summary.json, results.md, accuracy.png      (complete runs only)

The checkpoints and the model, each file with its SHA-256, are :mod:`fedfew.run.checkpoints`'s
(:class:`~fedfew.run.checkpoints.CheckpointFiles`, which :class:`RunFolder` extends). ``status.json``
records the config's SHA-256 from the start and, once complete, those of summary.json and model/*. A
lock on ``RUN/.lock`` (released by the OS when the process dies, even by kill -9) tells a live run from
a dead one.

The folder owns its status: :meth:`RunFolder.begin` and :meth:`RunFolder.resuming` mark a run running,
and a run trains inside :meth:`RunFolder.lifecycle`, which records each round, checkpoints it when due
and, on the way out, leaves the status the way out calls for (complete, interrupted or failed): :mod:`fedfew.run.lifecycle`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedfew.config.validation import ConfigError, ExperimentConfig, dump_config
from fedfew.core.codeversion import numbers_version, package_version
from fedfew.interface import serialize
from fedfew.run.checkpoints import PENDING_MODEL, CheckpointFiles
from fedfew.run.folder_errors import DataChangedError, RunCrashedError, RunFolderError
from fedfew.run.json_files import strict_json
from fedfew.run.lifecycle import RunLife, interrupts_deferred

__all__ = ["COMPLETE_ONLY", "PENDING_MODEL", "PENDING_RESULTS", "STATUSES", "DataChangedError", "RunCrashedError",
           "RunFolder", "RunFolderError", "RunLife", "check_output_base", "interrupts_deferred", "new_run_path",
           "strict_json"]

STATUSES = ("running", "interrupted", "failed", "complete")
#: Written only when a run is complete (removed from a run that is not: a resumed or interrupted one).
COMPLETE_ONLY = ("summary.json", "results.md", "accuracy.png")
#: What status.json records only for a complete run (removed when the run is resumed or fails).
COMPLETE_ONLY_STATUS = ("summary_sha256", "model_sha256")
#: results.md and accuracy.png while they are written: renamed after summary.json.
PENDING_RESULTS = {"results.md": ".results.md.pending", "accuracy.png": ".accuracy.pending.png"}
#: Bytes kept aside in RUN/.reserve while a run holds its folder: freed on a full disk so that the
#: failed status and error.log can still be written.
RESERVE_BYTES = 64 * 1024
#: Lock descriptors this process holds: a forked child (a worker) closes its copies at once, so a
#: worker that outlived its parent could never keep the folder locked.
_HELD_LOCKS: set[int] = set()


def _close_inherited_locks() -> None:
    for fd in _HELD_LOCKS:
        try:
            os.close(fd)  # flock belongs to the open file: the parent's lock stays
        except OSError:
            pass
    _HELD_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_locks)


def new_run_path(base: str | Path, name: str) -> Path:
    """A new folder ``base/<name>-<YYYYmmdd-HHMMSS>[-k]`` (created)."""
    base = Path(base)
    check_output_base(base)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
    k = 1
    while True:
        folder = base / (f"{slug}-{stamp}" if k == 1 else f"{slug}-{stamp}-{k}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            k += 1


def check_output_base(base: Path, option: str = "--out or runtime.output_dir") -> None:
    """The output folder must be a writable folder, or creatable: checked before any work, by making
    (and removing) a folder in the nearest one that exists, since permissions alone do not tell (root
    may write almost anywhere, yet not in /proc)."""
    probe = base
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"output folder {base}: {probe} is a file, not a folder (set {option})")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"output folder {base}: {probe} is not writable (set {option})")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fedfew-probe-", dir=probe))
    except OSError as err:
        raise ConfigError(f"output folder {base}: cannot create folders in {probe} ({err.strerror or err}; set "
                          f"{option})") from None


class RunFolder(CheckpointFiles):
    """One run's folder (the layout above): its lock, its status and its lifecycle, the config and the
    metrics it writes, and (from :class:`~fedfew.run.checkpoints.CheckpointFiles`) its checkpoints and
    trained model."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None
        self._digests = {}

    # -- lock and status --------------------------------------------------------------------------
    def lock(self, orphans_grace: float = 10.0) -> None:
        """Hold the folder's lock for the life of this process; an error if a live run holds it. A
        lock whose owner (the pid in status.json) is dead can only be held by processes it started
        (worker processes die with it): it is waited for, up to ``orphans_grace`` seconds, and never
        taken while any process of that run is alive."""
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + orphans_grace
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                owner = self.read_status().get("pid")
                if isinstance(owner, int) and _alive(owner):
                    os.close(fd)
                    raise RunFolderError(f"run folder {self.path} is in use by a live run (pid {owner})") from None
                if time.monotonic() > deadline:
                    os.close(fd)
                    holders = _processes_holding(self.path / ".lock")
                    raise RunFolderError(
                        f"run folder {self.path} is locked by processes of a run whose main process (pid {owner}) is "
                        f"gone: {', '.join(map(str, holders)) or 'unknown pids'}; stop them (kill PID) and resume"
                    ) from None
                time.sleep(0.1)
        self._lock_fd = fd
        _HELD_LOCKS.add(fd)
        self._keep_reserve()

    def unlock(self) -> None:
        if self._lock_fd is not None:
            self.release_reserve()
            _HELD_LOCKS.discard(self._lock_fd)
            os.close(self._lock_fd)
            self._lock_fd = None

    @contextlib.contextmanager
    def held(self) -> Iterator[RunFolder]:
        """The folder locked (:meth:`lock`) for the ``with`` block, released after it."""
        self.lock()
        try:
            yield self
        finally:
            self.unlock()

    def _keep_reserve(self) -> None:
        reserve = self.path / ".reserve"
        try:
            if not reserve.is_file() or reserve.stat().st_size < RESERVE_BYTES:
                with open(reserve, "wb") as f:
                    f.write(bytes(RESERVE_BYTES))
        except OSError:  # the disk is full already: the run will say so when it writes
            reserve.unlink(missing_ok=True)

    def release_reserve(self) -> None:
        """Free the space kept aside (a full disk: room for the failed status and error.log)."""
        try:
            (self.path / ".reserve").unlink(missing_ok=True)
        except OSError:
            pass

    def discard_results(self) -> None:
        """Remove the complete-only files and the saved model that a cut-short write-up (an
        interrupt, kill -9, a full disk) may have left: they must never describe an unfinished run."""
        for name in (*COMPLETE_ONLY, *PENDING_RESULTS.values()):
            (self.path / name).unlink(missing_ok=True)
        for model in (self.model_dir, self.path / PENDING_MODEL):
            if model.is_dir():
                shutil.rmtree(model, ignore_errors=True)

    def remove_temporaries(self) -> list[Path]:
        """Delete the half-written ``.NAME.tmp-PID`` files (:func:`serialize.atomic_write_bytes`) that a
        process killed mid-write left anywhere in the folder; call only while holding the folder, when
        no other writer can be at work. Returns what was removed."""
        stale = sorted(p for p in self.path.rglob(".*.tmp-*") if p.is_file())
        for path in stale:
            path.unlink(missing_ok=True)
        return stale

    def set_status(self, status: str, **info: object) -> None:
        assert status in STATUSES
        record = {**self.read_status(), **info, "status": status, "pid": os.getpid(), "host": socket.gethostname(),
                  "updated": time.strftime("%Y-%m-%dT%H:%M:%S"), "fedfew": package_version(), "code": numbers_version()}
        if status != "failed":
            record.pop("error", None)
        if status != "complete":
            for key in COMPLETE_ONLY_STATUS:
                if key not in info:
                    record.pop(key, None)
        serialize.atomic_write_text(self.path / "status.json", json.dumps(record, indent=2) + "\n")

    def read_status(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / "status.json").read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    # -- the run's life ---------------------------------------------------------------------------
    def begin(self, **record: object) -> None:
        """A new run: status running at round 0, with ``record`` (its rounds, name, engine, config digest)."""
        self.set_status("running", round=0, **record)

    def resuming(self) -> None:
        """A run taken up again: status running, ``resumed`` from the round it had recorded."""
        self.set_status("running", resumed=self.read_status().get("round", 0))

    def note_status(self, **info: object) -> None:
        """Add ``info`` to status.json, the status as it was (interrupted where it names none)."""
        self.set_status(self.read_status().get("status") or "interrupted", **info)

    def lifecycle(self, rounds: int, checkpoint_every: int = 0) -> RunLife:
        """The run of ``rounds`` rounds in this folder (held: :meth:`lock`), from the experiment's
        building to its results, as a context manager: ``with folder.lifecycle(rounds, every) as run:``.
        The :class:`RunLife` it yields is told what the run is doing, and the status the run leaves
        follows from it. Leaving the block by

        - Ctrl-C or SIGTERM (KeyboardInterrupt): interrupted, raised as :class:`RunInterrupted`. Before
          the rounds start, at the round the status recorded (the checkpoint on disk stands); once they
          have, at the last finished round, which is checkpointed first if it was not yet (with
          ``checkpoint_every``), and any cut-short results are removed;
        - :class:`DataChangedError` while the run is set up: interrupted at the recorded round (the run
          stands as it was, resumable on its data);
        - :class:`DivergedError` or :class:`NothingTrainedError` in the rounds: failed with its message
          (a diverged round is appended to metrics.jsonl for the record);
        - another fedfew error: failed with its message (in the rounds, its traceback in error.log); in
          the write-up, as an unexpected error;
        - an unexpected error (or sys.exit): failed, raised as :class:`RunCrashedError`, which says what
          and where, with the traceback in error.log.

        Between the simulator's building (:meth:`RunLife.built`) and the first round
        (:meth:`RunLife.training`) only an interrupt changes the status; once it says complete, nothing
        does. An error leaving the block carries the folder (``run_folder``: the command line names its
        error.log), and the simulator's engine is closed after the status is written."""
        return RunLife(self, rounds, checkpoint_every)

    # -- config and metrics -----------------------------------------------------------------------
    def write_config(self, config: ExperimentConfig) -> None:
        serialize.atomic_write_text(self.path / "config.yaml", dump_config(config))

    def write_data(self, record: Mapping[str, object]) -> None:
        serialize.atomic_write_text(self.path / "data.json", json.dumps(record, indent=1) + "\n")

    def append_metrics(self, record: Mapping[str, object]) -> None:
        """One line of strict JSON (non-finite numbers as null), flushed to disk."""
        path = self.path / "metrics.jsonl"
        try:
            with open(path, "a") as f:
                f.write(strict_json(record) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:  # a full disk: the error names the file
            raise OSError(err.errno, err.strerror, str(path)) from None

    def rewrite_metrics(self, history: Sequence[Mapping[str, object]]) -> None:
        """metrics.jsonl exactly as the checkpoint's history (a resumed run drops rounds logged after
        its last checkpoint; they are run again)."""
        serialize.atomic_write_text(self.path / "metrics.jsonl", "".join(strict_json(r) + "\n" for r in history))

def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _processes_holding(path: Path) -> list[int]:
    """Pids of the processes with ``path`` open (Linux /proc; empty elsewhere)."""
    target, found = str(path.resolve()), []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if any(os.readlink(fd) == target for fd in (proc / "fd").iterdir()):
                found.append(int(proc.name))
        except OSError:
            continue
    return sorted(found)


