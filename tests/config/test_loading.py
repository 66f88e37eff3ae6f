"""Config text in and out (fedfew.config.loading): ``--set`` overrides (bare keys, YAML values, empty
parts), the command line changing partitions, options and engines of the committed configs, and the
files a config cannot be read from (empty, not UTF-8, a folder, above the size limit, without task,
dataset or algorithm), each one line naming the file; every committed config names what it runs
and no data folder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedfew.cli.main import demo_config_path
from fedfew.config.validation import ConfigError, apply_override, load_config
from fedfew.core.yaml12 import MAX_BYTES
from tests.cli.common import cli_all_lines, cli_lines, one_line, refused
from tests.run.common import write
from tests.tiny import tiny_config


def test_a_set_key_with_an_empty_part_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line(capsys, "run", str(demo_config_path()), "--out", str(tmp_path), "--set", ".federation.rounds=1")
    assert "'.federation.rounds'" in line and "empty part" in line and "(top level)" not in line, line


REPO = Path(__file__).resolve().parents[2]


# -- a config must say what it runs --------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "# only a comment\n", "\n\n"])
def test_an_empty_config_file_is_an_error_naming_the_file(text: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    code, lines = cli_lines(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and str(path) in lines[0] and "empty" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_config_without_task_dataset_or_algorithm_names_what_is_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tiny_config("fl-proto")
    del config["task"], config["algorithm"]["name"]
    path = write(tmp_path / "partial.yaml", config)
    code, lines = cli_lines(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and str(path) in lines[0]
    assert "task" in lines[0] and "algorithm.name" in lines[0] and "dataset.name" not in lines[0]
    # --set may supply what the file leaves out: the command line is part of the config.
    assert cli_lines(capsys, "run", str(path), "--out", str(tmp_path / "out"), "--quiet",
                   "--set", "task=fewshot", "--set", "algorithm.name=fl-proto")[0] == 0


def test_every_committed_config_names_its_task_dataset_and_algorithm() -> None:
    from fedfew.config.loading import REQUIRED_KEYS

    checked = 0
    for path in [*(REPO / "configs").rglob("*.yaml"), *(REPO / "src/fedfew/configs").glob("*.yaml"),
                 REPO / "benchmarks/peers.yaml"]:
        data = yaml.safe_load(path.read_text())
        if not {"dataset", "federation", "episodes"} & set(data):
            continue  # a table of algorithm blocks (configs/f2l/methods.yaml), not a config
        checked += 1
        for key in REQUIRED_KEYS:
            node: Any = data
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            assert node is not None, f"{path} does not set {key}"
    assert checked > 50


# -- vague messages ------------------------------------------------------------------------------------
def test_a_config_that_is_not_utf8_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    code, lines = cli_all_lines(capsys, "run", str(path), "--out", str(tmp_path / "out"), "--quiet")
    assert code == 2 and len(lines) == 1 and str(path) in lines[0] and "UTF-8" in lines[0], lines


def test_a_config_path_that_is_a_folder_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = cli_all_lines(capsys, "run", str(tmp_path), "--out", str(tmp_path / "out"), "--quiet")
    assert code == 2 and len(lines) == 1 and str(tmp_path) in lines[0] and "folder" in lines[0], lines
    assert "does not exist" not in lines[0]


def test_a_config_file_above_the_limit_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fl-proto")) + "# " + "x" * (MAX_BYTES + 10) + "\n")
    start = time.perf_counter()
    line = refused(capsys, tmp_path / "out", "run", str(path), "--out", str(tmp_path / "out"))
    assert time.perf_counter() - start < 10
    assert str(path) in line and f"{MAX_BYTES:,}" in line, line


def test_overrides_bare_keys_and_yaml_values() -> None:
    config = load_config(None, ["rounds=7", "name=x", "algorithm.options={inner_lr: 0.2}", "clients_per_round=0.5"])
    assert config.federation.rounds == 7 and config.name == "x"
    assert config.algorithm.options == {"inner_lr": 0.2}
    assert config.federation.clients_per_round == 0.5
    with pytest.raises(ConfigError, match="ambiguous"):
        apply_override({}, "options=1")
    with pytest.raises(ConfigError, match="key=value"):
        apply_override({}, "rounds")


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("federation: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


def test_committed_configs_name_no_data_folder() -> None:
    for path in sorted((REPO / "configs").rglob("*.yaml")) + [REPO / "src/fedfew/configs/demo.yaml"]:
        config = yaml.safe_load(path.read_text())
        dataset = config.get("dataset") if isinstance(config, dict) else None
        assert not (isinstance(dataset, dict) and "root" in dataset), path


# -- changing the partition from the command line --------------------------------------------------------
SUITED = {"fewshot": ("iid", "dirichlet", "shards", "dirichlet_classes", "label_skew"),
          "classification": ("iid", "dirichlet", "shards", "label_skew")}


def experiment_configs() -> list[str]:
    """The committed experiment configs (configs/f2l/methods.yaml and adaptation.yaml hold rows for a
    study to put in place, not configs)."""
    from fedfew.config.validation import ExperimentConfig

    return sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").rglob("*.yaml")
                  if set(yaml.safe_load(p.read_text())) <= set(ExperimentConfig.model_fields))


@pytest.mark.parametrize("config_path", experiment_configs())
def test_every_config_takes_every_suited_partition_from_the_command_line(config_path: str) -> None:
    base = load_config(REPO / config_path)
    for name in SUITED[base.task]:
        config = load_config(REPO / config_path, [f"partition.name={name}"])
        assert config.partition.name == name
        if name == base.partition.name:
            assert config.partition.options == base.partition.options  # unchanged name: options kept


def test_overridden_options_are_kept_and_still_checked() -> None:
    config = load_config(REPO / "configs/fedfsl/omniglot.yaml", ["partition.name=shards",
                                                                  "partition.options.shards_per_client=3"])
    assert config.partition.options == {"shards_per_client": 3}
    with pytest.raises(ConfigError, match="partition.options.alpha"):
        load_config(REPO / "configs/fedfsl/omniglot.yaml", ["partition.name=iid", "partition.options.alpha=2"])
    with pytest.raises(ConfigError, match="partition.options.alpah"):  # a typo in the file's own partition
        load_config({"partition": {"name": "dirichlet", "options": {"alpah": 1}}})


def test_switching_the_engine_drops_the_other_engines_options() -> None:
    """`--set runtime.engine=inprocess` on a config written for the workers engine (benchmarks/peers.yaml,
    a study's `--set runtime.engine=...`): the workers' option goes, as a partition's do."""
    config = load_config(REPO / "benchmarks/peers.yaml", ["runtime.engine=inprocess"])
    assert config.runtime.engine == "inprocess" and config.runtime.engine_options == {}
    kept = load_config(REPO / "benchmarks/peers.yaml")
    assert kept.runtime.engine == "workers" and kept.runtime.engine_options
    with pytest.raises(ConfigError, match="runtime.engine_options.workers"):  # set on the command line: checked
        load_config(REPO / "benchmarks/peers.yaml", ["runtime.engine=inprocess", "runtime.engine_options.workers=3"])


def test_an_iid_override_of_a_dirichlet_config_runs(tmp_path: Path) -> None:
    from fedfew.run.runner import run_experiment

    config = load_config(REPO / "src/fedfew/configs/demo.yaml", [
        "partition.name=iid", "partition.num_clients=2", "federation.rounds=1", "federation.clients_per_round=2",
        "model.options.hidden=8", "episodes.test_episodes=5", "algorithm.name=fl-proto",
        "algorithm.options={local_steps: 1}"])
    summary = run_experiment(config, tmp_path, progress=False)
    assert summary["rounds"] == 1 and 0.0 <= summary["test"]["accuracy"] <= 1.0
