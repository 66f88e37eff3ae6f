"""Plugins: a user's own Python file, imported before a config is validated, so that the datasets,
models, algorithms and partitions it registers (``@DATASETS.register("mydata")`` and the like) can
be named in a config.

    fedfew run my.yaml --plugin my_plugin.py        # or, in the config: plugins: [my_plugin.py]

A file is imported once per process under a module name unique to its path (the same file named
twice, or by a config and on the command line, is imported once). A missing file or an exception
while importing it is a :class:`PluginError` naming the file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType

from fedfew.core.errors import ConfigError

_LOADED: dict[Path, ModuleType] = {}
#: Plugins named on the command line (``--plugin``), recorded in every config the command loads.
_COMMAND_LINE: ContextVar[tuple[Path, ...]] = ContextVar("fedfew_command_line_plugins", default=())


class PluginError(ConfigError):
    """A plugin file is missing or failed to import; the message names the file and the problem."""


def _module_name(path: Path) -> str:
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    stem = "".join(ch if ch.isalnum() else "_" for ch in path.stem)
    return f"fedfew_plugin_{stem}_{digest}"


def _where(err: BaseException, path: Path) -> str:
    """' (line N)' for the deepest frame of the traceback that is in the plugin file."""
    lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if Path(f.filename) == path]
    return f" (line {lines[-1]})" if lines else ""


def load_plugin(path: str | Path) -> ModuleType:
    """Import the Python file ``path`` (once per process) and return its module."""
    file = Path(path).expanduser().resolve()
    if file in _LOADED:
        return _LOADED[file]
    if file.is_dir():
        found = sorted(p.name for p in file.glob("*.py"))
        raise PluginError(f"plugin {path}: is a folder, not a Python file; name the file ("
                          + (f"it holds {', '.join(found[:5])}" if found else "it holds no .py file") + ")")
    if not file.is_file():
        raise PluginError(f"plugin {path}: no such file")
    if file.suffix != ".py":
        raise PluginError(f"plugin {path}: expected a Python file ending in .py")
    name = _module_name(file)
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a spec
        raise PluginError(f"plugin {path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look the module up
    try:
        spec.loader.exec_module(module)
    except SystemExit as err:  # the plugin's own sys.exit(): not fedfew's exit code, and never silent
        del sys.modules[name]
        raise PluginError(f"plugin {file} called sys.exit({err.code!r}) while importing{_where(err, file)}") from None
    except Exception as err:  # the plugin's own code: any error is the plugin's
        del sys.modules[name]
        message = str(err).splitlines()[0] if str(err) else ""
        raise PluginError(
            f"plugin {file} failed to import: {type(err).__name__}{': ' + message if message else ''}{_where(err, file)}"
        ) from err
    _LOADED[file] = module
    return module


def load_plugins(paths: Iterable[str | Path], base: Path | None = None) -> list[str]:
    """Import every plugin (relative paths from ``base``, default the working directory); returns
    their absolute paths."""
    resolved = []
    for path in paths:
        if not isinstance(path, (str, Path)) or not str(path).strip():
            raise PluginError(f"plugins: each entry must be the path of a Python file, not {path!r}")
        file = Path(path).expanduser()
        if not file.is_absolute() and base is not None:
            file = base / file
        load_plugin(file)
        resolved.append(str(file.resolve()))
    return resolved


def config_plugins(listed: object, base: Path | None) -> list[str]:
    """A config's ``plugins`` (paths relative to ``base``, its folder) and the command line's,
    imported, as absolute paths without duplicates: what the validated config records."""
    if listed is None:
        listed = []
    elif isinstance(listed, str):
        listed = [listed]
    if not isinstance(listed, list):
        raise PluginError(f"plugins: expected a list of Python files, not {listed!r}")
    paths = load_plugins(listed, base) + [str(p) for p in _COMMAND_LINE.get()]
    return list(dict.fromkeys(paths))


@contextmanager
def command_line_plugins(paths: Iterable[str | Path]) -> Iterator[list[str]]:
    """Import ``paths`` (``--plugin``) and record them in every config loaded inside the block."""
    resolved = load_plugins(paths)
    token = _COMMAND_LINE.set(tuple(Path(p) for p in resolved))
    try:
        yield resolved
    finally:
        _COMMAND_LINE.reset(token)
