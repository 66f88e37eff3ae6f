"""The YAML reader of configs, ``--set`` values and study files (fedfew.core.yaml12): YAML 1.1 numbers
nobody meant and keys given twice are refused naming the key, every number the committed files use
reads as before, and alias bombs are answered at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from fedfew.cli.main import demo_config_path
from fedfew.config.validation import ConfigError, load_config
from fedfew.core.yaml12 import load_yaml
from tests.cli.common import refused
from tests.study.common import DIGITS_STUDY, REPO, run_cli, write_study
from tests.tiny import tiny_config


# -- YAML 1.1 numbers nobody meant ---------------------------------------------------------------------
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
    repo = Path(__file__).resolve().parents[2]
    files = [*repo.glob("configs/**/*.yaml"), *repo.glob("studies/*.yaml"), *repo.glob("src/fedfew/configs/*.yaml")]
    assert len(files) > 20
    for path in files:
        assert load_yaml(path.read_text()) == yaml.safe_load(path.read_text()), path


# -- answers before exhaustion -----------------------------------------------------------------------------
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


# -- keys given twice ---------------------------------------------------------------------------------
def test_duplicate_keys_in_a_config_file_are_refused_naming_key_and_file(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("name: a\nfederation:\n  rounds: 3\n  rounds: 5\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml.*'rounds'|'rounds'.*dup\.yaml"):
        load_config(path)
    nested = tmp_path / "dup2.yaml"
    nested.write_text("name: a\nalgorithm: {name: fl-proto, options: {lr: 0.1, lr: 0.2}}\n")
    with pytest.raises(ConfigError, match="'lr'"):
        load_config(nested)
    with pytest.raises(ConfigError, match="'a'"):  # in a --set value too
        load_config(None, ["dataset.options={a: 1, a: 2}"])


# -- the study file is as strict as a config ------------------------------------------------------------
STUDY_WITH_TWICE = """\
name: twice
config: {config}
methods:
  fl-proto: {{algorithm.name: fl-proto}}
settings:
  IID: {{partition.name: iid, partition.name: dirichlet}}
seeds: [0]
budgets:
  smoke: {{}}
  smoke: {{set: {{federation.rounds: 1}}}}
"""


def test_a_key_given_twice_anywhere_in_a_study_file_is_refused(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = REPO / "src/fedfew/configs/demo.yaml"
    for name, text, key in (
            ("nested.yaml", STUDY_WITH_TWICE.replace("  smoke: {{}}\n", ""), "'partition.name'"),
            ("top.yaml", STUDY_WITH_TWICE.replace("partition.name: dirichlet", "k_shot: 1"), "'smoke'")):
        path = tmp_path / name
        path.write_text(text.format(config=config))
        code, _, err = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store")], capsys)
        assert code == 2 and key in err and "twice" in err and str(path) in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
