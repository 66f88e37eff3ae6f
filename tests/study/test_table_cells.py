"""How one number of a study's tables is written (fedfew.study.table_cells): a cell whose runs selected
round 0 is marked in the tables and the claims."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.study.study_sections import CONTROL
from tests.study.common import DIGITS_STUDY, _put, run_cli, write_study


# -- a trained row that selected round 0 -----------------------------------------------------------------
def test_a_cell_whose_runs_selected_round_0_is_marked_in_tables_and_claims(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """fl-proto's runs selected round 0 on both seeds (the untrained model scored best on validation):
    its cell is the untrained model's number, so the table marks it, a legend under the table says
    what the mark means, and the claim that uses the cell says so; FL-MAML's seed 1 alone did: "1/2"."""
    path = write_study(tmp_path, DIGITS_STUDY)
    store = tmp_path / "store"
    cell = ("IID 1-shot",)
    values = {(m, *cell, s): v for m, v in (("fl-proto", 0.6), ("fl-maml", 0.55), (CONTROL, 0.5)) for s in (0, 1)}
    values[("fl-proto", "IID 1-shot", 1)] = 0.62
    _put(store, path, "smoke", values, selected={("fl-proto", "IID 1-shot", 0): 0, ("fl-proto", "IID 1-shot", 1): 0,
                                                 ("fl-maml", "IID 1-shot", 1): 0})
    code, out, err = run_cli(["study", "report", str(path), "--store", str(store), "--budget", "smoke"], capsys)
    assert code == 0, err
    assert "| fl-proto | 61.00 [48.07, 73.19] † | 63.40 |" in out  # the interval over seeds, inside [0, 100]
    assert "| FL-MAML | 55.00 [55.00, 55.00] †1/2 | — |" in out
    assert "| (control) untrained, round 0 | 50.00 [50.00, 50.00] | — |" in out  # the control is untrained by design
    assert "† round 0 selected: the untrained model scored best on validation" in out
    claim = next(line for line in out.splitlines() if "**" in line)  # the claim's row: fl-proto > control
    assert claim.startswith("| fl-proto † > (control) untrained, round 0 | IID 1-shot |"), out
