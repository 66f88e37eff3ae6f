"""Dataset registry and data-folder resolution."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedfew.data.dataset import DataError, LabelledDataset
from fedfew.registry import Registry

Loader = Callable[..., LabelledDataset]
DATASETS: Registry[Loader] = Registry("dataset")

#: Datasets that need no data folder (they ship inside a pip dependency).
BUNDLED = ("digits", "mnist5k")


def default_data_root() -> Path:
    """``$FEDFEW_DATA`` if set, else ``./data``."""
    return Path(os.environ.get("FEDFEW_DATA", "data")).expanduser()


def load_dataset(name: str, root: str | Path | None = None, **options: Any) -> LabelledDataset:
    """Load dataset ``name`` from ``root`` (default: :func:`default_data_root`).

    ``options`` go to the loader (for example ``image_size=28`` for Omniglot); an option the loader
    does not take is a :class:`DataError` naming the ones it does.
    """
    loader = DATASETS.get(name)
    path = Path(root).expanduser() if root is not None else default_data_root()
    try:
        return loader(path, **options)
    except TypeError as err:
        if "unexpected keyword argument" in str(err):
            import inspect

            allowed = [p for p in inspect.signature(loader).parameters if p != "root"]
            raise DataError(
                f"dataset {name!r} got an unknown option ({err}); it takes: {', '.join(allowed) or 'none'}"
            ) from None
        raise
