"""The docs pages agree with the code: docs/reliability.md gives the exit code of a run in which nothing
trained."""

from __future__ import annotations

import re

from tests.study.common import REPO


# -- the docs agree with the code -----------------------------------------------------------------------------
def test_the_reliability_page_gives_the_exit_code_of_a_run_in_which_nothing_trained() -> None:
    from fedfew.engine.simulator import NothingTrainedError

    text = (REPO / "docs" / "reliability.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| no client can train")]
    assert rows and all(f"exit {NothingTrainedError.exit_code}" in row for row in rows), rows
    tested = re.search(r"no client can form an episode[^;]*exits (\d)", text)
    assert tested and int(tested.group(1)) == NothingTrainedError.exit_code
