"""The model check before any work (fedfew.run.model_check): a model that cannot be built, or whose forward
pass raises, is one line naming the model options and the inputs, not the algorithm."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedfew.cli.main import demo_config_path
from tests.cli.common import cli_all_lines, cli_lines
from tests.run.common import write
from tests.tiny import tiny_config


# -- model-build errors name the model, not the algorithm -------------------------------------------------
@pytest.mark.parametrize("hidden", [0, -5])
def test_a_model_that_cannot_be_built_names_model_options_and_the_inputs(
        hidden: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tiny_config("fl-proto", model={"name": "conv4", "options": {"hidden": hidden}})
    code, lines = cli_lines(capsys, "run", str(write(tmp_path / "c.yaml", config)), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and "model.options" in lines[0] and "(1, 8, 8)" in lines[0]
    assert "algorithm.name" not in lines[0]


def test_one_dimensional_data_names_the_data_shape_not_the_algorithm(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "flat.npz", x=np.linspace(0, 1, 300, dtype=np.float32), y=np.repeat(np.arange(30), 10))
    config = {**tiny_config("fl-proto"), "dataset": {"name": "arrays", "options": {
        "path": str(tmp_path / "flat.npz"), "class_split": {"base": 0.6, "val": 0.2, "novel": 0.2, "seed": 0}}},
        "splits": {"train": "base", "val": "val", "test": "novel"}}
    code, lines = cli_lines(capsys, "run", str(write(tmp_path / "c.yaml", config)), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and "(1,)" in lines[0] and "algorithm.name" not in lines[0], lines


QUICK = ["--set", "federation.rounds=1", "--set", "episodes.test_episodes=5"]


def statuses(out: Path) -> list[str]:
    return [json.loads(p.read_text())["status"] for p in out.glob("*/status.json")]


# -- errors inside the model are config errors----------------------------------------------------------------------------------
@pytest.mark.parametrize("hidden", [0, -5])
def test_a_model_that_cannot_be_built_is_a_config_error_before_any_work(
        hidden: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = cli_all_lines(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                          "--set", f"model.options.hidden={hidden}", *QUICK)
    assert code == 2 and len(lines) == 1 and "model" in lines[0] and "conv4" in lines[0], lines
    assert not (tmp_path / "out").exists()  # found in preflight: no run folder


PLUGIN_FORWARD_RAISES = '''
import torch
from torch import nn
from fedfew.models import MODELS, FewShotModel


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 4)

    def forward(self, x):
        raise RuntimeError("this model is broken")


@MODELS.register("{name}")
def broken(input_shape, num_classes):
    return FewShotModel(Broken(), 4, None if num_classes is None else nn.Linear(4, num_classes))
'''


def test_a_plugin_model_whose_forward_raises_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "broken.py"
    plugin.write_text(PLUGIN_FORWARD_RAISES.replace("{name}", "broken-forward"))
    code, lines = cli_all_lines(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                          "--plugin", str(plugin), "--set", "model.name=broken-forward", "--set", "model.options={}",
                          *QUICK)
    assert code == 2 and len(lines) == 1, lines
    assert "broken-forward" in lines[0] and "this model is broken" in lines[0]
    assert "complete" not in statuses(tmp_path / "out")
