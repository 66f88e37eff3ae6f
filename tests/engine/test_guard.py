"""The divergence guard (fedfew.engine.guard): a round whose loss or parameters are not finite, or whose
loss exploded, fails the run naming the round and the client; the rule by hand, and no committed
study run would have tripped it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedfew.cli.main import demo_config_path, main
from fedfew.config.validation import load_config
from fedfew.engine.guard import LossGuard
from fedfew.engine.round import RoundOutcome
from fedfew.interface.algorithm import ClientResult
from fedfew.run.runner import run_experiment
from tests.cli.common import cli_lines
from tests.run.common import only_status, status_record, strict_rows, write
from tests.tiny import tiny_config

# -- divergence is a failure ---------------------------------------------------------------------------
NAN_MODEL = '''
import torch
from torch import nn
from fedfew.models import MODELS, FewShotModel


class NaNAfterTraining(nn.Module):
    """Finite in eval mode (the preflight check passes), NaN features once training starts."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 8)

    def forward(self, x):
        out = self.linear(x.flatten(1))
        return out * float("nan") if self.training else out


@MODELS.register("nan-after-training")
def nan_model(input_shape, num_classes):
    return FewShotModel(NaNAfterTraining(), 8, None if num_classes is None else nn.Linear(8, num_classes))
'''


def test_a_model_that_outputs_nan_fails_the_run_naming_round_and_client(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "nan_model.py"
    plugin.write_text(NAN_MODEL)
    code = main(["run", str(demo_config_path()), "--out", str(tmp_path / "out"), "--quiet", "--plugin", str(plugin),
                 "--set", "model.name=nan-after-training", "--set", "model.options={}",
                 "--set", "algorithm.name=fl-proto", "--set", "algorithm.options={local_steps: 1}",
                 "--set", "federation.rounds=3", "--set", "episodes.test_episodes=5"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert "round 1" in lines[0] and "client 0" in lines[0] and "diverged" in lines[0]
    (folder,) = list((tmp_path / "out").iterdir())
    assert status_record(folder)["status"] == "failed" and "round 1" in status_record(folder)["error"]
    assert not (folder / "summary.json").exists()
    rows = strict_rows(folder)  # strict JSON: the NaN loss is null
    assert len(rows) == 1 and rows[0]["train_loss"] is None and "client 0" in rows[0]["diverged"]


def test_a_huge_learning_rate_fails_the_run(tmp_path: Path) -> None:
    config = load_config(tiny_config("fedavg", federation={"rounds": 3}))
    config = load_config(config.model_dump(mode="json"), ["algorithm.options.lr=1e30"])
    from fedfew.engine.guard import DivergedError

    with pytest.raises(DivergedError, match=r"round \d: client \d"):
        run_experiment(config, tmp_path, progress=False)
    (folder,) = list(tmp_path.iterdir())
    assert status_record(folder)["status"] == "failed"
    strict_rows(folder)


REPO = Path(__file__).resolve().parents[2]


# -- divergence that stays finite ----------------------------------------------------------------------
@pytest.mark.parametrize("algorithm,options", [("fl-proto", {"lr": 1.0e8}), ("fl-maml", {"inner_lr": 1.0e8})])
def test_a_finite_explosion_fails_the_run_naming_round_and_client(
        algorithm: str, options: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tiny_config(algorithm)
    config["algorithm"]["options"].update(options)  # Adam's lr (fl-proto) and MAML's inner step, both at 1e8
    out = tmp_path / "out"
    code, lines = cli_lines(capsys, "run", str(write(tmp_path / "c.yaml", config)), "--out", str(out), "--quiet")
    assert code == 1 and len(lines) == 1, lines
    assert "round 1" in lines[0] and "client" in lines[0] and "diverged" in lines[0], lines[0]
    recorded = only_status(out)
    assert recorded["status"] == "failed" and "max_loss" in recorded["error"]
    assert not list(out.glob("*/summary.json"))  # no accuracy is reported
    # A failed run is resumable (runtime.* may change, here the guard itself): nothing refuses it.
    (folder,) = list(out.iterdir())
    assert cli_lines(capsys, "resume", str(folder), "--quiet", "--set", "runtime.divergence.max_loss=1e300",
                   "--set", "runtime.divergence.loss_factor=0")[0] in (0, 1)
    assert only_status(out)["status"] in ("complete", "failed")


def outcome_with_losses(losses: dict[int, float]) -> RoundOutcome:
    results = {cid: ClientResult(upload={}, metrics={"loss": loss}) for cid, loss in losses.items()}
    return RoundOutcome(server=None, results=results, bytes_down=0, bytes_up=0, asked=sorted(losses))


def test_the_loss_guard_rule_absolute_and_relative_with_patience() -> None:
    guard = LossGuard(max_loss=1e6, loss_factor=100.0, patience=3)
    assert guard.exploded(outcome_with_losses({0: 1.0, 1: 2e6}), []) is not None  # client 1 above max_loss
    assert "client 1" in str(guard.exploded(outcome_with_losses({0: 1.0, 1: 2e6}), []))
    first = {"round": 1, "train_loss": 1.5}
    high = {"round": 2, "train_loss": 400.0}
    # 400 > 100 x 1.5 but only once, then twice: not yet; the third round in a row trips it.
    assert guard.exploded(outcome_with_losses({0: 400.0}), [first]) is None
    assert guard.exploded(outcome_with_losses({0: 400.0}), [first, high]) is None
    assert guard.exploded(outcome_with_losses({0: 400.0}), [first, high, {**high, "round": 3}]) is not None
    # One calm round in between resets it.
    assert guard.exploded(outcome_with_losses({0: 400.0}), [first, high, {"round": 3, "train_loss": 2.0}]) is None
    # A near-zero first loss is no yardstick: the limit is 100 x max(first, 1).
    assert guard.exploded(outcome_with_losses({0: 50.0}), [{"round": 1, "train_loss": 0.01}] * 3) is None
    assert LossGuard(loss_factor=0).exploded(outcome_with_losses({0: 1e5}), [first] * 5) is None


def test_no_committed_study_run_would_have_tripped_the_guard() -> None:
    """Every stored cell of the committed store (each a committed config or study run) stays within the
    default rule on the rounds it recorded."""
    from fedfew.config.validation import DivergenceConfig

    rule = DivergenceConfig()
    checked = 0
    for path in (REPO / "studies/store").glob("*/*.json"):
        history = json.loads(path.read_text()).get("history") or []
        for key in {k for row in history for k in row if k.startswith("train_") and k.endswith("loss")}:
            values = [row[key] for row in history if isinstance(row.get(key), (int, float))]
            if not values:
                continue
            checked += 1
            assert max(values) < rule.max_loss, path
            limit = rule.loss_factor * max(values[0], 1.0)
            assert max(values) < limit, f"{path}: {key} reaches {max(values)} against a limit of {limit}"
    assert checked > 1000
