"""Run folders: the resolved config, metrics per round (JSON lines), a summary, a markdown table and
an accuracy-versus-round plot."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from fedfew.config import ExperimentConfig, dump_config


def run_folder(base: str | Path, name: str) -> Path:
    """A new folder ``base/<name>-<YYYYmmdd-HHMMSS>[-k]``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
    folder = Path(base) / f"{slug}-{stamp}"
    k = 1
    while folder.exists():
        k += 1
        folder = Path(base) / f"{slug}-{stamp}-{k}"
    folder.mkdir(parents=True)
    return folder


def summarise(config: ExperimentConfig, outcome: dict[str, Any], seconds: float) -> dict[str, Any]:
    comm = outcome["comm"]
    return {
        "name": config.name,
        "algorithm": config.algorithm.name,
        "dataset": config.dataset.name,
        "task": config.task,
        "seed": config.seed,
        "rounds": config.federation.rounds,
        "selected_round": outcome["selected_round"],
        "test": outcome["test"],
        "bytes_down": sum(comm.down),
        "bytes_up": sum(comm.up),
        "seconds": round(seconds, 2),
    }


def format_accuracy(test: dict[str, float]) -> str:
    if "accuracy" not in test:
        return "n/a"
    text = f"{100 * test['accuracy']:.2f}"
    if "ci95" in test:
        text += f" ± {100 * test['ci95']:.2f}"
    return text


def markdown_table(summaries: list[dict[str, Any]], label_key: str = "name") -> str:
    lines = [
        f"| {label_key} | algorithm | test accuracy (%) ± 95% CI | selected round | MB sent (down+up) | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for s in summaries:
        mb = (s["bytes_down"] + s["bytes_up"]) / 1e6
        lines.append(
            f"| {s.get(label_key, s['name'])} | {s['algorithm']} | {format_accuracy(s['test'])} | "
            f"{s['selected_round']}/{s['rounds']} | {mb:.2f} | {s['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot_curves(histories: dict[str, list[dict[str, float]]], path: Path, title: str = "") -> bool:
    """Accuracy versus round for each labelled history (validation accuracy where measured, else
    test). Returns False when no history holds an accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for label, history in histories.items():
        for key, style in (("val_accuracy", "-"), ("test_accuracy", "--")):
            points = [(h["round"], 100 * h[key]) for h in history if key in h]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, style, marker="o", markersize=3, label=f"{label} ({key.split('_')[0]})")
                drawn = True
    if drawn:
        ax.set_xlabel("round")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn


def write_run(folder: Path, config: ExperimentConfig, outcome: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Write the run's files into ``folder`` and return its summary."""
    (folder / "config.yaml").write_text(dump_config(config))
    with (folder / "metrics.jsonl").open("w") as f:
        for record in outcome["history"]:
            f.write(json.dumps(record) + "\n")
    summary = summarise(config, outcome, seconds)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (folder / "results.md").write_text(f"# {config.name}\n\n" + markdown_table([summary]))
    plot_curves({config.algorithm.name: outcome["history"]}, folder / "accuracy.png", config.name)
    return summary
