"""Study records (issues 39, 41, 43): each record names the environment its run computed in and its CPU
seconds beside its wall seconds; `study verify` compares like with like (exactly within one environment,
within the run's interval over test episodes across environments) and prints a drift table; the code
version moves only with the code that can change a number."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedfew.core.codeversion import NOT_NUMBERS, NUMBERS_FOLDERS, in_source_hash, source_hash
from fedfew.run.environment import COMPARED, NOT_RECORDED, describe, describe_environments, same_environment
from fedfew.study.sittings import SITTINGS_FILE, cpu_seconds, run_usage
from fedfew.study.store import ResultStore
from tests.test_study import DIGITS_STUDY, REPO, _as_older_code, run_cli, write_study

PACKAGE = REPO / "src" / "fedfew"

#: One row, one column, one seed, no control: one cell, seconds to run.
ONE_CELL = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [], "seeds": [0],
            "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}


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


# -- the environment and CPU seconds in every record -----------------------------------------------------
def test_a_record_keeps_its_environment_cpu_seconds_and_load(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.config.validation import load_config
    from fedfew.run.environment import run_environment

    path = write_study(tmp_path, ONE_CELL)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    (record,) = store.records()
    environment = record["environment"]
    assert environment == run_environment(load_config(record["config"]))
    assert set(COMPARED) <= set(environment) and environment["fedfew"]
    assert environment["threads"] == 1 and environment["precision"] == "fp32" and environment["device"] == "cpu"
    assert environment["torch"] == __import__("torch").__version__ and environment["python"] == sys.version.split()[0]
    (sitting,) = record["sittings"]
    assert 0 < record["cpu_seconds"] == sitting["cpu_seconds"] and sitting["wall_seconds"] > 0
    assert len(sitting["load_average"]) == 2 and all(isinstance(x, float) for x in sitting["load_average"])
    assert "environment_note" not in record
    # the report's header names it
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke"],
                           capsys)
    assert code == 0 and f"Environment: {describe(environment)} (all 1 run)." in out

    # the run read back (its record lost): described by the sitting that ran it, none added
    (record_path,) = store.folder.glob("*.json")
    record_path.unlink()
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    (again,) = store.records()
    assert again["sittings"] == record["sittings"] and again["environment"] == environment

    # a record stored before environments were recorded says so, and the report with it
    older = {k: v for k, v in record.items() if k not in ("environment", "sittings", "cpu_seconds")}
    record_path.write_text(json.dumps(older))
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke"],
                           capsys)
    assert code == 0 and "Environment: not recorded (all 1 run)." in out


def _notes(folder: Path, *sittings: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SITTINGS_FILE).write_text("".join(json.dumps(s) + "\n" for s in sittings))
    return folder


ENV = {"python": "3.11.7", "torch": "2.13.0+cpu", "numpy": "2.2.1", "fedfew": "0.1.0", "platform": "Linux x86_64",
       "cpu": "Some CPU", "cpu_capability": "AVX512", "device": "cpu", "gpu": None, "cuda": None, "threads": 1,
       "precision": "fp32"}


def _sitting(fresh: bool, cpu: float, env: dict | None = None) -> dict:
    return {"fresh": fresh, "started": "2026-01-01T00:00:00Z", "environment": env or ENV, "wall_seconds": 2 * cpu,
            "cpu_seconds": cpu, "load_average": [0.5, 1.5]}


def test_a_resumed_runs_cpu_seconds_are_its_sittings_and_never_guessed(tmp_path: Path) -> None:
    both = run_usage(_notes(tmp_path / "a", _sitting(True, 10.0), _sitting(False, 5.5, {**ENV, "fedfew": "0.2.0"})))
    assert both["cpu_seconds"] == 15.5 and both["environment"]["fedfew"] == "0.2.0" and len(both["sittings"]) == 2
    # the first sittings not noted (an older fedfew ran them): no total, no environment, and why
    partial = run_usage(_notes(tmp_path / "b", _sitting(False, 5.0)))
    assert "cpu_seconds" not in partial and "environment" not in partial
    assert partial["environment_note"].startswith("not recorded: the run's first sittings were not noted")
    # sittings on two machines: the CPU time is known, the environment is not one
    mixed = run_usage(_notes(tmp_path / "c", _sitting(True, 1.0), _sitting(False, 1.0, {**ENV, "cpu": "Other"})))
    assert mixed["cpu_seconds"] == 2.0 and "environment" not in mixed and "Other" in mixed["environment_note"]
    assert "environment" not in run_usage(tmp_path / "d") and "not recorded" in run_usage(tmp_path / "d")[
        "environment_note"]
    # the report counts both as not recorded, never as either environment
    assert describe_environments([mixed, partial, {"environment": ENV}]) == (
        f"Environments: 1 run on {describe(ENV)}; 2 runs: {NOT_RECORDED}.")


def test_cpu_seconds_count_child_processes_that_ended() -> None:
    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: "
                    "pass"], check=True)
    assert cpu_seconds() - before >= 0.4


def test_environments_compare_everything_but_fedfews_version() -> None:
    assert same_environment(ENV, {**ENV, "fedfew": "9.9.9"})
    assert not same_environment(ENV, {**ENV, "cpu_capability": "AVX2"})
    assert not same_environment(ENV, {**ENV, "threads": 2})
    assert not same_environment(None, ENV) and not same_environment(None, None)  # unknown is not the same
    gpu = {**ENV, "device": "cuda", "gpu": "NVIDIA H200", "cuda": "12.8"}
    assert describe(gpu).startswith("NVIDIA H200 (CUDA 12.8), ") and describe(ENV).startswith("Some CPU (AVX512), ")


# -- verify: like with like ------------------------------------------------------------------------------
@pytest.fixture
def stored_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, list[str], ResultStore, dict]:
    """One cell run and stored, relabelled as older code's; its run folder is this code's, so `verify`
    reads it back (the same numbers, in seconds) rather than training again."""
    path = write_study(tmp_path, ONE_CELL)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    _as_older_code(store)
    (record,) = store.records()
    return path, args, store, record


def _restore(store: ResultStore, record: dict) -> None:
    """The store as it was: only the older record."""
    shutil.rmtree(store.folder)
    store.put(record)


def _with(record: dict, shift_ci95s: float, environment: dict | None | str = "keep") -> dict:
    """``record`` with its test accuracy moved by ``shift_ci95s`` times its interval, in another
    environment (or none: an older record) unless ``keep``."""
    test = record["metrics"]["test"]
    changed = {**record, "metrics": {**record["metrics"], "test": {**test, "accuracy": test["accuracy"]
                                                                    + shift_ci95s * test["ci95"]}}}
    if environment is None:
        changed.pop("environment")
    elif environment != "keep":
        changed["environment"] = environment
    return changed


def test_verify_allows_drift_within_the_interval_only_across_environments(
        stored_cell: tuple[Path, list[str], ResultStore, dict], capsys: pytest.CaptureFixture[str]) -> None:
    path, args, store, record = stored_cell
    elsewhere = {**record["environment"], "cpu_capability": "AVX2", "torch": "2.12.0+cpu"}

    # another environment, half an interval off: within tolerance, recorded as such with the difference
    store.put(_with(record, 0.5, elsewhere))
    code, out, err = run_cli(["study", "verify", str(path), *args], capsys)
    assert code == 0, err
    assert "within tolerance (another environment)" in err
    row = [line for line in out.splitlines() if line.startswith("| fl-proto / IID 1-shot / seed 0 |")]
    assert len(row) == 1 and "| E1 → E2 | within tolerance |" in row[0]
    assert "E1: " + describe(elsewhere) in out and "E2: " + describe(record["environment"]) in out
    assert "(0 exactly, 1 within the stored run's 95% interval" in out.splitlines()[-1]
    (equivalence,) = store.equivalences()
    (cell,) = equivalence["cells"]
    assert equivalence["exact"] is False and set(equivalence["environments"]) == {"E1", "E2"}
    assert cell["difference"] == pytest.approx(-0.5 * record["metrics"]["test"]["ci95"])
    assert cell["environments"] == ["E1", "E2"] and cell["judged"] == "within tolerance" and not cell["exact"]

    # another environment, one and a half intervals off: outside, exit 1, nothing written
    _restore(store, _with(record, 1.5, elsewhere))
    code, out, err = run_cli(["study", "verify", str(path), *args], capsys)
    assert code == 1 and "OUTSIDE tolerance" in out and "1 outside the stored run's 95% interval" in err
    assert store.equivalences() == [] and len(store.records()) == 1

    # the same environment: any difference fails, however small
    _restore(store, _with(record, 0.01))
    code, out, err = run_cli(["study", "verify", str(path), *args], capsys)
    assert code == 1 and "| E1 → E1 | DIFFERENT |" in out and "1 different in the same environment" in err

    # a record from before environments were recorded: judged by the tolerance, its environment named unknown
    _restore(store, _with(record, 0.5, None))
    code, out, err = run_cli(["study", "verify", str(path), *args], capsys)
    assert code == 0, err
    assert "| not recorded → E1 | within tolerance |" in out
    _restore(store, _with(record, 0.0, None))
    code, out, err = run_cli(["study", "verify", str(path), *args], capsys)
    assert code == 0 and "| not recorded → E1 | the same |" in out and "on all 1 re-run cells (exactly)" in out


def test_a_record_of_a_section_older_than_its_newest_field_hashes_to_its_key() -> None:
    """A store record holds the config as it was dumped when it ran: a section without the fields added
    since (privacy's noise and accounting, issue 51) is as neutral as one holding them at their defaults, so
    the record's own config still hashes to the key it is filed under."""
    from fedfew.config.validation import PrivacyConfig, load_config
    from fedfew.study.grid import config_hash, dump_hash
    from tests.tiny import tiny_config

    config = load_config(tiny_config("fl-proto"))
    dump = config.model_dump(mode="json")
    older = {**dump, "privacy": {k: v for k, v in dump["privacy"].items() if k not in ("noise", "accounting")}}
    assert dump_hash(older) == dump_hash(dump) == config_hash(config)
    assert set(PrivacyConfig().model_dump()) > set(older["privacy"])
    private = {**dump, "privacy": {**older["privacy"], "mechanism": "central-dp"}}
    assert dump_hash(private) != dump_hash(dump)  # a section with a field off its default is not neutral
