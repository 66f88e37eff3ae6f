"""Hugging Face libraries without the network, without changing the process's environment for good."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def offline_environment(**defaults: str) -> Iterator[None]:
    """Inside the block, each variable of ``defaults`` that is not set has that value (the Hugging
    Face libraries read ``HF_HUB_OFFLINE`` and the like when they are imported or called); after it,
    the environment is as it was. A value the user set is never replaced."""
    added = [key for key in defaults if key not in os.environ]
    for key in added:
        os.environ[key] = defaults[key]
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)
