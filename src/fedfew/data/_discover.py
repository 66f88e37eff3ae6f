"""Import every loader module in this package so that each registers itself."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

_SKIP = {"dataset", "registry", "bundled", "_discover", "__init__"}


def import_loaders() -> None:
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):  # this package's folder
        if info.name not in _SKIP:
            importlib.import_module(f"fedfew.data.{info.name}")
