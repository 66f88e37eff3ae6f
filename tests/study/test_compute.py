"""The compute block (fedfew.study.compute): each study's wall and CPU time and machines, from its records."""

from __future__ import annotations

from pathlib import Path

from fedfew.study.collect import collect
from fedfew.study.compute import compute_table, machine_name
from fedfew.study.grid import cells
from fedfew.study.store import ResultStore, make_record
from fedfew.study.study_file import load_study
from tests.study.common import DIGITS_STUDY, HANDMADE, dumped, write_study

INTEL = {"cpu": "Intel(R) Xeon(R) Processor", "device": "cpu", "torch": "2.13.0+cpu"}
AMD = {"cpu": "AMD EPYC 7B13 64-Core Processor", "device": "cpu", "torch": "2.13.0+cpu"}


def test_a_machine_is_its_cpu_without_marks_or_its_gpu() -> None:
    assert machine_name(INTEL) == "Intel Xeon"
    assert machine_name(AMD) == "AMD EPYC 7B13"
    assert machine_name({"cpu": "Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz"}) == "Intel Core i7-8700"
    assert machine_name({"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "cpu": "AMD EPYC"}) == "NVIDIA H100 80GB HBM3"
    assert machine_name(None) == "not recorded"
    assert machine_name({"device": "cpu"}) == "an unknown CPU"


def test_the_table_sums_each_studys_wall_and_cpu_time_and_counts_its_machines(tmp_path: Path) -> None:
    """Eight cpu runs (both methods): four on the Intel machine (CPU 30 s each), three on the AMD one (CPU 90 s
    each), one older record with neither: wall 8 x 60 s = 8.0 min, CPU 390 s = 6.5 min over 7 of 8 runs."""
    path = write_study(tmp_path, DIGITS_STUDY, "digits.yaml")
    study, root = load_study(path)
    store = ResultStore(tmp_path / "store", study.name)
    usages = [{"environment": INTEL, "cpu_seconds": 30.0}] * 4 + [{"environment": AMD, "cpu_seconds": 90.0}] * 3 + [{}]
    grid = [cell for cell in cells(study, root, "cpu") if cell.method in ("fl-proto", "fl-maml")]
    assert len(grid) == len(usages)
    for cell, usage in zip(grid, usages):
        store.put(make_record(study.name, "cpu", cell.method, cell.setting, cell.seed, cell.config_hash, dumped(cell),
                              HANDMADE, {"test": {"accuracy": 0.5}}, 60.0, usage=usage))  # type: ignore[arg-type]
    results = collect(study, root, tmp_path / "store", "cpu")
    table = compute_table({study.name: (study, path)}, root, lambda name, budget=None: results)
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[1] == ("| `digits.yaml` | cpu | 8/12 | 0, 1 | 8.0 | 6.5 (7 of 8 runs) | "
                       "Intel Xeon 4, AMD EPYC 7B13 3, not recorded 1 | handmade0000 |")
    assert rows[2] == "| all | | | | 8.0 | 6.5 (runs that recorded it) | | |"


def test_every_budget_with_runs_of_its_own_has_a_row_and_a_shared_run_counts_once(tmp_path: Path) -> None:
    """The docs budget (cpu) first; smoke, whose cells are other configs, a row of its own; a budget whose
    runs are all the cpu budget's (the same configs) no row, so the total counts each run once."""
    path = write_study(tmp_path, {**DIGITS_STUDY, "budgets": {**DIGITS_STUDY["budgets"],
                                                           "cpu-again": {"set": {"federation.rounds": 2}, "seeds": [0]}}}, "digits.yaml")
    study, root = load_study(path)
    store = ResultStore(tmp_path / "store", study.name)
    for budget, wall in (("smoke", 6.0), ("cpu", 60.0)):  # the controls (round 0) are one run in both: cpu's
        for cell in cells(study, root, budget):
            store.put(make_record(study.name, budget, cell.method, cell.setting, cell.seed, cell.config_hash,
                                  dumped(cell), HANDMADE, {"test": {"accuracy": 0.5}}, wall,
                                  usage={"environment": AMD, "cpu_seconds": wall}))  # type: ignore[arg-type]
    table = compute_table({study.name: (study, path)}, root,
                          lambda name, budget=None: collect(study, root, tmp_path / "store", budget))
    rows = [line.split(" | ")[1:5] for line in table.splitlines() if line.startswith("| `")]
    smoke = {c.config_hash for c in cells(study, root, "smoke")}
    cpu = {c.config_hash for c in cells(study, root, "cpu")}
    only_smoke = smoke - cpu
    assert len(cpu) == 12 and 0 < len(only_smoke) < len(smoke)  # shared: the controls
    assert [row[:2] for row in rows] == [["cpu", "12/12"], ["smoke", f"{len(smoke)}/{len(smoke)}"]]
    assert rows[0][3] == "12.0" and rows[1][3] == f"{len(only_smoke) * 0.1:.1f}"  # cpu-again: no row
    total = table.splitlines()[-1]
    assert total.startswith(f"| all | | | | {12 + len(only_smoke) * 0.1:.1f} |")
