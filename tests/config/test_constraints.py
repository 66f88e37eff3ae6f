"""What the sections of a config ask of one another (fedfew.config.constraints): fault settings that
leave no client to reply, compiled steps and batched clients outside the one process."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.cli.main import demo_config_path, main
from fedfew.config.validation import ConfigError, load_config
from fedfew.engine.base import Faults
from tests.tiny import tiny_config


# -- fault settings that leave no reply ----------------------------------------------------------------
def test_fault_settings_that_leave_no_reply_are_refused_with_the_draws_rounding() -> None:
    with pytest.raises(ConfigError, match=r"federation\.dropout.*federation\.stragglers.*no client to reply"):
        load_config(demo_config_path(), ["federation.dropout=0.9", "federation.stragglers=0.09"])  # 9 + 1 of 10
    with pytest.raises(ConfigError, match="round of 3"):  # round(1.5) = 2 fail, round(0.9) = 1 late, of 3
        load_config(demo_config_path(), ["federation.clients_per_round=3", "federation.dropout=0.5",
                                         "federation.stragglers=0.3"])
    # Accepted exactly where the draw leaves a reply (Python's round: round(0.5) = 0 of 1 fails).
    load_config(demo_config_path(), ["federation.clients_per_round=1", "federation.dropout=0.5"])
    assert Faults(0.5, 0.0).counts(1) == (0, 0)
    assert load_config(demo_config_path(), ["federation.dropout=0.5", "federation.stragglers=0.4"])
    assert Faults(0.5, 0.4).counts(10) == (5, 4)


def test_fault_settings_that_leave_no_reply_stop_before_any_work(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                 "--set", "federation.dropout=0.9", "--set", "federation.stragglers=0.09"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "federation.dropout" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_compile_outside_this_process_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="runtime.compile"):
        load_config(tiny_config("fl-maml"), ["runtime.compile=default", "runtime.workers=2"])


def test_batch_clients_with_worker_processes_is_a_config_error() -> None:
    with pytest.raises(Exception, match="runtime.batch_clients"):
        load_config(tiny_config("fl-maml"), ["runtime.batch_clients=true", "runtime.workers=2"])
