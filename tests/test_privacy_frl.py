"""FRL (GPAL) under client-level DP, our extension (docs/privacy.md): every release of an episode
(R inner rounds with prototypes, the meta-update) clipped and noised, and accounted; the same numbers in
process and on workers, on resume; with DP off nothing changes (tests/test_frl.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fedfew.config.validation import PrivacyConfig, load_config
from fedfew.core.errors import ConfigError
from fedfew.interface.algorithm import ClientResult
from fedfew.privacy.accounting import epsilon
from fedfew.privacy.clipping import DELTA, PROTOTYPES, REFERENCE, ClientSpec, l2_norm, privatize
from fedfew.run.experiment import build_experiment
from tests.helpers import cut_and_resumed
from tests.test_privacy import CENTRAL, LOCAL, SEEDED, private, simulated

ROUNDS = 2  # R, the inner rounds of an episode (the tiny config's)


def frl(privacy: dict[str, Any] | None = None, **federation: Any) -> dict[str, Any]:
    config = private("frl", privacy, federation={"rounds": 2, "clients_per_round": 2, **federation})
    assert config["algorithm"]["options"]["rounds"] == ROUNDS
    return config


def test_the_upload_and_prototypes_are_clipped_together_without_counts() -> None:
    payload = {"model": {"w": torch.zeros(3)}}
    upload = {"model": {"w": torch.tensor([3.0, 0.0, 0.0])},
              "prototypes": {"classes": torch.tensor([1, 4]), "prototypes": torch.full((2, 2), 2.0),
                             "counts": torch.tensor([5.0, 1.0])}}
    out = privatize(ClientResult(upload=upload, state=None, num_samples=6), payload,
                    ClientSpec("frl-prototypes", 1.0), 0, "0/r0", 1)
    sent = out.upload
    assert set(sent) == {DELTA, PROTOTYPES} and set(sent[PROTOTYPES]) == {"classes", "prototypes"}
    norm = math.sqrt(l2_norm(sent[DELTA]) ** 2 + l2_norm({"p": sent[PROTOTYPES]["prototypes"]}) ** 2)
    assert norm <= 1.0 and norm == pytest.approx(1.0, abs=1e-5) and out.num_samples == 0
    scale = 1.0 / math.sqrt(9 + 16)  # one joint clip: every coordinate scaled alike
    assert sent[DELTA]["w"][0] == pytest.approx(3 * scale, rel=1e-5)
    assert sent[PROTOTYPES]["prototypes"][0, 0] == pytest.approx(2 * scale, rel=1e-5)
    # the meta-update's update is measured from phi^t (REFERENCE), not from the theta^R it downloaded
    meta = privatize(ClientResult(upload={"model": {"w": torch.tensor([0.5, 0.0, 0.0])}}, state=None),
                     {"model": {"w": torch.ones(3)}, REFERENCE: {"w": torch.zeros(3)}},
                     ClientSpec("frl-prototypes", 1.0), 0, "0/meta", 1)
    assert torch.equal(meta.upload[DELTA]["w"], torch.tensor([0.5, 0.0, 0.0])) and PROTOTYPES not in meta.upload


def test_prototype_uploads_are_padded_to_every_preparation_class() -> None:
    """Issue 51: on main a client sent the classes it holds (and bytes_up counted their rows). Padded
    with zero rows to every class, the upload says nothing of them, and the clip and the server's sums
    are those of the unpadded upload."""
    payload = {"model": {"w": torch.zeros(3)}}
    upload = {"model": {"w": torch.tensor([3.0, 0.0, 0.0])},
              "prototypes": {"classes": torch.tensor([1, 4]), "prototypes": torch.full((2, 2), 2.0)}}
    result = ClientResult(upload=upload, state=None, num_samples=6)
    plain = privatize(result, payload, ClientSpec("frl-prototypes", 1.0), 0, "0/r0", 1).upload
    every = (0, 1, 2, 4, 7)
    spec = ClientSpec.from_json(ClientSpec("frl-prototypes", 1.0, classes=every).to_json())  # through JSON
    padded = privatize(result, payload, spec, 0, "0/r0", 1).upload
    assert padded[PROTOTYPES]["classes"].tolist() == list(every)
    rows = padded[PROTOTYPES]["prototypes"]
    assert torch.equal(rows[[1, 3]], plain[PROTOTYPES]["prototypes"]) and not rows[[0, 2, 4]].any()
    assert torch.equal(padded[DELTA]["w"], plain[DELTA]["w"])  # zero rows leave the joint clip alone
    other = {"model": upload["model"], "prototypes": {"classes": torch.tensor([0]), "prototypes": torch.ones(1, 2)}}
    second = privatize(ClientResult(upload=other, state=None), payload, spec, 0, "0/r0", 2).upload
    assert second[PROTOTYPES]["prototypes"].shape == rows.shape  # the same size whatever a client holds


def test_the_global_prototypes_are_a_noised_sum_over_every_class_with_a_fixed_divisor() -> None:
    experiment = build_experiment(load_config(frl()))
    privacy = experiment.simulator().privacy
    assert privacy is not None and privacy.nested and privacy.releases == ROUNDS + 1
    classes = privacy.prototype_classes
    sent = [{PROTOTYPES: {"classes": torch.tensor([classes[0]]), "prototypes": torch.ones(1, 2)}},
            {PROTOTYPES: {"classes": torch.tensor(classes[:2]), "prototypes": torch.ones(2, 2)}}]
    plain = privacy.noised_prototypes(sent, 0.0, torch.Generator().manual_seed(0))
    assert plain is not None and plain["classes"].tolist() == classes
    expected = torch.zeros(len(classes), 2)
    expected[0], expected[1] = 2 / privacy.per_round, 1 / privacy.per_round  # not 1 (a count-weighted mean)
    assert torch.equal(plain["prototypes"], expected)
    noised = privacy.noised_prototypes(sent, 1000.0, torch.Generator().manual_seed(0))
    assert noised is not None and float(noised["prototypes"].std()) * privacy.per_round == pytest.approx(1000, rel=0.3)


def test_every_release_is_accounted() -> None:
    config = load_config(frl())
    privacy = build_experiment(config).simulator().privacy
    assert privacy is not None
    k, z, delta = ROUNDS + 1, 0.8, 1e-3
    assert (CENTRAL["noise_multiplier"], CENTRAL["delta"]) == (z, delta)
    # one subsampling of the clients per episode, R + 1 Gaussians of multiplier z composed: z / sqrt(k)
    assert privacy.accounted_noise == pytest.approx(z / math.sqrt(k))
    assert privacy.epsilon(2) == epsilon("rdp", z / math.sqrt(k), privacy.sampling_rate, 2, delta)
    assert privacy.epsilon(2) > epsilon("rdp", z, privacy.sampling_rate, 2, delta)
    report = privacy.report(2)
    assert report["releases_per_round"] == k and report["releases"] == 2 * k and "our extension" in report["covers"]["what"]
    target = PrivacyConfig.model_validate({**{a: b for a, b in CENTRAL.items() if a != "noise_multiplier"},
                                           "target_epsilon": 8.0})
    solved = type(privacy)(target, build_experiment(config).algorithm, privacy.num_clients, privacy.per_round, 2)
    assert solved.epsilon(2) == pytest.approx(8.0, abs=0.05) and solved.epsilon(2) <= 8.0


def test_workers_equal_one_process_and_dp_changes_the_numbers() -> None:
    config = frl(SEEDED)  # research mode: the noise and the clients from the seed, so the engines compare exactly
    # with faults too (a participant that failed in inner round 0 holds no phi^t: it sits the meta-update out)
    faulty = frl(SEEDED, clients_per_round=3, dropout=0.34)
    assert simulated(faulty, ["runtime.engine=workers", "runtime.engine_options.workers=2"]) == simulated(faulty)
    inprocess = simulated(config)
    workers = simulated(config, ["runtime.engine=workers", "runtime.engine_options.workers=2"])
    assert workers == inprocess
    history = inprocess["history"]
    assert inprocess["privacy"]["epsilon"] == history[-1]["dp_epsilon"] > history[0]["dp_epsilon"] > 0
    assert inprocess["privacy"]["releases"] == 2 * (ROUNDS + 1)
    plain = simulated({k: v for k, v in config.items() if k != "privacy"})
    assert plain["privacy"] is None and plain["history"] != history


def test_resume_equals_uninterrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedfew.algorithms.frl import FRL

    config = load_config(frl(SEEDED, rounds=3))
    whole, resumed, rows, whole_rows = cut_and_resumed(config, FRL, tmp_path, monkeypatch)
    assert rows == whole_rows and len(rows) == 3 and all("dp_epsilon" in r for r in rows)
    assert resumed["test"] == whole["test"] and resumed["privacy"] == whole["privacy"]


@pytest.mark.parametrize("privacy,key", [(LOCAL, "local-dp"), ({**CENTRAL, "adaptive_clip": {"count_noise": 1.0}},
                                                               "adaptive clipping")])
def test_what_frl_does_not_implement_is_refused(privacy: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:  # adaptive clipping: refused by the config check, before the build
        build_experiment(load_config(frl(privacy)))
    assert key in str(info.value) and "\n" not in str(info.value)
