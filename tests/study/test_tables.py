"""A study's tables (fedfew.study.tables): a cell far apart over seeds stays inside [0, 100]."""

from __future__ import annotations

from pathlib import Path

from tests.study.common import CHAIN, INTERVAL, _results


def test_a_cell_far_apart_over_seeds_stays_inside_0_100(tmp_path: Path) -> None:
    """Two seeds at 5% and 99%: Student's t gives 52 ± 597; the table's interval is inside [0, 100]."""
    from fedfew.study.tables import table

    results = _results(tmp_path, CHAIN, {("fl-proto", "IID 1-shot"): {0: 5.0, 1: 99.0},
                                         ("fl-maml", "IID 1-shot"): {0: 100.0, 1: 100.0, 2: 100.0}})
    text = table(results)
    found = [tuple(map(float, m)) for m in INTERVAL.findall(text)]
    assert (52.0, 0.0, 100.0) in found and (100.0, 100.0, 100.0) in found
    assert all(0.0 <= low <= high <= 100.0 for _, low, high in found)
