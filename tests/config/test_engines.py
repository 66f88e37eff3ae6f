"""The engines by name (fedfew.config.engines): every built-in engine is registered, and bad engine names
and options are config errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedfew.cli.main import main
from fedfew.config.validation import load_config
from fedfew.engine.base import ENGINES, InProcessEngine
from tests.tiny import tiny_config


def test_the_engines_are_registered_by_name() -> None:
    from fedfew.config.engines import ENGINES as BY_NAME  # the built-in engines, loaded on first use

    assert {"inprocess", "workers", "flower"} <= set(BY_NAME.names())
    assert BY_NAME.get("inprocess") is InProcessEngine and BY_NAME.get("flower").runs_elsewhere
    assert BY_NAME.get("flower") is ENGINES.get("flower")  # registered where plugins register theirs
    assert load_config(tiny_config("fl-proto"), ["runtime.engine=workers"]).engine_options().workers == 2


def test_bad_engine_names_and_options_are_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    assert main(["run", str(config), "--out", str(tmp_path), "--quiet", "--set", "runtime.engine=worker"]) == 2
    err = capsys.readouterr().err
    assert "runtime.engine" in err and "'workers'" in err and len(err.strip().splitlines()) == 1
    assert main(["run", str(config), "--out", str(tmp_path), "--quiet", "--set", "runtime.engine=workers",
                 "--set", "runtime.engine_options={workers: 0}"]) == 2
    assert "runtime.engine_options.workers" in capsys.readouterr().err
