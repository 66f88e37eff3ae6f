"""The algorithm contract every method implements and every engine serves: the :class:`~fedfew.interface.
algorithm.Algorithm` base and its registry, the records its hooks receive and return, the state form
and its storage, aggregation, a client's keyed generators, and the device, precision and compile mode.
Importing it runs nothing of the engine, privacy, data or algorithms packages."""
