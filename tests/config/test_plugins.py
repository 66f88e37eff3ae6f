"""Plugins (fedfew.config.plugins): a user's file outside the package registers a dataset and a model,
and the command line runs them (``--plugin`` or ``plugins:`` in the config); broken plugins, a plugin
folder and a plugin calling sys.exit are one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedfew.cli.main import demo_config_path, main
from fedfew.config.plugins import PluginError, load_plugin
from fedfew.config.validation import ConfigError, load_config
from fedfew.data import DATASETS
from fedfew.models import MODELS
from tests.cli.common import cli_all_lines, cli_lines

PLUGIN = '''
"""A user's plugin: a toy dataset of rings and a tiny model."""
import torch
from torch import nn

from fedfew.data import DATASETS, LabelledDataset
from fedfew.models import MODELS, FewShotModel


@DATASETS.register("plugin-rings", help="points on 8 rings (a test plugin)")
def rings(root, classes: int = 8, per_class: int = 12) -> LabelledDataset:
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(classes).repeat_interleave(per_class)
    angle = torch.rand(len(labels), generator=g) * 6.2832
    radius = labels.float() + 0.1 * torch.randn(len(labels), generator=g)
    x = torch.stack([radius * angle.cos(), radius * angle.sin()], 1)
    return LabelledDataset(x, labels, [f"ring{c}" for c in range(classes)], name="plugin-rings",
                           splits={"base": [0, 1, 2, 3], "val": [4, 5], "novel": [6, 7]})


@MODELS.register("plugin-tiny", help="2 -> hidden -> ReLU (a test plugin)")
def tiny(input_shape, num_classes, hidden: int = 8) -> FewShotModel:
    encoder = nn.Sequential(nn.Flatten(), nn.Linear(input_shape[-1], hidden), nn.ReLU())
    return FewShotModel(encoder, hidden, None if num_classes is None else nn.Linear(hidden, num_classes))
'''


CONFIG = {
    "name": "rings",
    "task": "fewshot",
    "dataset": {"name": "plugin-rings"},
    "partition": {"name": "iid", "num_clients": 2},
    "model": {"name": "plugin-tiny"},
    "algorithm": {"name": "fl-proto", "options": {"local_steps": 1}},
    "federation": {"rounds": 2, "clients_per_round": 2},
    "episodes": {"n_way": 2, "k_shot": 1, "q_query": 2, "val_episodes": 4, "test_episodes": 6},
    "eval": {"every": 1},
    "runtime": {"threads": 1, "progress": False},
}


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside the package with the plugin, a config naming it and one that does not."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "rings_plugin.py").write_text(PLUGIN)
    (folder / "with_plugin.yaml").write_text(yaml.safe_dump({**CONFIG, "plugins": ["rings_plugin.py"]}))
    (folder / "plain.yaml").write_text(yaml.safe_dump(CONFIG))
    return folder


def test_plugin_named_in_the_config_runs_from_the_cli(plugin_dir: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the config's plugin path is relative to the config, not to here
    out = tmp_path / "runs"
    assert main(["run", str(plugin_dir / "with_plugin.yaml"), "--out", str(out), "--quiet"]) == 0
    (folder,) = out.iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["dataset"] == "plugin-rings" and 0.0 <= summary["test"]["accuracy"] <= 1.0
    assert summary["bytes_up"] > 0
    recorded = yaml.safe_load((folder / "config.yaml").read_text())
    assert recorded["plugins"] == [str(plugin_dir / "rings_plugin.py")]  # absolute: the folder re-runs anywhere
    assert main(["run", str(folder / "config.yaml"), "--out", str(tmp_path / "again"), "--quiet"]) == 0


def test_plugin_on_the_command_line_and_in_list(plugin_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    plugin = str(plugin_dir / "rings_plugin.py")
    assert main(["list", "--plugin", plugin]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^ +plugin-rings +points on 8 rings \(a test plugin\)$", out, re.M) and "plugin-tiny" in out
    assert "plugin-rings" in DATASETS and "plugin-tiny" in MODELS
    # named twice (command line and config): imported once, recorded once
    code = main(["run", str(plugin_dir / "with_plugin.yaml"), "--plugin", plugin, "--out", str(tmp_path), "--quiet"])
    assert code == 0
    (folder,) = tmp_path.iterdir()
    assert yaml.safe_load((folder / "config.yaml").read_text())["plugins"] == [plugin]


def test_command_line_plugins_are_recorded_only_inside_the_command(plugin_dir: Path, tmp_path: Path) -> None:
    plugin = str(plugin_dir / "rings_plugin.py")
    assert main(["run", str(plugin_dir / "plain.yaml"), "--plugin", plugin, "--out", str(tmp_path), "--quiet"]) == 0
    (folder,) = tmp_path.iterdir()
    assert yaml.safe_load((folder / "config.yaml").read_text())["plugins"] == [plugin]
    assert load_config(plugin_dir / "plain.yaml").plugins == []


def test_plugin_runs_in_a_fresh_process(plugin_dir: Path, tmp_path: Path) -> None:
    """The installed command in a new process: only the plugin file tells it about plugin-rings."""
    command = [sys.executable, "-m", "fedfew.cli.main", "run", str(plugin_dir / "plain.yaml"),
               "--plugin", str(plugin_dir / "rings_plugin.py"), "--out", str(tmp_path), "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("rings: test accuracy")
    failed = subprocess.run(command[:-5] + ["--out", str(tmp_path), "--quiet"], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path, env=env)
    assert failed.returncode == 2 and "unknown dataset 'plugin-rings'" in failed.stderr


@pytest.mark.parametrize(
    "source, words",
    [
        (None, ["no such file"]),
        ("x = 1 / 0\n", ["failed to import", "ZeroDivisionError: division by zero", "(line 1)"]),
        ("import fedfew\nimport no_such_module_here\n", ["ModuleNotFoundError", "no_such_module_here", "(line 2)"]),
        ("from fedfew.data import DATASETS\nDATASETS.register('digits')(lambda root: None)\n",
         ["ValueError: dataset 'digits' is registered twice", "(line 2)"]),
    ],
    ids=["missing", "exception", "import error", "name taken"],
)
def test_broken_plugins_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            source: str | None, words: list[str]) -> None:
    plugin = tmp_path / "my_plugin.py"
    if source is not None:
        plugin.write_text(source)
    for argv in (["list", "--plugin", str(plugin)],
                 ["run", "cfg.yaml", "--plugin", str(plugin)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(plugin) in err and "Traceback" not in err
        for word in words:
            assert word in err
    # from a config: the same error, naming the file resolved against the config's folder
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "plugins": [plugin.name]}))
    with pytest.raises(PluginError, match="plugin .*" + plugin.name):
        load_config(config)


def test_plugins_key_must_list_python_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ConfigError, match="expected a list of Python files"):
        load_config({"plugins": {"a": 1}})
    with pytest.raises(ConfigError, match="expected a Python file ending in .py"):
        load_config({"plugins": [str(tmp_path / "notes.txt")]})
    with pytest.raises(PluginError, match="no such file"):
        load_plugin(tmp_path / "absent.py")


# -- a plugin folder -----------------------------------------------------------------------------------
def test_a_plugin_folder_is_called_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine.py").write_text("x = 1\n")
    code, lines = cli_lines(capsys, "list", "--plugin", str(tmp_path))
    assert code == 2 and len(lines) == 1 and "is a folder" in lines[0] and "mine.py" in lines[0]
    assert "no such file" not in lines[0]


EXITS_PLUGIN = "import sys\nsys.exit(3)\n"


def test_a_plugin_calling_sys_exit_is_one_line_with_a_fedfew_exit_code(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "exits.py"
    plugin.write_text(EXITS_PLUGIN)
    code, lines = cli_all_lines(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                          "--plugin", str(plugin))
    assert code == 2 and len(lines) == 1 and "exits.py" in lines[0] and "sys.exit(3)" in lines[0], lines
