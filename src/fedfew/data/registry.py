"""Dataset registry and data-folder resolution."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fedfew.core.registry import Registry
from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset

Loader = Callable[..., LabelledDataset]
DATASETS: Registry[Loader] = Registry("dataset")

#: Datasets that need no data folder (they ship inside fedfew or a pip dependency).
BUNDLED = ("digits", "mnist5k", "omniglot-mini")


def default_data_root() -> Path:
    """``$FEDFEW_DATA`` if set, else ``./data``."""
    return Path(os.environ.get("FEDFEW_DATA", "data")).expanduser()


def data_root(root: str | Path | None) -> tuple[Path, str]:
    """The data folder and where it came from: ``root`` if given (``dataset.root``, also set by
    ``--set dataset.root=PATH``), else ``$FEDFEW_DATA``, else ``./data``."""
    if root is not None:
        folder, where = Path(root).expanduser(), "dataset.root"
    elif os.environ.get("FEDFEW_DATA"):
        folder, where = default_data_root(), "$FEDFEW_DATA"
    else:
        folder, where = default_data_root(), "the default ./data"
    if folder.exists() and not folder.is_dir():  # else every dataset would be "missing" under a file
        raise DataError(f"data folder {folder} ({where}) is a file, not a folder: set "
                        f"{where if where != 'the default ./data' else 'dataset.root or $FEDFEW_DATA'} to the folder "
                        "that holds the datasets")
    return folder, where


def load_dataset(name: str, root: str | Path | None = None, **options: object) -> LabelledDataset:
    """Load dataset ``name`` from ``root`` (default: :func:`default_data_root`).

    ``options`` go to the loader (for example ``image_size=28`` for Omniglot); an option the loader
    does not take is a :class:`DataError` naming the ones it does. ``class_split`` (any dataset)
    replaces the loader's base/val/novel classes: see :mod:`fedfew.data.splits`.
    """
    from fedfew.data.splits import apply_class_split
    from fedfew.data.text_datasets import refit_vocabulary

    class_split = options.pop("class_split", None)
    loader = DATASETS.get(name)
    path, origin = data_root(root)
    try:
        dataset = loader(path, **options)
    except DataNotFoundError as err:
        if name not in BUNDLED and origin != "dataset.root":
            # say which data folder was searched and how to name another
            err.args = (f"{err} (data folder {path}: {origin}; set dataset.root or $FEDFEW_DATA)",)
        raise
    except TypeError as err:
        if "unexpected keyword argument" in str(err):
            import inspect

            allowed = [p for p in inspect.signature(loader).parameters if p != "root"] + ["class_split"]
            raise DataError(
                f"dataset {name!r} got an unknown option ({err}); it takes: {', '.join(allowed)}"
            ) from None
        raise
    if class_split is not None:  # the one place a user's class split is applied, for every dataset
        dataset = refit_vocabulary(apply_class_split(dataset, class_split))
    return dataset
