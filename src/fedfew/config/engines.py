"""Every engine by name (``runtime.engine``): :data:`ENGINES`, the one registry of engines (it lives in
:mod:`fedfew.engine.base`), with the built-in engines above the engine layer named here, lazily: each
is loaded when its name is first used.

* ``inprocess`` (:class:`fedfew.engine.base.InProcessEngine`): every client in this process;
* ``workers`` (:class:`fedfew.engine.workers.WorkersEngine`): worker processes, one thread each;
* ``flower``, ``flower-sim`` (:mod:`fedfew.flower.launch`): Flower's deployment runtime, one SuperNode
  per client; Flower's Simulation Engine on Ray.

The base class and its template are :class:`fedfew.engine.base.Engine`. Another engine joins by
decorating its class with ``@ENGINES.register("name", help="...")`` in a module of its own, named in
:data:`BUILT_IN` (built-in) or imported by a plugin (``fedfew run --plugin``). Naming the built-in
engines instead of importing them keeps this registry, which the config check and the experiment
import, from importing the engines' packages (Flower's among them) until a run or a listing asks for
one; Flower's modules import flwr only when a Flower run starts.
"""

from __future__ import annotations

from fedfew.engine.base import ENGINES, Engine, EngineError, EngineSetup, Launch

__all__ = ["BUILT_IN", "ENGINES", "Engine", "EngineError", "EngineSetup", "Launch"]

#: The built-in engines registered outside :mod:`fedfew.engine.base` (which registers ``inprocess``
#: itself): name -> ``"module:class"``, the module that registers the class under that name.
BUILT_IN = {
    "workers": "fedfew.engine.workers:WorkersEngine",
    "flower": "fedfew.flower.launch:FlowerLaunch",
    "flower-sim": "fedfew.flower.launch:FlowerSimLaunch",
}

for _name, _where in BUILT_IN.items():
    if _name not in ENGINES:  # a module reloaded (importlib.reload) names them once
        ENGINES.register_lazily(_name, _where)
