"""How the command prints fedfew's log records and warnings on stderr: one line each (``fedfew: warning:
...``, ``fedfew: ...`` for notes), a study command's progress lines as they are."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: object = None, line: str | None = None) -> None:
    logging.getLogger("fedfew").warning("%s", message)  # warnings.warn from fedfew: one line each


#: Loggers whose INFO records are a command's progress lines, printed as they are (``[3/12] cell: ...``),
#: not as notes: ``fedfew.study`` (`fedfew study run` and `verify`; its child loggers' records are notes).
PROGRESS_LOGGERS = frozenset({"fedfew.study"})


class _OneLine(logging.Formatter):
    """``fedfew: warning: ...`` (``fedfew: ...`` for notes), one line per record; progress lines bare."""

    def format(self, record: logging.LogRecord) -> str:
        if record.name in PROGRESS_LOGGERS and record.levelno == logging.INFO:
            return record.getMessage()
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"fedfew: {level}{record.getMessage()}"


@contextlib.contextmanager
def logging_to_stderr(level: int) -> Iterator[None]:
    """Print fedfew's log records at ``level`` and above on stderr (through tqdm, so a progress bar
    survives them) while the command runs."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    package = logging.getLogger("fedfew")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    previous = (package.level, package.propagate)
    package.addHandler(handler)
    package.setLevel(level)
    package.propagate = False
    try:
        with logging_redirect_tqdm([package]):
            for redirected in package.handlers:
                redirected.setFormatter(_OneLine())
            yield
    finally:
        package.removeHandler(handler)
        package.setLevel(previous[0])
        package.propagate = previous[1]
