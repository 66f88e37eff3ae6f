"""Several runs (fedfew.run.sweep): grid items parse as YAML values, every point is validated and named
when it fails, a sweep that would mislabel its points is refused, and ``fedfew sweep`` runs every
point and writes the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedfew.cli.main import main
from fedfew.config.validation import ConfigError
from fedfew.run.sweep import parse_grid, sweep_configs
from tests.cli.common import refused
from tests.tiny import tiny_config


def test_a_sweep_error_names_the_grid_point(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from fedfew.cli.main import demo_config_path

    code = main(["sweep", str(demo_config_path()), "--grid", "federation.clients_per_round=5,20",
                 "--out", str(tmp_path / "sweep"), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "grid point federation.clients_per_round=20:" in err and "exceeds partition.num_clients=10" in err
    assert not (tmp_path / "sweep").exists()  # nothing ran


# -- sweeps that label what did not run ------------------------------------------------------------------
@pytest.mark.parametrize("grids, sets, key", [
    (["seed=1,2", "seed=3"], [], "seed"),
    (["seed=1,1"], [], "seed"),
    (["seed=1,01"], [], "seed"),
    (["seed=1,1.0"], [], "seed"),
    (["algorithm.options.lr=0.001,1e-3"], [], "algorithm.options.lr"),
    (["splits.val="], [], "splits.val"),
    (["seed=1,"], [], "seed"),
    (["seed=1,2"], ["seed=5"], "seed"),
    (["federation.rounds=1,2"], ["rounds=3"], "federation.rounds"),
])
def test_a_sweep_that_would_mislabel_its_points_is_refused(grids: list[str], sets: list[str], key: str,
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    args = ["sweep", str(config), "--out", str(tmp_path / "out")]
    for grid in grids:
        args += ["--grid", grid]
    for assignment in sets:
        args += ["--set", assignment]
    line = refused(capsys, tmp_path / "out", *args)
    assert key.split(".")[-1] in line and "--grid" in line, line


# -- sweep --------------------------------------------------------------------------------------------
def test_grid_items_parse_as_yaml_values() -> None:
    grid = parse_grid(["partition.num_clients=2,4", "algorithm.options.lr=0.1,1.0e-3", "splits.val=null,val",
                       "name=a"])
    assert grid == [("partition.num_clients", [2, 4]), ("algorithm.options.lr", [0.1, 0.001]),
                    ("splits.val", [None, "val"]), ("name", ["a"])]
    with pytest.raises(ConfigError, match="key=v1,v2"):
        parse_grid(["partition.num_clients"])
    with pytest.raises(ConfigError, match="federation.rounds"):
        parse_grid(["federation.rounds=[1,2"])


def test_sweep_configs_are_the_product_of_the_grid_each_validated() -> None:
    config = tiny_config("fl-proto")
    points = sweep_configs(config, parse_grid(["partition.num_clients=4,6", "federation.rounds=1,3"]),
                           ["seed=5"])
    assert [label for label, _ in points] == ["num_clients=4, rounds=1", "num_clients=4, rounds=3",
                                              "num_clients=6, rounds=1", "num_clients=6, rounds=3"]
    assert [(c.partition.num_clients, c.federation.rounds) for _, c in points] == [(4, 1), (4, 3), (6, 1), (6, 3)]
    assert all(c.seed == 5 for _, c in points)  # the overrides apply to every point
    with pytest.raises(ConfigError, match="federation.clients_per_round=4 exceeds partition.num_clients=2"):
        sweep_configs(config, parse_grid(["partition.num_clients=6,2"]), [])  # one bad point stops them all


def test_sweep_command_runs_every_point_and_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fl-proto", federation={"rounds": 1})))
    assert main(["sweep", str(path), "--grid", "seed=0,1", "--out", str(tmp_path / "sweep"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "seed=0" in out and "seed=1" in out
    rows = [json.loads(line) for line in (tmp_path / "sweep" / "summaries.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == ["seed=0", "seed=1"]
    assert (tmp_path / "sweep" / "results.md").is_file() and len(list((tmp_path / "sweep" / "runs").iterdir())) == 2
    assert main(["sweep", str(path), "--grid", "seed", "--out", str(tmp_path / "bad"), "--quiet"]) == 2
