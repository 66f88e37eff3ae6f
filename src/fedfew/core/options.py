"""What every options schema shares: a boolean is never accepted where a number is expected.

pydantic's lax mode reads ``true`` as 1 for an ``int`` or ``float`` field, so ``federation.rounds:
true`` would run one round. Every section of the config, every algorithm's ``Options`` and every
schema read off a function's signature derive from :class:`NoBoolNumbers`."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

_NUMBERS = (int, float, complex)


def accepts_bool(annotation: object) -> bool:
    """Whether a field of this type may take a boolean: anything but a number, or a union of numbers
    with ``bool`` or ``Any`` (a union of numbers with other types, ``int | None``, refuses it)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return accepts_bool(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        if any(m is bool or m is Any for m in members):
            return True
        return not any(_is_number(m) for m in members)
    return not _is_number(annotation)


def _is_number(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, _NUMBERS) and not issubclass(annotation, bool)


class NoBoolNumbers(BaseModel):
    """A pydantic model whose number fields refuse booleans (with the field's own error location)."""

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not accepts_bool(field.annotation):
                raise PydanticCustomError("bool_not_number", "expected a number, not a boolean")
        return value


class Section(NoBoolNumbers):
    """A section of an experiment config (``federation``, ``privacy``, ...): unknown keys are errors, and
    so are infinities and NaN."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
