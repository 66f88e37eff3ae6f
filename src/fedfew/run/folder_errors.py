"""What goes wrong with a run folder: the errors :mod:`fedfew.run.folder`, its checkpoints
(:mod:`fedfew.run.checkpoints`) and its lifecycle (:mod:`fedfew.run.lifecycle`) raise."""

from __future__ import annotations

from fedfew.core.errors import RunFailedError, UsageError


class RunFolderError(UsageError):
    """A run folder cannot be used as asked (missing, locked, corrupt, complete); names the folder."""


class DataChangedError(UsageError):
    """The data a run recorded is not the data there now (a resume would train on other data)."""


class RunCrashedError(RunFailedError):
    """The run stopped on an unexpected error (a bug, a plugin's exception or sys.exit, a full disk);
    the message says what and where, the traceback is in RUN/error.log."""
