"""The aggregate view of a study (fedfew.study.aggregate): by hand, and on the benchmark page."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.study.aggregate import aggregate, aggregate_markdown
from fedfew.study.docs import marker_pattern
from fedfew.study.study_sections import CONTROL
from tests.study.common import DIGITS_STUDY, REPO, _results


# -- the aggregate view -------------------------------------------------------------------------------
def test_the_aggregate_view_by_hand(tmp_path: Path) -> None:
    """Two settings, two seeds. Setting A: control mean 40, best mean (fl-proto) 60; setting B: control
    40, best (fl-maml) 50. Normalised: fl-proto A 0.9, 1.1, B 0.0, 0.4; fl-maml A 0.4, 0.6, B 0.9, 1.1;
    IQM of 4 values = the mean of the middle two: fl-proto (0.4 + 0.9) / 2, fl-maml (0.6 + 0.9) / 2."""
    values = {("fl-proto", "IID 1-shot"): {0: 58.0, 1: 62.0}, ("fl-maml", "IID 1-shot"): {0: 48.0, 1: 52.0},
              (CONTROL, "IID 1-shot"): {0: 39.0, 1: 41.0},
              ("fl-proto", "non-IID 1-shot"): {0: 40.0, 1: 44.0}, ("fl-maml", "non-IID 1-shot"): {0: 49.0, 1: 51.0},
              (CONTROL, "non-IID 1-shot"): {0: 40.0, 1: 40.0}}
    results = _results(tmp_path, DIGITS_STUDY, values)
    results.missing = {}
    view = aggregate(results, reps=500)
    assert not isinstance(view, str)
    assert view.best == "fl-maml" and view.methods == ["fl-maml", "fl-proto"]
    assert view.score["fl-maml"][0] == pytest.approx(0.75) and view.score["fl-proto"][0] == pytest.approx(0.65)
    assert view.rank["fl-maml"][0] == pytest.approx(1.5) and view.rank["fl-proto"][0] == pytest.approx(1.5)
    # P(fl-maml > fl-proto): setting IID 0 of 4 pairs, non-IID 4 of 4 -> (0 + 1) / 2
    assert view.improvement["fl-proto"][0] == pytest.approx(0.5)
    assert view.references["IID 1-shot"] == (40.0, 60.0)
    for low_high in (view.score["fl-proto"], view.rank["fl-maml"], view.improvement["fl-proto"]):
        assert low_high[1] <= low_high[2]
    again = aggregate(results, reps=500)
    assert not isinstance(again, str) and again.score == view.score  # seeded: the same every time
    text = aggregate_markdown(results, "studies/x.yaml", "studies/x-profile.png")
    assert "| FL-MAML | 0.75 [" in text and "![Performance profile" in text
    results.missing = {"IID 1-shot": 1}
    assert "incomplete" in aggregate_markdown(results, "studies/x.yaml")


def test_the_benchmark_page_has_the_aggregate_view() -> None:
    text = (REPO / "docs" / "benchmark.md").read_text()
    block = marker_pattern("benchmark-fewshot:aggregate").search(text)
    assert block is not None and "| method | aggregate score (IQM of normalised accuracy) |" in block.group(2)
    assert "docs/studies/benchmark-fewshot-profile.png".removeprefix("docs/") in block.group(2)
    assert (REPO / "docs" / "studies" / "benchmark-fewshot-profile.png").is_file()
