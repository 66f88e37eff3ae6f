"""Several runs: ``fedfew sweep`` (a config over a grid of values) and the comparison table and plot
that ``fedfew run`` writes for several configs."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import cast

import yaml

from fedfew.config import ConfigError, ExperimentConfig, load_config
from fedfew.experiment import dataset_cache
from fedfew.jsontypes import JSONObject, JSONValue
from fedfew.results import markdown_table, plot_curves
from fedfew.runfolder import check_output_base, strict_json
from fedfew.runner import run_experiment, validate_all

__all__ = ["parse_grid", "sweep", "sweep_configs", "write_comparison"]


def parse_grid(items: list[str]) -> list[tuple[str, list[JSONValue]]]:
    """``key=v1,v2`` items -> [(key, [v1, v2])], values parsed as YAML."""
    grid = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid {item!r} must look like key=v1,v2,...")
        key, values = item.split("=", 1)
        try:
            grid.append((key.strip(), [yaml.safe_load(v) for v in values.split(",")]))
        except yaml.YAMLError:
            raise ConfigError(f"--grid {key.strip()}: values {values!r} are not valid YAML") from None
    return grid


def sweep_configs(config_path: str | Path | dict[str, object], grid: list[tuple[str, list[JSONValue]]],
                  overrides: list[str]) -> list[tuple[str, ExperimentConfig]]:
    """(label, config) for every point of the grid, all validated."""
    keys = [k for k, _ in grid]
    points = []
    for combo in itertools.product(*[v for _, v in grid]):
        assignments = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                       for k, v in zip(keys, combo)]
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, combo))
        try:
            points.append((label, load_config(config_path, overrides + assignments)))
        except ConfigError as err:  # name the grid point: the other points may be fine
            raise ConfigError(f"grid point {', '.join(assignments)}: {err}") from None
    return points


def sweep(config_path: str | Path | dict[str, object], grid: list[tuple[str, list[JSONValue]]], overrides: list[str],
          out_base: str | Path, progress: bool = True) -> list[JSONObject]:
    """Run every combination of the grid (each validated first); write a combined table and plot
    under ``out_base``."""
    points = sweep_configs(config_path, grid, overrides)
    validate_all([c for _, c in points], Path(out_base) / "runs")
    summaries = []
    with dataset_cache():
        for label, config in points:
            summaries.append(run_experiment(config, Path(out_base) / "runs", progress, label=label))
    write_comparison(summaries, Path(out_base), "sweep")
    return summaries


def write_comparison(summaries: list[JSONObject], folder: Path, title: str) -> str:
    check_output_base(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table = markdown_table(summaries, label_key="label")
    (folder / "results.md").write_text(f"# {title}\n\n{table}")
    plot_curves({str(s["label"]): cast("list[dict[str, float]]", s["history"]) for s in summaries}, folder / "accuracy.png", title)
    with (folder / "summaries.jsonl").open("w") as f:
        for s in summaries:
            f.write(strict_json({k: v for k, v in s.items() if k not in ("history", "_simulator")}) + "\n")
    return table
