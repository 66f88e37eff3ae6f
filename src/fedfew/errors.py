"""The error families the command line maps to exit codes: a usage or config error exits 2, a run that
failed (diverged, nothing trained, a runtime fault) exits 1, an interrupt 130. Raise a subclass of the
family that fits; the CLI prints one line and the exit code comes from the class."""

from __future__ import annotations


class FedfewError(Exception):
    """Base of fedfew's own errors."""

    exit_code = 1


class UsageError(FedfewError, ValueError):
    """Bad input: a config key or value, a command-line argument, a data file. Exit 2."""

    exit_code = 2


class RunFailedError(FedfewError, RuntimeError):
    """A run started and could not produce a trustworthy result (diverged, nothing trained). Exit 1."""

    exit_code = 1
