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

Checkpoints are safetensors + JSON (:mod:`fedfew.engine.serialize`), never pickle. Every file is
written to a temporary name and renamed; ``checkpoint/run.json`` is written last and names every
file it needs, so a run killed at any instant leaves the previous checkpoint whole. A lock on
``RUN/.lock`` (released by the OS when the process dies, even by kill -9) tells a live run from a
dead one.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from fedfew.config import ConfigError, ExperimentConfig, dump_config
from fedfew.engine import serialize
from fedfew.engine.simulator import Best, CommLog, RunState, Simulator
from fedfew.engine.store import ClientStates, Entry

STATUSES = ("running", "interrupted", "failed", "complete")


class RunFolderError(ValueError):
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


def check_output_base(base: Path) -> None:
    """The output folder must be a writable folder, or creatable: checked before any work."""
    probe = base
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"output folder {base}: {probe} is a file, not a folder (set --out or runtime.output_dir)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"output folder {base}: {probe} is not writable (set --out or runtime.output_dir)")


class RunFolder:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

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
    def lock(self) -> None:
        """Hold the folder's lock for the life of this process; an error if a live run holds it."""
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            status = self.read_status()
            raise RunFolderError(f"run folder {self.path} is in use by a live run (pid {status.get('pid')})") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def set_status(self, status: str, **info: Any) -> None:
        assert status in STATUSES
        record = {**self.read_status(), **info, "status": status, "pid": os.getpid(), "host": socket.gethostname(),
                  "updated": time.strftime("%Y-%m-%dT%H:%M:%S"), "fedfew": _version()}
        if status != "failed":
            record.pop("error", None)
        serialize.atomic_write_text(self.path / "status.json", json.dumps(record, indent=2) + "\n")

    def read_status(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / "status.json").read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    # -- config and metrics -----------------------------------------------------------------------
    def write_config(self, config: ExperimentConfig) -> None:
        serialize.atomic_write_text(self.path / "config.yaml", dump_config(config))

    def write_data(self, record: dict[str, Any]) -> None:
        serialize.atomic_write_text(self.path / "data.json", json.dumps(record, indent=1) + "\n")

    def append_metrics(self, record: dict[str, Any]) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def rewrite_metrics(self, history: list[dict[str, Any]]) -> None:
        """metrics.jsonl exactly as the checkpoint's history (a resumed run drops rounds logged after
        its last checkpoint; they are run again)."""
        serialize.atomic_write_text(self.path / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in history))

    # -- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(self, simulator: Simulator) -> None:
        """Everything needed to continue after ``simulator.state.round``: written file by file, then
        committed by ``checkpoint/run.json``; files no checkpoint names any more are removed."""
        st, store = simulator.state, simulator.states
        ck = self.checkpoint_dir
        ck.mkdir(exist_ok=True)
        server_file = f"server-r{st.round}.safetensors"
        serialize.save(ck / server_file, st.server, {"round": st.round})
        current = _write_entries(store, store.snapshot())
        best = None
        if st.best is not None:
            best_file = f"best-server-r{st.best.round}.safetensors"
            if not (ck / best_file).exists():
                serialize.save(ck / best_file, st.best.server, {"round": st.best.round})
            best = {"accuracy": st.best.accuracy, "round": st.best.round, "server": best_file,
                    "states": _write_entries(store, st.best.states)}
        manifest = {"format": "fedfew-checkpoint/1", "round": st.round, "server": server_file,
                    "states": current, "best": best, "history": st.history,
                    "comm": {"down": st.comm.down, "up": st.comm.up}, "last_test": st.last_test,
                    "seconds": st.seconds, "initial": st.initial}
        serialize.atomic_write_text(ck / "run.json", json.dumps(manifest) + "\n")
        self._collect_garbage(manifest, store)

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

    # -- the finished run -------------------------------------------------------------------------
    def save_model(self, simulator: Simulator, selected_round: int) -> None:
        """The selected round's server state and every client's private state (the trained model(s))."""
        meta = {"round": selected_round, "algorithm": simulator.algorithm.name}
        serialize.save(self.model_dir / "server.safetensors", simulator.best_server, meta)
        if getattr(simulator.states, "remote", False):  # private models stay on the clients (Flower)
            return
        for cid, state in simulator.best_client_states.items():
            if state is not None:
                serialize.save(self.model_dir / "clients" / f"client-{cid}.safetensors", state,
                               {**meta, "client": cid})

    def load_model(self) -> tuple[Any, dict[int, Any], dict[str, Any]]:
        """(server state, {client: state}, meta) saved by :meth:`save_model`."""
        if not (self.model_dir / "server.safetensors").is_file():
            raise RunFolderError(f"{self.path} holds no trained model (is the run complete? `fedfew resume` it first)")
        server, meta = serialize.load(self.model_dir / "server.safetensors")
        clients: dict[int, Any] = {}
        for path in sorted((self.model_dir / "clients").glob("client-*.safetensors")):
            state, client_meta = serialize.load(path)
            clients[int(client_meta["client"])] = state
        return server, clients, meta


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedfew")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _write_entries(store: ClientStates, entries: dict[int, Entry]) -> dict[str, dict[str, Any]]:
    out = {}
    for cid, entry in sorted(entries.items()):
        name = entry.file
        if name is None and entry.state is not None:
            name = store.write_file(cid, entry.version, entry.state)
        out[str(cid)] = {"version": entry.version, "file": name}
    return out


def _read_entries(data: dict[str, dict[str, Any]]) -> dict[int, Entry]:
    return {int(cid): Entry(e["version"], None, e["file"]) for cid, e in data.items()}
