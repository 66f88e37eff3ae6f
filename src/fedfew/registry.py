"""A small name -> object registry with readable errors.

Every pluggable piece of fedfew (datasets, partitions, models, algorithms) is looked up by name
through one of these, so adding a method is one decorated function or class, never an if/elif.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from fedfew.errors import UsageError

T = TypeVar("T")


class RegistryError(UsageError, KeyError):
    """An unknown name was asked of a registry."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps names to objects; ``kind`` names what is registered ("dataset", "model", ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._help: dict[str, str] = {}

    def register(self, name: str, help: str = "") -> Callable[[T], T]:
        def decorate(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            doc = help or (getattr(obj, "__doc__", None) or "").strip().splitlines()[0:1]
            self._help[name] = doc if isinstance(doc, str) else (doc[0] if doc else "")
            return obj

        return decorate

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._items, n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(sorted(self._items))}"
            ) from None

    def describe(self, name: str) -> str:
        return self._help.get(name, "")

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
