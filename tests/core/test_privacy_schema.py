"""The ``privacy`` section (fedfew.core.privacy_schema): every incomplete or contradictory setting is one
line and exit 2 before any run folder exists, fuzzed settings included."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedfew.cli.main import main
from tests.cli.test_fuzz import check_outcome, run_cli
from tests.privacy.common import private

# -- refusals: one line, exit 2, before any run folder ---------------------------------------------------------
BAD = [
    (["privacy.delta=0.3"], "privacy.delta"),  # >= 1 / 4 clients
    (["privacy.noise_multiplier=-1"], "privacy.noise_multiplier"),
    (["privacy.noise_multiplier=0"], "privacy.noise_multiplier"),
    (["privacy.mechanism=laplace"], "privacy.mechanism"),
    (["privacy.clip=null"], "privacy.clip"),
    (["privacy.delta=null"], "privacy.delta"),
    (["privacy.target_epsilon=3"], "privacy.target_epsilon"),  # and a noise multiplier
    (["privacy.noise_multiplier=null"], "privacy.target_epsilon"),  # neither
    (["privacy.mechanism=none"], "privacy.mechanism"),  # settings without a mechanism
    (["privacy.mechanism=local-dp", "privacy.adaptive_clip={}"], "privacy.adaptive_clip"),
    (["privacy.adaptive_clip={count_noise: 0.1}"], "privacy.adaptive_clip.count_noise"),
    (["privacy.accountant=moments"], "privacy.accountant"),
    (["algorithm.name=f2l", "algorithm.options.decoupled=false"], "f2l"),
    (["algorithm.name=f2l", "algorithm.options.test_client_model=average"], "f2l"),
    (["algorithm.name=fedfsl-mi", "algorithm.options.reference=exclusive"], "reference: exclusive"),
]


@pytest.mark.parametrize("assignments,key", BAD)
def test_bad_privacy_settings_are_one_line_errors(assignments: list[str], key: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(private("fl-proto")))
    sets = [arg for a in assignments for arg in ("--set", a)]
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet", *sets]) == 2
    err = capsys.readouterr().err
    assert key in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# -- fuzzing the privacy section --------------------------------------------------------------------------------
#: Each key's values: mostly valid ones (so that some runs go through) and a few bad ones.
PRIVACY_VALUES = {
    "mechanism": st.sampled_from(["central-dp", "central-dp", "local-dp", "none", "gaussian", None]),
    "clip": st.one_of(st.floats(0.01, 5), st.sampled_from([0, -1, None, "big", 1e-300])),
    "noise_multiplier": st.one_of(st.floats(0.3, 3), st.sampled_from([0, -0.5, None, float("nan")])),
    "target_epsilon": st.one_of(st.none(), st.floats(0.5, 30), st.sampled_from([0, -1, 1e-9])),
    "delta": st.sampled_from([1e-5, 1e-3, 0.249, 0.25, 0.5, 0, 1, None, 1e-300]),
    "accountant": st.sampled_from(["rdp", "prv", "moments", 3]),
    "adaptive_clip": st.sampled_from([None, {}, {"count_noise": 2.0}, {"count_noise": 0.1}, {"bogus": 1},
                                      {"count_noise": 3.0, "target_quantile": 0.9, "lr": 1.0}, "yes"]),
    "client_metrics": st.sampled_from([True, False, 1, "yes"]),
}


privacy_changes = st.lists(st.sampled_from(sorted(PRIVACY_VALUES)).flatmap(
    lambda key: st.tuples(st.just(key), PRIVACY_VALUES[key])), min_size=1, max_size=3)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(changes=privacy_changes)
def test_fuzzed_privacy_settings_run_or_fail_cleanly(changes: list[tuple[str, Any]]) -> None:
    """Any privacy section ends in a complete run that reports its (epsilon, delta), or one line, exit 2."""
    config = private("fl-proto", federation={"rounds": 1, "clients_per_round": 2},
                     episodes={"n_way": 2, "q_query": 1, "test_episodes": 2})
    config["privacy"] = {**config["privacy"], **dict(changes)}  # never the shared CENTRAL itself
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        code, err = run_cli(["run", str(path)], Path(tmp) / "out")
        check_outcome("privacy", code, err, Path(tmp) / "out", ["privacy", "algorithm"])
        if code == 0:
            (folder,) = (Path(tmp) / "out").iterdir()
            summary = json.loads((folder / "summary.json").read_text())
            if config["privacy"].get("mechanism") in ("central-dp", "local-dp"):
                assert math.isfinite(summary["privacy"]["epsilon"]) and summary["privacy"]["epsilon"] >= 0
