"""Explicit, order-independent random generators.

A generator for (seed, *keys) depends only on those numbers, never on what ran before, so a client's
update gets the same randomness whether clients run in sequence, in parallel or in another process.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import numpy as np
import torch


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed derived from ``seed`` and any number of integer or string keys."""
    text = "/".join([str(seed), *map(str, keys)]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def torch_generator(seed: int, *keys: int | str) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, *keys))


def numpy_generator(seed: int, *keys: int | str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, *keys))


_INIT_SEED: list[int] = []
#: The generator of the initial-state hook the framework has just seeded torch's global RNG from
#: (:func:`seeded_for_init`), until the hook's own first :func:`seed_torch_init` with it, if any.
_SEEDED_FROM: list[torch.Generator] = []


def seed_torch_init(generator: torch.Generator) -> None:
    """Seed torch's global RNG from ``generator``: parameter initialisers in torch.nn only read the
    global RNG, so model construction is made reproducible this way and nowhere else. Inside
    :func:`initial_model_seed` the first call seeds with that number instead. Inside
    :func:`seeded_for_init` (the framework's call of an initial-state hook, which it has seeded already)
    the hook's own first call with the same generator is that seeding, not another: an algorithm
    written to seed its initial model itself gets the same numbers."""
    if _SEEDED_FROM and _SEEDED_FROM[-1] is generator:
        _SEEDED_FROM.pop()
        return
    if _INIT_SEED:
        torch.manual_seed(_INIT_SEED.pop())
        return
    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item()))


@contextlib.contextmanager
def seeded_for_init(generator: torch.Generator) -> Iterator[None]:
    """Seed torch's global RNG from ``generator`` (:func:`seed_torch_init`) for the initial-state hook
    called inside, which gets ``generator`` (see :func:`seed_torch_init` for a hook that seeds itself)."""
    seed_torch_init(generator)
    _SEEDED_FROM.append(generator)
    try:
        yield
    finally:
        if _SEEDED_FROM and _SEEDED_FROM[-1] is generator:
            _SEEDED_FROM.pop()


@contextlib.contextmanager
def initial_model_seed(seed: int | None) -> Iterator[None]:
    """Build the server's initial model after ``torch.manual_seed(seed)`` (``model.init_seed``): to
    start from exactly the model another tool starts from, when it builds the same layers in the
    same order."""
    _INIT_SEED[:] = [] if seed is None else [seed]
    try:
        yield
    finally:
        _INIT_SEED.clear()
