"""The Flower engine's errors (no flwr import: raised by the launcher too)."""

from __future__ import annotations

from fedfew.core.errors import UsageError
from fedfew.engine.base import EngineError


class FlowerRunError(EngineError):
    """The federation could not run (nodes missing, a node failing); the message says which."""


class FlowerPortError(UsageError, FlowerRunError):
    """The port the config names (``flower.port``) is taken: a setting to change, exit 2."""
