"""Experiment configuration: a YAML file validated by a schema, and its names checked against the
registries.

Unknown keys, wrong types and impossible combinations are :class:`ConfigError` naming the key and
what is allowed. Any value can be overridden with ``key=value`` (``--set`` on the command line);
a key is a dotted path (``federation.rounds=50``) or, where unambiguous, a bare field name
(``rounds=50``).

The schema (sections, fields, defaults, the checks a config's own values decide) is
:mod:`fedfew.core.config_schema`, at the foundations; :class:`ExperimentConfig` here extends it with what
needs the registries: the dataset, partition, model, algorithm and engine named, their options, the
engine's constraints and the fault rounding. This module sits above the registries it checks against
(docs/architecture.md); the sections are re-exported from here.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, ValidationError, model_validator

from fedfew.core.config_schema import (
    MAX_CLIENTS,
    MAX_EPISODES,
    MAX_ROUNDS,
    AdaptiveClipConfig,
    AlgorithmConfig,
    ClassificationConfig,
    DatasetConfig,
    DivergenceConfig,
    EpisodeConfig,
    EvalConfig,
    ExperimentSchema,
    FederationConfig,
    FlowerConfig,
    FlowerSimConfig,
    HeldOutTest,
    ModelConfig,
    PartitionConfig,
    PrivacyConfig,
    RuntimeConfig,
    Section,
    SecureAggregationConfig,
    SplitConfig,
    format_errors,
)
from fedfew.core.errors import ConfigError
from fedfew.core.yaml12 import MAX_BYTES, DuplicateKeyError, TooLargeError, YamlNumberError, load_yaml

__all__ = ["ConfigError", "DuplicateKeyError", "ExperimentConfig", "apply_override", "dump_config", "load_config",
           "load_yaml", "resolve_key",
           # the schema's sections, re-exported (fedfew.core.config_schema)
           "MAX_CLIENTS", "MAX_EPISODES", "MAX_ROUNDS", "AdaptiveClipConfig", "AlgorithmConfig", "ClassificationConfig",
           "DatasetConfig", "DivergenceConfig", "EpisodeConfig", "EvalConfig", "ExperimentSchema", "FederationConfig",
           "FlowerConfig", "FlowerSimConfig", "HeldOutTest", "ModelConfig", "PartitionConfig", "PrivacyConfig",
           "RuntimeConfig", "SecureAggregationConfig", "Section", "SplitConfig"]

if TYPE_CHECKING:
    from fedfew.interface.algorithm import BaseOptions


class ExperimentConfig(ExperimentSchema):
    """A config checked against the registries as well as the schema (:class:`ExperimentSchema`):
    the names it gives, their options, and what the named engine and the fault draw allow."""

    @model_validator(mode="after")
    def _check_names(self) -> ExperimentConfig:
        from fedfew.algorithms import register_all
        register_all()  # the built-in algorithms, registered
        from fedfew.config.engines import ENGINES
        from fedfew.core.registry import RegistryError
        from fedfew.core.signature_options import options_schema
        from fedfew.data import DATASETS
        from fedfew.fewshot.partition import PARTITIONS
        from fedfew.interface.algorithm import ALGORITHMS
        from fedfew.models import MODELS

        for key, registry, name in (
            ("dataset.name", DATASETS, self.dataset.name),
            ("partition.name", PARTITIONS, self.partition.name),
            ("model.name", MODELS, self.model.name),
            ("algorithm.name", ALGORITHMS, self.algorithm.name),
            ("runtime.engine", ENGINES, self.runtime.engine),
        ):
            try:
                registry.get(name)
            except RegistryError as err:
                raise ValueError(f"{key}: {err}") from None
        options_model = ALGORITHMS.get(self.algorithm.name).Options
        try:
            options_model.model_validate(self.algorithm.options)
        except ValidationError as err:
            raise ValueError(format_errors(err, prefix="algorithm.options", model=options_model, header=False)) from None
        from fedfew.fewshot.corruption import parse as parse_corruption
        from fedfew.fewshot.corruption import split_options

        # ``corrupt`` (fedfew.fewshot.corruption) is taken by every partitioner: checked here, not by their schemas.
        partition_options, corrupt = split_options(self.partition.options)
        parse_corruption(corrupt, self.partition.num_clients)
        for key, registry, name, options, skip in (
            ("partition.options", PARTITIONS, self.partition.name, partition_options,
             ("labels", "num_clients", "rng", "groups")),
            ("model.options", MODELS, self.model.name, self.model.options, ("input_shape", "num_classes")),
        ):
            schema = options_schema(registry.get(name), skip)
            try:
                schema.model_validate(options)
            except ValidationError as err:
                raise ValueError(format_errors(err, prefix=key, model=schema, header=False)) from None
        from fedfew.core.tracking import check_loggers

        check_loggers(self.runtime.loggers)
        engine_options = ENGINES.get(self.runtime.engine).Options
        try:
            engine_options.model_validate(self.runtime.engine_options)
        except ValidationError as err:
            raise ValueError(format_errors(err, prefix="runtime.engine_options", model=engine_options, header=False)) from None
        if self.runtime.compile != "off" and self.runtime.engine != "inprocess":
            raise ValueError(f"runtime.compile compiles the clients' step in this process: set runtime.engine: "
                             f"inprocess (got {self.runtime.engine}) or runtime.compile: off")
        if self.runtime.batch_clients and self.runtime.engine != "inprocess":
            raise ValueError("runtime.batch_clients runs a round's clients together in this process: set "
                             "runtime.engine: inprocess")
        if self.runtime.device != "cpu" and self.runtime.engine != "inprocess":
            raise ValueError("runtime.device=cuda/auto runs the clients in this process (one GPU): set "
                             "runtime.engine: inprocess")
        fpr = self.federation.clients_per_round
        if isinstance(fpr, int) and fpr > self.partition.num_clients:
            raise ValueError(
                f"federation.clients_per_round={fpr} exceeds partition.num_clients={self.partition.num_clients}"
            )
        if isinstance(fpr, float) and fpr > 1.0:
            raise ValueError("federation.clients_per_round as a fraction must be in (0, 1]")
        self._check_replies()
        self._check_privacy()
        self._check_secure_aggregation()
        return self

    def engine_options(self) -> BaseModel:
        from fedfew.config.engines import ENGINES

        return ENGINES.get(self.runtime.engine).Options.model_validate(self.runtime.engine_options)

    def _check_replies(self) -> None:
        """Some client must reply in every round: the fault counts are rounded exactly as the fault
        draw rounds them (engine.Faults.counts) for the round size the schedule uses."""
        from fedfew.engine.base import Faults
        from fedfew.engine.schedule import round_size

        f = self.federation
        if f.dropout == 0 and f.stragglers == 0:
            return
        asked = round_size(self.partition.num_clients, f.clients_per_round)
        failed, late = Faults(f.dropout, f.stragglers).counts(asked)
        if asked - failed - late <= 0:
            raise ValueError(
                f"federation.dropout={f.dropout} and federation.stragglers={f.stragglers} leave no client to reply "
                f"in a round of {asked} (federation.clients_per_round={f.clients_per_round}, partition.num_clients="
                f"{self.partition.num_clients}): {failed} fail and {late} are late; lower them or ask more clients")

    def _check_privacy(self) -> None:
        """What privacy settings contradict in the rest of the config (the algorithm's upload is
        checked when it is built: fedfew.privacy.check_algorithm)."""
        p = self.privacy
        if not p.enabled:
            return
        from fedfew.config.engines import ENGINES
        from fedfew.engine.schedule import round_size

        clients = self.partition.num_clients
        if p.delta is not None and p.delta >= 1 / clients:
            raise ValueError(f"privacy.delta={p.delta:g} must be below 1 / partition.num_clients = {1 / clients:g}: "
                             "a delta that large allows leaking one client's data outright")
        engine = ENGINES.get(self.runtime.engine)
        if not getattr(engine, "honours_privacy", False):
            raise ValueError(f"privacy: runtime.engine={self.runtime.engine} does not run client updates through "
                             "fedfew's client task (fedfew.engine.tasks.run_client_task), where updates are clipped: "
                             "use inprocess, workers, flower or flower-sim")
        if p.adaptive_clip is not None and self.algorithm.name == "frl":  # before the count's noise: it never runs
            raise ValueError("privacy.adaptive_clip: algorithm frl runs with a fixed clip only: adaptive clipping of "
                             "its R + 1 releases per episode is not implemented (remove privacy.adaptive_clip)")
        if p.adaptive_clip is not None and p.noise_multiplier is not None:
            from fedfew.privacy.mechanism import adaptive_clip_refusal

            m = round_size(clients, self.federation.clients_per_round)
            count_noise = p.adaptive_clip.count_noise or m / 20
            if 2 * count_noise <= p.noise_multiplier:
                raise ValueError(adaptive_clip_refusal(count_noise, p.noise_multiplier, m,
                                                       p.adaptive_clip.count_noise is None))
        if p.noise == "seeded" and self.runtime.engine == "flower" and "noise" not in p.model_fields_set:
            # Real parties hold the config on the deployment engine: reproducible noise only when asked for
            # (the default is secure, so this guards a default that would ever change, or a plugin's).
            raise ValueError("privacy.noise: seeded noise on runtime.engine=flower would let every party holding the "
                             "config regenerate it: set privacy.noise: seeded explicitly (research only) or secure")
        if p.accounting == "poisson" and self.flower.secure_aggregation.enabled:
            raise ValueError("privacy.accounting=poisson: a Poisson round may ask fewer than the 2 clients secure "
                             "aggregation needs, and SecAgg+ tells each client its neighbours: use "
                             "privacy.accounting: without_replacement or none")

    def _check_secure_aggregation(self) -> None:
        """What ``flower.secure_aggregation`` needs of the engine, the algorithm, the rounds and privacy
        (the protocol's own values are checked by :class:`SecureAggregationConfig`)."""
        s = self.flower.secure_aggregation
        if not s.enabled:
            return
        from fedfew.config.engines import ENGINES
        from fedfew.engine.base import Faults
        from fedfew.engine.schedule import round_size
        from fedfew.interface.algorithm import ALGORITHMS
        from fedfew.privacy.secure_sum import protocol_sizes, refusal

        key = "flower.secure_aggregation"
        if not getattr(ENGINES.get(self.runtime.engine), "honours_secure_aggregation", False):
            raise ValueError(f"{key}: runtime.engine={self.runtime.engine} cannot honour it (its server would see each "
                             "client's upload): use runtime.engine: flower or flower-sim")
        reason = refusal(ALGORITHMS.get(self.algorithm.name), self.algorithm_options())
        if reason is not None:
            raise ValueError(f"{key}: algorithm {self.algorithm.name} cannot run with secure aggregation: {reason}")
        f = self.federation
        if f.stragglers > 0:
            raise ValueError(f"{key}: federation.stragglers={f.stragglers} drops replies after they arrive, but a masked "
                             "sum cannot drop one client's part: set federation.stragglers: 0")
        asked = round_size(self.partition.num_clients, f.clients_per_round)
        summed = asked - Faults(f.dropout, f.stragglers).counts(asked)[0]
        if summed < 2:
            raise ValueError(f"{key}: a round sums {summed} client(s) (federation.clients_per_round, federation.dropout); "
                             "secure aggregation needs at least 2")
        if isinstance(s.num_shares, int) and s.num_shares > asked:
            raise ValueError(f"{key}.num_shares={s.num_shares} exceeds the {asked} clients of a round")
        shares, threshold = protocol_sizes(summed, s.num_shares, s.reconstruction_threshold)
        if threshold > shares:
            raise ValueError(f"{key}.reconstruction_threshold={s.reconstruction_threshold} asks {threshold} shares of "
                             f"the {shares} each client makes in a round of {summed}: lower it")
        if asked * s.quantization_range >= s.modulus_range:
            raise ValueError(f"{key}.quantization_range={s.quantization_range}: the sum of {asked} clients' quantised "
                             f"values would wrap around modulus_range={s.modulus_range}: lower it or raise modulus_range")
        p = self.privacy
        if p.enabled and p.client_metrics:
            raise ValueError(f"{key}: privacy.client_metrics sends each client's training metrics beside the masked "
                             "sum: set it to false")
        if p.enabled and p.clip is not None and p.clip > s.clipping_range:
            raise ValueError(f"{key}.clipping_range={s.clipping_range:g} is below privacy.clip={p.clip:g}: a clipped "
                             "update's coordinates reach the clip; raise it")
        if p.adaptive_clip is not None and not float(s.quantization_range / (2 * s.clipping_range)).is_integer():
            raise ValueError(f"{key}: with privacy.adaptive_clip, quantization_range / (2 clipping_range) must be an "
                             "integer, so that each client's within-the-clip bit is summed exactly (e.g. the defaults "
                             "2^22 and 8)")

    def algorithm_options(self) -> BaseOptions:
        from fedfew.interface.algorithm import ALGORITHMS

        return ALGORITHMS.get(self.algorithm.name).Options.model_validate(self.algorithm.options)


def read_config_text(path: Path) -> str:
    """The text of the config file ``path``, or a :class:`ConfigError` saying what is wrong with it."""
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder, not a YAML file")
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:  # refused unread: a config is a few KiB
            raise ConfigError(f"config file {path} is {size:,} bytes, above the {MAX_BYTES:,} a config may hold; "
                              "is it the right file?")
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte 0x{data[err.start]:02x} at position "
                          f"{err.start}); save it as UTF-8") from None


def _leaf_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths += _leaf_paths(annotation, f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{name}")
    return paths


def resolve_key(key: str) -> str:
    """The dotted path an override key names: itself, or the one field a bare name is (``rounds`` ->
    ``federation.rounds``); a :class:`ConfigError` for an ambiguous, unknown or malformed key."""
    key = key.strip()
    if not key or any(not part.strip() for part in key.split(".")):
        raise ConfigError(f"override key {key!r} has an empty part: write a dotted path such as federation.rounds")
    if "." not in key and key not in ExperimentConfig.model_fields:
        matches = [p for p in _leaf_paths(ExperimentConfig) if p.split(".")[-1] == key]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise ConfigError(f"override key {key!r} is ambiguous: use one of {', '.join(matches)}")
        raise ConfigError(f"override key {key!r} is unknown; use a dotted path such as federation.rounds")
    return key


def apply_override(data: dict[str, object], assignment: str) -> None:
    """Apply one ``key=value`` override in place; the value is parsed as YAML."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like key=value (e.g. federation.rounds=50)")
    key, raw = assignment.split("=", 1)
    key = key.strip()
    try:
        value = load_yaml(raw) if raw.strip() else None
    except (DuplicateKeyError, YamlNumberError, TooLargeError) as err:
        raise ConfigError(f"--set {key.strip()}: value {raw!r}: {err}") from None
    except yaml.YAMLError as err:
        problem = str(getattr(err, "problem", None) or err).splitlines()[0]
        raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({problem}); quote strings, "
                          "e.g. key='[1, 2]' for a list") from None
    key = resolve_key(key)
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        section = node.setdefault(part, {})
        if not isinstance(section, dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
        node = section
    node[parts[-1]] = value


def load_config(source: str | Path | Mapping[str, object] | None = None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read and validate a config from a YAML path or a dict, applying ``key=value`` overrides."""
    if source is None:
        data: dict[str, object] = {}
    elif isinstance(source, Mapping):
        data = yaml.safe_load(yaml.safe_dump(dict(source)))  # a deep copy
    else:
        path = Path(source)
        text = read_config_text(path)
        try:
            loaded = load_yaml(text)
        except DuplicateKeyError as err:
            raise ConfigError(f"config file {path}: {err}; remove one of them") from None
        except (YamlNumberError, TooLargeError) as err:
            raise ConfigError(f"config file {path}: {err}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
        if loaded is None:
            raise ConfigError(f"config file {path} is empty: a config sets at least {', '.join(REQUIRED_KEYS)} "
                              "(see src/fedfew/configs/demo.yaml)")
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded
        episodes = data.get("episodes")
        tasks = episodes.get("test_tasks") if isinstance(episodes, dict) else None
        if isinstance(episodes, dict) and isinstance(tasks, str) and not Path(tasks).is_absolute():
            episodes["test_tasks"] = str((path.parent / tasks).resolve())  # relative to the config file
    before = {section: _name_and_options(data, section) for section in _CHOICES}
    for assignment in overrides or []:
        apply_override(data, assignment)
    from fedfew.config.plugins import config_plugins

    # Before validation: a plugin registers the names the config may use.
    data["plugins"] = config_plugins(data.get("plugins"), Path(source).parent if isinstance(source, (str, Path)) else None)
    if isinstance(source, (str, Path)):
        _check_required(data, Path(source))
    for section, (name, options) in before.items():
        _drop_stale_options(data, section, name, options)
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        where = f"config file {source}: " if isinstance(source, (str, Path)) else ""  # which one of a batch
        raise ConfigError(where + format_errors(err, model=ExperimentConfig)) from None


_NOTED: set[str] = set()

#: What a config file (with its --set overrides) must say itself: a run on the defaults of these would
#: be a run nobody asked for (an empty file used to train fl-maml on digits for 50 rounds).
REQUIRED_KEYS = ("task", "dataset.name", "algorithm.name")


def _check_required(data: dict[str, object], path: Path) -> None:
    missing = []
    for key in REQUIRED_KEYS:
        node: object = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            missing.append(key)
    if missing:
        raise ConfigError(f"config file {path} does not set {', '.join(missing)}: a config names its task "
                          "(fewshot or classification), dataset and algorithm itself (defaults would run an "
                          "experiment nobody asked for)")

#: Sections whose options belong to the registered choice they sit beside: section -> (the key naming
#: the choice, the key of its options).
_CHOICES = {"partition": ("name", "options"), "model": ("name", "options"), "algorithm": ("name", "options"),
            "runtime": ("engine", "engine_options")}


def _name_and_options(data: dict[str, object], section: str) -> tuple[object, object]:
    node = data.get(section)
    if not isinstance(node, dict):
        return None, None
    name_key, options_key = _CHOICES[section]
    options = node.get(options_key)
    return node.get(name_key, "inprocess" if section == "runtime" else None), copy.deepcopy(options)


def _accepted_options(section: str, name: str) -> set[str] | None:
    """The option names ``name`` accepts in ``section`` (None: unknown name, left to validation)."""
    from fedfew.algorithms import register_all
    register_all()  # the built-in algorithms, registered
    from fedfew.config.engines import ENGINES
    from fedfew.core.registry import RegistryError
    from fedfew.core.signature_options import options_schema
    from fedfew.fewshot.partition import PARTITIONS
    from fedfew.interface.algorithm import ALGORITHMS
    from fedfew.models import MODELS

    try:
        if section == "algorithm":
            return set(ALGORITHMS.get(name).Options.model_fields)
        if section == "runtime":
            return set(ENGINES.get(name).Options.model_fields)
        if section == "partition":  # ``corrupt`` belongs to no partitioner and suits them all
            from fedfew.fewshot.corruption import KEY

            return {KEY, *options_schema(PARTITIONS.get(name), ("labels", "num_clients", "rng", "groups")).model_fields}
        return set(options_schema(MODELS.get(name), ("input_shape", "num_classes")).model_fields)
    except RegistryError:
        return None


def _drop_stale_options(data: dict[str, object], section: str, old_name: object, old_options: object) -> None:
    """The rule for changing a choice from the command line (``--set partition.name=iid``): when an
    override changed ``SECTION.name``, the options the file gave the old choice that the new one does not
    take are dropped, with a logged note. An option set by an override is kept and validated as usual,
    so a mistyped one is still an error, and so is one in a file whose choice was not changed. The same
    holds for ``runtime.engine`` and its ``runtime.engine_options``."""
    name, options = _name_and_options(data, section)
    if name == old_name or not isinstance(name, str) or not isinstance(options, dict):
        return
    accepted = _accepted_options(section, name)
    if accepted is None:
        return
    from_file = old_options if isinstance(old_options, dict) else {}
    dropped = sorted(k for k in options if k not in accepted and k in from_file and from_file[k] == options[k])
    if dropped:
        name_key, options_key = _CHOICES[section]
        section_data = data[section]
        if isinstance(section_data, dict):  # it is: _name_and_options found the options in it
            section_data[options_key] = {k: v for k, v in options.items() if k not in dropped}
        note = (f"{section}.{name_key} changed from {old_name} to {name}: dropped the options it does not take "
                f"({', '.join(f'{section}.{options_key}.{k}' for k in dropped)})")
        if note not in _NOTED:  # once per process: a study resolves the same change for many cells
            _NOTED.add(note)
            logging.getLogger(__name__).warning(note)


def dump_config(config: ExperimentConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
