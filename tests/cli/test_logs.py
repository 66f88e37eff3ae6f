"""How the command prints fedfew's log records (fedfew.cli.logs): one line each."""

from __future__ import annotations

import logging

import pytest

from fedfew.cli.main import logging_to_stderr


# -- logging ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("level,shown", [(logging.DEBUG, ["debug", "note", "warning"]),
                                         (logging.INFO, ["note", "warning"]),
                                         (logging.WARNING, ["warning"])])
def test_the_command_line_prints_fedfew_log_records_one_line_each(level: int, shown: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    log = logging.getLogger("fedfew.some.module")
    with logging_to_stderr(level):
        log.debug("a debug line")
        log.info("a note")
        log.warning("a warning")
    err = capsys.readouterr().err.splitlines()
    expected = {"debug": "fedfew: debug: a debug line", "note": "fedfew: a note", "warning": "fedfew: warning: a warning"}
    assert err == [expected[k] for k in shown]
    log.warning("after the command: not printed by fedfew")
    assert "after the command" not in capsys.readouterr().err
