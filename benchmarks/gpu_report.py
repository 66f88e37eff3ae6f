"""The GPU section's tables of docs/performance.md, from the files a device call of
benchmarks/gpu_checks.sh brought back (committed under benchmarks/results/<card>-<date>/).

    python benchmarks/gpu_report.py benchmarks/results/h100-2026-11-27

Prints markdown: every algorithm on the device against the CPU (cuda_vs_cpu*.json), the peers'
workload on the same GPU (peers_cuda.json: steady seconds a round, episodes a second, wall time, as
medians over the alternated pairs) and the stored study cell re-run on the device (cell*.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def one(folder: Path, pattern: str) -> dict[str, Any] | None:
    found = sorted(folder.glob(pattern))
    return json.loads(found[-1].read_text()) if found else None


def table_head(*columns: str) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def algorithms_table(rows: dict[str, Any]) -> list[str]:
    out = table_head("algorithm", "loss, largest relative difference", "test accuracy cpu / cuda",
                     "batched on cuda: loss difference")
    for name, row in rows.items():
        if "error" in row:
            out.append(f"| {name} | error: {row['error'][:80]} | | |")
            continue
        d = row["device_vs_cpu"]
        batched = row.get("batched_vs_cpu")
        batched_text = f"{batched['loss_rel']:.1e}" if batched else "no batched update"
        out.append(f"| {name} | {d['loss_rel']:.1e} | {row['cpu']['test'].get('accuracy', 0):.3f} / "
                   f"{row['device']['test'].get('accuracy', 0):.3f} | "
                   f"{batched_text} |")
    return out


def peers_table(data: dict[str, Any]) -> list[str]:
    rows = data["rows"]
    names = ["peer"] + list(data["variants"])
    peer_round = statistics.median(r["peer"]["round"] for r in rows)
    # every run of the workload trains the same episodes a round; fedfew's rows record how many
    episodes = next(v["episodes_per_round"] for v in rows[0].values() if "episodes_per_round" in v)
    out = table_head("run", "steady s/round, median (min-max)", "episodes/s", "speed vs the loop", "wall s, median",
                     "test accuracy (pair 1)")
    for name in names:
        rounds = [r[name]["round"] for r in rows if name in r]
        walls = [r[name]["wall"] for r in rows if name in r]
        median = statistics.median(rounds)
        label = "the loop (loop_pfllib_style.py --device cuda)" if name == "peer" else f"fedfew {name}"
        out.append(f"| {label} | {median:.3f} ({min(rounds):.3f}-{max(rounds):.3f}) | {episodes / median:.0f} | "
                   f"{peer_round / median:.2f}x | {statistics.median(walls):.1f} | "
                   f"{100 * rows[0][name]['acc']:.2f} ± {100 * rows[0][name]['ci95']:.2f} |")
    return out


def cell_lines(cell: dict[str, Any]) -> list[str]:
    rounds = cell["device_rounds"]
    gaps = [b["seconds"] - a["seconds"] for a, b in zip(rounds, rounds[1:])]
    cpu = cell["cpu_stored"]
    last = rounds[-1] if rounds else None
    lines = [f"- stored CPU cell {cpu['config_hash']} (code {cpu['code']['source']}): accuracy "
             f"{100 * cpu['accuracy']:.2f}, {cpu['wall_seconds']:.0f} s for the whole run",
             f"- on the device: {len(rounds)} rounds logged, {statistics.median(gaps):.2f} s a round "
             f"(median; min {min(gaps):.2f}, max {max(gaps):.2f})" if gaps else "- on the device: no round logged"]
    if cell.get("device_summary"):
        lines.append(f"- device accuracy {100 * cell['device_summary']['test']['accuracy']:.2f}")
    elif last:
        lines.append(f"- the run was stopped at its time limit after round {last['round']} (train loss {last['train_loss']:.4f})")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    folder = parser.parse_args().folder
    for title, data, render in (("Every algorithm, 2 rounds, cuda against cpu", one(folder, "cuda_vs_cpu*.json"), algorithms_table),
                                ("The peers' workload on the same GPU", one(folder, "peers_cuda*.json"), peers_table),
                                ("A stored study cell at its budget on the GPU", one(folder, "cell*.json"), cell_lines)):
        if data is not None:
            print(f"### {title}\n")
            print("\n".join(render(data)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
