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

#: What can change a run's numbers, relative to the package folder: every file under these folders (a
#: module added to one later is covered without a change here; the bundled data files too) ...
NUMBERS_FOLDERS = ("algorithms", "data", "engine", "meta", "models", "privacy")
#: ... and these modules: the adversarial clients, the label corruption, FRL's deployment groups and their
#: scores, the episodes, evaluation, the built experiment (data, split, partition, models), the model's
#: trial pass before a run (it must leave the generators as they were), the partitions, the registry
#: (which class a name runs), the summary's chance level (``results``), the checkpoints a resumed run
#: continues from (``runfolder``), the round loop and the selected round (``runner``), how options are
#: read (``schema``, ``signature_options``), the seeds, and the intervals ``evaluation`` takes from the
#: statistics module (``stats``: a run's ci95 over test episodes, Wilson's interval).
NUMBERS_MODULES = ("adversarial.py", "corruption.py", "deployment.py", "episodes.py", "evaluation.py",
                   "experiment.py", "model_check.py", "partition.py", "registry.py", "results.py", "runfolder.py",
                   "runner.py", "schema.py", "seeding.py", "signature_options.py", "stats.py")
#: The rest of the package, and why it cannot change a number. tests/test_study_records.py fails when a
#: module the hashed code imports is in neither list, so a new module cannot fall out of the version
#: unseen; ``fedfew study verify`` remains the check that the numbers did not move.
NOT_NUMBERS = {
    "__init__.py": "the package's lazy names",
    "codeversion.py": "computes this very version",
    "__main__.py": "python -m fedfew",
    "allocator.py": "how glibc hands out memory (the mmap threshold): where blocks live, never their values",
    "cli.py": "the command line",
    "config.py": "reads and checks configs: its output, the resolved config, is each cell's key (a changed "
                 "default changes the key, not the code version)",
    "configschema.py": "the config's schema (sections, fields, defaults), which config.py checks against the "
                       "registries: like config.py, what it decides is in each cell's key, the resolved config",
    "datarecord.py": "describes the data a run used (data.json)",
    "environment.py": "describes where a run computed (a study record's environment)",
    "engines.py": "the engines by name: runtime.engine is not in a cell's key, every engine giving the numbers "
                  "of engine/ and algorithms/",
    "errors.py": "exception classes",
    "integrity.py": "checksums of a run's files, config and data, verified on read back: it refuses, never "
                    "computes a number",
    "yaml12.py": "reads config and study files (refusing what YAML 1.1 and 1.2 read differently): like config.py, "
                 "what it reads is each cell's key",
    "jsontypes.py": "type aliases of JSON values, read by annotations only",
    "flower": "the Flower engine (launch, SuperNodes, records): like engines.py, it runs the clients of engine/ "
              "and algorithms/ elsewhere",
    "plugins.py": "loads a user's plugin files (outside the package)",
    "processes.py": "questions about OS processes (alive, descendants; psutil) for the Flower launcher and study "
                    "claims",
    "progress.py": "the progress bar",
    "rescore.py": "fedfew evaluate, which no study cell runs",
    "study": "which configs run (each cell's resolved config is its key) and how stored results are shown",
    "sweep.py": "fedfew sweep",
    "tracking.py": "TensorBoard and MLflow files",
}


def in_source_hash(relative: Path) -> bool:
    """Whether a file (relative to the package folder) is in the code version."""
    if "__pycache__" in relative.parts or relative.suffix == ".pyc":
        return False
    if len(relative.parts) > 1:
        return relative.parts[0] in NUMBERS_FOLDERS
    return relative.name in NUMBERS_MODULES


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
    """A hash of what can change a run's numbers: the modules under :data:`NUMBERS_FOLDERS` and in
    :data:`NUMBERS_MODULES`, each by its path and :func:`code_text`, and the data files there by their
    bytes."""
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
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


@cache
def numbers_version() -> str:
    """This installation's :func:`source_hash`: the version of the code that computes a run's numbers.

    Parsing ~90 modules costs ~0.3 s, every run; the result is kept in ``$FEDFEW_CACHE`` (else
    ``~/.cache/fedfew``) under a hash of the same files' bytes (~2 ms), so it is computed once per
    source state. An unwritable cache only costs the parse."""
    package_dir = Path(__file__).resolve().parent
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
