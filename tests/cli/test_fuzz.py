"""Fuzzing the command line with hypothesis: mutated configs and corrupted data files.

Every input must end in one of two ways: exit 0 with a complete run folder, or exit 2 with a single
line on stderr naming the key or the file, no traceback, and no run folder marked complete. Each
test counts the inputs it tried and how they ended (run with -s to see the counts; docs/reliability.md
quotes them)."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import random
import shutil
import struct
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedfew.cli.main import main
from tests.tiny import tiny_config

FUZZ_SETTINGS = settings(max_examples=100, deadline=None, derandomize=True,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
COUNTS: dict[str, Counter[str]] = {}


def run_cli(args: list[str], out: Path) -> tuple[int, str]:
    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        code = main([*args, "--out", str(out), "--quiet"])
    return code, err.getvalue()


def check_outcome(kind: str, code: int, err: str, out: Path, names: list[str]) -> None:
    """The contract: exit 0 and a complete run; or exit 2 (bad input), one line naming one of
    ``names``; or exit 1 (a run that failed: diverged, nothing trained), one line and status failed."""
    statuses = [json.loads(p.read_text())["status"] for p in out.glob("*/status.json")]
    counts = COUNTS.setdefault(kind, Counter())
    counts["inputs"] += 1
    assert "Traceback" not in err
    if code == 0:
        counts["ran"] += 1
        assert statuses and all(s == "complete" for s in statuses)
        return
    lines = [line for line in err.splitlines() if line.strip() and "warning" not in line]
    assert len(lines) == 1 and lines[0].startswith("fedfew:"), err
    assert "complete" not in statuses
    if code == 1:
        counts["failed at runtime"] += 1
        assert lines[0].startswith("fedfew: run failed") and statuses == ["failed"], (lines, statuses)
        return
    counts["rejected"] += 1
    assert code == 2, err
    assert any(name in lines[0] for name in names), (names, lines[0])


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Any:
    yield
    for kind, counts in sorted(COUNTS.items()):
        print(f"\nfuzz {kind}: {dict(counts)}")


# -- configs -----------------------------------------------------------------------------------------
BASE = tiny_config("fl-proto", federation={"rounds": 1}, episodes={"n_way": 2, "q_query": 1, "test_episodes": 2},
                   model={"name": "conv4", "options": {"hidden": 4}})


def leaf_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [p for k, v in node.items() for p in leaf_paths(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")]


PATHS = leaf_paths(BASE) + ["federation.dropout", "federation.stragglers", "partition.options.alpha",
                            "model.options.hidden", "algorithm.options.lr", "episodes.k_shot", "splits.val"]
values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 6), st.floats(-2, 3), st.sampled_from([float("nan"), float("inf")]), st.text(max_size=6),
    st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.sampled_from(["a", "alpha", "hidden"]),
                                                            st.integers(0, 3), max_size=2),
)
mutations = st.lists(
    st.tuples(st.sampled_from(["set", "add", "delete"]), st.sampled_from(PATHS),
              st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8), values),
    min_size=1, max_size=3,
)


def mutate(config: dict[str, Any], changes: list[tuple[str, str, str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Apply (operation, path, new key, value) changes; returns the config and the keys touched."""
    touched = []
    for operation, path, new_key, value in changes:
        parts = path.split(".")
        node = config
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if operation == "set":
            node[parts[-1]] = value
            touched.append(path)
        elif operation == "add":
            node[new_key] = value
            touched.append(f"{'.'.join(parts[:-1])}.{new_key}".strip("."))
        else:
            node.pop(parts[-1], None)
            touched.append(path)
    return config, touched


@FUZZ_SETTINGS
@given(changes=mutations)
def test_fuzzed_configs_run_or_fail_cleanly(changes: list[tuple[str, str, str, Any]]) -> None:
    config, touched = mutate(json.loads(json.dumps(BASE)), changes)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        code, err = run_cli(["run", str(path)], Path(tmp) / "out")
        # The message names a key the fuzzer touched (or one the touched value made impossible).
        names = [t.split(".")[-1] for t in touched] + [t.split(".")[0] for t in touched] + [
            "episodes", "partition", "clients", "splits", "model", "dataset", "algorithm", "federation"]
        check_outcome("configs", code, err, Path(tmp) / "out", names)


raw_values = st.one_of(st.text(max_size=8), st.sampled_from(["[1", "{a:", "- -", "'", "1e999", "-0", "~", "!!x"]))


@FUZZ_SETTINGS
@given(key=st.sampled_from(PATHS + ["rounds", "bogus", "federation", "a.b.c"]), raw=raw_values)
def test_fuzzed_set_values_run_or_fail_cleanly(key: str, raw: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(BASE))
        code, err = run_cli(["run", str(path), "--set", f"{key}={raw}"], Path(tmp) / "out")
        names = [key, key.split(".")[-1], "override", "--set", "episodes", "partition", "model", "clients",
                 "splits", "dataset", "federation", "algorithm"]
        check_outcome("set values", code, err, Path(tmp) / "out", names)


# -- data files ----------------------------------------------------------------------------------------
def write_huffpost(root: Path) -> list[Path]:
    lines = [json.dumps({"raw": f"words about topic {c} item {i}", "label": c}) for c in range(41) for i in range(3)]
    path = root / "text" / "huffpost.json"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    return [path]


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape) + array.tobytes()


def write_mnist(root: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10, dtype=np.uint8), 4)
    images = rng.integers(0, 255, (len(labels), 28, 28), dtype=np.uint8)
    folder = root / "mnist"
    folder.mkdir(parents=True)
    paths = [folder / "t10k-images-idx3-ubyte.gz", folder / "t10k-labels-idx1-ubyte.gz"]
    paths[0].write_bytes(gzip.compress(idx_bytes(images, 2051)))
    paths[1].write_bytes(gzip.compress(idx_bytes(labels, 2049)))
    return paths


def write_femnist(root: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    users = [f"w{k}" for k in range(3)]
    data = {u: {"x": rng.random((62 * 2, 784)).round(2).tolist(), "y": [c for c in range(62) for _ in range(2)]}
            for u in users}
    path = root / "femnist" / "train" / "shard.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"users": users, "num_samples": [124] * 3, "user_data": data}))
    return [path]


def write_omniglot(root: Path) -> list[Path]:
    folder = root / "omniglot"
    folder.mkdir(parents=True)
    paths = []
    for half, chars in (("background", 4), ("evaluation", 3)):
        images = np.random.default_rng(1).random((chars, 20, 105, 105)) > 0.5
        labels = np.repeat(np.arange(chars), 20).reshape(chars, 20)
        path = folder / f"images_{half}.npz"
        np.savez(path, images=images, labels=labels)
        paths.append(path)
    return paths


DATA_FORMATS: dict[str, tuple[Callable[[Path], list[Path]], list[str]]] = {
    "huffpost": (write_huffpost, ["--set", "model.name=bilstm", "--set", "model.options={}"]),
    "mnist": (write_mnist, []),
    "femnist": (write_femnist, []),
    "omniglot": (write_omniglot, ["--set", "dataset.options={split: official, image_size: 14}"]),
}
corruptions = st.tuples(
    st.sampled_from(["truncate", "flip", "empty", "garbage", "append"]),
    st.floats(0, 1), st.integers(0, 2**32 - 1),
)


def corrupt(path: Path, how: str, where: float, seed: int) -> None:
    data = path.read_bytes()
    rng = random.Random(seed)
    if how == "truncate":
        data = data[: int(len(data) * where)]
    elif how == "flip":
        data = bytearray(data)
        for _ in range(1 + rng.randrange(8)):
            data[int(where * (len(data) - 1)) if rng.random() < 0.5 else rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        data = bytes(data)
    elif how == "empty":
        data = b""
    elif how == "garbage":
        data = rng.randbytes(1 + int(where * 2000))
    else:
        data = data + rng.randbytes(1 + int(where * 50))
    path.write_bytes(data)


@pytest.mark.parametrize("dataset", sorted(DATA_FORMATS))
def test_uncorrupted_data_files_run(dataset: str, tmp_path: Path) -> None:
    """The files the fuzzer corrupts are valid to begin with: the fuzz reaches past the first check."""
    writer, extra = DATA_FORMATS[dataset]
    writer(tmp_path / "data")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(BASE))
    code, err = run_cli(["run", str(config), "--set", f"dataset.name={dataset}",
                         "--set", f"dataset.root={tmp_path / 'data'}", *extra], tmp_path / "out")
    assert code == 0, err


@pytest.mark.parametrize("dataset", sorted(DATA_FORMATS))
def test_fuzzed_data_files_run_or_fail_cleanly(dataset: str) -> None:
    writer, extra = DATA_FORMATS[dataset]

    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(which=st.integers(0, 3), corruption=corruptions)
    def check(which: int, corruption: tuple[str, float, int]) -> None:
        tmp = Path(tempfile.mkdtemp())
        try:
            files = writer(tmp / "data")
            target = files[which % len(files)]
            corrupt(target, *corruption)
            config = tmp / "config.yaml"
            config.write_text(yaml.safe_dump(BASE))
            code, err = run_cli(["run", str(config), "--set", f"dataset.name={dataset}",
                                 "--set", f"dataset.root={tmp / 'data'}", *extra], tmp / "out")
            check_outcome(f"{dataset} files", code, err, tmp / "out", [target.name, dataset, "episodes", "splits"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    check()


# -- keys twice, booleans, bytes, folders ---------------------------------------------------------------
NEW_KIND_SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
#: Every number in the schema that the base config or the options of its model, partition and algorithm
#: hold: a boolean there must be refused (pydantic's lax mode would read true as 1).
NUMBER_PATHS = [
    "seed", "partition.num_clients", "federation.rounds", "federation.clients_per_round", "federation.dropout",
    "federation.stragglers", "episodes.n_way", "episodes.k_shot", "episodes.q_query", "episodes.test_episodes",
    "episodes.val_episodes", "eval.every", "runtime.threads", "runtime.workers", "runtime.checkpoint_every",
    "model.options.hidden", "partition.options.alpha", "algorithm.options.local_steps", "algorithm.options.lr",
    "classification.test_fraction", "flower.port", "flower.round_timeout",
]


def yaml_lines(config: dict[str, Any]) -> list[str]:
    return yaml.safe_dump(config, default_flow_style=False, sort_keys=False).splitlines()


@NEW_KIND_SETTINGS
@given(line=st.integers(0, 10_000), value=st.one_of(st.integers(-2, 9), st.text("abc", max_size=3), st.booleans()))
def test_fuzzed_duplicate_keys_are_refused_naming_key_and_file(line: int, value: Any) -> None:
    lines = yaml_lines(BASE)
    keyed = [i for i, text in enumerate(lines) if ":" in text and not text.lstrip().startswith("- ")]
    at = keyed[line % len(keyed)]
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    key = lines[at].strip().split(":", 1)[0]
    lines.insert(at, f"{indent}{key}: {json.dumps(value)}")  # the same key again, first, in the same mapping
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "duplicate.yaml"
        path.write_text("\n".join(lines) + "\n")
        code, err = run_cli(["run", str(path)], Path(tmp) / "out")
        check_outcome("duplicate keys", code, err, Path(tmp) / "out", [f"{key!r} appears twice"])
        assert code == 2 and str(path) in err


@NEW_KIND_SETTINGS
@given(path=st.sampled_from(NUMBER_PATHS), value=st.booleans(), how=st.sampled_from(["file", "--set"]))
def test_fuzzed_booleans_for_numbers_are_refused(path: str, value: bool, how: str) -> None:
    config, _ = mutate(json.loads(json.dumps(BASE)), [] if how == "--set" else [("set", path, "", value)])
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "config.yaml"
        file.write_text(yaml.safe_dump(config))
        extra = ["--set", f"{path}={'true' if value else 'false'}"] if how == "--set" else []
        code, err = run_cli(["run", str(file), *extra], Path(tmp) / "out")
        check_outcome("booleans for numbers", code, err, Path(tmp) / "out", [path])
        assert code == 2


@NEW_KIND_SETTINGS
@given(where=st.floats(0, 1), byte=st.integers(0x80, 0xFF), count=st.integers(1, 3))
def test_fuzzed_non_utf8_configs_name_the_file(where: float, byte: int, count: int) -> None:
    data = yaml.safe_dump(BASE).encode()
    at = int(where * len(data))
    data = data[:at] + bytes([byte]) * count + data[at:]  # a lone byte >= 0x80 in ASCII text: never UTF-8
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "latin.yaml"
        path.write_bytes(data)
        code, err = run_cli(["run", str(path)], Path(tmp) / "out")
        check_outcome("non-UTF-8 configs", code, err, Path(tmp) / "out", [str(path)])
        assert code == 2 and "UTF-8" in err


FOLDER_TARGETS = ["config", "plugin", "test_tasks", *sorted(DATA_FORMATS)]


@NEW_KIND_SETTINGS
@given(target=st.sampled_from(FOLDER_TARGETS), which=st.integers(0, 3))
def test_fuzzed_folders_where_files_belong_name_the_path(target: str, which: int) -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        config = tmp / "config.yaml"
        config.write_text(yaml.safe_dump(BASE))
        folder = tmp / "a-folder.yaml"
        args = ["run", str(config)]
        if target == "config":
            folder.mkdir()
            args = ["run", str(folder)]
        elif target == "plugin":
            folder = tmp / "a-folder.py"
            folder.mkdir()
            args += ["--plugin", str(folder)]
        elif target == "test_tasks":
            folder = tmp / "tasks.json"
            folder.mkdir()
            args += ["--set", f"episodes.test_tasks={folder}"]
        else:
            writer, extra = DATA_FORMATS[target]
            files = writer(tmp / "data")
            folder = files[which % len(files)]
            folder.unlink()
            folder.mkdir()
            args += ["--set", f"dataset.name={target}", "--set", f"dataset.root={tmp / 'data'}", *extra]
        code, err = run_cli(args, tmp / "out")
        names = [folder.name] if target in ("config", "plugin", "test_tasks") else [folder.name, target]
        check_outcome("folders as files", code, err, tmp / "out", names)
        assert code == 2


# -- study files and store records -----------------------------------------------------------------------
def run_study_cli(args: list[str]) -> tuple[int, str]:
    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        code = main(args)
    return code, err.getvalue()


STUDY_PATHS = ["name", "title", "config", "seeds", "methods", "settings", "budgets", "control", "paper", "claims",
               "set", "methods.fl-proto", "methods.fl-maml.set", "methods.fl-maml.label", "settings.IID 1-shot",
               "budgets.smoke", "budgets.smoke.set", "budgets.smoke.settings", "budgets.cpu", "control.method"]
study_values = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 3), st.text(max_size=6), st.lists(st.integers(0, 2), max_size=3),
    st.lists(st.text("abc", max_size=3), max_size=2), st.dictionaries(st.sampled_from(["set", "x", "seeds"]),
                                                                      st.integers(0, 2), max_size=2),
)
study_mutations = st.lists(
    st.tuples(st.sampled_from(["set", "add", "delete"]), st.sampled_from(STUDY_PATHS),
              st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8), study_values),
    min_size=1, max_size=3,
)


def check_study_outcome(kind: str, code: int, err: str, names: list[str]) -> None:
    """A study command ends in exit 0, or exit 2 with one line naming one of ``names``; never a traceback."""
    counts = COUNTS.setdefault(kind, Counter())
    counts["inputs"] += 1
    assert "Traceback" not in err and "unexpected" not in err, err
    if code == 0:
        counts["accepted"] += 1
        return
    lines = [line for line in err.splitlines() if line.strip() and "warning" not in line]
    counts["rejected"] += 1
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fedfew:"), (code, err)
    assert any(name in lines[0] for name in names), (names, lines[0])


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(changes=study_mutations)
def test_fuzzed_study_files_are_read_or_refused_in_one_line(changes: list[tuple[str, str, str, Any]]) -> None:
    from tests.study.common import DIGITS_STUDY

    study, touched = mutate(json.loads(json.dumps(DIGITS_STUDY)), changes)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        path = tmp / "study.yaml"
        path.write_text(yaml.safe_dump(study, sort_keys=False))
        code, err = run_study_cli(["study", "status", str(path), "--store", str(tmp / "store"),
                                   "--runs", str(tmp / "runs"), "--budget", "smoke"])
        names = [str(path), "study", "budget", "--budget", *[t.split(".")[0] for t in touched],
                 *[t.rsplit(".", 1)[-1] for t in touched]]
        check_study_outcome("study files", code, err, names)


@pytest.fixture(scope="module")
def stored_digits_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The tests' digits study run once at its smoke budget: (study file, store, runs)."""
    from tests.study.common import DIGITS_STUDY

    tmp = tmp_path_factory.mktemp("fuzz-store")
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump({**DIGITS_STUDY, "seeds": [0]}, sort_keys=False))
    code, err = run_study_cli(["study", "run", str(path), "--store", str(tmp / "store"), "--runs", str(tmp / "runs"),
                               "--budget", "smoke"])
    assert code == 0, err
    return path, tmp / "store", tmp / "runs"


RECORD_FIELDS = ["format", "study", "budget", "method", "setting", "seed", "config_hash", "config", "code",
                 "metrics", "wall_seconds", "finished", "history", "environment", "cpu_seconds"]
record_changes = st.one_of(
    st.tuples(st.just("delete"), st.sampled_from(RECORD_FIELDS), st.none()),
    st.tuples(st.just("set"), st.sampled_from(RECORD_FIELDS + ["metrics.test", "metrics.test.accuracy", "code.source"]),
              st.one_of(st.none(), st.integers(-1, 2), st.text(max_size=4), st.lists(st.integers(), max_size=2),
                        st.floats(allow_nan=True))),
    st.tuples(st.just("bytes"), st.sampled_from(["truncate", "flip", "empty", "not json"]), st.integers(0, 10_000)),
)


@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(change=record_changes)
def test_fuzzed_store_records_are_used_or_named_as_damaged(stored_digits_study: tuple[Path, Path, Path],
                                                           change: tuple[str, str, Any]) -> None:
    """A changed record is either still a whole record (used) or named, with its path, as damaged by
    status and report alike (exit 0: the study's other cells stand); never a traceback."""
    study, store, _ = stored_digits_study
    with tempfile.TemporaryDirectory() as tmp_name:
        copy = Path(tmp_name) / "store"
        shutil.copytree(store, copy)
        record_path = sorted(copy.glob("*/*.json"))[0]
        operation, where, value = change
        if operation == "bytes":
            data = record_path.read_bytes()
            cut = value % max(len(data), 1)
            record_path.write_bytes({"truncate": data[:cut], "flip": data[:cut] + bytes([data[cut] ^ 0x5A]) + data[cut + 1:],
                                     "empty": b"", "not json": b"hello"}[where])
        else:
            record = json.loads(record_path.read_text())
            *parents, key = where.split(".")
            node = record
            for part in parents:
                node = node.setdefault(part, {}) if isinstance(node, dict) else {}
            if isinstance(node, dict):
                if operation == "delete":
                    node.pop(key, None)
                else:
                    node[key] = value
            record_path.write_text(json.dumps(record))
        for command in ("status", "report"):
            code, err = run_study_cli(["study", command, str(study), "--store", str(copy), "--budget", "smoke",
                                       *(["--runs", str(Path(tmp_name) / "runs")] if command == "status" else [])])
            check_study_outcome(f"store records ({command})", code, err, [record_path.name])
            if code == 0 and "damaged" in err:
                COUNTS[f"store records ({command})"]["named as damaged"] += 1
                assert record_path.name in err


# -- what a run reads back, sweeps, YAML numbers and aliases --------------------------------------------
READ_BACK_SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-round run of ``local`` (private states on disk) interrupted by Ctrl-C in round 3."""
    from fedfew.algorithms.local import Local
    from fedfew.config.validation import load_config
    from fedfew.run.runner import RunInterrupted, run_experiment

    config = load_config(tiny_config("local", federation={"rounds": 3, "clients_per_round": 4},
                                     runtime={"threads": 1, "progress": False, "client_states": "disk"}))
    original, calls = Local.client_update, {"n": 0}

    def client_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 9:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    Local.client_update = client_update  # type: ignore[method-assign]
    try:
        with pytest.raises(RunInterrupted) as cut:
            run_experiment(config, tmp_path_factory.mktemp("interrupted"), progress=False)
    finally:
        Local.client_update = original  # type: ignore[method-assign]
    return Path(cut.value.folder)


#: What a hand or a disk may do to an interrupted run folder; each but the runtime edit must be refused.
READ_BACK_DAMAGE = ["flip checkpoint", "flip state", "truncate run.json", "delete status.json", "garble status.json",
                    "edit config", "edit runtime", "swap checkpoint", "delete a state"]


def _damage(folder: Path, how: str, at: int, rng: random.Random) -> str:
    """Damage ``folder`` as ``how`` says; returns the file or key the refusal must name."""
    manifest = json.loads((folder / "checkpoint" / "run.json").read_text())
    files = sorted(manifest["sha256"])
    states = [f for f in files if f.startswith("states/")]
    if how in ("flip checkpoint", "flip state"):
        name = (states if how == "flip state" else [f for f in files if f.startswith("checkpoint/")])[at % 2 % len(
            states if how == "flip state" else [f for f in files if f.startswith("checkpoint/")])]
        data = bytearray((folder / name).read_bytes())
        i = len(data) - 1 - at % 64  # tensor bytes at the end: the header stays whole, the size the same
        data[i] ^= 1 << rng.randrange(8)
        (folder / name).write_bytes(bytes(data))
        return name
    if how == "truncate run.json":
        path = folder / "checkpoint" / "run.json"
        path.write_bytes(path.read_bytes()[: at % 200])
        return "checkpoint"
    if how == "delete status.json":
        (folder / "status.json").unlink()
        return "status.json"
    if how == "garble status.json":
        (folder / "status.json").write_text("{" * (1 + at % 3))
        return "status.json"
    if how == "swap checkpoint":  # another round's server state under this round's name
        name = [f for f in files if f.startswith("checkpoint/server")][0]
        data = bytearray((folder / name).read_bytes())
        data[-4:] = bytes(4)
        (folder / name).write_bytes(bytes(data))
        return name
    if how == "delete a state":
        (folder / states[at % len(states)]).unlink()
        return states[at % len(states)]
    config = yaml.safe_load((folder / "config.yaml").read_text())
    if how == "edit runtime":
        config["runtime"]["threads"] = 1 + at % 2
    else:
        section = ["federation", "episodes", "algorithm", "seed"][at % 4]
        if section == "seed":
            config["seed"] += 1
        elif section == "federation":
            config["federation"]["rounds"] += 1 + at % 5
        elif section == "episodes":
            config["episodes"]["q_query"] += 1
        else:
            config["algorithm"]["options"]["lr"] = 0.05
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return "config.yaml"


@READ_BACK_SETTINGS
@given(how=st.sampled_from(READ_BACK_DAMAGE), at=st.integers(0, 10_000), seed=st.integers(0, 2**16))
def test_fuzzed_damage_to_a_run_folder_is_refused_on_resume(interrupted_run: Path, how: str, at: int,
                                                            seed: int) -> None:
    """Resume of a damaged or edited run folder: refused in one line naming the file (exit 2), never
    trained on; an edit of runtime.* resumes to completion."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / interrupted_run.name
        shutil.copytree(interrupted_run, folder)
        named = _damage(folder, how, at, random.Random(seed))
        err, std = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
            code = main(["resume", str(folder), "--quiet"])
        counts = COUNTS.setdefault("resume of a damaged run folder", Counter())
        counts["inputs"] += 1
        text = err.getvalue()
        assert "Traceback" not in text and "unexpected" not in text, text
        lines = [line for line in text.splitlines() if line.strip() and "warning" not in line]
        if how == "edit runtime":
            counts["ran"] += 1
            assert code == 0 and json.loads((folder / "status.json").read_text())["status"] == "complete", text
            return
        counts["rejected"] += 1
        assert code == 2 and len(lines) == 1 and named in lines[0], (how, code, text)
        assert not (folder / "summary.json").exists()


@pytest.fixture(scope="module")
def stored_two_seeds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Hand-made records of the digits study's smoke cells, seeds 0 and 1: (study file, store)."""
    from fedfew.study.grid import cells
    from fedfew.study.store import CodeVersion, ResultStore, make_record
    from fedfew.study.study_file import load_study
    from tests.study.common import DIGITS_STUDY, dumped

    tmp = tmp_path_factory.mktemp("fuzz-other-cells")
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump({**DIGITS_STUDY, "seeds": [0, 1]}, sort_keys=False))
    study, root = load_study(path)
    store = ResultStore(tmp / "store", study.name)
    for i, cell in enumerate(cells(study, root, "smoke")):
        store.put(make_record(study.name, "smoke", cell.method, cell.setting, cell.seed, cell.config_hash, dumped(cell),
                              CodeVersion("0.0.0", "handmade0000", None), {"test": {"accuracy": 0.4 + i / 100}}, 1.0))
    return path, tmp / "store"


@READ_BACK_SETTINGS
@given(source=st.integers(0, 100), target=st.integers(0, 100),
       edits=st.lists(st.sampled_from(["config_hash", "seed", "method", "setting", "study"]), unique=True, max_size=5))
def test_fuzzed_records_of_other_cells_are_never_read_as_this_cells(stored_two_seeds: tuple[Path, Path], source: int,
                                                                    target: int, edits: list[str]) -> None:
    """A record copied over another cell's, with any of its labels edited to match: the report names it as
    damaged (exit 0, the cell not stored), never shows the other cell's number as this one's."""
    path, store = stored_two_seeds
    with tempfile.TemporaryDirectory() as tmp_name:
        copy = Path(tmp_name) / "store"
        shutil.copytree(store, copy)
        records = sorted(copy.glob("*/*.json"))
        a, b = records[target % len(records)], records[source % len(records)]
        if a == b:
            b = records[(source + 1) % len(records)]
        mine, other = json.loads(a.read_text()), json.loads(b.read_text())
        forged = {**other, **{key: mine[key] for key in edits}}
        if "study" in edits and len(edits) == 1:
            forged["study"] = "another-study"  # a record of another study
        a.write_text(json.dumps(forged))
        code, err = run_study_cli(["study", "report", str(path), "--store", str(copy), "--budget", "smoke"])
        counts = COUNTS.setdefault("records of other cells (report)", Counter())
        counts["inputs"] += 1
        assert code == 0 and "Traceback" not in err, err
        assert a.name in err and "damaged" in err, (edits, err)
        counts["named as damaged"] += 1


#: Values a grid key takes, chosen to repeat once read (1 and 1.0, 0.001 and 1e-3) as often as not.
GRID_VALUES = {"seed": ["1", "2", "1.0", "01", "1_0", ""], "algorithm.options.lr": ["0.001", "1e-3", "0.01", ""],
               "federation.rounds": ["1", "2", "1:0", "1.0", ""]}


@READ_BACK_SETTINGS
@given(grids=st.lists(st.tuples(st.sampled_from(sorted(GRID_VALUES)), st.lists(st.integers(0, 5), min_size=1,
                                                                               max_size=3)), min_size=1, max_size=2),
       also_set=st.sampled_from([None, *sorted(GRID_VALUES)]))
def test_fuzzed_sweeps_label_what_they_run_or_are_refused(grids: list[tuple[str, list[int]]],
                                                          also_set: str | None) -> None:
    """A sweep either resolves to points whose configs hold exactly the values their labels give, each
    point once, or is refused in one line naming a swept key (exit 2) before any run."""
    from fedfew.config.validation import ConfigError, load_config
    from fedfew.run.sweep import parse_grid, sweep_configs

    items = [f"{key}={','.join(GRID_VALUES[key][i % len(GRID_VALUES[key])] for i in picks)}" for key, picks in grids]
    sets = [f"{also_set}=2"] if also_set else []
    counts = COUNTS.setdefault("sweeps", Counter())
    counts["inputs"] += 1
    try:
        points = sweep_configs(dict(BASE), parse_grid(items), sets)
    except ConfigError as err:
        counts["rejected"] += 1
        assert any(key in str(err) for key, _ in grids) and "\n" not in str(err), (items, sets, err)
        return
    counts["resolved"] += 1
    seen = set()
    for label, config in points:
        dump = config.model_dump(mode="json")
        for part in label.split(", "):
            short, value = part.split("=", 1)
            key = next(k for k, _ in grids if k.split(".")[-1] == short)
            node: Any = dump
            for piece in key.split("."):
                node = node[piece]
            expected = load_config(dict(BASE), [f"{key}={value}"]).model_dump(mode="json")
            for piece in key.split("."):
                expected = expected[piece]
            assert node == expected, (label, key, node)
        key_of = json.dumps({k: v for k, v in dump.items() if k != "name"}, sort_keys=True)
        assert key_of not in seen, (items, label)
        seen.add(key_of)


#: Scalars YAML 1.1 and 1.2 read differently, and ones they read alike.
yaml_numbers = st.one_of(
    st.from_regex(r"\A[-+]?[1-9][0-9]?(_[0-9]{1,2}){1,2}\Z"), st.from_regex(r"\A[1-9](:[0-5][0-9]){1,2}\Z"),
    st.from_regex(r"\A0[0-7]{1,3}\Z"), st.from_regex(r"\A[-+]?[0-9]{1,3}\Z"), st.from_regex(r"\A0x[0-9a-f]{1,2}\Z"),
    st.from_regex(r"\A[0-9]{1,2}\.[0-9]{0,2}\Z"), st.from_regex(r"\A[1-9]e[0-9]\Z"))


@READ_BACK_SETTINGS
@given(key=st.sampled_from(["seed", "federation.rounds", "episodes.test_episodes", "partition.options.alpha"]),
       raw=yaml_numbers, how=st.sampled_from(["--set", "file"]))
def test_fuzzed_yaml_numbers_mean_what_yaml_12_says_or_are_refused(key: str, raw: str, how: str) -> None:
    """A number read differently by YAML 1.1 and 1.2 is refused naming the key; any other is read as
    YAML 1.2 reads it (never base 60, never an underscore dropped, never octal from a leading zero)."""
    import re as re_

    from fedfew.config.validation import ConfigError, load_config

    counts = COUNTS.setdefault("YAML numbers", Counter())
    counts["inputs"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        lines = yaml.safe_dump(BASE, sort_keys=False)
        path.write_text(lines)
        try:
            if how == "--set":
                config = load_config(path, [f"{key}={raw}"])
            else:
                data = yaml.safe_load(lines)
                node = data
                *parents, last = key.split(".")
                for part in parents:
                    node = node.setdefault(part, {})
                node[last] = "@@"
                path.write_text(yaml.safe_dump(data, sort_keys=False).replace("'@@'", raw))
                config = load_config(path)
        except ConfigError as err:
            counts["rejected"] += 1
            assert key.split(".")[-1] in str(err) and "\n" not in str(err), (raw, err)
            return
    counts["read"] += 1
    value: Any = config.model_dump(mode="json")
    for part in key.split("."):
        value = value[part]
    if re_.fullmatch(r"[-+]?[0-9]+", raw):
        assert value == int(raw, 10), (raw, value)  # YAML 1.2: decimal, whatever zeros lead
    elif raw.startswith("0x"):
        assert value == int(raw, 16)
    else:
        assert float(value) == float(raw), (raw, value)


@READ_BACK_SETTINGS
@given(depth=st.integers(1, 12), width=st.integers(1, 12))
def test_fuzzed_alias_nests_are_answered_at_once(depth: int, width: int) -> None:
    """Aliases nested ``depth`` levels of ``width`` under dataset.options: refused naming the file when
    they expand past the cap, else read (and the unknown options named); in seconds either way."""
    import time

    lines = ['a0: &a0 ["x"]'] + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]"
                                 for i in range(1, depth + 1)]
    text = yaml.safe_dump(BASE, sort_keys=False).replace("dataset:\n  name: digits\n", "dataset:\n  name: digits\n"
                                                         "  options:\n    " + "\n    ".join(lines) + "\n")
    counts = COUNTS.setdefault("YAML aliases", Counter())
    counts["inputs"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "aliases.yaml"
        path.write_text(text)
        start = time.perf_counter()
        code, err = run_cli(["run", str(path)], Path(tmp) / "out")
        assert time.perf_counter() - start < 20
        check_outcome("YAML aliases", code, err, Path(tmp) / "out", [str(path), "dataset.options", "'a0'"])
        counts["inputs"] -= 1  # check_outcome counted it
        assert code == 2
        if "aliases" in err:
            counts["refused as too large"] += 1
