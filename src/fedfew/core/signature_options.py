"""Options schemas read off a function's signature: a partitioner's or a model factory's keyword
arguments become a pydantic model that rejects unknown keys and wrong types, exactly as an
algorithm's ``Options`` class does. The function stays the single place where an option is
declared, with its type hint and default."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model

from fedfew.core.options import NoBoolNumbers


class _OptionsBase(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, allow_inf_nan=False)


@cache
def _schema(func: Callable[..., object], skip: tuple[str, ...]) -> type[BaseModel]:
    try:
        hints = typing.get_type_hints(func)
    except (NameError, TypeError):  # an annotation that cannot be resolved: accept any value there
        hints = {}
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(func).parameters.items():
        if name in skip or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = ... if param.default is param.empty else param.default
        fields[name] = (hints.get(name, Any), default)
    return create_model(f"{getattr(func, '__name__', 'function')}_options", __base__=_OptionsBase, **fields)


def options_schema(func: Callable[..., object], skip: Iterable[str] = ()) -> type[BaseModel]:
    """A pydantic model of ``func``'s keyword options, leaving out the parameters in ``skip`` (those
    the caller supplies) and ``*args``/``**kwargs``."""
    return _schema(func, tuple(sorted(skip)))
