"""The Flower engine's errors (no flwr import: raised by the launcher too)."""

from __future__ import annotations

from fedfew.engine.engines import EngineError


class FlowerRunError(EngineError):
    """The federation could not run (nodes missing, a node failing); the message says which."""
