"""The config schema (fedfew.core.config_schema): bounds on what sizes a run, run names that would
escape their folder, the deprecated ``runtime.workers`` alias, and ``eval.selection`` and
``eval.initial`` as validated keys."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fedfew.cli.main import demo_config_path, main
from fedfew.config.validation import ConfigError, load_config
from tests.cli.common import cli_lines, refused
from tests.tiny import tiny_config


# -- bounds on what sizes a run before its first round -------------------------------------------------
@pytest.mark.parametrize("assignment,key", [("federation.rounds=99999999999999999999999", "federation.rounds"),
                                            ("federation.rounds=100000000", "federation.rounds"),
                                            ("partition.num_clients=100000000", "partition.num_clients"),
                                            ("episodes.test_episodes=1000000000", "episodes.test_episodes")])
def test_huge_counts_are_refused_at_once(assignment: str, key: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = cli_lines(capsys, "run", str(demo_config_path()), "--out", str(tmp_path), "--set", assignment)
    assert code == 2 and len(lines) == 1 and key in lines[0] and "1000000" in lines[0], lines


# -- names that escape ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [".", "..", ".hidden", "x" * 300, ""])
def test_a_run_name_that_would_escape_or_hide_its_folder_is_refused(name: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, tmp_path, "run", str(demo_config_path()), "--out", str(tmp_path), "--set", f"name='{name}'")
    assert "name" in line, line
    assert not list(tmp_path.iterdir())


def test_runtime_workers_is_a_deprecated_alias(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fedfew"):
        config = load_config(tiny_config("fl-proto"), ["runtime.workers=3"])
    assert config.runtime.engine == "workers" and config.runtime.engine_options == {"workers": 3}
    assert any("runtime.workers is deprecated" in r.getMessage() for r in caplog.records)
    back = load_config(config.model_dump(mode="json"), ["runtime.workers=0"])  # the old way back to one process
    assert back.runtime.engine == "inprocess" and back.runtime.engine_options == {}
    assert "workers" not in config.model_dump()["runtime"]  # a run folder records the new form


def test_selection_is_a_validated_config_key() -> None:
    assert load_config({"eval": {"selection": "last"}}).eval.selection == "last"
    with pytest.raises(ConfigError, match="selection"):
        load_config({"eval": {"selection": "median"}})


def test_a_bad_value_is_one_line_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="eval.initial"):
        load_config(tiny_config("fl-proto"), ["eval.initial=never"])
    path = tmp_path / "c.yaml"
    import yaml

    path.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    assert main(["run", str(path), "--set", "runtime.compile=fast", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "runtime.compile" in err
