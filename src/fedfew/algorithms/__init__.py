"""Every algorithm module in this package registers itself in :data:`fedfew.engine.ALGORITHMS`."""

import importlib
import pkgutil

from fedfew.engine.algorithm import ALGORITHMS

_HELPERS = {"common", "episodic", "batched_episodic", "optimizers"}

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in _HELPERS and not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["ALGORITHMS"]
