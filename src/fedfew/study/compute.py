"""The compute every study spent, from its store: the block between ``<!-- studies:compute begin -->`` and
its end marker (docs/results.md, "Compute"). Per study and budget with stored runs: the cells stored, the
seeds, the runs' summed wall time and CPU time, the machines that ran them and the code version."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from fedfew.study.collect import StudyResults
from fedfew.study.store import StudyRecord
from fedfew.study.study_file import Study

NOT_RECORDED = "not recorded"
#: Trademark marks and generic words a CPU's brand string carries that say nothing about which machine it is.
_BRAND_NOISE = re.compile(r"\((R|TM)\)|\bProcessor\b|\bCPU\b|@.*$|\d+-Core", re.IGNORECASE)


def machine_name(environment: object) -> str:
    """A record's machine, short: the GPU on a GPU run, else the CPU's brand without its marks
    ("Intel(R) Xeon(R) Processor" -> "Intel Xeon"); "not recorded" for a record without an environment."""
    if not isinstance(environment, Mapping):
        return NOT_RECORDED
    if environment.get("device") == "cuda":
        return str(environment.get("gpu") or "an unknown GPU")
    cpu = environment.get("cpu")
    return " ".join(_BRAND_NOISE.sub(" ", str(cpu)).split()) if cpu else "an unknown CPU"


def own_records(results: StudyResults) -> list[StudyRecord]:
    """The records of the runs this study ran (not those copied from another study's store, counted there)."""
    return [record for record in results.run_records if not record.get("reused_from")]


def machines(records: list[StudyRecord]) -> str:
    """Runs by machine, most first: "Intel Xeon 30, not recorded 12"."""
    counts = Counter(machine_name(record.get("environment")) for record in records)
    ranked = sorted(counts.items(), key=lambda item: (item[0] == NOT_RECORDED, -item[1], item[0]))
    return ", ".join(f"{name} {n}" for name, n in ranked) or "—"


def cpu_seconds(records: list[StudyRecord]) -> tuple[float, int, int]:
    """The runs' CPU time (every thread of a run's process), summed over the records that keep it; how
    many do, and how many runs there are (records written before it was kept have none)."""
    kept = [float(cpu) for record in records if isinstance(cpu := record.get("cpu_seconds"), (int, float))]
    return sum(kept), len(kept), len(records)


def cpu_minutes(records: list[StudyRecord]) -> str:
    """The runs' CPU time in minutes, with how many runs it covers where some records predate it."""
    seconds, kept, runs = cpu_seconds(records)
    if kept == 0:
        return "—"
    covered = "" if kept == runs else f" ({kept} of {runs} runs)"
    return f"{seconds / 60:.1f}{covered}"


def _code(results: StudyResults) -> str:
    code = results.code.source if results.code else "—"
    older = sorted(src for src in results.sources if results.code and src != results.code.source)
    if older:
        code += f" ({sum(results.sources[src] for src in older)} records of {', '.join(older)}, verified equal)"
    return code


def compute_table(studies: dict[str, tuple[Study, Path]], root: Path,
                  results_of: Callable[[str, str | None], StudyResults]) -> str:
    """Per study and budget: cells in the store of all, seeds, the runs' summed wall time (one process
    each, as `fedfew study run` runs them; a run copied from another study's store counts there only),
    their CPU time where the records hold it, the machines and the code version. The docs budget comes
    first, always; another budget has a row when it holds runs no earlier row of its study counted (a
    run two budgets share, the same config, counts once, at the first)."""
    lines = ["| study | budget | cells in the store | seeds | compute (run wall time, min) | CPU time (min) | "
             "machines (runs) | code |",
             "|---|---|---|---|---|---|---|---|"]
    total_wall = total_cpu = 0.0
    for name, (study, path) in sorted(studies.items(), key=lambda item: str(item[1][1])):
        counted: set[str] = set()
        for budget in [study.docs_budget, *(b for b in study.budgets if b != study.docs_budget)]:
            results = results_of(name, budget)
            runs = [r for r in own_records(results) if r["config_hash"] not in counted]
            if budget != study.docs_budget and not runs:
                continue
            counted |= {r["config_hash"] for r in runs}
            wall = sum(float(r.get("wall_seconds", 0.0)) for r in runs)
            total_wall += wall
            total_cpu += cpu_seconds(runs)[0]
            lines.append(f"| `{path.relative_to(root)}` | {budget} | {results.cells_found}/{results.cells_total} | "
                         f"{', '.join(map(str, results.seeds)) or '—'} | {wall / 60:.1f} | "
                         f"{cpu_minutes(runs)} | {machines(runs)} | {_code(results)} |")
    lines.append(f"| all | | | | {total_wall / 60:.1f} | {total_cpu / 60:.1f} (runs that recorded it) | | |")
    return "\n".join(lines) + "\n"
