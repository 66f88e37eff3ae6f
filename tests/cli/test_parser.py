"""The command's parser and help (fedfew.cli.parser): the --set example each command's help gives is one
that command takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.cli.main import main


@pytest.mark.parametrize("command", ["resume", "evaluate"])
def test_help_examples_are_accepted(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The --set example each command's help gives is one that command takes."""
    import re

    from fedfew.run.rescore import EVALUATE_KEYS

    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    (example,) = re.findall(r"e\.g\. --set (\S+)", help_text)
    key = example.split("=")[0]
    assert key.startswith("runtime.") if command == "resume" else key.startswith(EVALUATE_KEYS)
