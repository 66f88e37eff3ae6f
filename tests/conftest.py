"""Shared fixtures. Tests that need the real datasets in ../shared/data skip cleanly without them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def shared_data_root() -> Path | None:
    env = os.environ.get("FEDFEW_SHARED_DATA")
    root = Path(env) if env else REPO.parent / "shared" / "data"
    return root if root.is_dir() else None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = shared_data_root()
    if root is None:
        pytest.skip("../shared/data is not present (set FEDFEW_SHARED_DATA to point at it)")
    return root


@pytest.fixture(autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)
