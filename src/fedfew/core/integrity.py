"""Checksums of what a run reads back: its checkpoint and model files, its config and its data source.

A run folder records a SHA-256 of every file it will read again (``checkpoint/run.json`` for the
checkpoint's files, ``status.json`` for the config, the model and the summary, ``data.json`` for the
data source), and ``fedfew resume``, ``fedfew evaluate`` and ``fedfew study`` verify them before use: a
file changed since it was written (a bit flip, a hand edit, a file copied in from another run) is
refused in one line naming it, never used. A folder written before these records has none: that is
"not recorded", said once, never damage. Nothing here changes a number: it only refuses.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path

from fedfew.core.errors import UsageError
from fedfew.core.jsontypes import JSONObject

logger = logging.getLogger(__name__)

#: A data source file up to this size is hashed whole; a larger one by its size, modification time and
#: the hash of its first and last MiB (hashing many GiB at every resume would cost more than the run).
FULL_HASH_BYTES = 256 * 1024 * 1024
END_BYTES = 1024 * 1024
#: A data source folder with more files than this is not fingerprinted (walking it would be the cost).
MAX_FILES = 100_000

#: The config keys a user may change on resume, in config.yaml or with --set: how and where the run
#: computes, never what it computes (``dataset.root``: where the same data lies now; its content is
#: checked by the data fingerprint).
RESUME_CHANGEABLE = ("runtime", "dataset.root")


class DamagedFileError(UsageError):
    """A file of a run folder differs from what the run recorded when it wrote it; names the file."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_file(path: Path, expected: str | None, what: str) -> None:
    """Refuse ``path`` when its SHA-256 is not ``expected`` (None: not recorded, nothing to check)."""
    if expected is None:
        return
    try:
        actual = sha256_file(path)
    except OSError as err:
        raise DamagedFileError(f"{path} cannot be read ({err.strerror or err}): {what} needs it") from None
    if actual != expected:
        raise DamagedFileError(f"{path} has changed since the run wrote it (SHA-256 {actual[:12]}, recorded "
                               f"{expected[:12]}): {what} refuses to use it; restore the file or start a new run")


def verify_files(base: Path, digests: Mapping[str, str], what: str) -> None:
    """:func:`verify_file` for each ``{path relative to base: digest}``."""
    for relative, digest in sorted(digests.items()):
        verify_file(base / relative, digest, what)


def note_not_recorded(path: Path, what: str) -> None:
    """Say once per file that an older run folder has no checksum of ``what`` (it is used unchecked)."""
    if str(path) not in _NOTED:
        _NOTED.add(str(path))
        logger.info("%s: no checksum of %s recorded (written by an older fedfew): used unchecked", path, what)


_NOTED: set[str] = set()


# -- the config -----------------------------------------------------------------------------------
def config_digest(config_json: Mapping[str, object]) -> str:
    """SHA-256 of a resolved config (``model_dump(mode="json")``) without what may change on resume
    (:data:`RESUME_CHANGEABLE`)."""
    data = json.loads(json.dumps(config_json))  # a deep copy
    for key in RESUME_CHANGEABLE:
        *parents, last = key.split(".")
        holder = data
        for part in parents:
            holder = holder.get(part, {}) if isinstance(holder, dict) else {}
        if isinstance(holder, dict):
            holder.pop(last, None)
    return sha256_bytes(json.dumps(data, sort_keys=True).encode())


def changed_keys(before: Mapping[str, object], after: Mapping[str, object], prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two config dumps (for the refusal's message)."""
    out: list[str] = []
    for key in sorted(set(before) | set(after), key=str):
        a, b = before.get(key), after.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


# -- the data source ------------------------------------------------------------------------------
def fingerprint(path: Path) -> JSONObject | None:
    """What identifies a data source's content: ``{"kind": "sha256", ...}`` (a file hashed whole),
    ``"size+mtime+ends"`` (a large file: size, modification time and the hash of its first and last
    MiB) or ``"listing"`` (a folder: the hash of its files' relative paths and sizes). None when the
    source is missing, unreadable or too large a folder to walk."""
    try:
        if path.is_file():
            size = path.stat().st_size
            if size <= FULL_HASH_BYTES:
                return {"kind": "sha256", "bytes": size, "sha256": sha256_file(path)}
            digest = hashlib.sha256()
            with path.open("rb") as f:
                digest.update(f.read(END_BYTES))
                f.seek(size - END_BYTES)
                digest.update(f.read(END_BYTES))
            return {"kind": "size+mtime+ends", "bytes": size, "mtime_ns": path.stat().st_mtime_ns,
                    "ends_sha256": digest.hexdigest()}
        if path.is_dir():
            entries = []
            for count, item in enumerate(sorted(path.rglob("*"))):
                if count >= MAX_FILES:
                    return None
                if item.is_file():
                    entries.append(f"{item.relative_to(path).as_posix()}\t{item.stat().st_size}")
            return {"kind": "listing", "files": len(entries),
                    "sha256": sha256_bytes("\n".join(entries).encode())}
    except OSError:
        return None
    return None


def data_changed(recorded: Mapping[str, object], now: Mapping[str, object]) -> str | None:
    """Why the data a run recorded (``data.json``) is not the data there now, or None when it is (or
    when the run recorded no fingerprint: an older folder, or a source not fingerprinted)."""
    before, after = recorded.get("fingerprint"), now.get("fingerprint")
    if not isinstance(before, dict):
        return None
    if recorded.get("source") != now.get("source"):
        return f"the source was {recorded.get('source')} and is now {now.get('source')}"
    if after != before:
        what = {"sha256": "its content (SHA-256)", "size+mtime+ends": "its size, time or first/last MiB",
                "listing": "its files or their sizes"}.get(str(before.get("kind")), "its fingerprint")
        return f"{now.get('source')} has changed since the run read it ({what} differ)"
    return None
