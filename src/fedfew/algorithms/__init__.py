"""The registered algorithms, one module each; their shared and per-paper parts are in
:mod:`fedfew.algorithms.parts`. :func:`register_all` imports every algorithm module here, each of which
registers itself in :data:`fedfew.interface.algorithm.ALGORITHMS`. Importing the package (which importing
any of its modules, the parts' too, runs first) registers nothing by itself."""

import importlib
import pkgutil


def register_all() -> None:
    """Import every algorithm module of this package (each registers itself); a no-op after the first."""
    for info in pkgutil.iter_modules(__path__):
        if not info.ispkg and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


__all__ = ["register_all"]
