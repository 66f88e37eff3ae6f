"""Datasets: one in-memory type, a registry of loaders, transforms and text tools."""

from fedfew.data import (
    _discover,
    bundled,  # noqa: F401  (registers digits, mnist5k)
)
from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset
from fedfew.data.registry import BUNDLED, DATASETS, default_data_root, load_dataset

_discover.import_loaders()

__all__ = [
    "BUNDLED",
    "DATASETS",
    "DataError",
    "DataNotFoundError",
    "LabelledDataset",
    "default_data_root",
    "load_dataset",
]
