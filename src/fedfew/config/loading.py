"""Config text in and out: a YAML file (or a dict) read into the data a config is checked from, with its
``key=value`` overrides (``--set`` on the command line: a key is a dotted path, ``federation.rounds=50``, or
where unambiguous a bare field name, ``rounds=50``), and a checked config written back as YAML. Checking
the data is :mod:`fedfew.config.validation`'s, which re-exports the names callers use (``apply_override``,
``resolve_key``, ``dump_config``)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import BaseModel

from fedfew.core.config_schema import ExperimentSchema
from fedfew.core.errors import ConfigError
from fedfew.core.yaml12 import MAX_BYTES, DuplicateKeyError, TooLargeError, YamlNumberError, load_yaml

#: The note of options dropped by a changed choice keeps the logger of :mod:`fedfew.config.validation`,
#: where loading was before it had a module of its own: a study view quiets that logger by name.
logger = logging.getLogger("fedfew.config.validation")


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
    if "." not in key and key not in ExperimentSchema.model_fields:
        matches = [p for p in _leaf_paths(ExperimentSchema) if p.split(".")[-1] == key]
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


def read_config(source: str | Path | Mapping[str, object] | None = None,
                overrides: list[str] | None = None) -> dict[str, object]:
    """The data of a config before it is checked: read from a YAML path (a relative ``episodes.test_tasks``
    made relative to the file) or copied from a dict, the ``key=value`` overrides applied, its plugins
    imported, the keys a file must set checked, and the options a changed choice does not take dropped
    (:func:`fedfew.config.validation.load_config` then validates it)."""
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
    return data


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
    from fedfew.interface.registration import ALGORITHMS
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
            logger.warning(note)


def dump_config(config: ExperimentSchema) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
