"""fedfew on Flower, one engine beside the others (``runtime.engine: flower``).

* :mod:`fedfew.flower.launch`: the registered engine; a run on this machine (SuperLink, SuperNodes
  and ``flwr run`` as processes, :mod:`fedfew.flower.local`) followed through the run folder;
* :mod:`fedfew.flower.apps.server`: the ServerApp's work, a fedfew run with :class:`~fedfew.flower.engine.FlowerEngine`;
* :mod:`fedfew.flower.apps.components`: the ServerApp and ClientApp Flower loads by name; the ClientApp hands
  :mod:`fedfew.flower.handlers` (its three messages) and :mod:`fedfew.flower.node` (a SuperNode's side)
  the experiment's builder (:class:`~fedfew.engine.base.ExperimentBuilder`), so they import no
  :mod:`fedfew.run.experiment`;
* :mod:`fedfew.flower.simulation`: ``flower-sim``, the same handlers on Flower's Simulation Engine;
* :mod:`fedfew.flower.records`, :mod:`fedfew.flower.security`: the state form as Flower records; TLS
  certificates and node keys.
* :mod:`fedfew.flower.secagg`, :mod:`fedfew.privacy.secure_sum`: secure aggregation (Flower's
  SecAgg+; ``flower.secure_aggregation``): the protocol's rounds, and which algorithms it covers (the
  latter imports no flwr: the config checks use it).

This package's ``__init__`` and :mod:`~fedfew.flower.launch` import no flwr: registering the engine
costs nothing when Flower is not installed. No module outside this package imports flwr.
"""

from fedfew.flower import launch as launch  # registers "flower"
