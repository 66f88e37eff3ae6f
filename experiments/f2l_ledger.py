"""The F2L ledger (docs/f2l.md, "Ledger"): every difference between the paper's F2L and ours, each
measured on its own against the reference row at the paper's budget, over seeds.

    .venv/bin/python experiments/f2l_ledger.py run [--rows base eq3_paper ...] [--seeds 0 1 2]
    .venv/bin/python experiments/f2l_ledger.py report [--write]

``run`` runs each row of configs/f2l/ledger/ (default: all) for each seed, one run folder per
(row, seed) under runs/f2l-ledger/<row>/ (``fedfew sweep <row>.yaml --grid seed=...`` does the
same); a (row, seed) already there is skipped. ``--set KEY=VALUE`` overrides every row (a quick
check, e.g. ``--set federation.rounds=2``; such runs go to ``--out`` elsewhere, never mixed with the
paper-budget runs). ``report`` reads the run folders and prints the ledger table: per row, the test
accuracy of the validation-selected round and of the last round (mean over seeds), and the effect
against the row's reference (the mean of the per-seed differences, with a 95% t-interval over
seeds: the same seed gives both rows the same tasks); ``--write`` puts it into docs/f2l.md between
the ``ledger:start`` / ``ledger:end`` markers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEDGER = REPO / "configs" / "f2l" / "ledger"
PAGE = REPO / "docs" / "f2l.md"
#: two-sided 95% Student t quantiles by degrees of freedom (seeds - 1)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def header(path: Path, key: str) -> str | None:
    found = re.search(rf"^# {key}: (.*)$", path.read_text(), flags=re.M)
    return found.group(1).strip() if found else None


def difference(path: Path) -> str:
    """The row's change from its reference (its "# changes:" line), "reference" for a reference row."""
    changes = header(path, "changes")
    if reference_of(path) is None:
        return "(a reference row)"
    return (changes or "").replace("algorithm.options.", "").replace(";", ",")


def reference_of(path: Path) -> str | None:
    ref = header(path, "reference") or ("(none)" if header(path, "changes") == "(none)" else "base.yaml")
    return None if ref == "(none)" else Path(ref).stem


def run(rows: list[str], seeds: list[int], out: Path, overrides: list[str]) -> None:
    from fedfew.config import load_config
    from fedfew.runner import run_experiment

    for row in rows:
        for seed in seeds:
            if seed in scores(out / row):
                continue
            config = load_config(LEDGER / f"{row}.yaml", [*overrides, f"seed={seed}"])
            summary = run_experiment(config, out / row / "runs", progress=False, label=f"{row} seed={seed}")
            print(f"{row} seed={seed}: {100 * summary['test']['accuracy']:.2f}", flush=True)


def scores(folder: Path) -> dict[int, dict[str, float]]:
    """seed -> {"selected": test accuracy of the selected round, "last": of the last round, "seconds"}."""
    found: dict[int, dict[str, float]] = {}
    for summary_path in sorted(folder.glob("runs/*/summary.json")):
        summary = json.loads(summary_path.read_text())
        history = [json.loads(line) for line in (summary_path.parent / "metrics.jsonl").read_text().splitlines()
                   if line.strip()]
        tested = [r for r in history if "test_accuracy" in r]
        found[int(summary["seed"])] = {
            "selected": float(summary["test"]["accuracy"]),
            "last": float(tested[-1]["test_accuracy"]) if tested else float("nan"),
            "selected_round": float(summary["selected_round"]),
            "seconds": float(summary.get("seconds", float("nan"))),
        }
    return found


def mean_t95(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, T95.get(n - 1, 1.96) * sd / math.sqrt(n)


def cell(values: list[float]) -> str:
    if not values:
        return "pending"
    mean, half = mean_t95([100 * v for v in values])
    return f"{mean:.1f}" if math.isnan(half) else f"{mean:.1f} ± {half:.1f}"


def effect(row: dict[int, dict[str, float]], ref: dict[int, dict[str, float]], key: str) -> str:
    common = sorted(set(row) & set(ref))
    if not common:
        return "pending"
    return cell([row[s][key] - ref[s][key] for s in common]).replace("pending", "")


def report(out: Path) -> str:
    lines = ["| row (config) | change from the reference | reference | seeds | selected round: test % | "
             "effect (points) | last round: test % | effect (points) | seconds per run |",
             "|---|---|---|---|---|---|---|---|---|"]
    results = {p.stem: scores(out / p.stem) for p in sorted(LEDGER.glob("*.yaml"))}
    for path in sorted(LEDGER.glob("*.yaml"), key=lambda p: (p.stem != "base", p.stem)):
        row, ref = path.stem, reference_of(path)
        got = results[row]
        selected = [v["selected"] for v in got.values()]
        last = [v["last"] for v in got.values()]
        seconds = [v["seconds"] for v in got.values()]
        command = f"`fedfew sweep configs/f2l/ledger/{row}.yaml --grid seed=0,1,2 --out runs/f2l-ledger/{row}`"
        lines.append(" | ".join([
            f"| {row}", difference(path), ref or "—", str(len(got)) if got else f"pending: {command}",
            cell(selected), effect(got, results[ref], "selected") if ref else "—", cell(last),
            effect(got, results[ref], "last") if ref else "—",
            f"{sum(seconds) / len(seconds):.0f}" if seconds else "—"]) + " |")
    return "\n".join(lines)


def splice(text: str) -> None:
    page = PAGE.read_text()
    start, end = "<!-- ledger:start -->", "<!-- ledger:end -->"
    if start not in page or end not in page:
        raise SystemExit(f"{PAGE} has no {start} ... {end} markers")
    head, rest = page.split(start, 1)
    _, tail = rest.split(end, 1)
    PAGE.write_text(f"{head}{start}\n{text}\n{end}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--rows", nargs="*", help="row names (config stems); default: every row")
    r.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    r.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    r.add_argument("--out", default=str(REPO / "runs" / "f2l-ledger"))
    p = sub.add_parser("report")
    p.add_argument("--out", default=str(REPO / "runs" / "f2l-ledger"))
    p.add_argument("--write", action="store_true", help="put the table into docs/f2l.md")
    args = parser.parse_args()
    out = Path(args.out)
    if args.command == "run":
        if args.set and out == REPO / "runs" / "f2l-ledger":
            raise SystemExit("--set changes the rows: give another --out, so the paper-budget runs stay apart")
        run(args.rows or [p.stem for p in sorted(LEDGER.glob("*.yaml"))], args.seeds, out, args.set)
    text = report(out)
    print(text)
    if args.command == "report" and args.write:
        splice(text)


if __name__ == "__main__":
    os.environ.setdefault("FEDFEW_DATA", str(REPO.parent / "shared" / "data"))
    main()
