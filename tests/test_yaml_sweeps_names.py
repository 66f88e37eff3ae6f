"""YAML that means what it says, sweeps that run what they label, names that stay in their folder, and
answers before exhaustion (issue 53, items 6, 7, 9 and 10). Each input is one line naming the key or
file, exit 2, before any run folder exists."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from fedfew.cli.main import demo_config_path, main
from fedfew.config.validation import load_config
from fedfew.core.yaml12 import MAX_BYTES, load_yaml
from tests.test_study import DIGITS_STUDY, write_study
from tests.tiny import tiny_config


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unexpected" not in err, err
    return code, [line for line in err.splitlines() if line.strip() and "warning" not in line]


def refused(capsys: pytest.CaptureFixture[str], out: Path, *args: str) -> str:
    code, lines = run_cli(capsys, *args)
    assert code == 2 and len(lines) == 1, lines
    assert not out.exists() or not any(out.rglob("status.json")), "a run started"
    return lines[0]


# -- 6: YAML 1.1 numbers nobody meant ------------------------------------------------------------------
@pytest.mark.parametrize("assignment, key, shown", [("federation.rounds=1:0", "federation.rounds", "1:0"),
                                                    ("seed=1_0", "seed", "1_0"),
                                                    ("episodes.n_way=010", "episodes.n_way", "010")])
def test_a_yaml_11_number_in_set_is_refused_naming_the_key(assignment: str, key: str, shown: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, tmp_path, "run", str(demo_config_path()), "--out", str(tmp_path), "--set", assignment)
    assert key in line and shown in line and "YAML 1.1" in line, line


def test_a_yaml_11_number_in_a_config_file_is_refused_naming_the_key(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    text = yaml.safe_dump(tiny_config("fl-proto")).replace("rounds: 2", "rounds: 1:0")
    assert "rounds: 1:0" in text
    (tmp_path / "c.yaml").write_text(text)
    line = refused(capsys, tmp_path / "out", "run", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"))
    assert "'rounds'" in line and str(tmp_path / "c.yaml") in line and "1:0" in line, line


def test_a_yaml_11_number_in_a_study_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    path.write_text(path.read_text().replace("- 0\n- 1\n", "- 0\n- 1_0\n"))
    assert "1_0" in path.read_text()
    line = refused(capsys, tmp_path / "runs", "study", "status", str(path), "--runs", str(tmp_path / "runs"))
    assert str(path) in line and "1_0" in line, line


def test_every_number_the_committed_configs_and_studies_use_reads_as_before() -> None:
    """The reader refuses only the forms above: every committed config and study file reads as PyYAML
    reads it (so every stored cell keeps its key)."""
    repo = Path(__file__).resolve().parents[1]
    files = [*repo.glob("configs/**/*.yaml"), *repo.glob("studies/*.yaml"), *repo.glob("src/fedfew/configs/*.yaml")]
    assert len(files) > 20
    for path in files:
        assert load_yaml(path.read_text()) == yaml.safe_load(path.read_text()), path


# -- 7: sweeps that label what did not run ---------------------------------------------------------------
@pytest.mark.parametrize("grids, sets, key", [
    (["seed=1,2", "seed=3"], [], "seed"),
    (["seed=1,1"], [], "seed"),
    (["seed=1,01"], [], "seed"),
    (["seed=1,1.0"], [], "seed"),
    (["algorithm.options.lr=0.001,1e-3"], [], "algorithm.options.lr"),
    (["splits.val="], [], "splits.val"),
    (["seed=1,"], [], "seed"),
    (["seed=1,2"], ["seed=5"], "seed"),
    (["federation.rounds=1,2"], ["rounds=3"], "federation.rounds"),
])
def test_a_sweep_that_would_mislabel_its_points_is_refused(grids: list[str], sets: list[str], key: str,
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    args = ["sweep", str(config), "--out", str(tmp_path / "out")]
    for grid in grids:
        args += ["--grid", grid]
    for assignment in sets:
        args += ["--set", assignment]
    line = refused(capsys, tmp_path / "out", *args)
    assert key.split(".")[-1] in line and "--grid" in line, line


# -- 9: names that escape ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [".", "..", ".hidden", "x" * 300, ""])
def test_a_run_name_that_would_escape_or_hide_its_folder_is_refused(name: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, tmp_path, "run", str(demo_config_path()), "--out", str(tmp_path), "--set", f"name='{name}'")
    assert "name" in line, line
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", [".", "..", ".hidden", "s" * 101])
def test_a_study_name_that_would_escape_its_store_is_refused(name: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, "name": name})
    line = refused(capsys, tmp_path / "runs", "study", "run", str(path), "--store", str(tmp_path / "store"),
                   "--runs", str(tmp_path / "runs"), "--budget", "smoke")
    assert "name" in line and str(path) in line, line
    assert not (tmp_path / "store").exists()


def test_the_longest_names_allowed_still_make_folders(tmp_path: Path) -> None:
    config = load_config(tiny_config("fl-proto", name="n" * 200))
    from fedfew.run.runner import new_run

    folder = new_run(config, tmp_path)
    assert folder.path.is_dir() and folder.path.name.startswith("n" * 200)


# -- 10: answers before exhaustion -------------------------------------------------------------------------
def alias_bomb(levels: int) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join(lines)


def test_an_alias_bomb_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = yaml.safe_dump(tiny_config("fl-proto"))
    assert "dataset:\n  name: digits\n" in text
    path = tmp_path / "bomb.yaml"  # 9 levels of 9: 9^10 strings under dataset.options once expanded
    path.write_text(text.replace("dataset:\n  name: digits\n", "dataset:\n  name: digits\n  options:\n    "
                                 + alias_bomb(9).replace("\n", "\n    ") + "\n"))
    assert len(path.read_bytes()) < 4096
    start = time.perf_counter()
    line = refused(capsys, tmp_path / "out", "run", str(path), "--out", str(tmp_path / "out"))
    assert time.perf_counter() - start < 10
    assert str(path) in line and "aliases" in line, line


def test_aliases_that_repeat_a_little_are_still_read() -> None:
    assert load_yaml("a: &x [1, 2]\nb: *x\nc: {<<: {k: 1}}\n") == {"a": [1, 2], "b": [1, 2], "c": {"k": 1}}


def test_a_config_file_above_the_limit_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fl-proto")) + "# " + "x" * (MAX_BYTES + 10) + "\n")
    start = time.perf_counter()
    line = refused(capsys, tmp_path / "out", "run", str(path), "--out", str(tmp_path / "out"))
    assert time.perf_counter() - start < 10
    assert str(path) in line and f"{MAX_BYTES:,}" in line, line
