"""The ``fedfew`` command: ``run``, ``sweep``, ``resume``, ``evaluate``, ``list``, ``demo``, ``study``
(fedfew.cli.study) and the Flower helpers. This module is its entry point (:func:`run_command`,
:func:`main`): parse the arguments (:mod:`fedfew.cli.parser`), run the command's handler
(:mod:`fedfew.cli.commands`, :mod:`fedfew.cli.listing`, :mod:`fedfew.cli.demo`) with the log handler
installed (:mod:`fedfew.cli.logs`), and turn what it raised into one line and an exit code.

Conventions: warnings and notes go through :mod:`logging` (one logger per module, under ``fedfew``);
:func:`main` installs the one handler that prints them to stderr as ``fedfew: warning: ...``
(``--quiet``: warnings only; ``-v``: debug too), and a study command's progress lines (logger
``fedfew.study``) as they are. Exit codes come from the exception's class
(:mod:`fedfew.core.errors`): 2 for usage and config errors, 1 for a run that failed, 130 for an interrupt.
An unexpected exception prints one line and where its traceback was written (the run folder's
``error.log``, else a temporary file); ``--traceback`` prints it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
import traceback
import warnings
from pathlib import Path
from typing import NoReturn

from fedfew.cli.demo import demo_config_path
from fedfew.cli.logs import logging_to_stderr, show_warning
from fedfew.cli.parser import build_parser
from fedfew.config.plugins import command_line_plugins
from fedfew.core.allocator import keep_large_blocks
from fedfew.core.errors import FedfewError, RunInterrupted

#: What the tests and benchmarks import from here besides the entry points (their modules are the
#: parser's, the demo's and the log set-up's).
__all__ = ["build_parser", "demo_config_path", "exit_quickly", "logging_to_stderr", "main", "run_command"]

logger = logging.getLogger(__name__)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a run as Ctrl-C does: checkpointed, resumable


def _traceback_file(err: BaseException) -> Path:
    """Where the traceback of an unexpected error goes: the run folder's ``error.log`` when the run
    wrote one (it holds this traceback), else a new temporary file."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    folder = getattr(err, "run_folder", None)
    if folder is not None and (Path(folder) / "error.log").is_file():
        return Path(folder) / "error.log"
    with tempfile.NamedTemporaryFile("w", prefix="fedfew-error-", suffix=".log", delete=False) as f:
        f.write(text)
    return Path(f.name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_large_blocks()  # before the first tensor: a run's large activations are reused, not re-mapped
    level = logging.DEBUG if args.verbose else logging.WARNING if getattr(args, "quiet", False) else logging.INFO
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread (a test calling main from a thread)
        previous = None
    try:
        with logging_to_stderr(level), warnings.catch_warnings():
            warnings.showwarning = show_warning  # one line each, as errors are
            try:
                with command_line_plugins(getattr(args, "plugin", [])):
                    code = int(args.func(args))
                sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
                return code
            except BrokenPipeError:
                # The reader stopped reading (`fedfew list | head -1`): what it read is what it wanted.
                # stdout goes to /dev/null so that the interpreter's own flush at exit stays quiet.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 0
            except RunInterrupted as err:
                print(f"fedfew: {err}", file=sys.stderr)
                return err.exit_code
            except KeyboardInterrupt:
                print("fedfew: interrupted before any round finished", file=sys.stderr)
                return 130
            except FedfewError as err:
                kind = "error" if err.exit_code == 2 else "run failed"
                message = _one_line(err)
                print(f"fedfew: {message if message.startswith(kind) else kind + ': ' + message}", file=sys.stderr)
                return err.exit_code
            except Exception as err:  # a bug, or a failure fedfew did not foresee: keep the traceback
                where = _traceback_file(err)
                print(f"fedfew: unexpected {type(err).__name__}: {_one_line(err)} (traceback in {where})",
                      file=sys.stderr)
                if args.traceback:
                    traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
                return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run_command() -> NoReturn:
    """The ``fedfew`` command (and ``python -m fedfew``): :func:`main` on ``sys.argv``, then
    :func:`exit_quickly` with its exit code."""
    exit_quickly(main())


def exit_quickly(code: int) -> NoReturn:
    """End the process with ``code`` once the exit handlers have run, without Python's own shutdown.

    That shutdown (every module torn down, every object collected: torch's are many) costs a run about
    half a second after its results are written (docs/performance.md, "exit"), and frees only memory
    the process is about to give back. The exit handlers still run: logging's flush, weakref
    finalizers (temporary folders), multiprocessing's joins of its children, Ray's shutdown. A
    non-daemon thread still running (a tracker's writer, say) keeps the ordinary exit, which waits for
    it."""
    main_thread = threading.main_thread()
    if any(thread is not main_thread and not thread.daemon for thread in threading.enumerate()):
        sys.exit(code)  # the ordinary exit waits for it (daemon threads, such as tqdm's monitor, it does not)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing left to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run_command()
