"""A run's life in its folder: :class:`RunLife` (what :meth:`fedfew.run.folder.RunFolder.lifecycle`
yields) follows the run from the experiment's building to its results and leaves the status the way
out calls for: complete, interrupted or failed (the rules are on :meth:`RunFolder.lifecycle`)."""

from __future__ import annotations

import contextlib
import signal
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from fedfew.core.errors import FedfewError, RunInterrupted
from fedfew.engine.guard import DivergedError
from fedfew.engine.simulator import NothingTrainedError, Simulator
from fedfew.run.folder_errors import DataChangedError, RunCrashedError


class LivingFolder(Protocol):
    """What a run's life needs of its folder (:class:`fedfew.run.folder.RunFolder` is one): its path,
    its status, its metrics, its checkpoints and the results a cut-short write-up may have left."""

    path: Path

    def set_status(self, status: str, **info: object) -> None: ...

    def read_status(self) -> dict[str, Any]: ...

    def append_metrics(self, record: Mapping[str, object]) -> None: ...

    def save_checkpoint(self, simulator: Simulator) -> None: ...

    def discard_results(self) -> None: ...

    def release_reserve(self) -> None: ...


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C while a checkpoint is written (a half-written checkpoint is harmless, but a
    status saying 'interrupted' must follow a whole one); the interrupt is raised right after."""
    pending: list[int] = []
    deferred = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.getsignal(signum) for signum in deferred}
    try:
        for signum in deferred:
            signal.signal(signum, lambda signum, frame: pending.append(signum))
    except ValueError:  # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            raise KeyboardInterrupt



class RunLife:
    """What a run in its folder is doing (:meth:`RunFolder.lifecycle` yields it): the stage, which
    decides the status an exception leaves, the simulator and the round last checkpointed."""

    #: The stages, in order: building the experiment and its simulator; loading the checkpoint and
    #: clearing what an earlier attempt left; the rounds; writing the results; done.
    SETTING_UP = "setting up"
    PREPARING = "preparing"
    TRAINING = "training"
    WRITING_UP = "writing up"
    COMPLETE = "complete"

    def __init__(self, folder: LivingFolder, rounds: int, checkpoint_every: int = 0) -> None:
        self.folder, self.rounds, self.every = folder, rounds, checkpoint_every
        self.stage = self.SETTING_UP
        self.simulator: Simulator | None = None
        #: The last round whose checkpoint is on disk (set when the rounds start).
        self.checkpointed = 0
        #: What the loop is doing after a round's training ("while checkpointing round 3 of 10"), for a
        #: failure's message; empty while a round trains.
        self.step = ""

    def built(self, simulator: Simulator) -> Simulator:
        """The run's simulator is built: from here until :meth:`training` (the checkpoint loaded, stale
        files removed) only an interrupt changes the status, and the lifecycle closes its engine."""
        self.simulator, self.stage = simulator, self.PREPARING
        return simulator

    def training(self) -> None:
        """The rounds start, from the round the simulator stands at (its checkpoint's)."""
        self.checkpointed, self.stage = self._simulator.state.round, self.TRAINING

    def round_finished(self, r: int, record: Mapping[str, object],
                       log: Callable[[int, Mapping[str, object]], None] | None = None) -> None:
        """Round ``r`` ended with ``record``: appended to metrics.jsonl, given to ``log`` (the trackers),
        checkpointed when due (every ``checkpoint_every`` rounds and the last), then the status says it."""
        self.step = f"while recording round {r} of {self.rounds}"
        self.folder.append_metrics(record)
        if log is not None:
            log(r, record)
        if self.every and (r % self.every == 0 or r == self.rounds):
            self.step = f"while checkpointing round {r} of {self.rounds}"
            with interrupts_deferred():
                self.folder.save_checkpoint(self._simulator)
                self.checkpointed = r
        self.folder.set_status("running", round=r)
        self.step = ""

    def writing_up(self) -> None:
        """Every round ran: the results are being written (any error now fails the run)."""
        self.stage = self.WRITING_UP

    def complete(self, selected_round: int, summary_sha256: str, model_sha256: dict[str, str]) -> None:
        """The results are written: status complete, with the digests of summary.json and model/."""
        self.folder.set_status("complete", round=self.rounds, selected_round=selected_round,
                               summary_sha256=summary_sha256, model_sha256=model_sha256)
        self.stage = self.COMPLETE

    def _crashed(self, err: BaseException, where: str) -> RunCrashedError:
        """Record a run that stopped on an unexpected error (status failed, the traceback in error.log,
        room made first if the disk is full) and the one-line error to raise; call while handling ``err``."""
        folder = self.folder
        folder.release_reserve()  # a full disk: the few KiB kept for this record
        if isinstance(err, SystemExit):
            message = f"the run's code called sys.exit({err.code!r}) {where}"
        elif isinstance(err, OSError) and err.filename and err.strerror:
            message = f"cannot write {err.filename}: {err.strerror} ({where})"
        else:
            text = " ".join(str(err).split())
            message = f"{type(err).__name__}{': ' + text if text else ''} ({where})"
        with contextlib.suppress(OSError):
            (folder.path / "error.log").write_text(f"{message}\n\n{traceback.format_exc()}")
        with contextlib.suppress(OSError):
            folder.set_status("failed", error=message)
        return RunCrashedError(f"run failed: {message}; see {folder.path / 'error.log'}")

    @property
    def _simulator(self) -> Simulator:
        assert self.simulator is not None, "RunLife.built(simulator) first"
        return self.simulator

    # -- the way out ------------------------------------------------------------------------------
    def __enter__(self) -> RunLife:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: object) -> None:
        try:
            if isinstance(err, KeyboardInterrupt):
                interrupted = self._interrupted()
                if interrupted is not None:
                    raise interrupted from None
            elif isinstance(err, (Exception, SystemExit)):
                crashed = self._failed(err)
                if crashed is not None:
                    raise crashed from err
            if isinstance(err, Exception):
                _name_folder(err, self.folder.path)
        except Exception as leaving:
            _name_folder(leaving, self.folder.path)
            raise
        finally:
            if self.simulator is not None:
                self.simulator.engine.close()

    def _interrupted(self) -> RunInterrupted | None:
        """Record an interrupt (status interrupted) and the error that says where the run stands; None
        once the run is complete."""
        folder = self.folder
        if self.stage in (self.SETTING_UP, self.PREPARING):  # nothing new finished: the checkpoint stands
            done = folder.read_status().get("round", 0)
            folder.set_status("interrupted", round=done)
            return RunInterrupted(folder.path, done, self.rounds, "while the run was being set up")
        if self.stage == self.COMPLETE:
            return None
        simulator = self._simulator
        if self.stage == self.WRITING_UP:
            stage = "while the results were being written"
        else:
            stage = "during the final evaluation" if simulator.state.round >= self.rounds else ""
        folder.discard_results()
        with interrupts_deferred():
            if self.every and self.checkpointed != simulator.state.round:
                folder.save_checkpoint(simulator)
            folder.set_status("interrupted", round=simulator.state.round)
        return RunInterrupted(folder.path, simulator.state.round, self.rounds, stage)

    def _failed(self, err: BaseException) -> RunCrashedError | None:
        """Record the status ``err`` leaves (see :meth:`RunFolder.lifecycle`); the error to raise in its
        place, or None to raise ``err`` itself. Call while handling ``err``."""
        folder = self.folder
        if self.stage == self.SETTING_UP:
            if isinstance(err, DataChangedError):  # refused before any work: the run stands as it was
                folder.set_status("interrupted", round=folder.read_status().get("round", 0))
                return None
            if isinstance(err, FedfewError):
                folder.set_status("failed", error=str(err))
                return None
            return self._crashed(err, "while the run was being set up")
        if self.stage == self.TRAINING:
            if isinstance(err, DivergedError):
                with contextlib.suppress(OSError):
                    folder.append_metrics(err.record)  # the diverged round, for the record (never checkpointed)
            elif isinstance(err, FedfewError) and not isinstance(err, NothingTrainedError):
                with contextlib.suppress(OSError):
                    (folder.path / "error.log").write_text(traceback.format_exc())
            if isinstance(err, FedfewError):
                folder.set_status("failed", error=str(err))
                return None
            where = self.step or f"in round {self._simulator.state.round + 1} of {self.rounds}"
            resumes = f"the last checkpoint is round {self.checkpointed}, where resume starts" if self.checkpointed \
                else "no round was checkpointed: resume starts from the beginning"
            return self._crashed(err, f"{where}; {resumes}")
        if self.stage == self.WRITING_UP:
            folder.discard_results()
            return self._crashed(err, "while the results were being written")
        return None  # preparing (the checkpoint refused, say) or complete: the status stays as it was


def _name_folder(err: Exception, path: Path) -> None:
    with contextlib.suppress(AttributeError):
        err.run_folder = path  # type: ignore[attr-defined]  # the command line names its error.log
