"""What a cell's run folder says, read and never written: its status (through
:class:`fedfew.run.folder.RunFolder`, the run folder's one reader of it), its logged rounds, the rounds a
report keeps, how far it has come and how long it took over all its sittings."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from fedfew.core.jsontypes import JSONObject, JSONValue
from fedfew.study.store import as_float


class _Timed(TypedDict, total=False):
    seconds: float  # the run's cumulative seconds at the round's end


class MetricsRow(_Timed):
    """The fields of a metrics.jsonl line the study layer reads (the line holds more: its numbers, who replied, bytes)."""

    round: int


def run_status(run_folder: Path) -> JSONObject:
    """A run folder's status.json as :meth:`fedfew.run.folder.RunFolder.read_status` reads it (empty when
    it has none or it cannot be read)."""
    # imported here: it loads the engine's modules, which a study command reading no run folder never needs
    from fedfew.run.folder import RunFolder

    return RunFolder(run_folder).read_status()


def finished(run_folder: Path | None) -> bool:
    """A run folder whose run completed: read back, not run again."""
    return run_folder is not None and run_status(run_folder).get("status") == "complete" \
        and (run_folder / "summary.json").is_file()


def read_summary(run_folder: Path) -> JSONObject:
    """A finished run's summary.json, checked against the SHA-256 its status.json recorded when the run
    completed (a summary edited since is refused, naming it; one of an older run has none: used as is)."""
    from fedfew.core.integrity import note_not_recorded, verify_file

    path = run_folder / "summary.json"
    expected = run_status(run_folder).get("summary_sha256")
    if isinstance(expected, str):
        verify_file(path, expected, "the study")
    else:
        note_not_recorded(path, "the summary")
    summary: JSONObject = json.loads(path.read_text())
    if not isinstance(expected, str):
        _check_against_checkpoint(run_folder, summary)
    return summary


def _check_against_checkpoint(run_folder: Path, summary: JSONObject) -> None:
    """An older run's summary (no checksum) against its own last checkpoint: a run that selected no best
    round reports the last round's test score, which ``checkpoint/run.json`` keeps (``last_test``)."""
    from fedfew.core.integrity import DamagedFileError

    try:
        manifest = json.loads((run_folder / "checkpoint" / "run.json").read_text())
    except (OSError, ValueError):
        return
    last, test = manifest.get("last_test"), summary.get("test")
    if manifest.get("best") is not None or not isinstance(last, dict) or not isinstance(test, dict):
        return
    if manifest.get("round") != summary.get("rounds") or "accuracy" not in last:
        return
    if test.get("accuracy") != last["accuracy"]:
        raise DamagedFileError(f"{run_folder / 'summary.json'} says test accuracy {test.get('accuracy')!r} but the "
                               f"run's last checkpoint recorded {last['accuracy']!r}: the study refuses it; restore it "
                               "or run the cell again")


def metrics_rows(run_folder: Path) -> list[MetricsRow]:
    """A run folder's metrics.jsonl, one dict a round (none when the run has not logged one)."""
    path = run_folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def evaluated_history(run_folder: Path) -> list[dict[str, float]]:
    """The rounds of a run's metrics.jsonl that were evaluated, with their numbers only (round, train_*,
    val_*, test_*; not who replied or bytes): what a report draws as curves, kept small in the store."""
    kept: list[dict[str, float]] = []
    for row in metrics_rows(run_folder):
        if not any(k.startswith(("val_", "test_")) for k in row):
            continue
        kept.append({"round": row["round"], **{k: v for k, v in row.items() if k.startswith(("train_", "val_", "test_"))
                                               and isinstance(v, (int, float)) and not isinstance(v, bool)}})
    return kept


def rounds_done(run_folder: Path | None) -> int:
    """The last round a run folder logged: how far an interrupted or running cell has come (0: none)."""
    return max((row.get("round", 0) for row in metrics_rows(run_folder)), default=0) if run_folder else 0


def run_seconds(run_folder: Path, summary: Mapping[str, JSONValue]) -> float:
    """The run's time over all its sittings. The summary of a resumed run written by fedfew before
    ``seconds_resumed_from`` was added to summaries counted its last sitting's rounds twice
    (the runner of the time, ``fedfew.run.runner._train``, added the simulator's cumulative seconds at
    the end, which hold that sitting's rounds already, to the sitting's elapsed time, where the
    cumulative seconds at the checkpoint it resumed from were meant). Those summaries are in the committed store's run folders,
    so for a run whose status.json says it was resumed (``resumed``: the round it resumed from) and
    whose summary has no ``seconds_resumed_from``, the time is the summary's minus the cumulative
    seconds of metrics.jsonl's last round plus those of the resumed round. Any other run keeps the
    summary's seconds."""
    seconds = as_float(summary["seconds"])
    resumed = run_status(run_folder).get("resumed")
    if not isinstance(resumed, int) or "seconds_resumed_from" in summary:
        return seconds
    cumulative = {row["round"]: float(row["seconds"]) for row in metrics_rows(run_folder)
                  if isinstance(row.get("seconds"), (int, float))}
    if not cumulative:
        return seconds
    corrected = seconds - cumulative[max(cumulative)] + cumulative.get(resumed, 0.0)
    return corrected if 0 < corrected <= seconds else seconds
