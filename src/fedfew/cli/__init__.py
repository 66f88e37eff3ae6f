"""The ``fedfew`` command line: its entry point and exit codes (:mod:`fedfew.cli.main`), its parser, the
handlers of its subcommands (``fedfew study``'s in :mod:`fedfew.cli.study`) and the handler that prints
fedfew's log records."""
