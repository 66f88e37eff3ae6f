"""A small name -> object registry with readable errors.

Every pluggable piece of fedfew (datasets, partitions, models, algorithms) is looked up by name
through one of these, so adding a method is one decorated function or class, never an if/elif.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from fedfew.core.errors import UsageError

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
        self._lazy: dict[str, str] = {}

    def register_lazily(self, name: str, where: str) -> None:
        """Name an object by ``"module:attribute"`` without importing it: the module is imported (and
        registers the object under ``name``) the first time the name is asked for. A layer above the
        module names it so (:mod:`fedfew.config.engines`), so that the registry, and whoever reads it,
        imports the module's package (Flower's, say) only when a run or a listing asks for it."""
        if name in self._items or name in self._lazy:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._lazy[name] = where

    def _load(self, name: str) -> None:
        where = self._lazy.get(name)
        if where is None or name in self._items:
            return
        module, _, attribute = where.partition(":")
        loaded = getattr(importlib.import_module(module), attribute)  # importing it registers it
        if self._items.get(name) is not loaded:
            raise RuntimeError(f"{module} did not register {attribute} as {self.kind} {name!r}")

    def load_all(self) -> None:
        """Import every lazily named object's module."""
        for name in list(self._lazy):
            self._load(name)

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
        self._load(name)
        if name not in self._items:
            self.load_all()  # the error names every entry and the close ones among them
        try:
            return self._items[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._items, n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(sorted(self._items))}"
            ) from None

    def describe(self, name: str) -> str:
        self._load(name)
        return self._help.get(name, "")

    def names(self) -> list[str]:
        return sorted(set(self._items) | set(self._lazy))

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
