"""What a run folder saves of a run's states: the checkpoint it resumes from (``checkpoint/``, with
the clients' private states under ``states/``) and the trained model it ends with (``model/``), each
file with its SHA-256.

Checkpoints are safetensors + JSON (:mod:`fedfew.interface.serialize`), never pickle. Every file is
written to a temporary name and renamed; ``checkpoint/run.json`` is written last and names every file
it needs with its SHA-256, so a run killed at any instant leaves the previous checkpoint whole, and a
resume refuses a file changed since (:mod:`fedfew.core.integrity`). :class:`CheckpointFiles` is the part
of :class:`fedfew.run.folder.RunFolder` that does this; the folder gives it its paths and status.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedfew.core.integrity import note_not_recorded, sha256_bytes, sha256_file, verify_files
from fedfew.engine.round import CommLog
from fedfew.engine.simulator import Best, RunState, Simulator
from fedfew.interface import serialize
from fedfew.interface.algorithm import State
from fedfew.interface.state_store import ClientStates, Entry
from fedfew.run.folder_errors import RunFolderError
from fedfew.run.json_files import strict_json

#: The model of a run being written up: renamed to model/ after summary.json (a run cut short leaves
#: no model/ that looks finished).
PENDING_MODEL = ".model-pending"


class CheckpointFiles:
    """Checkpoints and the trained model of the run folder at :attr:`path` (the folder's part that
    saves states; :class:`fedfew.run.folder.RunFolder` extends it)."""

    path: Path
    #: SHA-256 of the files this process wrote or verified, by relative path: a state file is
    #: written once and never changes, so it is hashed once.
    _digests: dict[str, str]

    @property
    def states_dir(self) -> Path:
        return self.path / "states"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoint"

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    def read_status(self) -> dict[str, Any]:
        raise NotImplementedError  # the folder's (RunFolder.read_status): model_sha256 is recorded there

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
                    # the membership check's record (eval.membership_inference): [row, first round] pairs
                    "rows_first_used": None if st.rows_first_used is None else sorted(st.rows_first_used.items()),
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
                                       manifest["last_test"], manifest["seconds"], manifest.get("initial"),
                                       _rows_first_used(manifest.get("rows_first_used")))
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


def _rows_first_used(pairs: list[list[int]] | None) -> dict[int, int] | None:
    return None if pairs is None else {int(row): int(first) for row, first in pairs}
