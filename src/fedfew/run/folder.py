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
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedfew.config.validation import ConfigError, ExperimentConfig, dump_config
from fedfew.core.codeversion import numbers_version, package_version
from fedfew.core.errors import UsageError
from fedfew.core.integrity import note_not_recorded, sha256_bytes, sha256_file, verify_files
from fedfew.engine.round import CommLog
from fedfew.engine.simulator import Best, RunState, Simulator
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
            if not isinstance(client_meta.get("client"), int):
                raise RunFolderError(f"{path} is not a client's model (its header names no client)")
            clients[int(client_meta["client"])] = state
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
