"""The client protocol: what every engine agrees on when a client runs somewhere else.

* the keys each client's seeded generators are derived from (spelled here once): a client's initial
  state, its update in a round, the global generator of that update, its evaluation of its own model;
* the call of the initial-state hooks (:func:`initial_server_state`, :func:`initial_client_state`): torch's
  global RNG seeded from the hook's generator first where the algorithm builds its initial models there;
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

from fedfew.core.seeding import derive_seed, seeded_for_init, torch_generator
from fedfew.interface.algorithm import Algorithm, ClientData, ClientResult, State
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


def initial_server_state(algorithm: Algorithm, generator: torch.Generator) -> object:
    """``algorithm.init_server(generator)``, with torch's global RNG seeded from ``generator`` first
    (:func:`~fedfew.core.seeding.seed_torch_init`) where the algorithm builds its initial model there
    (:attr:`~fedfew.interface.algorithm.Algorithm.seeds_init_server`): the framework's one call of it."""
    if not algorithm.seeds_init_server:
        return algorithm.init_server(generator)
    with seeded_for_init(generator):
        return algorithm.init_server(generator)


def initial_client_state(algorithm: Algorithm, client: ClientData, generator: torch.Generator) -> object:
    """``algorithm.init_client_state(client, generator)``, with torch's global RNG seeded from ``generator``
    first where the clients build their initial models there
    (:attr:`~fedfew.interface.algorithm.Algorithm.seeds_init_client_state`), wherever the state is made."""
    if not algorithm.seeds_init_client_state:
        return algorithm.init_client_state(client, generator)
    with seeded_for_init(generator):
        return algorithm.init_client_state(client, generator)


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
