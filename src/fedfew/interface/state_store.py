"""Clients' private states, versioned, in memory or spilled to disk.

Every state is immutable by convention: a client update returns a new state object and never
changes the one it was given. So a snapshot of the states (the best round's, a checkpoint's) is a
mapping of references, not a deep copy, and a state written to disk once never has to be written
again. Each entry carries its *version*, the round after which it was written (0: initial).

States can be written to files in ``folder`` (one per client and version: a checkpoint writes the
ones it needs there). With ``spill`` they live only there, and nothing but their file names stays in
memory: memory stays bounded however many clients exist.
A client never updated has its initial state from ``init`` (the algorithm's ``init_client_state``
with the client's own generator), made again whenever asked and never stored, as a real client
would create its own: memory and disk grow with the clients that trained, not with those that exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch

from fedfew.core.errors import RunFailedError
from fedfew.interface import serialize
from fedfew.interface.algorithm import State

#: A client's initial private state from its id (the algorithm's ``init_client_state``, in its own form).
Init = Callable[[int], object]


@dataclass(frozen=True)
class Entry:
    version: int
    state: object = None  # the object (the algorithm's own form), when held in memory
    file: str | None = None  # the file name under the store's folder, when written


class ClientStates(Mapping[int, object]):
    """``{client id: private state}`` with lazy creation, versions and optional spilling to disk."""

    def __init__(self, client_ids: list[int], init: Init, folder: Path | None = None, spill: bool = False) -> None:
        if spill and folder is None:
            raise ValueError("spilling client states to disk needs a folder")
        self.client_ids = list(client_ids)
        self._ids = set(self.client_ids)
        self.init = init
        self.folder = folder
        self.spill = spill
        self.entries: dict[int, Entry] = {}

    # -- the Mapping view (what evaluation reads) ---------------------------------------------
    def __getitem__(self, cid: int) -> object:
        if cid not in self._ids:
            raise KeyError(cid)
        return self.get_state(cid)

    def __iter__(self) -> Iterator[int]:
        return iter(self.client_ids)

    def __len__(self) -> int:
        return len(self.client_ids)

    # -- reading and writing --------------------------------------------------------------------
    def get_state(self, cid: int) -> object:
        entry = self.entries.get(cid)
        if entry is None:  # never updated: its initial state, made again when asked (nothing stored)
            return self.init(cid)
        if entry.state is not None or entry.file is None:
            return entry.state
        state = self.read_file(entry.file)
        if not self.spill:  # restored from a checkpoint: keep it in memory from now on
            self.entries[cid] = Entry(entry.version, state, entry.file)
        return state

    def put(self, cid: int, state: object, version: int) -> None:
        if self.spill and state is not None:
            self.entries[cid] = Entry(version, None, self.write_file(cid, version, state))
        else:
            self.entries[cid] = Entry(version, state, None)

    def write_file(self, cid: int, version: int, state: object) -> str:
        """Write one state to its file in the folder (once: a (client, version) never changes)."""
        assert self.folder is not None
        name = self.file_name(cid, version)
        if not (self.folder / name).exists():
            serialize.save(self.folder / name, state)
        return name

    def version(self, cid: int) -> int | None:
        entry = self.entries.get(cid)
        return None if entry is None else entry.version

    @staticmethod
    def file_name(cid: int, version: int) -> str:
        return f"client-{cid}-v{version}.safetensors"

    def read_file(self, name: str) -> State:
        if self.folder is None:
            raise ValueError(f"client state file {name} named, but the store has no folder")
        state, _ = serialize.load(self.folder / name)
        return serialize.to_device(state, torch.get_default_device())  # where the caller computes

    # -- snapshots --------------------------------------------------------------------------------
    def snapshot(self) -> dict[int, Entry]:
        """The current entries (references: cheap, and unaffected by later writes)."""
        return dict(self.entries)

    def restore(self, entries: Mapping[int, Entry]) -> None:
        self.entries = dict(entries)

    def view(self, entries: Mapping[int, Entry]) -> SnapshotView:
        """A read-only mapping of the states in a snapshot (states never created stay lazy)."""
        return SnapshotView(self, entries)


class SnapshotView(Mapping[int, object]):
    """The states of a snapshot; a client absent from it gets its initial state."""

    def __init__(self, store: ClientStates, entries: Mapping[int, Entry]) -> None:
        self.store, self.entries = store, entries

    def __getitem__(self, cid: int) -> object:
        if cid not in self.store._ids:
            raise KeyError(cid)
        entry = self.entries.get(cid)
        if entry is None:
            return self.store.init(cid)
        return entry.state if entry.state is not None or entry.file is None else self.store.read_file(entry.file)

    def __iter__(self) -> Iterator[int]:
        return iter(self.store.client_ids)

    def __len__(self) -> int:
        return len(self.store.client_ids)


class RemoteStateError(RunFailedError):
    """Something on the server side asked for a private state that stays with its client."""


class RemoteClientStates(ClientStates):
    """The server's view of private states when each client keeps its own (a Flower node): there is
    none to read."""

    remote = True

    def __init__(self, client_ids: list[int]) -> None:
        super().__init__(client_ids, self.refuse)

    @staticmethod
    def refuse(cid: int) -> NoReturn:
        raise RemoteStateError(f"client {cid}'s private state stays on its Flower node and is never sent; this "
                               "evaluation needs it on the server (e.g. f2l test_client_model=average): use an "
                               "evaluation each client runs itself, or runtime.engine=inprocess")
