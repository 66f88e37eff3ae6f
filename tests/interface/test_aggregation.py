"""Aggregation helpers (fedfew.interface.aggregation): weights sum to one and nonsense is refused;
weighted averages of states."""

from __future__ import annotations

import pytest
import torch

from fedfew.interface.aggregation import normalise, weighted_average, weights_for


def test_weights_sum_to_one_and_reject_nonsense() -> None:
    for kind in ("samples", "episodes", "uniform"):
        w = weights_for(kind, [10, 30, 60], [1, 2, 5])
        assert float(w.sum()) == pytest.approx(1.0, abs=1e-12)
    assert weights_for("samples", [10, 30, 60], [0, 0, 0]).tolist() == pytest.approx([0.1, 0.3, 0.6])
    assert weights_for("episodes", [1, 1], [1, 3]).tolist() == pytest.approx([0.25, 0.75])
    with pytest.raises(ValueError):
        normalise([-1.0, 2.0])
    with pytest.raises(ValueError):
        normalise([0.0, 0.0])


def test_weighted_average_of_states() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    avg = weighted_average([a, b], [1, 3])
    assert torch.allclose(avg["w"], torch.tensor([2.5, 5.0]))
    assert int(avg["n"]) == 3  # integer buffers come from the first state
