"""Config validation (fedfew.config.validation): every bad input is a clear error naming the key, from a
file or from ``--set``; the defaults and every committed config are valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.cli.main import demo_config_path, main
from fedfew.config.validation import ConfigError, dump_config, load_config


def error_of(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    return str(info.value)


def test_defaults_are_valid_and_round_trip(tmp_path: Path) -> None:
    config = load_config(None)
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config


def test_unknown_key_names_the_key_and_suggests() -> None:
    message = error_of(["federation.roudns=3"])
    assert "federation.roudns" in message and "rounds" in message


def test_wrong_type_names_the_key() -> None:
    assert "federation.rounds" in error_of(["federation.rounds=many"])
    assert "algorithm.options.lr" in error_of(["algorithm.options.lr=fast"])


def test_unknown_algorithm_option_lists_allowed() -> None:
    message = error_of(["algorithm.options.inner_lrr=0.1"])
    assert "algorithm.options.inner_lrr" in message and "inner_lr" in message


def test_unknown_registry_names() -> None:
    assert "Did you mean 'fl-maml'" in error_of(["algorithm.name=fl-mam"])
    assert "dataset.name" in error_of(["dataset.name=imagenet22k"])
    assert "model.name" in error_of(["model.name=vgg"])
    assert "partition.name" in error_of(["partition.name=random"])


def test_impossible_combinations() -> None:
    assert "exceeds" in error_of(["partition.num_clients=5", "federation.clients_per_round=6"])
    assert "fraction" in error_of(["federation.clients_per_round=1.5"])
    assert "n_way" in error_of(["episodes.n_way=1"])


def test_committed_configs_are_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    paths = sorted((root / "configs").rglob("*.yaml")) + [root / "src/fedfew/configs/demo.yaml"]
    import yaml

    from fedfew.config.validation import ExperimentConfig

    checked = 0
    for path in paths:
        data = yaml.safe_load(path.read_text()) or {}
        if not set(data) & set(ExperimentConfig.model_fields):
            continue  # an overlay of algorithm blocks (e.g. configs/f2l/methods.yaml), checked by its own test
        load_config(path)
        checked += 1
    assert checked >= 1


# -- clean one-line errors for bad values ------------------------------------------------------------
BAD_SETS = [
    ("federation.rounds=[1", "federation.rounds"),
    ("model.options.hidden=big", "model.options.hidden"),
    ("partition.options.alpha=big", "partition.options.alpha"),
    ("partition.options.alpah=0.1", "partition.options.alpah"),
    ("algorithm.options.lr=-1", "algorithm.options.lr"),
    ("episodes.n_way=one", "episodes.n_way"),
]


@pytest.mark.parametrize("assignment,key", BAD_SETS)
def test_bad_values_are_one_line_errors_naming_the_key(assignment: str, key: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(demo_config_path()), "--out", str(tmp_path), "--quiet", "--set", assignment]) == 2
    err = capsys.readouterr().err
    assert key in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
