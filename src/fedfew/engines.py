"""Every engine by name (``runtime.engine``): :data:`ENGINES` with the built-in engines registered.

* ``inprocess`` (:class:`fedfew.engine.engines.InProcessEngine`): every client in this process;
* ``workers`` (:class:`fedfew.engine.workers.WorkersEngine`): worker processes, one thread each;
* ``flower`` (:mod:`fedfew.flower`): Flower's deployment runtime, one SuperNode per client.

The base class and its template are :class:`fedfew.engine.engines.Engine`. Another engine joins by
decorating its class with ``@ENGINES.register("name", help="...")`` in a module imported here (or by a
plugin, ``fedfew run --plugin``); Flower's modules import flwr only when a Flower run starts.
"""

from __future__ import annotations

import fedfew.engine.workers  # noqa: F401  (registers "workers")
import fedfew.flower  # noqa: F401  (registers "flower"; flwr is imported only when a Flower run starts)
from fedfew.engine.engines import ENGINES, Engine, EngineError, EngineSetup, Launch

__all__ = ["ENGINES", "Engine", "EngineError", "EngineSetup", "Launch"]
