"""The result store: one small JSON record per finished cell, ``STORE/<study>/<config hash>-<code>.json``.

A record holds the cell's names, the resolved config, the code version (package version, a hash of the
package's sources but the study layer's, the git commit when there is one), the run's metrics and its wall time. A cell is
found by its config hash and code version, never by its labels, so renaming a row keeps its results.
Records are written to a temporary name and renamed: an interrupted write never leaves half a record.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TypedDict, TypeGuard

from fedfew.core.codeversion import numbers_version, package_version
from fedfew.core.jsontypes import JSONObject, JSONValue
from fedfew.study.study_sections import StudyError, parse_metric

FORMAT = 1


class CodeJSON(TypedDict):
    """A code version as records and equivalence files hold it (:meth:`CodeVersion.to_json`)."""

    package: str
    source: str
    commit: str | None


class SittingRecord(TypedDict):
    """What a record keeps of one sitting of its run (:func:`fedfew.study.sittings.run_usage`)."""

    started: str | None
    wall_seconds: float | None
    cpu_seconds: float | None
    load_average: list[float | None] | None


class Usage(TypedDict, total=False):
    """What a record keeps of its run's sittings (:func:`fedfew.study.sittings.run_usage`): ``sittings``,
    and ``cpu_seconds`` and ``environment`` or else ``environment_note`` (in a record: absent or null in older ones)."""

    sittings: list[SittingRecord] | None
    cpu_seconds: float | None
    environment: Mapping[str, JSONValue] | None
    environment_note: str


class _RecordAdded(Usage, total=False):
    """The fields a record has only sometimes (a base class: ``NotRequired`` needs Python 3.11): its run's
    evaluated rounds (:func:`fedfew.study.run_readback.evaluated_history`; round, train_*, val_*, test_*)
    and, for a copy of another study's record, that record's name (:func:`stored_elsewhere`)."""

    history: list[dict[str, float]]
    reused_from: str


class StudyRecord(_RecordAdded):
    """One cell's store record (:func:`make_record`); :func:`fedfew.study.records.problem` checks a record
    read back has these fields with these types. A newer version's further fields are allowed."""

    format: int
    study: str
    budget: str
    method: str
    setting: str
    seed: int
    config_hash: str
    config: JSONObject
    code: CodeJSON
    #: What the record keeps of the run's summary (:data:`KEPT_SUMMARY`).
    metrics: JSONObject
    wall_seconds: float
    finished: str


class OlderCheckout(CodeJSON):
    """The checkout ``fedfew study verify --old-code`` ran the older code from: its path and code version."""

    checkout: str


class _EquivalenceAdded(TypedDict, total=False):
    """The fields of an equivalence file that verify writes since it judges other environments by a
    tolerance (absent in older files: those were exact)."""

    exact: bool
    tolerance: str
    environments: dict[str, Mapping[str, JSONValue]]
    #: ``verify --old-code``: the checkout of the older code that ran each cell on the verifying machine
    #: (its path, package, sources and commit); the comparison was then in one environment.
    older_code_run_here: OlderCheckout


class Equivalence(_EquivalenceAdded):
    """An equivalence file (``fedfew study verify``): ``code`` gives the numbers of ``equal_to`` on ``cells``."""

    format: int
    study: str
    budget: str
    code: CodeJSON
    equal_to: CodeJSON
    cells: list[JSONObject]
    verified: str


@dataclass(frozen=True)
class CodeVersion:
    package: str
    source: str  # hash of the code that can change a run's numbers (source_hash)
    commit: str | None

    @property
    def key(self) -> str:
        return f"{self.package}+{self.source}"

    def describe(self) -> str:
        return f"fedfew {self.package}, sources {self.source}" + (f", git {self.commit[:10]}" if self.commit else "")

    def to_json(self) -> CodeJSON:
        return {"package": self.package, "source": self.source, "commit": self.commit}

    @classmethod
    def from_json(cls, data: CodeJSON) -> CodeVersion:
        return cls(data["package"], data["source"], data.get("commit"))


@cache
def current_code() -> CodeVersion:
    """This installation's code version. The source hash covers what can change a run's numbers
    (:func:`source_hash`), so a commit that changes only docs, docstrings, configs, the command line, the
    store or how studies are reported keeps the version."""
    package_dir = Path(__file__).resolve().parents[1]
    return CodeVersion(package_version(), numbers_version(), _git_commit(package_dir))


def _git_commit(folder: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


class ResultStore:
    """The records of one study under ``base/<study>/``."""

    def __init__(self, base: str | Path, study: str) -> None:
        self.folder = Path(base) / study

    def _path(self, config_hash: str, code: CodeVersion) -> Path:
        return self.folder / f"{config_hash}-{code.source}.json"

    def records(self) -> list[StudyRecord]:
        if not self.folder.is_dir():
            return []
        out: list[StudyRecord] = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
                raise StudyError(f"store record {path} cannot be read ({type(err).__name__}); move it away "
                                 "and run the cell again") from None
            if not _is_record(record):
                raise StudyError(f"store record {path} is not a fedfew study record (format {FORMAT})")
            out.append(record)
        return out

    def codes(self) -> dict[str, CodeVersion]:
        """The code versions the store holds records of, by key."""
        return {CodeVersion.from_json(r["code"]).key: CodeVersion.from_json(r["code"]) for r in self.records()}

    def newest_code(self, hashes: set[str] | None = None) -> CodeVersion | None:
        """The code version of the most recently finished record (of these cells, if given): the one a
        report shows."""
        records = [r for r in self.records() if hashes is None or r["config_hash"] in hashes]
        if not records:
            return None
        return CodeVersion.from_json(max(records, key=lambda r: (r["finished"], r["config_hash"]))["code"])

    def get(self, config_hash: str, code: CodeVersion) -> StudyRecord | None:
        path = self._path(config_hash, code)
        return json.loads(path.read_text()) if path.is_file() else None

    def by_hash(self, code: CodeVersion) -> dict[str, StudyRecord]:
        """One record per cell: of ``code`` and the versions verified to give its numbers (``fedfew study
        verify``), the cell's first run (earliest ``finished``). A verify's re-run of a stored cell comes
        later and stays in the store as the check's evidence (its equivalence file holds both numbers), so
        verifying never changes a table, nor mixes the re-run's machine into one written on another."""
        same = self.equal_codes(code) | {code.key}
        found: dict[str, StudyRecord] = {}
        for r in self.records():
            if CodeVersion.from_json(r["code"]).key not in same:
                continue
            first = found.get(r["config_hash"])
            if first is None or (r["finished"], r["code"]["source"]) < (first["finished"], first["code"]["source"]):
                found[r["config_hash"]] = r
        return found

    # -- code versions verified to give the same numbers ------------------------------------------------
    @property
    def _equal_folder(self) -> Path:
        return self.folder / "equal-code"

    def equivalences(self) -> list[Equivalence]:
        """The verifications in this study's store: {code, equal_to, cells, verified}."""
        folder = self._equal_folder
        out: list[Equivalence] = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                data = json.loads(path.read_text())
                CodeVersion.from_json(data["code"]), CodeVersion.from_json(data["equal_to"])
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise StudyError(f"store file {path} cannot be read ({type(err).__name__}); move it away and run "
                                 "`fedfew study verify` again") from None
            out.append(data)
        return out

    def equal_codes(self, code: CodeVersion) -> set[str]:
        """Keys of the other versions ``code`` gives the same numbers as: every version linked to it by a
        chain of verifications, in either direction (equality is symmetric: a version verified against
        an older one that an in-between version was also verified against gives that version's numbers too)."""
        links = [(CodeVersion.from_json(e["code"]).key, CodeVersion.from_json(e["equal_to"]).key)
                 for e in self.equivalences()]
        found = {code.key}
        frontier = {code.key}
        while frontier:
            frontier = ({old for new, old in links if new in frontier} | {new for new, old in links if old in frontier}) \
                - found
            found |= frontier
        return found - {code.key}

    def newer_equal(self, code: CodeVersion) -> CodeVersion:
        """The version a report names when its records are of ``code``: the most recently verified version
        that gives ``code``'s numbers (``code`` itself if none)."""
        same = self.equal_codes(code) | {code.key}
        verified = [e for e in self.equivalences() if CodeVersion.from_json(e["code"]).key in same]
        if not verified:
            return code
        return CodeVersion.from_json(max(verified, key=lambda e: str(e.get("verified", "")))["code"])

    def put_equivalence(self, data: Equivalence) -> Path:
        new, old = CodeVersion.from_json(data["code"]), CodeVersion.from_json(data["equal_to"])
        self._equal_folder.mkdir(parents=True, exist_ok=True)
        path = self._equal_folder / f"{new.source}-equals-{old.source}.json"
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        return path

    def put(self, record: StudyRecord) -> Path:
        code = CodeVersion.from_json(record["code"])
        path = self._path(record["config_hash"], code)
        tmp = path.with_name(path.name + ".tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, path)
        except OSError as err:  # a full disk, a file where the folder should be: name the record
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise StudyError(f"cannot write store record {path}: {err.strerror or err}; the run's folder keeps its "
                             "result, and the same command stores it once there is room") from None
        return path


#: What a record keeps of a run's summary: the test metrics and the scores around them (the initial
#: model's, on validation where the run has it; the selected and the last round's on the same split);
#: a private run's guarantee (``privacy``: epsilon, delta, ...; the report shows them beside its cells) and
#: the membership-inference attack's numbers (``membership``, with ``eval.membership_inference``).
KEPT_SUMMARY = ("test", "selected_round", "rounds", "seconds", "bytes_down", "bytes_up", "chance", "at_chance",
                "rounds_without_training", "initial_score", "selected_score", "final_score", "privacy", "membership")


def make_record(study: str, budget: str, method: str, setting: str, seed: int, config_hash: str,
                config: JSONObject, code: CodeVersion, summary: Mapping[str, JSONValue], wall_seconds: float,
                history: list[dict[str, float]] | None = None, usage: Usage | None = None) -> StudyRecord:
    """One cell's record; ``history`` is the run's evaluated rounds (:func:`fedfew.study.run_readback.evaluated_history`),
    ``usage`` its environment, CPU seconds and sittings (:func:`fedfew.study.sittings.run_usage`)."""
    record: StudyRecord = {"format": FORMAT, "study": study, "budget": budget, "method": method, "setting": setting, "seed": seed,
              "config_hash": config_hash, "config": config, "code": code.to_json(),
              "metrics": {k: summary[k] for k in KEPT_SUMMARY if k in summary},
              "wall_seconds": round(wall_seconds, 2), "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if history:
        record["history"] = history
    if usage:
        record = {**record, **usage}
    return record


def metric(record: StudyRecord, path: str) -> float | None:
    """The value at a dotted ``path`` of a record's metrics (``test.accuracy``, ``test.local_by_client.0``)
    or of its evaluated rounds (``history.last.test_accuracy``, ``history.200.train_l_mi``),
    or with ``[k1,k2,...]`` at the end the mean of those keys of the mapping there
    (``test.local_by_client[1,2]``); None when any of it is missing (a mean is never over fewer keys)."""
    parts, keys = parse_metric(path)
    value = _at(_history_rounds(record), parts[1:]) if parts[0] == "history" else _at(record["metrics"], parts)
    if keys is None:
        return value if isinstance(value, float) or value is None else None
    chosen = [_at(value, [key]) if isinstance(value, dict) else None for key in keys]
    numbers = [v for v in chosen if isinstance(v, float)]
    return sum(numbers) / len(numbers) if len(numbers) == len(keys) else None


def _history_rounds(record: StudyRecord) -> dict[str, Mapping[str, object]]:
    """A record's evaluated rounds by round number, and its last one as ``last``: ``history.last.test_accuracy``
    is the test score of the run's last evaluated round, whichever round the run selected."""
    rounds: dict[str, Mapping[str, object]] = {str(entry["round"]): entry for entry in record.get("history") or []
                                               if "round" in entry}
    test = record["metrics"].get("test")
    if record.get("history"):
        rounds["last"] = record["history"][-1]
    elif record["metrics"].get("rounds") == 0 and isinstance(test, dict):
        # A round-0 run (the untrained control) evaluates one round, round 0: its last evaluated round
        # is its test score, so a last-round table shows the control beside the trained rows.
        rounds["0"] = rounds["last"] = {"round": 0, **{f"test_{k}": v for k, v in test.items()}}
    return rounds


def _at(value: object, parts: list[str]) -> object:
    """The number (as a float) or mapping at ``parts`` of ``value``; None where there is none."""
    for part in parts:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return float(value) if isinstance(value, (int, float)) else value if isinstance(value, dict) else None


def as_float(value: object) -> float:
    """``float(value)`` of a value read from JSON (a number, or a string float() reads); for anything else the
    TypeError float() raises."""
    if isinstance(value, (int, float, str)):
        return float(value)
    raise TypeError(f"float() argument must be a string or a real number, not '{type(value).__name__}'")


def _is_record(value: object) -> TypeGuard[StudyRecord]:
    """Whether ``value`` (read from a store file) is a study record of this format, at a glance."""
    return isinstance(value, dict) and value.get("format") == FORMAT and "config_hash" in value


def stored_elsewhere(base: str | Path, study: str, config_hash: str, code: CodeVersion) -> StudyRecord | None:
    """A record of the same run, the same config hash and code version, in another study's store under
    ``base`` (two studies sharing a row or a control), with ``reused_from`` naming the record of the
    study that ran it (a record that ran is preferred to another study's copy of one); None when no
    other study holds one. An unreadable record there is skipped: it is not this study's to judge, and
    the cell then simply runs."""
    copies: list[StudyRecord] = []
    for path in sorted(Path(base).glob(f"*/{config_hash}-{code.source}.json")):
        if path.parent.name == study:
            continue
        try:
            record: StudyRecord = json.loads(path.read_text())
            same_code = CodeVersion.from_json(record["code"]).key == code.key
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if record.get("format") != FORMAT or record.get("config_hash") != config_hash or not same_code:
            continue
        if not record.get("reused_from"):
            return {**record, "reused_from": f"{path.parent.name}/{path.name}"}
        copies.append(record)
    return copies[0] if copies else None


def foreign_codes(store: ResultStore, code: CodeVersion, hashes: Iterable[str]) -> list[CodeVersion]:
    """Code versions other than ``code`` (and those verified to give its numbers) that hold records of
    these cells."""
    wanted = set(hashes)
    mine = {code.key} | store.equal_codes(code)
    return list({CodeVersion.from_json(r["code"]).key: CodeVersion.from_json(r["code"]) for r in store.records()
                 if r["config_hash"] in wanted and CodeVersion.from_json(r["code"]).key not in mine}.values())
