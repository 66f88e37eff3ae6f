"""Every engine by name (``runtime.engine``): :data:`ENGINES`, the registry of
:mod:`fedfew.engine.engines` with the built-in engines named here and loaded when a name is first used.

* ``inprocess`` (:class:`fedfew.engine.engines.InProcessEngine`): every client in this process;
* ``workers`` (:class:`fedfew.engine.workers.WorkersEngine`): worker processes, one thread each;
* ``flower``, ``flower-sim`` (:mod:`fedfew.flower.launch`): Flower's deployment runtime, one SuperNode
  per client; Flower's Simulation Engine on Ray.

The base class and its template are :class:`fedfew.engine.engines.Engine`. Another engine joins by
decorating its class with ``@ENGINES.register("name", help="...")`` in a module of its own, named in
:data:`BUILT_IN` (built-in) or imported by a plugin (``fedfew run --plugin``). Naming the built-in
engines instead of importing them keeps this registry, which the config check and the experiment
import, from importing the engines' packages (Flower's among them) until a run or a listing asks for
one; Flower's modules import flwr only when a Flower run starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator

from fedfew.engine.engines import ENGINES as REGISTERED
from fedfew.engine.engines import Engine, EngineError, EngineSetup, Launch
from fedfew.registry import Registry

__all__ = ["BUILT_IN", "ENGINES", "Engine", "EngineError", "EngineSetup", "Launch"]

#: The built-in engines registered outside :mod:`fedfew.engine.engines` (which registers ``inprocess``
#: itself): name -> ``"module:class"``, the module that registers the class under that name.
BUILT_IN = {
    "workers": "fedfew.engine.workers:WorkersEngine",
    "flower": "fedfew.flower.launch:FlowerLaunch",
    "flower-sim": "fedfew.flower.launch:FlowerSimLaunch",
}


class LazyRegistry(Registry[type[Engine]]):
    """A registry that reads and writes ``registered`` and loads the module registering a name of
    ``built_in`` the first time that name is asked for (:meth:`get`, :meth:`describe`). Its names are
    those registered and those it can load; an unknown name loads every built-in engine first, so the
    error's close matches and known names are the full list, as the registry itself gives them."""

    def __init__(self, registered: Registry[type[Engine]], built_in: dict[str, str]) -> None:
        super().__init__(registered.kind)
        self._registered = registered
        self._built_in = dict(built_in)

    def _load(self, name: str) -> None:
        if name in self._registered or name not in self._built_in:
            return
        module, _, attribute = self._built_in[name].partition(":")
        loaded = getattr(importlib.import_module(module), attribute)  # importing it registers it
        if name not in self._registered or self._registered.get(name) is not loaded:
            raise RuntimeError(f"{module} did not register {attribute} as engine {name!r} (fedfew.engines.BUILT_IN)")

    def load_all(self) -> None:
        for name in self._built_in:
            self._load(name)

    def register(self, name: str, help: str = "") -> Callable[[type[Engine]], type[Engine]]:
        return self._registered.register(name, help)

    def get(self, name: str) -> type[Engine]:
        self._load(name)
        if name not in self._registered:
            self.load_all()  # the error names every engine and the close ones among them
        return self._registered.get(name)

    def describe(self, name: str) -> str:
        self._load(name)
        return self._registered.describe(name)

    def names(self) -> list[str]:
        return sorted(set(self._registered.names()) | set(self._built_in))

    def __contains__(self, name: object) -> bool:
        return name in self._registered or name in self._built_in

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


#: Every engine by name: the engines registered so far and the built-in ones, loaded on first use.
ENGINES: Registry[type[Engine]] = LazyRegistry(REGISTERED, BUILT_IN)
