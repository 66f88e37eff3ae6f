"""The entries Flower's own processes load by name (``fedfew.flower.apps.components:server_app`` and
``client_app``) and the ServerApp's run, which trains through the run layer: the one part of the
Flower engine above :mod:`fedfew.run`."""
