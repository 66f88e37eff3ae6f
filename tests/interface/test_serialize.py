"""The flat state form (fedfew.interface.serialize): every kind of value round-trips, and state files from
elsewhere are refused naming the file."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from fedfew.interface import serialize


# -- the flat state form ---------------------------------------------------------------------------
def test_state_form_round_trips_every_kind_of_value(tmp_path: Path) -> None:
    model = torch.nn.Conv2d(2, 3, 3).to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(1, 2, 5, 5)).sum().backward()
    optimizer.step()
    shared = torch.arange(6.0)
    state = {
        "model": {k: v for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),  # integer keys, tuples (betas), None values
        "scores": {3: 0.5, 7: float("nan"), 9: float("-inf")},
        "members": [shared, shared, {"nested": (1, "two", None, True)}],
        "rounds": 4,
    }
    serialize.save(tmp_path / "s.safetensors", state, {"round": 4})
    back, meta = serialize.load(tmp_path / "s.safetensors")
    assert meta == {"round": 4}
    for k, v in state["model"].items():
        assert torch.equal(back["model"][k], v)
    assert back["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert set(back["optimizer"]["state"]) == {0, 1}
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    assert back["scores"][3] == 0.5 and math.isnan(back["scores"][7]) and back["scores"][9] == float("-inf")
    assert back["members"][2] == {"nested": (1, "two", None, True)} and back["rounds"] == 4
    assert torch.equal(back["members"][0], shared) and back["members"][0] is back["members"][1]
    with pytest.raises(serialize.StateFormatError, match="'bad'"):
        serialize.flatten({"bad": object()})


def test_state_files_from_elsewhere_are_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(os.urandom(300))
    with pytest.raises(serialize.StateFormatError, match="x.safetensors"):
        serialize.load(path)
    good = serialize.to_bytes({"a": torch.ones(3)})
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(serialize.StateFormatError, match="x.safetensors"):
        serialize.load(path)
