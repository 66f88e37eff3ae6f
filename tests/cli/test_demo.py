"""``fedfew demo`` (fedfew.cli.demo): end to end on a small budget, and a ``--set`` that cannot apply to
some of its rows names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.cli.main import main
from tests.cli.common import one_line


# -- a --set the demo's rows cannot take---------------------------------------------------------------------------------
def test_demo_names_the_rows_a_set_cannot_apply_to(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line(capsys, "demo", "--out", str(tmp_path), "--set", "privacy.mechanism=central-dp",
                    "--set", "privacy.noise_multiplier=1.0", "--set", "privacy.clip=1.0", "--set", "privacy.delta=1e-5")
    assert "demo's 'local'" in line and "fedfew run" in line, line


def test_demo_end_to_end_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["demo", "--out", str(tmp_path), "--quiet"]
    for item in ("federation.rounds=1", "partition.num_clients=4", "federation.clients_per_round=4",
                 "episodes.test_episodes=5", "episodes.val_episodes=5", "model.options={hidden: 8}"):
        args += ["--set", item]
    assert main(args) == 0
    out = capsys.readouterr().out
    for name in ("| untrained |", "| local |", "| fl-proto |", "| fedavg |", "omniglot-mini"):
        assert name in out
    assert (tmp_path / "results.md").is_file() and (tmp_path / "accuracy.png").is_file()
