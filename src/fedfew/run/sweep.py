"""Several runs: ``fedfew sweep`` (a config over a grid of values) and the comparison table and plot
that ``fedfew run`` writes for several configs."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import yaml

from fedfew.config.validation import ConfigError, ExperimentConfig, load_config, load_yaml, resolve_key
from fedfew.core.jsontypes import JSONValue
from fedfew.run.experiment import dataset_cache
from fedfew.run.folder import check_output_base, strict_json
from fedfew.run.results import RunSummary, markdown_table, plot_curves
from fedfew.run.runner import run_experiment, validate_all

__all__ = ["parse_grid", "sweep", "sweep_configs", "write_comparison"]


def parse_grid(items: list[str]) -> list[tuple[str, list[JSONValue]]]:
    """``key=v1,v2`` items -> [(key, [v1, v2])], values parsed as YAML (:func:`fedfew.core.yaml12.load_yaml`).
    A key given in two items, an empty value list or an empty value is refused: each would run points
    other than the labels say."""
    grid: list[tuple[str, list[JSONValue]]] = []
    seen: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid {item!r} must look like key=v1,v2,...")
        key, values = item.split("=", 1)
        key = key.strip()
        path = resolve_key(key)
        if path in seen:
            raise ConfigError(f"--grid {key}: {path} is already swept by --grid {seen[path]}; give its values in one "
                              "--grid (key=v1,v2)")
        seen[path] = item
        texts = values.split(",")
        if not values.strip() or any(not v.strip() for v in texts):
            raise ConfigError(f"--grid {key}: an empty value in {values!r}; give values separated by commas (null "
                              f"for none), e.g. --grid {key}=1,2")
        try:
            grid.append((key, [cast("JSONValue", load_yaml(v)) for v in texts]))
        except yaml.YAMLError as err:
            raise ConfigError(f"--grid {key}: values {values!r} are not valid YAML ({err})") from None
    return grid


def sweep_configs(config_path: str | Path | dict[str, object], grid: list[tuple[str, list[JSONValue]]],
                  overrides: list[str]) -> list[tuple[str, ExperimentConfig]]:
    """(label, config) for every point of the grid, all validated. A key both swept and set (``--set``) is
    refused, and so are two values of a key that resolve to the same config (``1,1.0``, ``0.001,1e-3``):
    each would label a point that did not run as asked."""
    keys = [k for k, _ in grid]
    set_keys = {resolve_key(o.split("=", 1)[0]): o for o in overrides if "=" in o}
    for key in keys:
        if resolve_key(key) in set_keys:
            raise ConfigError(f"--grid {key}: also set by --set {set_keys[resolve_key(key)]}; sweep it or set it, "
                              "not both")
    points = []
    resolved: dict[str, tuple[JSONValue, ...]] = {}
    for combo in itertools.product(*[v for _, v in grid]):
        assignments = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                       for k, v in zip(keys, combo)]
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, combo))
        try:
            config = load_config(config_path, overrides + assignments)
        except ConfigError as err:  # name the grid point: the other points may be fine
            raise ConfigError(f"grid point {', '.join(assignments)}: {err}") from None
        same = resolved.setdefault(_key(config), combo)
        if same is not combo:  # another point of the product: some value reads as one already swept
            key, a, b = next(((k, x, y) for k, x, y in zip(keys, same, combo) if x != y or type(x) is not type(y)
                              or x is not y), (keys[0], same[0], combo[0]))
            raise ConfigError(f"--grid {key}: {a!r} and {b!r} are the same value once read ({label}): the two "
                              "points would run the same config; give each value once")
        points.append((label, config))
    return points


def _key(config: ExperimentConfig) -> str:
    """What a point runs: its config without its name, the algorithm's options as read (``1e-3`` is 0.001)."""
    data = config.model_dump(mode="json")
    data.pop("name", None)
    data["algorithm"]["options"] = config.algorithm_options().model_dump(mode="json")
    return json.dumps(data, sort_keys=True)


def sweep(config_path: str | Path | dict[str, object], grid: list[tuple[str, list[JSONValue]]], overrides: list[str],
          out_base: str | Path, progress: bool = True) -> list[RunSummary]:
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


def write_comparison(summaries: Sequence[Mapping[str, Any]], folder: Path, title: str) -> str:
    check_output_base(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table = markdown_table(summaries, label_key="label")
    (folder / "results.md").write_text(f"# {title}\n\n{table}")
    plot_curves({str(s["label"]): s["history"] for s in summaries}, folder / "accuracy.png", title)
    with (folder / "summaries.jsonl").open("w") as f:
        for s in summaries:
            f.write(strict_json({k: v for k, v in s.items() if k != "history"}) + "\n")
    return table
