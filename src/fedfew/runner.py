"""Run one experiment (or several) end to end, with a progress bar and a results folder."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import yaml

from fedfew.config import ExperimentConfig, load_config
from fedfew.experiment import build_experiment
from fedfew.results import markdown_table, plot_curves, run_folder, write_run


def run_experiment(config: ExperimentConfig, out_base: str | Path | None = None, progress: bool | None = None,
                   label: str | None = None) -> dict[str, Any]:
    """Build and run ``config``; write its folder under ``out_base`` (default runtime.output_dir).
    Returns the summary with the run's history and folder."""
    show = config.runtime.progress if progress is None else progress
    start = time.perf_counter()
    experiment = build_experiment(config)
    simulator = experiment.simulator()
    bar = None
    if show:
        from tqdm.auto import tqdm

        bar = tqdm(total=config.federation.rounds, desc=label or config.algorithm.name, unit="round",
                   leave=True, dynamic_ncols=True)

    def on_round(r: int, record: dict[str, float]) -> None:
        if bar is None:
            return
        shown = {k.replace("train_", ""): f"{v:.3f}" for k, v in record.items()
                 if k in ("train_loss", "train_accuracy", "val_accuracy", "test_accuracy")}
        bar.set_postfix(shown, refresh=False)
        bar.update(1)

    outcome = simulator.run(config.federation.rounds, config.federation.clients_per_round,
                            config.eval.every, config.eval.track_test, on_round)
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - start
    folder = run_folder(out_base or config.runtime.output_dir, config.name)
    summary = write_run(folder, config, outcome, seconds)
    summary.update({"history": outcome["history"], "folder": str(folder), "label": label or config.name})
    summary["_simulator"] = simulator
    return summary


def parse_grid(items: list[str]) -> list[tuple[str, list[Any]]]:
    """``key=v1,v2`` items -> [(key, [v1, v2])], values parsed as YAML."""
    grid = []
    for item in items:
        if "=" not in item:
            raise ValueError(f"--grid {item!r} must look like key=v1,v2,...")
        key, values = item.split("=", 1)
        grid.append((key.strip(), [yaml.safe_load(v) for v in values.split(",")]))
    return grid


def sweep(config_path: str | Path | dict[str, Any], grid: list[tuple[str, list[Any]]], overrides: list[str],
          out_base: str | Path, progress: bool = True) -> list[dict[str, Any]]:
    """Run every combination of the grid; write a combined table and plot under ``out_base``."""
    summaries = []
    keys = [k for k, _ in grid]
    for combo in itertools.product(*[v for _, v in grid]):
        assignments = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                       for k, v in zip(keys, combo)]
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, combo))
        config = load_config(config_path, overrides + assignments)
        summaries.append(run_experiment(config, Path(out_base) / "runs", progress, label=label))
    write_comparison(summaries, Path(out_base), "sweep")
    return summaries


def write_comparison(summaries: list[dict[str, Any]], folder: Path, title: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    table = markdown_table(summaries, label_key="label")
    (folder / "results.md").write_text(f"# {title}\n\n{table}")
    plot_curves({s["label"]: s["history"] for s in summaries}, folder / "accuracy.png", title)
    import json

    with (folder / "summaries.jsonl").open("w") as f:
        for s in summaries:
            f.write(json.dumps({k: v for k, v in s.items() if k not in ("history", "_simulator")}) + "\n")
    return table
