"""The client protocol: what every engine agrees on when a client runs somewhere else.

* the keys each client's seeded generators are derived from (spelled here once): a client's initial
  state, its update in a round, the global generator of that update, its evaluation of its own model;
* the namespace of a client's persistent private state (:data:`MAIN`);
* a :class:`~fedfew.interface.algorithm.ClientResult` to and from its wire form: the tensors
  (``upload``, ``state``) travel in the state form of :mod:`fedfew.interface.serialize` (or Flower's
  records), everything else as the JSON-able summary of :meth:`ClientResult.summary`.

An engine that carries a result across a process boundary uses :func:`to_wire` / :func:`from_wire`
(or :meth:`ClientResult.summary` / :meth:`ClientResult.from_summary` when the tensors travel apart), so
that a field added to ``ClientResult`` takes one edit.
"""

from __future__ import annotations

import torch

from fedfew.core.seeding import derive_seed, torch_generator
from fedfew.interface.algorithm import ClientResult, State
from fedfew.interface.serialize import named_parts

#: The persistent private state of a client; other namespaces live for one top-level round only.
MAIN = "main"

INIT_KEY = "client-init"
UPDATE_KEY = "client"
UPDATE_GLOBAL_KEY = "client-global"
EVALUATE_KEY = "evaluate"


def init_generator(seed: int, client_id: int) -> torch.Generator:
    """The generator a client's initial private state is drawn from (wherever it is created)."""
    return torch_generator(seed, INIT_KEY, client_id)


def update_generator(seed: int, round_key: str, client_id: int) -> torch.Generator:
    """The generator of one client update."""
    return torch_generator(seed, UPDATE_KEY, round_key, client_id)


def update_global_seed(seed: int, round_key: str, client_id: int) -> int:
    """The seed of torch's global generator during one client update (dropout, DropBlock)."""
    return derive_seed(seed, UPDATE_GLOBAL_KEY, round_key, client_id)


def evaluate_generator(seed: int, split: str, client_id: int) -> torch.Generator:
    """The generator of a client's evaluation of its own model on ``split``."""
    return torch_generator(seed, EVALUATE_KEY, split, client_id)


def to_wire(result: ClientResult) -> dict[str, object]:
    """The form a result crosses a process boundary in (a nested dict the state form can carry)."""
    return {"upload": result.upload, "state": result.state, "summary": result.summary()}


def from_wire(wire: State) -> ClientResult:
    """The result back from :func:`to_wire`'s form (as the state form gives it back)."""
    parts = named_parts(wire, "a client's result")
    return ClientResult.from_summary(upload=parts["upload"], state=parts["state"], summary=parts["summary"])
