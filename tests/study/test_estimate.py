"""The time a study has left (fedfew.study.estimate): each pending cell's stored time of its method, not
extrapolated from the first cell of a sitting."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.study.grid import cells
from fedfew.study.store import ResultStore
from fedfew.study.study_file import load_study
from tests.study.common import (
    DIGITS_STUDY,
    ONE_ROW,
    _store_args,
    dumped,
    run_cli,
    write_study,
)


# -- the time a study has left -------------------------------------------------------------------------
def test_time_left_is_each_pending_cells_stored_time_of_its_method(tmp_path: Path) -> None:
    """The estimate adds, per pending cell, the median stored time of its method and setting among the
    budget's cells (its method's over settings where the setting has none); a copied run's time and
    another budget's are left out, a method the store has no time of counts as this sitting's mean per
    cell, and a cell part-way through counts the fraction of its rounds still to run."""
    from fedfew.study.estimate import time_left, typical_seconds
    from fedfew.study.store import CodeVersion, make_record

    study, root = load_study(write_study(tmp_path, DIGITS_STUDY))
    store = ResultStore(tmp_path / "store", study.name)
    code = CodeVersion("0.0.0", "handmade0000", None)
    grid = {(c.method, c.setting, c.seed): c for c in cells(study, root, "cpu")}
    times = {("fl-proto", "IID 1-shot", 0): 60.0, ("fl-proto", "IID 1-shot", 1): 100.0,
             ("fl-proto", "non-IID 1-shot", 0): 400.0}
    for (method, setting, seed), seconds in times.items():
        c = grid[(method, setting, seed)]
        store.put(make_record(study.name, "cpu", method, setting, seed, c.config_hash, dumped(c), code,
                              {"test": {"accuracy": 0.5}}, seconds))
    copied = grid[("fl-maml", "IID 1-shot", 0)]  # another study's run: its 9,999 s are not this study's
    store.put({**make_record(study.name, "cpu", "fl-maml", "IID 1-shot", 0, copied.config_hash, dumped(copied), code,
                             {"test": {"accuracy": 0.5}}, 9999.0), "reused_from": "other/x.json"})
    smoke = cells(study, root, "smoke")[0]  # another budget's cell: its time does not count either
    store.put(make_record(study.name, "smoke", smoke.method, smoke.setting, smoke.seed, smoke.config_hash, dumped(smoke),
                          code,
                          {"test": {"accuracy": 0.5}}, 7777.0))
    typical = typical_seconds(store, {c.config_hash for c in grid.values()})
    assert typical == {("fl-proto", "IID 1-shot"): 80.0, ("fl-proto", "non-IID 1-shot"): 400.0,
                       ("fl-proto", None): 100.0}
    pending = [grid[("fl-proto", "non-IID 1-shot", 1)], grid[("fl-proto", "IID 1-shot", 1)]]
    assert time_left(pending, typical, []) == 480.0
    maml = grid[("fl-maml", "IID 1-shot", 1)]
    assert time_left(pending + [maml], typical, []) is None  # nothing known of fl-maml yet
    assert time_left(pending + [maml], typical, [30.0, 50.0]) == 520.0  # this sitting's mean for it
    # an interrupted run counts only the rounds it has left; one done (a copy) counts nothing
    rounds = pending[0].config.federation.rounds
    half = {pending[0].config_hash: rounds // 2, pending[1].config_hash: rounds}
    assert time_left(pending, typical, [], half) == pytest.approx(400.0 * (1 - (rounds // 2) / rounds))


def test_the_time_left_is_not_extrapolated_from_the_first_cell(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The first cell of a sitting carries one-off start-up (a sentence encoder, the data cache): with no
    stored time of the method, no estimate is made from it alone; from the second cell on, the cells
    after the first give it."""
    path = write_study(tmp_path, {**ONE_ROW, "seeds": [0, 1, 2]})
    code, _, err = run_cli(["study", "run", str(path), *_store_args(tmp_path)], capsys)
    assert code == 0, err
    first = next(line for line in err.splitlines() if line.startswith("[1/3]"))
    second = next(line for line in err.splitlines() if line.startswith("[2/3]"))
    assert "left" not in first and "left" in second, err
