"""``eval.initial``: "always" (the default) scores round 0 as before; "auto" leaves it unscored where no
selection reads it (no validation split, or eval.selection: last) and changes no other number."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.cli.main import main
from fedfew.config.validation import ConfigError, load_config
from fedfew.run.runner import run_experiment
from tests.tiny import tiny_config


def _run(tmp_path: Path, overrides: list[str], **sections: object) -> dict:
    config = load_config(tiny_config("fl-proto", federation={"rounds": 2}, **sections), overrides)
    summary = run_experiment(config, out_base=tmp_path / "_".join(overrides or ["default"]), progress=False)
    for row in summary["history"]:
        row.pop("seconds")
    return summary


def test_auto_skips_round_zero_without_validation_and_changes_nothing_else(tmp_path: Path) -> None:
    always = _run(tmp_path, [])
    auto = _run(tmp_path, ["eval.initial=auto"])
    assert "initial_score" in always and "initial_scored" not in always  # today's summary
    assert "initial_score" not in auto and auto["initial_scored"] is False
    assert auto["history"] == always["history"]
    assert auto["test"] == always["test"] and auto["selected_round"] == always["selected_round"]


def test_auto_still_scores_round_zero_where_the_selection_reads_it(tmp_path: Path) -> None:
    splits = {"train": "base", "val": "val", "test": "novel"}
    dataset = {"name": "digits", "options": {"class_split": {"base": [0, 1, 2, 3], "val": [4, 5, 6],
                                                             "novel": [7, 8, 9]}}}
    always = _run(tmp_path, [], splits=splits, dataset=dataset)
    auto = _run(tmp_path, ["eval.initial=auto"], splits=splits, dataset=dataset)
    assert auto["initial_score"] == always["initial_score"] and "initial_scored" not in auto
    control = _run(tmp_path, ["eval.initial=auto", "federation.rounds=0"])  # the untrained control
    assert "initial_score" in control


def test_a_bad_value_is_one_line_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="eval.initial"):
        load_config(tiny_config("fl-proto"), ["eval.initial=never"])
    path = tmp_path / "c.yaml"
    import yaml

    path.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    assert main(["run", str(path), "--set", "runtime.compile=fast", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "runtime.compile" in err


def test_the_new_keys_at_their_defaults_keep_every_stored_key() -> None:
    # Their defaults are registered as neutral (left out of the key), so every stored cell keeps its
    # key (the stored records' own hashes: tests/test_per_class.py, test_privacy.py, test_secagg.py);
    # any other value is part of it.
    from fedfew.core.config_schema import EvalConfig, RuntimeConfig
    from fedfew.study.grid import NEUTRAL_DEFAULTS, config_hash

    assert NEUTRAL_DEFAULTS[("eval", "initial")] == EvalConfig().initial == "always"
    assert NEUTRAL_DEFAULTS[("runtime", "compile")] == RuntimeConfig().compile == "off"
    config = load_config(tiny_config("fl-proto"))
    assert load_config(tiny_config("fl-proto"), ["runtime.compile=off"]).runtime.compile == "off"  # YAML's false
    for override in ("eval.initial=auto", "runtime.compile=default"):
        assert config_hash(load_config(tiny_config("fl-proto"), [override])) != config_hash(config), override
