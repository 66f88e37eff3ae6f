"""fedfew's folder of computed files (``$FEDFEW_CACHE``, else ``~/.cache/fedfew``) and a content-keyed
store of tensors in it: a file is found again only by the same inputs, and a damaged or unwritable
one costs the computation, never a wrong value."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where fedfew keeps computed files: ``$FEDFEW_CACHE`` if set, else ``~/.cache/fedfew``."""
    return Path(os.environ.get("FEDFEW_CACHE") or Path.home() / ".cache" / "fedfew").expanduser()


def cached_tensors(folder: str, key: str, compute: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``compute()``'s tensors, kept in ``cache_dir()/folder/key.safetensors``. ``key`` must name every
    input the tensors depend on (file digests, options, the torch version where numerics could change).
    A cache file that cannot be read is computed again and replaced; one that cannot be written is
    skipped (logged), so the cache changes only speed."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    path = cache_dir() / folder / f"{key}.safetensors"
    if path.is_file():
        try:
            return load_file(path)
        except (OSError, SafetensorError) as err:
            logger.info("cache file %s cannot be read (%s): computing it again", path, err)
    tensors = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(handle)
        try:
            save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, temporary)
            os.replace(temporary, path)  # atomic: a reader sees the whole file or none
        finally:
            Path(temporary).unlink(missing_ok=True)
    except OSError as err:
        logger.info("cache file %s not written (%s)", path, err)
    return tensors
