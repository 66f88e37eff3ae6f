"""Which clients take part in each round: the seeded schedule drawn once for a run, and the round's size
(the config check reads it to say what a fault or secure-aggregation setting means for a round)."""

from __future__ import annotations

from fedfew.core.seeding import numpy_generator


def client_schedule(num_clients: int, per_round: int | float, rounds: int, seed: int) -> list[list[int]]:
    """Which clients take part in each round, drawn once from the seed so that every algorithm run
    with the same seed sees the same clients. ``per_round`` is a count or a fraction in (0, 1]."""
    count = round_size(num_clients, per_round)
    if not 1 <= count <= num_clients:
        raise ValueError(f"clients per round must be in 1..{num_clients}, got {per_round}")
    rng = numpy_generator(seed, "schedule")
    return [sorted(rng.choice(num_clients, count, replace=False).tolist()) for _ in range(rounds)]


def round_size(num_clients: int, per_round: int | float) -> int:
    """How many clients each round asks: ``per_round`` itself, or a fraction in (0, 1] of the clients."""
    if isinstance(per_round, float) and per_round <= 1.0:
        return max(1, round(per_round * num_clients))
    return int(per_round)
