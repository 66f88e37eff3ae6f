"""The client schedule (fedfew.engine.schedule): drawn once for a run, and reproducible."""

from __future__ import annotations

import pytest

from fedfew.engine.schedule import client_schedule


def test_client_schedule_is_drawn_once_and_reproducible() -> None:
    a = client_schedule(10, 0.3, 5, seed=1)
    assert a == client_schedule(10, 3, 5, seed=1)
    assert all(len(r) == 3 and len(set(r)) == 3 for r in a)
    assert a != client_schedule(10, 3, 5, seed=2)
    with pytest.raises(ValueError):
        client_schedule(10, 11, 1, seed=0)
