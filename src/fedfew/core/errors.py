"""The error families the command line maps to exit codes: a usage or config error exits 2, a run that
failed (diverged, nothing trained, a runtime fault) exits 1, an interrupt 130. Raise a subclass of the
family that fits; the CLI prints one line and the exit code comes from the class."""

from __future__ import annotations

from pathlib import Path


class FedfewError(Exception):
    """Base of fedfew's own errors."""

    exit_code = 1


class UsageError(FedfewError, ValueError):
    """Bad input: a config key or value, a command-line argument, a data file. Exit 2."""

    exit_code = 2


class RunFailedError(FedfewError, RuntimeError):
    """A run started and could not produce a trustworthy result (diverged, nothing trained). Exit 1."""

    exit_code = 1


class ConfigError(UsageError):
    """A configuration is invalid; the message names the key and what is allowed."""


class RunInterrupted(FedfewError):
    """Ctrl-C (or SIGTERM) stopped a run; it was checkpointed and can be resumed. Exit 130."""

    exit_code = 130

    def __init__(self, folder: Path, round_done: int, rounds: int, stage: str = "") -> None:
        # The message says what had finished: some rounds, every round (the write-up was cut short), or none.
        if round_done >= rounds:
            what = f"interrupted after all {rounds} rounds finished, {stage or 'before the results were written'}"
        elif round_done == 0:
            what = f"interrupted before any round finished{', ' + stage if stage else ''}"
        else:
            what = f"interrupted after round {round_done}/{rounds}"
        super().__init__(f"{what}; resume with: fedfew resume {folder}")
        self.folder, self.round_done, self.rounds = folder, round_done, rounds
