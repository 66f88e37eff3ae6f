"""Secure mode, the default under DP: noise and participants from OS randomness, so two
runs with one seed differ, a resumed run continues from its checkpoint's noised models, private
client states are not released, every report says what its epsilon covers, and the bad inputs of the
``privacy`` section are one line and exit 2 before any run folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedfew.cli.main import main
from fedfew.config.validation import load_config
from fedfew.privacy.coverage import REPRODUCIBLE_NOISE, SHARED_ONLY
from fedfew.run.experiment import build_experiment
from fedfew.run.runner import run_experiment
from tests.privacy.common import CENTRAL, SEEDED, private, simulated

#: A secret fixed-size sample (2 of 4 clients): the same number of client updates every round.
FIXED = {**CENTRAL, "accounting": "without_replacement"}


def test_two_runs_with_one_seed_draw_different_noise() -> None:
    config = private("fl-proto", federation={"rounds": 2, "clients_per_round": 4})  # everyone: only the noise differs
    first, second = simulated(config), simulated(config)
    assert first["history"][0]["clients"] == second["history"][0]["clients"]
    assert first["history"] != second["history"]
    seeded = private("fl-proto", SEEDED, federation={"rounds": 2, "clients_per_round": 4})
    assert simulated(seeded) == simulated(seeded)  # research mode: reproducible


def test_a_secure_run_resumes_from_its_checkpoint_without_redrawing_a_finished_round(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedfew.algorithms.fl_proto import FLProto
    from fedfew.run.folder import RunFolder
    from fedfew.run.runner import RunInterrupted, resume_run

    config = load_config(private("fl-proto", FIXED, federation={"rounds": 3, "clients_per_round": 2}))
    calls = {"n": 0}
    original = FLProto.client_update

    def client_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # round 2's first client: round 1 is checkpointed
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FLProto, "client_update", client_update)
    with pytest.raises(RunInterrupted):
        run_experiment(config, tmp_path / "out", progress=False)
    monkeypatch.setattr(FLProto, "client_update", original)
    (folder,) = (tmp_path / "out").iterdir()
    before = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    checkpoint = RunFolder(folder).checkpoint_dir / "server-r1.safetensors"
    saved = checkpoint.read_bytes()
    summary = resume_run(folder, progress=False)
    after = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert len(before) == 1 and len(after) == 3
    assert after[0] == before[0]  # round 1 stands as it was noised, not re-drawn
    assert saved and summary["privacy"]["epsilon"] == after[-1]["dp_epsilon"] > after[0]["dp_epsilon"]
    assert [r["clients"]["asked"] for r in after] == [2, 2, 2]  # counts of the secret sample


def test_private_states_are_not_saved_unless_asked(tmp_path: Path) -> None:
    config = private("f2l", FIXED, federation={"rounds": 1, "clients_per_round": 2})
    run_experiment(load_config(config), tmp_path / "a", progress=False)
    (folder,) = (tmp_path / "a").iterdir()
    assert not (folder / "model" / "clients").exists()
    config["privacy"] = {**FIXED, "keep_private_states": True}
    summary = run_experiment(load_config(config), tmp_path / "b", progress=False)
    (kept,) = (tmp_path / "b").iterdir()
    assert any((kept / "model" / "clients").glob("client-*.safetensors"))
    assert summary["privacy"]["keep_private_states"] is True


# A fixed-size secret sample where one round must train: a Poisson round of 4 clients at q = 0.5 is empty
# one time in 16, and a run in which nobody trained reports no score.
@pytest.mark.parametrize("name,privacy,says", [("f2l", FIXED, SHARED_ONLY), ("fl-proto", SEEDED, REPRODUCIBLE_NOISE),
                                               ("fl-proto", {**FIXED, "client_metrics": True}, "training metrics")])
def test_every_epsilon_says_what_it_covers(name: str, privacy: dict[str, Any], says: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(private(name, privacy, federation={"rounds": 1, "clients_per_round": 2})))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    (folder,) = (tmp_path / "out").iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    covers = summary["privacy"]["covers"]
    assert says in covers["short"] and covers["noise"] == summary["privacy"]["noise"]
    assert covers["score_covered"] is (name != "f2l")
    if name == "f2l":  # scored on private models: no round is selected on their validation scores
        assert summary["selected_round"] == summary["rounds"]
    assert says in capsys.readouterr().out  # the run's last line
    assert says in (folder / "results.md").read_text()


def test_the_study_table_marks_what_a_cell_covers() -> None:
    from fedfew.study.collect import StudyResults
    from fedfew.study.table_cells import privacy_mark

    results = StudyResults.__new__(StudyResults)
    results.privacy = {("f2l", "eps 4"): {0: (3.99, 1e-5)}}
    results.privacy_covers = {("f2l", "eps 4"): {f"{SHARED_ONLY}; {REPRODUCIBLE_NOISE}"}}
    results.privacy_no_amplification = {}
    mark = privacy_mark(results, "f2l", "eps 4")
    assert mark.startswith(" (ε 3.99, δ 1e-05; ") and SHARED_ONLY in mark and REPRODUCIBLE_NOISE in mark
    assert "unamplified" not in mark  # an older record without the number
    # amplified by sampling: the worst seed's epsilon with no amplification beside it
    results.privacy_no_amplification = {("f2l", "eps 4"): {0: 12.6, 1: 12.61}}
    assert privacy_mark(results, "f2l", "eps 4").startswith(" (ε 3.99, δ 1e-05; ε 12.61 unamplified; ")
    # accounted with no amplification (or every client in every round): the two are one number, shown once
    results.privacy_no_amplification = {("f2l", "eps 4"): {0: 3.99}}
    assert "unamplified" not in privacy_mark(results, "f2l", "eps 4")


def test_a_table_says_every_client_took_part_where_no_sample_was_drawn() -> None:
    """Poisson accounting at a sampling rate of 1 (ten clients, all of them each round) drew no sample: the
    table's note says every client took part, not that a sample was kept secret; below 1 it keeps the note."""
    from fedfew.study.collect import WHOLE_FEDERATION, _whole_federation

    short = f"{SHARED_ONLY}; Poisson sample kept secret by the server; {REPRODUCIBLE_NOISE}"
    assert _whole_federation(short, {"sampling_rate": 1.0}) == f"{SHARED_ONLY}; {WHOLE_FEDERATION}; {REPRODUCIBLE_NOISE}"
    assert _whole_federation(short, {"sampling_rate": 10 / 64}) == short
    assert _whole_federation("secret fixed-size sample", {"sampling_rate": 1.0}) == WHOLE_FEDERATION
    assert _whole_federation(short, {}) == short  # a record without the rate: as it says


# -- bad inputs: one line naming the key, exit 2, no run folder ------------------------------------------------
BAD = [
    (["privacy={client_metrics: false}"], "privacy.client_metrics"),  # ignored without a mechanism
    (["privacy={noise: seeded}"], "privacy.noise"),
    (["privacy.noise_multiplier=1e308"], "privacy.noise_multiplier"),  # the accountant overflowed after the folder
    (["privacy.clip=1e308"], "privacy.clip"),  # "the model diverged"
    (["privacy.mechanism=local-dp", "privacy.accounting=poisson"], "privacy.accounting"),
    (["privacy.accounting=without_replacement", "privacy.accountant=prv"], "privacy.accountant"),
    (["privacy.accounting=sometimes"], "privacy.accounting"),
    (["privacy.noise=urandom"], "privacy.noise"),
    (["algorithm.name=frl", "privacy.adaptive_clip={}"], "privacy.adaptive_clip"),
    (["privacy.adaptive_clip={}", "privacy.noise_multiplier=2"], "10 x noise_multiplier"),
]


@pytest.mark.parametrize("assignments,key", BAD)
def test_bad_privacy_inputs_are_one_line_and_exit_2(assignments: list[str], key: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(private("fl-proto")))
    sets = [arg for a in assignments for arg in ("--set", a)]
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet", *sets]) == 2
    err = "\n".join(line for line in capsys.readouterr().err.splitlines() if "warning: algorithm.name" not in line)
    assert key in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_poisson_under_secure_aggregation_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = private("fl-proto", {**CENTRAL, "accounting": "poisson"},
                     runtime={"engine": "flower-sim"}, flower={"secure_aggregation": {"enabled": True}})
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "privacy.accounting=poisson" in err and len(err.strip().splitlines()) == 1, err


def test_secure_aggregation_defaults_to_a_fixed_secret_sample() -> None:
    pytest.importorskip("flwr")
    config = load_config(private("fl-proto", runtime={"engine": "flower-sim"},
                                 flower={"secure_aggregation": {"enabled": True}}))
    privacy = build_experiment(config).privacy
    assert privacy is not None and privacy.accounting == "without_replacement"
