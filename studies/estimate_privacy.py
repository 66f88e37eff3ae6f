"""Compute estimate of studies/privacy_fewshot.yaml's budgets (docs/privacy-study.md), before any of its
runs is stored, from the cross-paper benchmark's stored runs of the same methods and settings:

    python studies/estimate_privacy.py

Each cell of a budget is given the median wall time of the benchmark's stored runs of its method and
setting (the setting's name without ", eps E"; an untrained row: the benchmark's untrained row of the
same head, FL-MAML's: the benchmark's control), times the clients a round it trains over the
benchmark's 10 for trained rows (the work of a round grows with its clients; evaluation does not, so
this over-counts a little). DP's clipping and noise and the membership-inference attack (500 pairs,
a test evaluation's size) are not in the benchmark's times: measured on two cells (FL-MAML Omniglot
1-shot and FedFSL-MI-Adv FEMNIST 5-shot at eps 4: 16 s and 121 s against the benchmark's 14 s and
138 s) they are within the machine's noise, and 25% is added for them. One process, one thread."""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from fedfew.study.estimate import duration
from fedfew.study.grid import cells
from fedfew.study.study_file import load_study

ROOT = Path(__file__).resolve().parents[1]
#: This study's untrained rows -> the benchmark's row with the same head at round 0.
BENCHMARK_ROW = {"FL-Proto, untrained": "FL-Proto, untrained", "FL-MAML, untrained": "control",
                 "FedFSL-MI-Adv, untrained": "FedFSL, untrained"}
OVERHEAD = 1.25


def benchmark_times() -> dict[tuple[str, str], float]:
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for path in (ROOT / "studies" / "store" / "benchmark-fewshot").glob("*.json"):
        record = json.loads(path.read_text())
        if "reused_from" not in record and record.get("budget") in ("cpu", "cpu-omniglot", "cpu-femnist", "headline"):
            times[(record["method"], record["setting"])].append(float(record["wall_seconds"]))
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> None:
    study, root = load_study(ROOT / "studies" / "privacy_fewshot.yaml")
    times = benchmark_times()
    budgets = sys.argv[1:] or [b for b in study.budgets if b != "cpu-mia"]
    print("| budget | runs | estimate (one process) |")
    print("|---|---|---|")
    for budget in budgets:
        total, runs = 0.0, 0
        for cell in cells(study, root, budget):
            source = BENCHMARK_ROW.get(cell.method, cell.method)
            seconds = times.get((source, cell.setting.rsplit(", eps", 1)[0]))
            if seconds is None:
                raise SystemExit(f"no benchmark time for {source} / {cell.setting}")
            trained = cell.config.federation.rounds > 0
            scale = cell.config.federation.clients_per_round / 10 if trained else 1.0
            if budget == "smoke":  # 1 round of 3 clients, 4 test tasks: the round-0 control's time is the floor
                seconds, scale = times.get((BENCHMARK_ROW["FL-Proto, untrained"], cell.setting.rsplit(", eps", 1)[0]),
                                           seconds), 1.0
            total += seconds * scale * OVERHEAD
            runs += 1
        print(f"| {budget} | {runs} | {duration(total)} |")


if __name__ == "__main__":
    main()
