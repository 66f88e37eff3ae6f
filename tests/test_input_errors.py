"""Bad input that used to end in a traceback, a silently wrong run or a vague message (issue 25,
items 7-9): each is now one line naming the key or file, with exit 2 (usage/config) or 1 (a run
that failed), and nothing marked complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedfew.cli.main import demo_config_path, main
from fedfew.config.validation import ConfigError, load_config
from tests.tiny import tiny_config

QUICK = ["--set", "federation.rounds=1", "--set", "episodes.test_episodes=5"]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [line for line in err.splitlines() if line.strip()]


def statuses(out: Path) -> list[str]:
    return [json.loads(p.read_text())["status"] for p in out.glob("*/status.json")]


# -- item 7: tracebacks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("hidden", [0, -5])
def test_a_model_that_cannot_be_built_is_a_config_error_before_any_work(
        hidden: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run_cli(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                          "--set", f"model.options.hidden={hidden}", *QUICK)
    assert code == 2 and len(lines) == 1 and "model" in lines[0] and "conv4" in lines[0], lines
    assert not (tmp_path / "out").exists()  # found in preflight: no run folder


PLUGIN_FORWARD_RAISES = '''
import torch
from torch import nn
from fedfew.models import MODELS, FewShotModel


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 4)

    def forward(self, x):
        raise RuntimeError("this model is broken")


@MODELS.register("{name}")
def broken(input_shape, num_classes):
    return FewShotModel(Broken(), 4, None if num_classes is None else nn.Linear(4, num_classes))
'''


def test_a_plugin_model_whose_forward_raises_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "broken.py"
    plugin.write_text(PLUGIN_FORWARD_RAISES.replace("{name}", "broken-forward"))
    code, lines = run_cli(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                          "--plugin", str(plugin), "--set", "model.name=broken-forward", "--set", "model.options={}",
                          *QUICK)
    assert code == 2 and len(lines) == 1, lines
    assert "broken-forward" in lines[0] and "this model is broken" in lines[0]
    assert "complete" not in statuses(tmp_path / "out")


# -- item 8: silently wrong ---------------------------------------------------------------------------
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


@pytest.mark.parametrize("assignment,key", [
    ("federation.rounds=true", "federation.rounds"),
    ("episodes.n_way=false", "episodes.n_way"),
    ("seed=true", "seed"),
    ("federation.clients_per_round=true", "federation.clients_per_round"),
    ("federation.dropout=true", "federation.dropout"),
    ("algorithm.options.local_steps=true", "algorithm.options.local_steps"),
    ("model.options.hidden=true", "model.options.hidden"),
    ("partition.options.alpha=true", "partition.options.alpha"),
])
def test_booleans_are_not_numbers_anywhere_in_the_schema(assignment: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(demo_config_path(), [assignment])
    load_config(demo_config_path(), ["runtime.progress=false", "eval.track_test=true"])  # real booleans still are


EXITS_PLUGIN = "import sys\nsys.exit(3)\n"


def test_a_plugin_calling_sys_exit_is_one_line_with_a_fedfew_exit_code(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "exits.py"
    plugin.write_text(EXITS_PLUGIN)
    code, lines = run_cli(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                          "--plugin", str(plugin))
    assert code == 2 and len(lines) == 1 and "exits.py" in lines[0] and "sys.exit(3)" in lines[0], lines


PLUGIN_EXITS_IN_TRAINING = '''
import sys
from torch import nn
from fedfew.models import MODELS, FewShotModel


class ExitsWhenTraining(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 4)

    def forward(self, x):
        if self.training:
            sys.exit(3)
        return self.linear(x.flatten(1))


@MODELS.register("exits-in-training")
def exits(input_shape, num_classes):
    return FewShotModel(ExitsWhenTraining(), 4, None if num_classes is None else nn.Linear(4, num_classes))
'''


def test_a_plugin_calling_sys_exit_during_training_fails_the_run(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "exits_training.py"
    plugin.write_text(PLUGIN_EXITS_IN_TRAINING)
    code, lines = run_cli(capsys, "run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet",
                          "--plugin", str(plugin), "--set", "model.name=exits-in-training", "--set",
                          "model.options={}", *QUICK)
    assert code == 1 and len(lines) == 1 and "sys.exit(3)" in lines[0], lines
    (folder,) = list((tmp_path / "out").iterdir())
    status = json.loads((folder / "status.json").read_text())
    assert status["status"] == "failed" and "sys.exit(3)" in status["error"]
    assert "SystemExit" in (folder / "error.log").read_text()


# -- item 9: vague messages ----------------------------------------------------------------------------
def test_a_config_that_is_not_utf8_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    code, lines = run_cli(capsys, "run", str(path), "--out", str(tmp_path / "out"), "--quiet")
    assert code == 2 and len(lines) == 1 and str(path) in lines[0] and "UTF-8" in lines[0], lines


def test_a_config_path_that_is_a_folder_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run_cli(capsys, "run", str(tmp_path), "--out", str(tmp_path / "out"), "--quiet")
    assert code == 2 and len(lines) == 1 and str(tmp_path) in lines[0] and "folder" in lines[0], lines
    assert "does not exist" not in lines[0]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_an_output_folder_that_cannot_be_created_is_found_in_preflight(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    code, lines = run_cli(capsys, "run", str(good), "--out", "/proc/x", "--quiet")
    assert code == 2 and len(lines) == 1 and "/proc/x" in lines[0] and "output folder" in lines[0], lines
    assert "[Errno" not in lines[0].split("(")[0]  # the message leads with what is wrong, not an errno

