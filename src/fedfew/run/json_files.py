"""JSON as a run folder writes it: strict (any parser reads it), non-finite numbers as null."""

from __future__ import annotations

import json
import math


def strict_json(obj: object, indent: int | None = None) -> str:
    """JSON that any parser reads: a non-finite float (NaN, inf) becomes null, never bare NaN."""
    return json.dumps(_finite_or_none(obj), allow_nan=False, indent=indent)


def _finite_or_none(obj: object) -> object:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    return obj
