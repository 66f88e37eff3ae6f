"""The code version of a run's numbers (fedfew.core.codeversion): an edit moves it only where it can
change a number, a new module or data file under a hashed folder counts, the code text is the same on
every Python, and every module the number code imports is hashed or named harmless."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from fedfew.core.codeversion import NOT_NUMBERS, NUMBERS_FOLDERS, in_source_hash, source_hash
from tests.study.common import REPO


def test_the_source_hash_covers_what_computes_numbers_not_the_study_layer(tmp_path: Path) -> None:
    """A change to an algorithm makes a new code version; a change to how studies run or report
    (fedfew/study/), to the command line, or to an algorithm's docstring does not: the resolved config is
    in each cell's key already (the tests below edit a copy of the real package)."""
    from fedfew.core.codeversion import source_hash

    package = tmp_path / "fedfew"
    (package / "study").mkdir(parents=True)
    (package / "algorithms").mkdir()
    (package / "algorithms" / "fedavg.py").write_text("LR = 0.1\n")
    (package / "study" / "report.py").write_text("DIGITS = 2\n")
    (package / "cli.py").write_text("USAGE = 'fedfew run'\n")
    first = source_hash(package)
    (package / "study" / "report.py").write_text("DIGITS = 3\n")
    (package / "cli.py").write_text("USAGE = 'fedfew run CONFIG'\n")
    (package / "algorithms" / "fedavg.py").write_text('"""FedAvg."""\nLR = 0.1  # the paper\'s\n')
    assert source_hash(package) == first
    (package / "algorithms" / "fedavg.py").write_text("LR = 0.2\n")
    assert source_hash(package) != first
    (package / "algorithms" / "fedavg.py").write_text("LR = 0.1\n")
    (package / "algorithms" / "fedavg_copy.py").write_text("LR = 0.1\n")  # a new module counts too
    assert source_hash(package) != first


PACKAGE = REPO / "src" / "fedfew"


# -- the code version moves only with the numbers' code --------------------------------------------------
@pytest.fixture(scope="module")
def package_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the real package's sources (and bundled data), to edit."""
    folder = tmp_path_factory.mktemp("package") / "fedfew"
    shutil.copytree(PACKAGE, folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return folder


def _edited(path: Path, old: str, new: str) -> str:
    """``path``'s text with ``old`` (which must be there once) replaced; the original back with
    :func:`Path.write_text`."""
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {path}"
    path.write_text(text.replace(old, new))
    return text


@pytest.mark.parametrize("where, old, new, moves", [
    # a docstring, a comment and the layout of an algorithm: the same code
    ("algorithms/fedavg.py", '"""FedAvg (McMahan', '"""A docstring edit. FedAvg (McMahan', False),
    ("algorithms/fedavg.py", "from __future__ import annotations\n",
     "from __future__ import annotations  # a comment\n\n\n", False),
    # the layers above the run: the command line, the Flower launch and apps, the study layer: not numbers
    ("cli/main.py", "from __future__ import annotations\n", "from __future__ import annotations\nCLI_EDIT = 1\n", False),
    ("flower/launch.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", False),
    ("flower/apps/server.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", False),
    ("study/report.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", False),
    # the config's defaults reach each cell's key (the resolved config), not the code version
    ("config/validation.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", False),
    # a folder is hashed whole: code that computes numbers (an algorithm, the contract, the round loop, the
    # evaluation, the seeds, the run) and, beside it, a module that cannot (the progress bar, the trackers)
    ("algorithms/fedavg.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", True),
    ("algorithms/parts/common.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", True),
    ("interface/aggregation.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", True),
    ("engine/round.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", True),
    ("run/runner.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", True),
    ("fewshot/evaluation.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", True),
    ("core/seeding.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", True),
    ("core/progress.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", True),
    ("core/tracking.py", "from __future__ import annotations\n", "from __future__ import annotations\nX = 1\n", True),
])
def test_an_edit_moves_the_code_version_only_where_it_can_change_a_number(package_copy: Path, where: str, old: str,
                                                                          new: str, moves: bool) -> None:
    before = source_hash(package_copy)
    original = _edited(package_copy / where, old, new)
    assert (package_copy / where).read_text() != original, f"{where}: the edit changed nothing"
    try:
        assert (source_hash(package_copy) != before) is moves
    finally:
        (package_copy / where).write_text(original)
    assert source_hash(package_copy) == before


def test_a_new_module_or_data_file_under_a_hashed_folder_counts(package_copy: Path) -> None:
    before = source_hash(package_copy)
    new = package_copy / "models" / "new_model.py"  # added later, named nowhere
    new.write_text("WIDTH = 3\n")
    try:
        assert source_hash(package_copy) != before
    finally:
        new.unlink()
    data = package_copy / "data" / "omniglot_mini.npz"  # the bundled images a digits run reads
    original = data.read_bytes()
    data.write_bytes(original + b"\0")
    try:
        assert source_hash(package_copy) != before
    finally:
        data.write_bytes(original)
    (package_copy / "sweep_helper.py").write_text("X = 1\n")  # outside: the next test names it unclassified
    try:
        assert source_hash(package_copy) == before
    finally:
        (package_copy / "sweep_helper.py").unlink()


def test_the_code_text_keeps_no_empty_fields_that_python_versions_differ_in() -> None:
    from fedfew.core.codeversion import code_text

    text = code_text("def f(x: int) -> int:\n    'doc'\n    return x\nclass A:\n    pass\n")
    assert "type_params" not in text and "kind" not in text and "doc" not in text and "lineno" not in text
    assert code_text("x = None\n") != code_text("x = ...\n")  # a None constant is still a value


def _imports(path: Path, package: Path) -> set[Path]:
    """The package's files that ``path`` imports, anywhere in it (imports inside functions, fedfew's
    lazy ones, included; ``if TYPE_CHECKING:`` blocks, which never run, not), with each module's
    parent packages' ``__init__.py``, which importing it runs."""
    tree = ast.parse(path.read_text())
    skipped = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
               and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
               for statement in block.body for node in ast.walk(statement)}
    here = path.relative_to(package.parent).with_suffix("").parts
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package (here[:-1], __init__ or not), up level - 1
                above = here[:-1][:len(here) - node.level]
                base = ".".join([*above, *([node.module] if node.module else [])])
            else:
                base = str(node.module)
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    found = set()
    for name in names:
        parts = name.split(".")
        if parts[0] != package.name:
            continue
        for end in range(1, len(parts) + 1):  # the module, and every package above it
            folder = package.parent.joinpath(*parts[:end])
            for candidate in (folder.with_suffix(".py"), folder / "__init__.py"):
                if candidate.is_file():
                    found.add(candidate)
    return found - {path}


def unclassified_imports(package: Path) -> dict[str, str]:
    """Modules the hashed code imports, transitively through hashed code, that are neither hashed nor in
    NOT_NUMBERS: {module: the hashed module that imports it}."""
    hashed = [p for p in package.rglob("*.py") if in_source_hash(p.relative_to(package))]
    seen, stack, out = set(hashed), list(hashed), {}
    while stack:
        module = stack.pop()
        for imported in _imports(module, package):
            relative = imported.relative_to(package)
            if imported in seen:
                continue
            seen.add(imported)
            if in_source_hash(relative):
                stack.append(imported)
            elif relative.parts[0] not in NOT_NUMBERS:
                out[relative.as_posix()] = module.relative_to(package).as_posix()
    return out


def test_every_module_the_number_code_imports_is_hashed_or_named_harmless(package_copy: Path) -> None:
    """The allowlist cannot go stale unseen: a module that algorithms, the engine or any other hashed
    module imports (transitively, lazily too) is hashed or named in NOT_NUMBERS with why; and every
    module and folder of the package is one or the other."""
    assert unclassified_imports(PACKAGE) == {}
    top = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p.is_dir() and any(p.rglob("*.py")))}
    named = set(NUMBERS_FOLDERS) | set(NOT_NUMBERS)
    assert top - named == set(), "classify these in fedfew.core.codeversion (NUMBERS_FOLDERS or NOT_NUMBERS)"
    assert named - top == set(), "these are gone: take them out of fedfew.core.codeversion's lists"
    assert not set(NUMBERS_FOLDERS) & set(NOT_NUMBERS)
    # the check catches a new module an algorithm starts to use
    helper = package_copy / "lr_schedule.py"
    helper.write_text("def lr(step):\n    return 0.1 / (1 + step)\n")
    original = _edited(package_copy / "algorithms" / "fedavg.py", "from __future__ import annotations\n",
                       "from __future__ import annotations\n\nfrom fedfew.lr_schedule import lr\n")
    try:
        assert unclassified_imports(package_copy) == {"lr_schedule.py": "algorithms/fedavg.py"}
    finally:
        (package_copy / "algorithms" / "fedavg.py").write_text(original)
        helper.unlink()
