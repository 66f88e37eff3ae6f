"""The compute every study spent, from its store: the block between ``<!-- studies:compute begin -->`` and
its end marker (docs/results.md, "Compute"). Per study at its docs budget: the cells stored, the seeds, the
runs' summed wall time and CPU time, the machines that ran them and the code version."""

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


def machines(results: StudyResults) -> str:
    """The study's own runs by machine, most first: "Intel Xeon 30, not recorded 12"."""
    counts = Counter(machine_name(record.get("environment")) for record in own_records(results))
    ranked = sorted(counts.items(), key=lambda item: (item[0] == NOT_RECORDED, -item[1], item[0]))
    return ", ".join(f"{name} {n}" for name, n in ranked) or "—"


def cpu_seconds(results: StudyResults) -> tuple[float, int, int]:
    """The study's own runs' CPU time (every thread of a run's process), summed over the records that keep
    it; how many do, and how many runs there are (records written before it was kept have none)."""
    own = own_records(results)
    kept = [float(cpu) for record in own if isinstance(cpu := record.get("cpu_seconds"), (int, float))]
    return sum(kept), len(kept), len(own)


def cpu_minutes(results: StudyResults) -> str:
    """The runs' CPU time in minutes, with how many runs it covers where some records predate it."""
    seconds, kept, own = cpu_seconds(results)
    if kept == 0:
        return "—"
    covered = "" if kept == own else f" ({kept} of {own} runs)"
    return f"{seconds / 60:.1f}{covered}"


def compute_table(studies: dict[str, tuple[Study, Path]], root: Path,
                  results_of: Callable[[str], StudyResults]) -> str:
    """Per study, at its docs budget: cells in the store of all, seeds, the runs' summed wall time
    (one process each, as `fedfew study run` runs them; a run copied from another study's store counts
    there only), their CPU time where the records hold it, the machines and the code version."""
    lines = ["| study | budget | cells in the store | seeds | compute (run wall time, min) | CPU time (min) | "
             "machines (runs) | code |",
             "|---|---|---|---|---|---|---|---|"]
    total_wall = total_cpu = 0.0
    for name, (_, path) in sorted(studies.items(), key=lambda item: str(item[1][1])):
        results = results_of(name)
        total_wall += results.wall_seconds
        total_cpu += cpu_seconds(results)[0]
        code = results.code.source if results.code else "—"
        older = sorted(src for src in results.sources if results.code and src != results.code.source)
        if older:
            code += f" ({sum(results.sources[src] for src in older)} records of {', '.join(older)}, verified equal)"
        lines.append(f"| `{path.relative_to(root)}` | {results.budget} | {results.cells_found}/{results.cells_total} | "
                     f"{', '.join(map(str, results.seeds)) or '—'} | {results.wall_seconds / 60:.1f} | "
                     f"{cpu_minutes(results)} | {machines(results)} | {code} |")
    lines.append(f"| all | | | | {total_wall / 60:.1f} | {total_cpu / 60:.1f} (runs that recorded it) | | |")
    return "\n".join(lines) + "\n"
