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

Checkpoints are safetensors + JSON (:mod:`fedfew.interface.serialize`), never pickle. Every file is
written to a temporary name and renamed; ``checkpoint/run.json`` is written last and names every
file it needs with its SHA-256, so a run killed at any instant leaves the previous checkpoint whole,
and a resume refuses a file changed since (:mod:`fedfew.core.integrity`). ``status.json`` records the
config's SHA-256 from the start and, once complete, those of summary.json and model/*. A lock on
``RUN/.lock`` (released by the OS when the process dies, even by kill -9) tells a live run from a
dead one.

The folder owns its status: :meth:`RunFolder.begin` and :meth:`RunFolder.resuming` mark a run running,
and a run trains inside :meth:`RunFolder.lifecycle`, which records each round, checkpoints it when due
and, on the way out, leaves the status the way out calls for (complete, interrupted or failed).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedfew.config.validation import ConfigError, ExperimentConfig, dump_config
from fedfew.core.codeversion import numbers_version, package_version
from fedfew.core.errors import FedfewError, RunFailedError, RunInterrupted, UsageError
from fedfew.core.integrity import note_not_recorded, sha256_bytes, sha256_file, verify_files
from fedfew.engine.guard import DivergedError
from fedfew.engine.round import CommLog
from fedfew.engine.simulator import Best, NothingTrainedError, RunState, Simulator
from fedfew.interface import serialize
from fedfew.interface.algorithm import State
from fedfew.interface.state_store import ClientStates, Entry

STATUSES = ("running", "interrupted", "failed", "complete")
#: Written only when a run is complete (removed from a run that is not: a resumed or interrupted one).
COMPLETE_ONLY = ("summary.json", "results.md", "accuracy.png")
#: What status.json records only for a complete run (removed when the run is resumed or fails).
COMPLETE_ONLY_STATUS = ("summary_sha256", "model_sha256")
#: The model of a run being written up: renamed to model/ after summary.json (a run cut short leaves
#: no model/ that looks finished).
PENDING_MODEL = ".model-pending"
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


def strict_json(obj: object, indent: int | None = None) -> str:
    """JSON that any parser reads: a non-finite float (NaN, inf) becomes null, never bare NaN."""
    return json.dumps(_finite_or_none(obj), allow_nan=False, indent=indent)


def _finite_or_none(obj: object) -> object:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    return obj


class RunFolderError(UsageError):
    """A run folder cannot be used as asked (missing, locked, corrupt, complete); names the folder."""


class DataChangedError(UsageError):
    """The data a run recorded is not the data there now (a resume would train on other data)."""


class RunCrashedError(RunFailedError):
    """The run stopped on an unexpected error (a bug, a plugin's exception or sys.exit, a full disk);
    the message says what and where, the traceback is in RUN/error.log."""


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C while a checkpoint is written (a half-written checkpoint is harmless, but a
    status saying 'interrupted' must follow a whole one); the interrupt is raised right after."""
    pending: list[int] = []
    deferred = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.getsignal(signum) for signum in deferred}
    try:
        for signum in deferred:
            signal.signal(signum, lambda signum, frame: pending.append(signum))
    except ValueError:  # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            raise KeyboardInterrupt


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


class RunFolder:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None
        #: SHA-256 of the files this process wrote or verified, by relative path: a state file is
        #: written once and never changes, so it is hashed once.
        self._digests: dict[str, str] = {}

    # -- paths ------------------------------------------------------------------------------------
    @property
    def states_dir(self) -> Path:
        return self.path / "states"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoint"

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

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

    # -- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(self, simulator: Simulator) -> None:
        """Everything needed to continue after ``simulator.state.round``: written file by file, then
        committed by ``checkpoint/run.json``; files no checkpoint names any more are removed."""
        st, store = simulator.state, simulator.states
        ck = self.checkpoint_dir
        ck.mkdir(exist_ok=True)
        server_file = f"server-r{st.round}.safetensors"
        self._save_hashed(ck / server_file, st.server, {"round": st.round})
        current = _write_entries(store, store.snapshot())
        best = None
        if st.best is not None:
            best_file = f"best-server-r{st.best.round}.safetensors"
            if not (ck / best_file).exists():
                self._save_hashed(ck / best_file, st.best.server, {"round": st.best.round})
            best = {"accuracy": st.best.accuracy, "round": st.best.round, "server": best_file,
                    "states": _write_entries(store, st.best.states)}
        manifest = {"format": "fedfew-checkpoint/1", "round": st.round, "server": server_file,
                    "states": current, "best": best, "history": st.history,
                    "comm": {"down": st.comm.down, "up": st.comm.up}, "last_test": st.last_test,
                    "seconds": st.seconds, "initial": st.initial,
                    "sha256": self._digests_of(_named_files(ck, manifest_files(server_file, current, best), store))}
        serialize.atomic_write_text(ck / "run.json", strict_json(manifest) + "\n")
        self._collect_garbage(manifest, store)

    # -- checksums ------------------------------------------------------------------------------
    def _relative(self, path: Path) -> str:
        """``path`` as a checkpoint's sha256 table names it: relative to the run folder when inside it."""
        try:
            return path.relative_to(self.path).as_posix()
        except ValueError:
            return str(path)

    def _save_hashed(self, path: Path, obj: object, meta: Mapping[str, object]) -> str:
        """``serialize.save`` that remembers the SHA-256 of the bytes written (no second read)."""
        data = serialize.to_bytes(obj, meta)
        serialize.atomic_write_bytes(path, data)
        digest = self._digests[self._relative(path)] = sha256_bytes(data)
        return digest

    def _digests_of(self, paths: list[Path]) -> dict[str, str]:
        out = {}
        for path in paths:
            key = self._relative(path)
            if key not in self._digests:
                self._digests[key] = sha256_file(path)
            out[key] = self._digests[key]
        return out

    def _collect_garbage(self, manifest: dict[str, Any], store: ClientStates) -> None:
        keep = {manifest["server"]} | ({manifest["best"]["server"]} if manifest["best"] else set())
        for path in self.checkpoint_dir.glob("*.safetensors"):
            if path.name not in keep:
                path.unlink(missing_ok=True)
        if store.folder != self.states_dir or not self.states_dir.is_dir():
            return
        live = {e["file"] for e in manifest["states"].values() if e["file"]}
        if manifest["best"]:
            live |= {e["file"] for e in manifest["best"]["states"].values() if e["file"]}
        live |= {e.file for e in store.entries.values() if e.file}
        for path in self.states_dir.glob("client-*.safetensors"):
            if path.name not in live:
                path.unlink(missing_ok=True)

    def has_checkpoint(self) -> bool:
        return (self.checkpoint_dir / "run.json").is_file()

    def load_checkpoint(self, simulator: Simulator) -> None:
        """Put ``simulator`` (built from this folder's config) where the checkpoint left the run."""
        path = self.checkpoint_dir / "run.json"
        try:
            manifest = json.loads(path.read_text())
            if manifest.get("format") != "fedfew-checkpoint/1":
                raise RunFolderError(f"{path} is not a fedfew checkpoint (format {manifest.get('format')!r})")
            self.verify_checkpoint(manifest)
            device = simulator.engine.compute.device
            server = serialize.to_device(serialize.load(self.checkpoint_dir / manifest["server"])[0], device)
            best = None
            if manifest["best"]:
                b = manifest["best"]
                best_server = serialize.to_device(serialize.load(self.checkpoint_dir / b["server"])[0], device)
                best = Best(b["accuracy"], b["round"], best_server, _read_entries(b["states"]))
            simulator.state = RunState(manifest["round"], server, manifest["history"],
                                       CommLog(manifest["comm"]["down"], manifest["comm"]["up"]), best,
                                       manifest["last_test"], manifest["seconds"], manifest.get("initial"))
            simulator.states.restore(_read_entries(manifest["states"]))
        except (OSError, json.JSONDecodeError, KeyError, TypeError, serialize.StateFormatError) as err:
            raise RunFolderError(f"checkpoint in {self.checkpoint_dir} is unreadable or incomplete: {err}") from None

    def verify_checkpoint(self, manifest: dict[str, Any]) -> None:
        """Refuse a checkpoint file whose SHA-256 is not the one run.json recorded (one written before
        checksums were recorded is used unchecked, said once)."""
        digests = manifest.get("sha256")
        if not isinstance(digests, dict):
            note_not_recorded(self.checkpoint_dir / "run.json", "the checkpoint's files")
            return
        verify_files(self.path, digests, "resume")
        self._digests.update(digests)  # verified: a later checkpoint naming the same files need not read them

    # -- the finished run -------------------------------------------------------------------------
    def save_model(self, simulator: Simulator, selected_round: int) -> dict[str, str]:
        """The selected round's server state and every client's private state (the trained model(s)),
        written under a hidden name (:data:`PENDING_MODEL`) that :meth:`publish_model` renames to model/
        once summary.json is written. Returns their SHA-256 by path under model/."""
        pending = self.path / PENDING_MODEL
        if pending.is_dir():
            shutil.rmtree(pending)
        meta = {"round": selected_round, "algorithm": simulator.algorithm.name}
        files = {"server.safetensors": serialize.to_bytes(simulator.best_server, meta)}
        privacy = simulator.privacy
        # a DP run's private (un-noised) client states are outside the guarantee: not released unless asked
        released = privacy is None or privacy.keep_private_states
        if released and not getattr(simulator.states, "remote", False):  # private models stay on the clients (Flower)
            for cid, state in simulator.best_client_states.items():
                if state is not None:
                    files[f"clients/client-{cid}.safetensors"] = serialize.to_bytes(state, {**meta, "client": cid})
        for name, data in files.items():
            serialize.atomic_write_bytes(pending / name, data)
        return {name: sha256_bytes(data) for name, data in files.items()}

    def publish_model(self) -> None:
        """The written model (:meth:`save_model`) becomes model/."""
        if self.model_dir.is_dir():
            shutil.rmtree(self.model_dir)
        os.replace(self.path / PENDING_MODEL, self.model_dir)

    def load_model(self, verify: bool = True) -> tuple[State, dict[int, State], dict[str, Any]]:
        """(server state, {client: state}, meta) saved by :meth:`save_model`; ``verify``: first check the
        files against the checksums status.json recorded (:meth:`verify_model`)."""
        if not (self.model_dir / "server.safetensors").is_file():
            raise RunFolderError(f"{self.path} holds no trained model (is the run complete? `fedfew resume` it first)")
        if verify:
            self.verify_model()
        server, meta = serialize.load(self.model_dir / "server.safetensors")
        clients: dict[int, State] = {}
        for path in sorted((self.model_dir / "clients").glob("client-*.safetensors")):
            state, client_meta = serialize.load(path)
            client = client_meta.get("client")
            if not isinstance(client, int):
                raise RunFolderError(f"{path} is not a client's model (its header names no client)")
            clients[int(client)] = state
        return server, clients, meta

    def verify_model(self) -> None:
        """Refuse model files changed since the run wrote them, or not written by it."""
        digests = self.read_status().get("model_sha256")
        if isinstance(digests, dict):
            saved = {p.relative_to(self.model_dir).as_posix() for p in self.model_dir.rglob("*.safetensors")}
            extra = sorted(saved - set(digests))
            if extra:
                raise RunFolderError(f"{self.model_dir / extra[0]} is not a file the run wrote (status.json lists "
                                     f"{len(digests)} model files): evaluate refuses it; remove it")
            verify_files(self.model_dir, digests, "evaluate")
        else:
            note_not_recorded(self.model_dir, "the model's files")


class RunLife:
    """What a run in its folder is doing (:meth:`RunFolder.lifecycle` yields it): the stage, which
    decides the status an exception leaves, the simulator and the round last checkpointed."""

    #: The stages, in order: building the experiment and its simulator; loading the checkpoint and
    #: clearing what an earlier attempt left; the rounds; writing the results; done.
    SETTING_UP = "setting up"
    PREPARING = "preparing"
    TRAINING = "training"
    WRITING_UP = "writing up"
    COMPLETE = "complete"

    def __init__(self, folder: RunFolder, rounds: int, checkpoint_every: int = 0) -> None:
        self.folder, self.rounds, self.every = folder, rounds, checkpoint_every
        self.stage = self.SETTING_UP
        self.simulator: Simulator | None = None
        #: The last round whose checkpoint is on disk (set when the rounds start).
        self.checkpointed = 0
        #: What the loop is doing after a round's training ("while checkpointing round 3 of 10"), for a
        #: failure's message; empty while a round trains.
        self.step = ""

    def built(self, simulator: Simulator) -> Simulator:
        """The run's simulator is built: from here until :meth:`training` (the checkpoint loaded, stale
        files removed) only an interrupt changes the status, and the lifecycle closes its engine."""
        self.simulator, self.stage = simulator, self.PREPARING
        return simulator

    def training(self) -> None:
        """The rounds start, from the round the simulator stands at (its checkpoint's)."""
        self.checkpointed, self.stage = self._simulator.state.round, self.TRAINING

    def round_finished(self, r: int, record: Mapping[str, object],
                       log: Callable[[int, Mapping[str, object]], None] | None = None) -> None:
        """Round ``r`` ended with ``record``: appended to metrics.jsonl, given to ``log`` (the trackers),
        checkpointed when due (every ``checkpoint_every`` rounds and the last), then the status says it."""
        self.step = f"while recording round {r} of {self.rounds}"
        self.folder.append_metrics(record)
        if log is not None:
            log(r, record)
        if self.every and (r % self.every == 0 or r == self.rounds):
            self.step = f"while checkpointing round {r} of {self.rounds}"
            with interrupts_deferred():
                self.folder.save_checkpoint(self._simulator)
                self.checkpointed = r
        self.folder.set_status("running", round=r)
        self.step = ""

    def writing_up(self) -> None:
        """Every round ran: the results are being written (any error now fails the run)."""
        self.stage = self.WRITING_UP

    def complete(self, selected_round: int, summary_sha256: str, model_sha256: dict[str, str]) -> None:
        """The results are written: status complete, with the digests of summary.json and model/."""
        self.folder.set_status("complete", round=self.rounds, selected_round=selected_round,
                               summary_sha256=summary_sha256, model_sha256=model_sha256)
        self.stage = self.COMPLETE

    def _crashed(self, err: BaseException, where: str) -> RunCrashedError:
        """Record a run that stopped on an unexpected error (status failed, the traceback in error.log,
        room made first if the disk is full) and the one-line error to raise; call while handling ``err``."""
        folder = self.folder
        folder.release_reserve()  # a full disk: the few KiB kept for this record
        if isinstance(err, SystemExit):
            message = f"the run's code called sys.exit({err.code!r}) {where}"
        elif isinstance(err, OSError) and err.filename and err.strerror:
            message = f"cannot write {err.filename}: {err.strerror} ({where})"
        else:
            text = " ".join(str(err).split())
            message = f"{type(err).__name__}{': ' + text if text else ''} ({where})"
        with contextlib.suppress(OSError):
            (folder.path / "error.log").write_text(f"{message}\n\n{traceback.format_exc()}")
        with contextlib.suppress(OSError):
            folder.set_status("failed", error=message)
        return RunCrashedError(f"run failed: {message}; see {folder.path / 'error.log'}")

    @property
    def _simulator(self) -> Simulator:
        assert self.simulator is not None, "RunLife.built(simulator) first"
        return self.simulator

    # -- the way out ------------------------------------------------------------------------------
    def __enter__(self) -> RunLife:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: object) -> None:
        try:
            if isinstance(err, KeyboardInterrupt):
                interrupted = self._interrupted()
                if interrupted is not None:
                    raise interrupted from None
            elif isinstance(err, (Exception, SystemExit)):
                crashed = self._failed(err)
                if crashed is not None:
                    raise crashed from err
            if isinstance(err, Exception):
                _name_folder(err, self.folder.path)
        except Exception as leaving:
            _name_folder(leaving, self.folder.path)
            raise
        finally:
            if self.simulator is not None:
                self.simulator.engine.close()

    def _interrupted(self) -> RunInterrupted | None:
        """Record an interrupt (status interrupted) and the error that says where the run stands; None
        once the run is complete."""
        folder = self.folder
        if self.stage in (self.SETTING_UP, self.PREPARING):  # nothing new finished: the checkpoint stands
            done = folder.read_status().get("round", 0)
            folder.set_status("interrupted", round=done)
            return RunInterrupted(folder.path, done, self.rounds, "while the run was being set up")
        if self.stage == self.COMPLETE:
            return None
        simulator = self._simulator
        if self.stage == self.WRITING_UP:
            stage = "while the results were being written"
        else:
            stage = "during the final evaluation" if simulator.state.round >= self.rounds else ""
        folder.discard_results()
        with interrupts_deferred():
            if self.every and self.checkpointed != simulator.state.round:
                folder.save_checkpoint(simulator)
            folder.set_status("interrupted", round=simulator.state.round)
        return RunInterrupted(folder.path, simulator.state.round, self.rounds, stage)

    def _failed(self, err: BaseException) -> RunCrashedError | None:
        """Record the status ``err`` leaves (see :meth:`RunFolder.lifecycle`); the error to raise in its
        place, or None to raise ``err`` itself. Call while handling ``err``."""
        folder = self.folder
        if self.stage == self.SETTING_UP:
            if isinstance(err, DataChangedError):  # refused before any work: the run stands as it was
                folder.set_status("interrupted", round=folder.read_status().get("round", 0))
                return None
            if isinstance(err, FedfewError):
                folder.set_status("failed", error=str(err))
                return None
            return self._crashed(err, "while the run was being set up")
        if self.stage == self.TRAINING:
            if isinstance(err, DivergedError):
                with contextlib.suppress(OSError):
                    folder.append_metrics(err.record)  # the diverged round, for the record (never checkpointed)
            elif isinstance(err, FedfewError) and not isinstance(err, NothingTrainedError):
                with contextlib.suppress(OSError):
                    (folder.path / "error.log").write_text(traceback.format_exc())
            if isinstance(err, FedfewError):
                folder.set_status("failed", error=str(err))
                return None
            where = self.step or f"in round {self._simulator.state.round + 1} of {self.rounds}"
            resumes = f"the last checkpoint is round {self.checkpointed}, where resume starts" if self.checkpointed \
                else "no round was checkpointed: resume starts from the beginning"
            return self._crashed(err, f"{where}; {resumes}")
        if self.stage == self.WRITING_UP:
            folder.discard_results()
            return self._crashed(err, "while the results were being written")
        return None  # preparing (the checkpoint refused, say) or complete: the status stays as it was


def _name_folder(err: Exception, path: Path) -> None:
    with contextlib.suppress(AttributeError):
        err.run_folder = path  # type: ignore[attr-defined]  # the command line names its error.log


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


def _named_files(checkpoint_dir: Path, files: tuple[list[str], list[str]], store: ClientStates) -> list[Path]:
    servers, states = files
    return [checkpoint_dir / name for name in servers] + \
        ([store.folder / name for name in states] if store.folder is not None else [])


def _write_entries(store: ClientStates, entries: dict[int, Entry]) -> dict[str, dict[str, Any]]:
    out = {}
    for cid, entry in sorted(entries.items()):
        name = entry.file
        if name is None and entry.state is not None:
            name = store.write_file(cid, entry.version, entry.state)
        out[str(cid)] = {"version": entry.version, "file": name}
    return out


def manifest_files(server_file: str, states: dict[str, dict[str, Any]],
                   best: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """(checkpoint files, state files) a checkpoint's manifest names."""
    servers = [server_file] + ([best["server"]] if best else [])
    state_files = [e["file"] for e in states.values() if e["file"]]
    if best:
        state_files += [e["file"] for e in best["states"].values() if e["file"]]
    return list(dict.fromkeys(servers)), list(dict.fromkeys(state_files))


def _read_entries(data: dict[str, dict[str, Any]]) -> dict[int, Entry]:
    return {int(cid): Entry(e["version"], None, e["file"]) for cid, e in data.items()}
