"""The code version of a run's numbers: which of fedfew's sources can change a number, and a hash of
them that ignores docstrings, comments and layout. A study record is keyed by it
(:mod:`fedfew.study.store`) and a run folder records it (``status.json``), so ``fedfew resume`` can refuse
to continue a run with code that computes differently. Depends on nothing in fedfew."""

from __future__ import annotations

import ast
import hashlib
import os
from functools import cache
from pathlib import Path

#: What can change a run's numbers: every file under these folders of the package (a module added to one
#: later is covered without a change here; the bundled data files too). They are the layers from the
#: foundations up to the run (docs/architecture.md): the seeds, registries, options and statistics
#: (``core``), the datasets and models, the episodes, learners, partitions and evaluation (``fewshot``),
#: the algorithm contract and the state form (``interface``), the clip and the noise (``privacy``), the
#: round loop and the engines (``engine``), the algorithms, and the built experiment, its checkpoints,
#: the selected round and the summary (``run``). A folder is hashed whole, its few modules that cannot
#: change a number (``core/errors.py``, ``run/sweep.py``) with it: a change there costs a
#: ``fedfew study verify``, never a silently wrong version.
NUMBERS_FOLDERS = ("algorithms", "core", "data", "engine", "fewshot", "interface", "models", "privacy", "run")
#: The layers above the run, and the package's own two files, with why none can change a number.
#: tests/core/test_codeversion.py fails when a module the hashed code imports is in neither, so a new
#: folder cannot fall out of the version unseen; ``fedfew study verify`` remains the check that the
#: numbers did not move.
NOT_NUMBERS = {
    "__init__.py": "the package's lazy names",
    "__main__.py": "python -m fedfew",
    "cli": "the command line",
    "config": "reads and checks configs, the engine names and plugin files: its output, the resolved config, is "
              "each cell's key (a changed default changes the key, not the code version); runtime.engine is "
              "not in a cell's key, every engine giving the numbers of engine/ and algorithms/",
    "flower": "the Flower engine (launch, SuperNodes, records, its apps): like the engine names, it runs the "
              "clients of engine/ and algorithms/ elsewhere",
    "study": "which configs run (each cell's resolved config is its key) and how stored results are shown",
}


def in_source_hash(relative: Path) -> bool:
    """Whether a file (relative to the package folder) is in the code version."""
    if "__pycache__" in relative.parts or relative.suffix == ".pyc":
        return False
    return len(relative.parts) > 1 and relative.parts[0] in NUMBERS_FOLDERS


def code_text(source: str | bytes) -> str:
    """What of a module's source counts: its syntax tree without docstrings (comments never reach the
    tree), written without line numbers, so a comment, docstring or layout edit keeps the version. The
    writing leaves out empty fields (``type_params=[]``, ``kind=None``), which Python versions add or drop
    as their trees grow: the same code gives the same text on every Python fedfew runs on."""
    return _dump(_without_docstrings(ast.parse(source)))


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:]
    return tree


def _dump(node: object) -> str:
    if isinstance(node, ast.AST):
        fields = [f"{name}={_dump(value)}" for name, value in ast.iter_fields(node)
                  if (value is not None and value != []) or (name == "value" and isinstance(node, ast.Constant))]
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return f"[{', '.join(_dump(item) for item in node)}]"
    return f"{type(node).__name__}:{node!r}"


def _hashed_files(package_dir: Path) -> list[Path]:
    return [path for path in sorted(package_dir.rglob("*"))
            if path.is_file() and in_source_hash(path.relative_to(package_dir))]


def source_hash(package_dir: Path) -> str:
    """A hash of what can change a run's numbers: the modules under :data:`NUMBERS_FOLDERS`, each by its
    path and :func:`code_text`, and the data files there by their bytes."""
    digest = hashlib.sha256()
    for path in _hashed_files(package_dir):
        relative = path.relative_to(package_dir)
        content = code_text(path.read_bytes()).encode() if path.suffix == ".py" else path.read_bytes()
        digest.update(relative.as_posix().encode() + b"\0" + content + b"\0")
    return digest.hexdigest()[:12]


def package_version() -> str:
    """fedfew's installed version (its package metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedfew")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        return "0+unknown"


@cache
def numbers_version() -> str:
    """This installation's :func:`source_hash`: the version of the code that computes a run's numbers.

    Parsing ~90 modules costs ~0.3 s, every run; the result is kept in ``$FEDFEW_CACHE`` (else
    ``~/.cache/fedfew``) under a hash of the same files' bytes (~2 ms), so it is computed once per
    source state. An unwritable cache only costs the parse."""
    package_dir = Path(__file__).resolve().parents[1]  # src/fedfew: this module is in core/
    raw = hashlib.sha256()
    for path in _hashed_files(package_dir):
        raw.update(path.relative_to(package_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    cached = Path(os.environ.get("FEDFEW_CACHE") or Path.home() / ".cache" / "fedfew").expanduser() / \
        "codeversion" / raw.hexdigest()[:32]
    try:
        text = cached.read_text().strip()
        if len(text) == 12:
            return text
    except OSError:
        pass
    version = source_hash(package_dir)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.tmp-{os.getpid()}")
        tmp.write_text(version + "\n")
        os.replace(tmp, cached)
    except OSError:
        pass
    return version
