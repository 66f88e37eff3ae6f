"""Store records checked on read. A record is a result only when every field the study layer reads is
there with its type: a record with its ``metrics`` deleted by hand, a field of the wrong type or a
file that is no JSON at all would otherwise count as stored (``study run`` skipping its cell for
good) or stop a report with a KeyError. :class:`CheckedStore` reads a study's store through
:func:`read_records`: a damaged record is named once in a warning, with its path, and left out, so its
cell counts as not stored and ``study run`` runs it again, overwriting the file."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from fedfew.study.grid import dump_hash
from fedfew.study.store import FORMAT, CodeVersion, ResultStore, StudyRecord, stored_elsewhere

log = logging.getLogger(__name__)

#: The fields every record has (:func:`fedfew.study.store.make_record`) and the types they must have.
REQUIRED: dict[str, tuple[type, ...]] = {
    "format": (int,), "study": (str,), "budget": (str,), "method": (str,), "setting": (str,), "seed": (int,),
    "config_hash": (str,), "config": (dict,), "code": (dict,), "metrics": (dict,), "wall_seconds": (int, float),
    "finished": (str,)}


#: Fields added later (the environment, CPU seconds, sittings): absent or null in older records.
OPTIONAL: dict[str, tuple[type, ...]] = {"environment": (dict,), "cpu_seconds": (int, float), "sittings": (list,)}


def problem(record: object, path: Path | None = None) -> str | None:
    """What makes ``record`` (read from ``path``) not a usable store record, in a few words; None when
    it is one. Fields a newer version adds are allowed: only what the study layer reads is checked."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if record.get("format") != FORMAT:
        return f"format {record.get('format')!r}, not {FORMAT}"
    for key, types in REQUIRED.items():
        if key not in record:
            return f"no {key!r}"
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, types):  # True is an int to Python, not a seed
            return f"{key!r} is {json.dumps(value)[:40]}, not {' or '.join(t.__name__ for t in types)}"
    code = record["code"]
    if not (isinstance(code.get("package"), str) and isinstance(code.get("source"), str)
            and isinstance(code.get("commit"), (str, type(None)))):
        return "'code' is not {package, source, commit}"
    history = record.get("history", [])
    if not isinstance(history, list) or not all(isinstance(row, dict) and isinstance(row.get("round"), int)
                                                for row in history):
        return "'history' is not a list of evaluated rounds"
    if not isinstance(record.get("reused_from", ""), str):
        return "'reused_from' is not a record's name"
    for key, types in OPTIONAL.items():  # newer fields: absent in older records, typed when there
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            return f"{key!r} is {json.dumps(value)[:40]}, not {' or '.join(t.__name__ for t in types)}"
    # A record is its config's: the hash of the config it holds, and the seed in it, must be the ones it
    # is filed under (a record copied in from another cell, its config_hash edited to match, is not).
    own = dump_hash(record["config"])
    if own != record["config_hash"]:
        return f"its config hashes to {own}, not to its config_hash {record['config_hash']}"
    if record["config"].get("seed") != record["seed"]:
        return f"its seed is {record['seed']} but its config's is {json.dumps(record['config'].get('seed'))}"
    # The file's name is how `study run` finds a cell: a record under another name is not that cell's.
    if path is not None and path.name != f"{record['config_hash']}-{code['source']}.json":
        return f"its config hash and code say {record['config_hash']}-{code['source']}.json"
    if path is not None and record["study"] != path.parent.name:
        return f"it is a record of study {record['study']!r}, filed in the store of {path.parent.name!r}"
    return None


def read_record(path: Path) -> tuple[StudyRecord | None, str | None]:
    """The record in ``path`` and None, or None and what is wrong with it."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError, UnicodeDecodeError
        return None, f"cannot be read as JSON ({type(err).__name__})"
    why = problem(record, path)
    return (record, None) if why is None else (None, why)


def read_records(folder: Path) -> tuple[list[StudyRecord], list[tuple[Path, str]]]:
    """The usable records in a study's store folder and the damaged files (path, what is wrong)."""
    good: list[StudyRecord] = []
    damaged: list[tuple[Path, str]] = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record, why = read_record(path)
        if record is not None:
            good.append(record)
        else:
            damaged.append((path, why or "damaged"))
    return good, damaged


class CheckedStore(ResultStore):
    """A study's store that reads only usable records (:func:`read_records`). ``then`` says what the
    command does about a damaged record (``study run``: runs its cell again); each is warned about
    once per ``seen`` (one command's stores share it: `study status` over budgets names a record once)."""

    def __init__(self, base: str | Path, study: str, then: str, seen: dict[Path, str] | None = None) -> None:
        super().__init__(base, study)
        self.then = then
        #: The damaged records seen so far: path -> what is wrong.
        self.damaged: dict[Path, str] = {} if seen is None else seen

    def _note(self, path: Path, why: str) -> None:
        if path not in self.damaged:
            log.warning("store record %s is damaged (%s): %s", path, why, self.then)
        self.damaged[path] = why

    def records(self) -> list[StudyRecord]:
        good, damaged = read_records(self.folder)
        for path, why in damaged:
            self._note(path, why)
        return good

    def get(self, config_hash: str, code: CodeVersion) -> StudyRecord | None:
        path = self._path(config_hash, code)
        if not path.is_file():
            return None
        record, why = read_record(path)
        if record is None:
            self._note(path, why or "damaged")
        return record


def usable_elsewhere(base: str | Path, study: str, config_hash: str, code: CodeVersion) -> StudyRecord | None:
    """:func:`fedfew.study.store.stored_elsewhere`, unless the record found there is damaged (a copy of
    it would be too): then None, and the cell runs."""
    record = stored_elsewhere(base, study, config_hash, code)
    if record is None:
        return None
    return record if problem(record) is None else None
