"""Reading the pickles datasets are distributed as (fedfew.data.safe_pickle): a pickle cannot run code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


def test_dataset_pickles_cannot_run_code(tmp_path: Path) -> None:
    import pickle

    from fedfew.data.dataset import DataError
    from fedfew.data.registry import load_dataset

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": Evil()}))
    with pytest.raises(DataError, match="batches.meta"):
        load_dataset("cifar10", tmp_path)
    assert not (tmp_path / "pwned").exists()
