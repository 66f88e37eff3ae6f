"""The round and the engines that run it: the engine base and its registry (:mod:`fedfew.engine.base`),
the client task (:mod:`~fedfew.engine.tasks`), the one round loop (:mod:`~fedfew.engine.simulator`),
worker processes (:mod:`~fedfew.engine.workers`) and the batched in-process path
(:mod:`~fedfew.engine.batched`). Importing the package runs none of them."""
