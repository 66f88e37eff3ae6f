"""docs/studies.md's "Measured drift" table is what scripts/drift_table.py prints from the committed
store's equivalence files for the code version the page names (so the page cannot drift from the store)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_drift_table_in_the_docs_is_the_scripts_output() -> None:
    page = (REPO / "docs" / "studies.md").read_text()
    blocks = re.findall(r"<!-- drift-table source=(\w+) begin -->\n(.*?)\n<!-- drift-table end -->", page, re.S)
    assert blocks, "docs/studies.md has no drift-table block"
    for source, shown in blocks:
        out = subprocess.run([sys.executable, str(REPO / "scripts" / "drift_table.py"), "--source", source],
                             capture_output=True, text=True, check=True).stdout
        assert shown.strip() == out.strip(), f"the drift table of {source}"
        rows = [line for line in shown.splitlines() if line.startswith("| ") and not line.startswith("| study")]
        assert len(rows) >= 10  # at least ten cells of different methods
