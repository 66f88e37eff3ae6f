"""Who takes part in a private round, and the noise generators, where the guarantee needs them secret.

Amplification by sampling (``privacy.accounting`` poisson or without_replacement) holds only against an
observer who does not know whether a client took part; the noise protects only if no one who sees the
noised value can regenerate it. So, unless ``privacy.noise: seeded`` (research mode) asks for
reproducible runs:

* the clients of each round are drawn, when the round starts, from OS randomness
  (:class:`random.SystemRandom`, ``os.urandom``), never from the run's seed: a Poisson sample (each
  client independently with probability q) or a fixed-size one without replacement;
* each noise generator (the server's, and each local-dp client's own, drawn on the client) is seeded
  with 63 bits from :func:`secrets.randbits` when it is made: nobody else holds the seed.

With ``noise: seeded`` the Poisson sample comes from the seed (accounting poisson asked for
explicitly); the fixed-size sample is then the simulator's own seeded schedule, the one every run
without DP uses.
"""

from __future__ import annotations

import random
import secrets

import numpy as np
import torch

from fedfew.core.seeding import numpy_generator

__all__ = ["ParticipantSampler", "secure_generator"]

_SYSTEM = random.SystemRandom()


def secure_generator(device: torch.device | str | None = None) -> torch.Generator:
    """A torch generator seeded from OS randomness (63 bits of :func:`secrets.randbits`): noise no one
    holding the run's config can regenerate. Not a cryptographic generator itself (torch's Philox /
    Mersenne Twister, as Opacus without ``secure_mode``); its seed is what nobody else has."""
    generator = torch.Generator(device=device) if device is not None else torch.Generator()
    return generator.manual_seed(secrets.randbits(63))


class ParticipantSampler:
    """The clients of each private round: ``poisson`` (each of ``num_clients`` with probability
    ``rate``) or a fixed ``per_round`` without replacement; from OS randomness unless ``seed`` is given
    (research mode)."""

    def __init__(self, num_clients: int, per_round: int, poisson: bool, seed: int | None = None) -> None:
        self.num_clients, self.per_round, self.poisson = num_clients, per_round, poisson
        self.rate = per_round / num_clients
        self.seed = seed
        #: Whether the sample is a secret (OS randomness): the history then records counts, not clients.
        self.secret = seed is None

    def draw(self, round_index: int) -> list[int]:
        """The sorted client ids of round ``round_index`` (0-based)."""
        if self.seed is not None:  # research mode: the same clients for the same seed and round
            rng = numpy_generator(self.seed, "dp-poisson-schedule", round_index)
            if self.poisson:
                return sorted(np.flatnonzero(rng.random(self.num_clients) < self.rate).tolist())
            return sorted(rng.choice(self.num_clients, self.per_round, replace=False).tolist())
        if self.poisson:
            return [c for c in range(self.num_clients) if _SYSTEM.random() < self.rate]
        return sorted(_SYSTEM.sample(range(self.num_clients), self.per_round))
