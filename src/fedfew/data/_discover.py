"""Import every loader module in this package so that each registers itself."""

from __future__ import annotations

import importlib
import pkgutil

_SKIP = {"dataset", "registry", "bundled", "_discover", "__init__"}


def import_loaders() -> None:
    import fedfew.data as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in _SKIP:
            importlib.import_module(f"fedfew.data.{info.name}")
