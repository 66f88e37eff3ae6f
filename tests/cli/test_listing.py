"""``fedfew list`` (fedfew.cli.listing): every registry, aligned columns whatever the names' length, and
which algorithms differential privacy covers."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.cli.main import main


def test_fedfew_list_privacy_says_which_algorithms_dp_covers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "privacy"]) == 0
    out = capsys.readouterr().out
    assert "central-dp" in out and "local-dp" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "covered" in lines["fl-proto"] and lines["local"].split()[1] == "refused:"
    assert "depends on its options" in lines["frl"] and "our extension" in lines["frl"]
    assert lines["fml"].split()[1] == "covered:" and "depends on its options" in lines["f2l"]
    assert "depends on its options" in lines["fedavg"]


# -- the command line a newcomer meets ------------------------------------------------------------
def test_list_columns_stay_aligned_with_long_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "long.py"
    plugin.write_text("from fedfew.data import DATASETS\n\n"
                      "@DATASETS.register('a-dataset-with-a-rather-long-name', help='LONG')\n"
                      "def load(root):\n    raise NotImplementedError\n")
    assert main(["list", "datasets", "--plugin", str(plugin)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    starts = {len(line) - len(line[2:].split(" ", 1)[1].lstrip()) for line in rows}
    assert len(starts) == 1  # every description starts in the same column
    assert any("a-dataset-with-a-rather-long-name  LONG" in line for line in rows)


def test_list_shows_every_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("algorithms:", "fl-maml", "datasets:", "omniglot", "models:", "conv4", "partitions:", "dirichlet"):
        assert word in out
