"""From a study and a budget to its cells: one resolved, validated experiment config per
(method, setting, seed), plus the untrained control per (setting, seed)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fedfew.config.validation import (
    ConfigError,
    ExperimentConfig,
    PrivacyConfig,
    SecureAggregationConfig,
    load_config,
)
from fedfew.core.jsontypes import JSONValue
from fedfew.study.study_file import Study
from fedfew.study.study_sections import CONTROL, StudyError

#: Config values that change how fast or where a run goes (or when a diverging run stops: a stopped run
#: stores no record), never its numbers: left out of a cell's key so a study can be continued with more
#: workers or on another machine's data folder.
NOT_IN_KEY = {"dataset": ("root",), "runtime": ("threads", "output_dir", "progress", "checkpoint_every",
                                                 "client_states", "workers", "engine", "divergence"),
              "flower": ("round_timeout", "startup_timeout", "port", "tls", "node_auth")}

#: Config fields added after records were stored, with the default that reproduces the older runs: a
#: field at that value is left out of the key, so every stored cell keeps its key; any other value
#: (the new behaviour, opt-in) is part of it.
NEUTRAL_DEFAULTS: dict[tuple[str, ...], JSONValue] = {("eval", "per_class"): False, ("eval", "initial"): "always",
                                                ("eval", "membership_inference"): None,
                                                ("runtime", "compile"): "off",
                                                ("episodes", "train_way"): None, ("episodes", "train_query"): None,
                                                ("privacy",): PrivacyConfig().model_dump(mode="json"),
                                                ("flower", "secure_aggregation"):
                                                    SecureAggregationConfig().model_dump(mode="json")}


@dataclass(frozen=True)
class Cell:
    method: str  # a method name, or CONTROL
    setting: str
    seed: int
    config: ExperimentConfig

    @property
    def config_hash(self) -> str:
        return config_hash(self.config)

    @property
    def title(self) -> str:
        return f"{self.method} / {self.setting} / seed {self.seed}"


def config_hash(config: ExperimentConfig) -> str:
    """A short hash of the parts of a resolved config that decide its numbers."""
    return dump_hash(config.model_dump(mode="json"))


def dump_hash(dump: Mapping[str, JSONValue]) -> str:
    """:func:`config_hash` of a config's JSON dump (a store record's ``config``: a record is checked
    against the hash of its own config, not only its file name)."""
    data = json.loads(json.dumps(dump))  # a deep copy
    data.pop("name", None)  # the label of the run folder, made from the cell's names
    for section, keys in NOT_IN_KEY.items():
        for key in keys:
            data.get(section, {}).pop(key, None)
    # The engine's options go with the engine (left out above): `--set runtime.workers=N` becomes
    # engine: workers with engine_options {workers: N}. Kept as {} rather than dropped, so every stored
    # cell (all with engine_options {}) keeps its key.
    if "engine_options" in data.get("runtime", {}):
        data["runtime"]["engine_options"] = {}
    for path, neutral in NEUTRAL_DEFAULTS.items():
        *parents, key = path
        holder = data
        for part in parents:
            holder = holder.get(part, {})
        if key in holder and _is_neutral(holder[key], neutral):
            del holder[key]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _is_neutral(value: JSONValue, neutral: JSONValue) -> bool:
    """Whether a config value is its neutral default. A whole section (a mapping) is neutral when every
    field it holds is at the default: a record written before a field was added to the section holds the
    section without it, and is as neutral as a new config holding the field at its default."""
    if isinstance(neutral, dict):
        return isinstance(value, dict) and set(value) <= set(neutral) \
            and all(_is_neutral(item, neutral[name]) for name, item in value.items())
    return type(value) is type(neutral) and value == neutral


def assignments(overrides: Mapping[str, object]) -> list[str]:
    """``{key: value}`` -> ``["key=value"]`` with the value written as JSON (which is YAML)."""
    return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise StudyError(f"--seeds {text!r}: give integers separated by commas, e.g. --seeds 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise StudyError(f"--seeds {text!r}: give one or more distinct integers, e.g. --seeds 0,1,2")
    return seeds


def cells(study: Study, root: Path, budget_name: str, seeds: list[int] | None = None,
          extra: list[str] | None = None) -> list[Cell]:
    """Every cell of ``study`` at ``budget_name``, each config validated (nothing runs). Method-major
    order (as the table reads); the control cells come last."""
    budget = study.budget(budget_name)
    seeds = seeds or budget.seeds or study.seeds
    methods = budget.methods or list(study.methods)
    settings = budget.settings or list(study.settings)
    out = []
    for method in methods:
        for setting in settings:
            for seed in seeds:
                out.append(Cell(method, setting, seed, _config(study, root, method, setting, seed, budget.set,
                                                                extra, budget_method=budget.per_method.get(
                                                                    study.source_of(method)))))
    if study.control is not None and budget.control:
        for setting in settings:
            for seed in seeds:
                out.append(Cell(CONTROL, setting, seed, _config(study, root, study.control.method, setting, seed,
                                                                 budget.set, extra, control=True,
                                                                 budget_method=budget.per_method.get(study.control.method))))
    return out


@lru_cache(maxsize=4096)
def _load(path: Path, mtime_ns: int, overrides: tuple[str, ...]) -> ExperimentConfig:
    """``load_config``, remembered per (file, its modification time, overrides): a report and the docs
    resolve the same hundreds of cells (configs are never modified in place; cells copy them)."""
    return load_config(path, list(overrides))


def _config(study: Study, root: Path, method: str, setting: str, seed: int, budget_set: Mapping[str, object],
            extra: list[str] | None, control: bool = False,
            budget_method: Mapping[str, object] | None = None) -> ExperimentConfig:
    # An untrained_of row is its method's cell at round 0: that method's config, set and per-setting entries.
    untrained, source = study.methods[method].untrained, study.source_of(method)
    m, s = study.methods[source], study.settings[setting]
    base = m.config or s.config or study.config
    if base is None:
        raise StudyError(f"study {study.name}: method {method!r} has no config (set `config` on the study, "
                         "the setting or the method)")
    path = Path(base) if Path(base).is_absolute() else root / base
    overrides = [*assignments(study.set), *assignments(s.set), *assignments(m.set),
                 *assignments(s.per_method.get(source, {})), *assignments(budget_set),
                 *assignments(budget_method or {}),  # the budget's per_method entry: none adds nothing
                 *(extra or []), f"seed={seed}"]
    if control or untrained:
        overrides.append("federation.rounds=0")
    try:
        config = _load(path, path.stat().st_mtime_ns if path.is_file() else 0, tuple(overrides))
    except ConfigError as err:
        cell = f"{'control' if control else method} / {setting}"
        raise StudyError(f"study {study.name}, cell {cell}: {' '.join(str(err).split())}") from None
    return config.model_copy(update={"name": f"{study.name}-{'control' if control else method}-{setting}-s{seed}"
                                     .replace(" ", "_")})
