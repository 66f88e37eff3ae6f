"""Experiment configuration: a YAML file validated by a schema, and its names checked against the
registries.

Unknown keys, wrong types and impossible combinations are :class:`ConfigError` naming the key and
what is allowed. Any value can be overridden with ``key=value`` (``--set`` on the command line);
a key is a dotted path (``federation.rounds=50``) or, where unambiguous, a bare field name
(``rounds=50``).

The schema (sections, fields, defaults, the checks a config's own values decide) is
:mod:`fedfew.core.config_schema`, at the foundations; :class:`ExperimentConfig` here extends it with what
needs the registries: the dataset, partition, model, algorithm and engine named, their options, the
engine's constraints and the fault rounding (those across sections are :mod:`fedfew.config.constraints`).
Reading the YAML and applying the overrides is :mod:`fedfew.config.loading`; :func:`load_config` reads
there and checks here. This module sits above the registries it checks against (docs/architecture.md);
the sections, and the loading module's names, are re-exported from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError, model_validator

from fedfew.config.constraints import check_engine, check_privacy, check_rounds, check_secure_aggregation
from fedfew.config.loading import apply_override, dump_config, read_config, resolve_key
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
from fedfew.core.yaml12 import DuplicateKeyError, load_yaml

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
        from fedfew.interface.registration import ALGORITHMS
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
        check_engine(self)
        check_rounds(self)
        check_privacy(self)
        check_secure_aggregation(self)
        return self

    def engine_options(self) -> BaseModel:
        from fedfew.config.engines import ENGINES

        return ENGINES.get(self.runtime.engine).Options.model_validate(self.runtime.engine_options)

    def algorithm_options(self) -> BaseOptions:
        from fedfew.interface.registration import ALGORITHMS

        return ALGORITHMS.get(self.algorithm.name).Options.model_validate(self.algorithm.options)


def load_config(source: str | Path | Mapping[str, object] | None = None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read and validate a config from a YAML path or a dict, applying ``key=value`` overrides."""
    data = read_config(source, overrides)  # fedfew.config.loading: the file read, the overrides applied
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        where = f"config file {source}: " if isinstance(source, (str, Path)) else ""  # which one of a batch
        raise ConfigError(where + format_errors(err, model=ExperimentConfig)) from None
