"""Reading the pickles some datasets are distributed as (CIFAR's python batches, mini-ImageNet's
caches) without letting a file run code: only numpy arrays and plain Python containers may be built.
A pickle that asks for anything else is refused as corrupt."""

from __future__ import annotations

import pickle
from typing import IO

#: (module, name) pairs a dataset pickle may reference: numpy's array reconstruction and dtypes.
ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("collections", "OrderedDict"),
}


class _DataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a dataset pickle holds only arrays and "
                                     "containers")


def load_data_pickle(f: IO[bytes], encoding: str = "bytes") -> object:
    """``pickle.load`` restricted to arrays and containers (see the module docstring)."""
    return _DataUnpickler(f, encoding=encoding).load()
