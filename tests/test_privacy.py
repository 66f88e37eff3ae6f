"""Client-level differential privacy (config ``privacy``, fedfew.privacy; docs/privacy.md).

* the mathematics: the clip bound holds after the float32 cast; the server's noise has standard
  deviation z C on the sum (and z_Delta C with adaptive clipping, Andrew et al.'s Theorem 1); local-dp's
  noise is z C on each update; epsilon is the accountant's own number (and, at sampling rate 1, the
  RDP-to-(epsilon, delta) conversion worked by hand); a target epsilon solves to a multiplier just
  within it;
* the engines: in process = workers (= flower and flower-sim, marked ``flower``) with DP on; resume =
  uninterrupted: both in research mode (``privacy.noise: seeded``), the only mode in which runs repeat;
  by default the noise comes from OS randomness (tests/test_privacy_secure.py) and nobody can regenerate
  it from the config seed (tested here);
* the refusals: every incomplete or contradictory privacy setting, and every algorithm whose upload
  is not covered, is one line and exit 2, before any run folder exists;
* privacy off changes nothing: a stored cell keeps its key (and the equality suites pass unchanged).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedfew.cli.main import main
from fedfew.config.validation import PrivacyConfig, load_config
from fedfew.core.errors import UsageError
from fedfew.interface.algorithm import ALGORITHMS, Algorithm, ClientResult, register
from fedfew.interface.protocol import initial_client_state, initial_server_state
from fedfew.privacy import (
    ClientSpec,
    PrivacyConfigError,
    PrivateAggregation,
    clip_to,
    epsilon,
    l2_norm,
    privatize,
)
from fedfew.privacy.accounting import EPSILON_TOLERANCE
from fedfew.privacy.clipping import DELTA, WITHIN
from fedfew.run.experiment import build_experiment
from fedfew.run.runner import run_experiment
from fedfew.study.grid import config_hash
from tests.helpers import cut_and_resumed
from tests.test_fuzz import check_outcome, run_cli
from tests.tiny import simulate, tiny_config

REPO = Path(__file__).resolve().parents[1]

CENTRAL = {"mechanism": "central-dp", "clip": 0.5, "noise_multiplier": 0.8, "delta": 1e-3}
#: Research mode: the noise and the clients of each round from the seed, so runs can be compared exactly.
SEEDED = {**CENTRAL, "noise": "seeded"}


def private(name: str, privacy: dict[str, Any] | None = None, **sections: Any) -> dict[str, Any]:
    """The tiny config of ``name`` with DP on (2 of 4 clients a round, so sampling amplifies)."""
    sections.setdefault("federation", {"rounds": 2, "clients_per_round": 2})
    return tiny_config(name, privacy=privacy or CENTRAL, **sections)


class Averaged(Algorithm):
    """The least an algorithm needs for PrivateAggregation: a model the server averages."""

    name = "averaged"
    dp_upload = "model-delta"


def aggregation(per_round: int = 4, num_clients: int = 8, rounds: int = 10, **privacy: Any) -> PrivateAggregation:
    config = PrivacyConfig.model_validate({**CENTRAL, **privacy})
    return PrivateAggregation(config, Averaged(None, None), num_clients, per_round, rounds)  # type: ignore[arg-type]


# -- the client side: the clip ---------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e-3, 0.3, 1.0, 7.0, 1e4])
def test_the_clip_bound_holds_after_the_float32_cast(scale: float) -> None:
    g = torch.Generator().manual_seed(int(scale * 1000))
    sent = {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g),
            "steps": torch.tensor(3), "frozen": torch.randn(5, generator=g)}
    upload = {"w": sent["w"] + scale * torch.randn(64, 32, generator=g), "b": sent["b"] + scale * torch.randn(32, generator=g),
              "steps": torch.tensor(9), "frozen": sent["frozen"] + 1.0}
    result = ClientResult(upload={"model": upload, "extra": torch.ones(3)}, state={"private": 1},
                          metrics={"loss": 0.7}, num_samples=50, num_episodes=4)
    clip = 1.0
    out = privatize(result, {"model": sent}, ClientSpec("model-delta", clip, adaptive=True), 0, "3", 2, ["frozen"])
    delta = out.upload[DELTA]
    assert set(out.upload) == {DELTA, WITHIN}  # nothing else of the upload leaves the client
    assert set(delta) == {"b", "w"}  # floating tensors only, frozen ones left out
    assert all(t.dtype == torch.float32 for t in delta.values())
    assert l2_norm(delta) <= clip  # the bound, on what is actually sent (float32)
    true = {k: upload[k].double() - sent[k].double() for k in ("b", "w")}
    norm = l2_norm(true)
    assert float(out.upload[WITHIN]) == (1.0 if norm <= clip else 0.0)
    if norm < clip * (1 - 1e-5):  # within the clip: the update itself, to float32 rounding
        assert all(torch.allclose(delta[k].double(), true[k], rtol=1e-6, atol=1e-7) for k in delta)
    else:  # clipped: the same direction, norm C
        assert l2_norm(delta) == pytest.approx(clip, rel=1e-5)
        assert torch.allclose(delta["w"].double() / clip, true["w"] / norm, atol=1e-6)
    # no metrics or counts leave the client by default; its private state stays as it was returned
    assert out.metrics == {} and out.num_samples == 0 and out.num_episodes == 0 and out.state == {"private": 1}
    kept = privatize(result, {"model": sent}, ClientSpec("model-delta", clip, metrics=True), 0, "3", 2)
    assert kept.metrics == {"loss": 0.7} and WITHIN not in kept.upload


def test_clip_to_scales_only_what_is_too_long() -> None:
    v = {"a": torch.tensor([3.0, 4.0], dtype=torch.float64)}  # norm 5
    same, norm = clip_to(v, 10.0)
    assert norm == 5.0 and torch.equal(same["a"], v["a"])
    short, _ = clip_to(v, 1.0)
    assert l2_norm(short) <= 1.0 and l2_norm(short) == pytest.approx(1.0, rel=1e-5)


def test_a_client_that_sat_out_sends_nothing() -> None:
    out = privatize(ClientResult.sat_out({"s": 1}, 3), {"model": {}}, ClientSpec("model-delta", 1.0), 0, "0", 1)
    assert out.upload == {} and out.skipped and out.num_samples == 0


# -- the noise ---------------------------------------------------------------------------------------------
def test_central_noise_has_standard_deviation_z_times_c_on_the_sum() -> None:
    """Zero updates from every client: w' - w = N(0, (zC)^2) / m, over 200 000 coordinates (the
    sample standard deviation is within 1% with overwhelming probability: its relative error is about
    1 / sqrt(2n) = 0.16%)."""
    agg = aggregation(per_round=4, clip=0.5, noise_multiplier=0.8, noise="seeded")
    model = {"w": torch.zeros(400, 500), "steps": torch.tensor(2)}
    server = agg.init_server({"model": model})
    zero = {"w": torch.zeros(400, 500)}
    results = {c: ClientResult(upload={DELTA: zero}) for c in range(3)}  # one of the 4 expected failed
    new, record = agg.aggregate(server, results, seed=5, round_key="7")
    noise = (new["model"]["w"].double() * 4)  # the fixed denominator m = 4, not the 3 that replied
    assert float(noise.mean()) == pytest.approx(0.0, abs=0.01)
    assert float(noise.std()) == pytest.approx(0.8 * 0.5, rel=0.01)
    assert torch.equal(new["model"]["steps"], torch.tensor(2)) and record == {"dp_clip": 0.5}
    again, _ = agg.aggregate(server, results, seed=5, round_key="7")
    assert torch.equal(again["model"]["w"], new["model"]["w"])  # seeded by (seed, round key)
    other, _ = agg.aggregate(server, results, seed=5, round_key="8")
    assert not torch.equal(other["model"]["w"], new["model"]["w"])
    secure = aggregation(per_round=4, clip=0.5, noise_multiplier=0.8)  # the default: OS randomness
    first, _ = secure.aggregate(server, results, seed=5, round_key="7")
    second, _ = secure.aggregate(server, results, seed=5, round_key="7")
    assert float((first["model"]["w"].double() * 4).std()) == pytest.approx(0.8 * 0.5, rel=0.01)
    assert not torch.equal(first["model"]["w"], second["model"]["w"])  # nobody regenerates it from the seed
    assert not torch.equal(first["model"]["w"], new["model"]["w"])


def test_the_server_adds_the_mean_of_the_clipped_updates() -> None:
    agg = aggregation(per_round=2, clip=10.0, noise_multiplier=1e-9)  # noise negligible
    server = agg.init_server({"model": {"w": torch.ones(3)}})
    results = {0: ClientResult(upload={DELTA: {"w": torch.tensor([1.0, 2.0, 3.0])}}),
               1: ClientResult(upload={DELTA: {"w": torch.tensor([3.0, 0.0, -1.0])}})}
    new, _ = agg.aggregate(server, results, 0, "0")
    assert torch.allclose(new["model"]["w"], torch.tensor([3.0, 2.0, 2.0]), atol=1e-6)  # 1 + (sum / 2)


def test_local_noise_has_standard_deviation_z_times_c_on_each_update() -> None:
    sent = {"w": torch.zeros(200_000)}
    result = ClientResult(upload={"model": {"w": torch.zeros(200_000)}})
    spec = ClientSpec("model-delta", clip=0.5, local_noise=0.8 * 0.5)
    out = privatize(result, {"model": sent}, spec, 0, "4", 3)
    assert float(out.upload[DELTA]["w"].double().std()) == pytest.approx(0.4, rel=0.01)
    other = privatize(result, {"model": sent}, spec, 0, "4", 2)  # each client its own draw
    assert not torch.equal(other.upload[DELTA]["w"], out.upload[DELTA]["w"])


def test_local_noise_is_not_reproducible_from_the_config_seed() -> None:
    """The server holds the config seed: by default a client's noise must not be derivable from it
    (on main it was torch_generator(seed, "dp-local-noise", round, client), so the server could
    subtract it). Research mode keeps the seeded draw, on request."""
    sent = {"w": torch.zeros(1000)}
    result = ClientResult(upload={"model": {"w": torch.zeros(1000)}})
    spec = ClientSpec("model-delta", clip=0.5, local_noise=0.4)
    first = privatize(result, {"model": sent}, spec, 0, "4", 3).upload[DELTA]["w"]
    again = privatize(result, {"model": sent}, spec, 0, "4", 3).upload[DELTA]["w"]
    assert not torch.equal(first, again)
    from fedfew.core.seeding import torch_generator
    from fedfew.privacy.clipping import LOCAL_NOISE_KEY

    regenerated = torch.randn(1000, generator=torch_generator(0, LOCAL_NOISE_KEY, "4", 3), dtype=torch.float64) * 0.4
    assert not torch.allclose(first.double(), regenerated, atol=1e-6)  # what the server could compute
    seeded = ClientSpec("model-delta", clip=0.5, local_noise=0.4, seeded_noise=True)
    research = privatize(result, {"model": sent}, seeded, 0, "4", 3).upload[DELTA]["w"]
    assert torch.allclose(research.double(), regenerated, atol=1e-6)


def test_no_generator_of_the_private_path_derives_from_the_config_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every seeded generator the noise could come from raises: a secure run's server noise, count
    noise, local noise and participants are drawn without them (on main the noise came from them)."""
    import fedfew.privacy.clipping
    import fedfew.privacy.mechanism
    import fedfew.privacy.sampling

    def refuse(*args: object) -> None:
        raise AssertionError(f"a generator derived from the config seed: {args}")

    for module in (fedfew.privacy.mechanism, fedfew.privacy.clipping):
        monkeypatch.setattr(module, "torch_generator", refuse)
    monkeypatch.setattr(fedfew.privacy.sampling, "numpy_generator", refuse)
    agg = aggregation(per_round=2, num_clients=8, adaptive_clip={"count_noise": 2.0})
    server = agg.init_server({"model": {"w": torch.zeros(5)}})
    results = {c: ClientResult(upload={DELTA: {"w": torch.zeros(5)}, WITHIN: torch.tensor(1.0)}) for c in range(2)}
    agg.aggregate(server, results, 0, "0")
    sampler = agg.sampler(seed=0)
    assert sampler is not None and sampler.secret
    sampler.draw(0)
    local = ClientSpec("model-delta", clip=0.5, local_noise=0.4)
    privatize(ClientResult(upload={"model": {"w": torch.ones(5)}}), {"model": {"w": torch.zeros(5)}}, local, 0, "0", 1)


def test_adaptive_clipping_splits_the_budget_and_moves_the_clip() -> None:
    """Andrew et al. 2021: updates get z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) so that both releases
    together are a Gaussian mechanism of multiplier z; the clip moves by exp(-eta (b - gamma))."""
    z, sigma_b = 0.8, 2.0
    agg = aggregation(per_round=4, clip=0.5, noise_multiplier=z,
                      adaptive_clip={"target_quantile": 0.5, "lr": 0.2, "count_noise": sigma_b})
    z_delta = (z ** -2 - (2 * sigma_b) ** -2) ** -0.5
    assert agg.update_noise == pytest.approx(z_delta) and z_delta > z
    assert (agg.update_noise ** -2 + (2 * sigma_b) ** -2) ** -0.5 == pytest.approx(z)  # Theorem 1
    server = agg.init_server({"model": {"w": torch.zeros(300_000)}})
    within = {c: ClientResult(upload={DELTA: {"w": torch.zeros(300_000)}, WITHIN: torch.tensor(1.0)})
              for c in range(4)}
    new, record = agg.aggregate(server, within, 1, "0")
    assert float((new["model"]["w"].double() * 4).std()) == pytest.approx(z_delta * 0.5, rel=0.01)
    share = record["dp_within_clip"]
    assert new["dp"]["clip"] == pytest.approx(0.5 * math.exp(-0.2 * (share - 0.5)))
    # all four within the clip: the noised share is 1 + N(0, sigma_b^2) / 4, so the clip shrinks on average
    small = agg.init_server({"model": {"w": torch.zeros(1)}})
    within = {c: ClientResult(upload={DELTA: {"w": torch.zeros(1)}, WITHIN: torch.tensor(1.0)}) for c in range(4)}
    shares = [agg.aggregate(small, within, 1, str(r))[1]["dp_within_clip"] for r in range(400)]
    assert float(np.mean(shares)) == pytest.approx(1.0, abs=0.1)
    assert float(np.std(shares)) == pytest.approx(sigma_b / 4, rel=0.15)


# -- accounting ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("accountant,z,q,rounds,delta", [("rdp", 1.0, 0.5, 20, 1e-5), ("prv", 1.3, 0.1, 50, 1e-6)])
def test_epsilon_is_the_accountant_s_own_number(accountant: str, z: float, q: float, rounds: int, delta: float) -> None:
    from opacus.accountants import create_accountant

    own = create_accountant(mechanism=accountant)
    for _ in range(rounds):
        own.step(noise_multiplier=z, sample_rate=q)
    expected = own.get_epsilon(delta=delta)
    assert epsilon(accountant, z, q, rounds, delta) == expected
    agg = aggregation(per_round=round(q * 100), num_clients=100, rounds=rounds, noise_multiplier=z, delta=delta,
                      accountant=accountant)
    assert agg.epsilon(rounds) == expected and agg.report(rounds)["epsilon"] == expected


def test_local_dp_is_accounted_as_z_over_two_every_round_worked_by_hand() -> None:
    """local-dp: sensitivity 2C (replacing a client's data), noise zC, every round, no sampling: RDP of
    order a is T a / (2 (z/2)^2); Opacus converts with eps = min_a rdp - (log delta + log a) / (a - 1) +
    log((a - 1) / a) (Balle et al. 2020)."""
    from opacus.accountants import RDPAccountant

    z, rounds, delta = 4.0, 10, 1e-5
    agg = aggregation(per_round=2, num_clients=10, rounds=rounds, mechanism="local-dp", noise_multiplier=z, delta=delta)
    orders = np.array(RDPAccountant.DEFAULT_ALPHAS, dtype=float)
    rdp = rounds * orders / (2 * (z / 2) ** 2)
    by_hand = np.min(rdp - (np.log(delta) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders))
    assert agg.epsilon(rounds) == pytest.approx(float(by_hand), rel=1e-9)
    assert agg.report(rounds)["adjacency"] == "replace one client's data"


def test_a_target_epsilon_solves_to_a_multiplier_just_within_it(caplog: pytest.LogCaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import fedfew.privacy.mechanism

    monkeypatch.setattr(fedfew.privacy.mechanism, "_SAID", set())  # said once per process
    target, rounds = 4.0, 20
    with caplog.at_level("INFO", logger="fedfew.privacy"):
        agg = aggregation(per_round=5, num_clients=10, rounds=rounds, noise_multiplier=None, target_epsilon=target,
                          delta=1e-5)
    assert agg.noise_multiplier is not None
    reached = agg.epsilon(rounds)
    assert target - EPSILON_TOLERANCE <= reached <= target
    assert "solved" in caplog.text and f"{agg.noise_multiplier:.4f}" in caplog.text  # it says so
    assert agg.report(rounds)["target_epsilon"] == target


def test_an_unreachable_target_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="target_epsilon"):
        aggregation(per_round=5, num_clients=10, rounds=10_000, noise_multiplier=None, target_epsilon=1e-9,
                    delta=1e-5, mechanism="local-dp")  # sampling rate 1: the accountant's closed form, quick


# -- runs: every engine the same numbers, resume, reports ------------------------------------------------------
def numbers(out: dict[str, Any]) -> dict[str, Any]:
    return {"history": out["history"], "test": out["test"], "selected": out["selected_round"],
            "privacy": out.get("privacy")}


def simulated(config: dict[str, Any], overrides: list[str] | None = None) -> dict[str, Any]:
    cfg = load_config(config, overrides)
    return numbers(simulate(build_experiment(cfg).simulator(), cfg))


ADAPTIVE = {**SEEDED, "adaptive_clip": {"count_noise": 1.0}}
LOCAL = {"mechanism": "local-dp", "clip": 0.5, "noise_multiplier": 0.8, "delta": 1e-3, "noise": "seeded"}


@pytest.mark.parametrize("name,privacy", [("fl-proto", ADAPTIVE), ("fedavg", SEEDED), ("fedfsl-prox", LOCAL),
                                          ("f2l", ADAPTIVE), ("fml", SEEDED), ("fml", LOCAL)])
def test_workers_equal_one_process_with_privacy_on(name: str, privacy: dict[str, Any]) -> None:
    config = private(name, privacy, federation={"rounds": 2, "clients_per_round": 3, "dropout": 0.34})
    inprocess = simulated(config)
    workers = simulated(config, ["runtime.engine=workers", "runtime.engine_options.workers=2"])
    assert workers == inprocess
    history = inprocess["history"]
    assert all(len(h["clients"]["replied"]) == 2 for h in history)  # one of the three failed each round
    assert all("train_loss" not in h for h in history)  # the clients' metrics stayed with them
    assert inprocess["privacy"]["epsilon"] == history[-1]["dp_epsilon"] > history[0]["dp_epsilon"] > 0
    if "adaptive_clip" in privacy:
        assert history[1]["dp_clip"] != history[0]["dp_clip"] == privacy["clip"]
        assert inprocess["privacy"]["adaptive_clip"]["final_clip"] != privacy["clip"]


def test_privacy_changes_the_numbers_and_batched_clients_keep_them() -> None:
    plain = simulated(tiny_config("fl-proto", federation={"rounds": 2, "clients_per_round": 2}))
    dp = simulated(private("fl-proto", SEEDED))
    assert dp["history"] != plain["history"] and dp["privacy"] is not None and plain["privacy"] is None
    batched = simulated(private("fl-proto", SEEDED), ["runtime.batch_clients=true"])
    assert batched["privacy"] == dp["privacy"]
    for a, b in zip(batched["history"], dp["history"]):  # equal up to floating-point summation order
        assert a["clients"] == b["clients"] and a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=0.05)


def test_resume_equals_uninterrupted_with_privacy_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted in round 2 and resumed: the clip (adaptive, in the server state) and the noise carry
    on as in the run never stopped."""
    from fedfew.algorithms.fl_proto import FLProto

    config = load_config(private("fl-proto", ADAPTIVE, federation={"rounds": 3, "clients_per_round": 2}))
    whole, resumed, rows, whole_rows = cut_and_resumed(config, FLProto, tmp_path, monkeypatch)
    assert rows == whole_rows and len({r["dp_clip"] for r in rows}) == 3
    assert resumed["test"] == whole["test"] and resumed["privacy"] == whole["privacy"]


@pytest.mark.parametrize("name", ["f2l", "fml"])
def test_resume_equals_uninterrupted_with_privacy_on_for_private_models(name: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """F2L (its shared server-model) and FML (its meme) under central DP with an adaptive clip: interrupted
    in round 2 and resumed, the noise, the clip and the private models carry on as in the run never stopped."""
    from fedfew.algorithms.f2l import F2L
    from fedfew.algorithms.fml import FML

    cls: Any = {"f2l": F2L, "fml": FML}[name]
    config = load_config(private(name, ADAPTIVE, federation={"rounds": 3, "clients_per_round": 2}))
    whole, resumed, rows, whole_rows = cut_and_resumed(config, cls, tmp_path, monkeypatch)
    assert rows == whole_rows and len({r["dp_clip"] for r in rows}) == 3
    assert resumed["test"] == whole["test"] and resumed["privacy"] == whole["privacy"]
    covers = whole["privacy"]["covers"]
    assert "server-model" in covers["what"] or "meme" in covers["what"]
    assert covers["models"].startswith("the shared model only")


def test_f2l_sends_only_its_clipped_server_model_and_fml_keeps_counting_rounds() -> None:
    """F2L's private client-model stays in its state and never in the upload; FML's round counter (its
    dynamic weights' clock) moves under the noised average that replaces its aggregation."""
    experiment = build_experiment(load_config(private("f2l", federation={"rounds": 1, "clients_per_round": 2})))
    algorithm, client = experiment.algorithm, experiment.clients[0]
    generator = torch.Generator().manual_seed(0)
    server = initial_server_state(algorithm, generator)
    state = initial_client_state(algorithm, client, generator)
    payload = algorithm.broadcast(server, 0)
    result = algorithm.client_update(payload, state, client, generator)
    assert experiment.privacy is not None
    sent = privatize(result, payload, experiment.privacy.client_spec(experiment.privacy.init_server(server)), 0, "0", 0)
    assert set(sent.upload) == {DELTA} and set(sent.upload[DELTA]) <= set(server["server"])
    assert l2_norm(sent.upload[DELTA]) <= CENTRAL["clip"] and "client" in sent.state
    fml = build_experiment(load_config(private("fml", federation={"rounds": 2, "clients_per_round": 2})))
    assert fml.privacy is not None
    start = fml.privacy.init_server(initial_server_state(fml.algorithm, generator))
    after, _ = fml.privacy.aggregate(start, {}, 0, "0")
    assert (start["round"], after["round"]) == (0, 1)


def test_the_guarantee_is_reported_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dp.yaml"
    # 4 rounds: a secret Poisson sample (2 of 4 expected) leaves every round empty one run in 65 536
    path.write_text(yaml.safe_dump(private("fl-proto", federation={"rounds": 4, "clients_per_round": 2})))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    (folder,) = (tmp_path / "out").iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    p = summary["privacy"]
    assert {"mechanism", "clip", "noise_multiplier", "delta", "epsilon", "accountant", "sampling_rate",
            "rounds", "accounting", "noise", "covers", "participation", "epsilon_no_amplification"} <= set(p)
    assert p["sampling_rate"] == 0.5 and p["rounds"] == 4 and p["mechanism"] == "central-dp"
    assert p["epsilon"] == epsilon("rdp", CENTRAL["noise_multiplier"], 0.5, 4, CENTRAL["delta"])
    assert (p["accounting"], p["noise"]) == ("poisson", "secure")
    budget = f"ε = {p['epsilon']:.2f}, δ = {p['delta']:g}"
    assert budget in capsys.readouterr().out  # the run's final line
    results = (folder / "results.md").read_text()
    assert budget in results and "privacy (ε, δ)" in results and "Privacy: central-dp" in results


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


#: The built-in algorithms whose upload DP does not cover (with their tiny configs' options).
REFUSED = ["frl-scratch", "local", "oneshot", "adfl"]


def refused(name: str) -> str:
    """Why DP refuses a registered algorithm, as its class declares it (Algorithm.dp_refused)."""
    return vars(ALGORITHMS.get(name))["dp_refused"]


@pytest.mark.parametrize("name", ["adfl", "local"])
def test_an_upload_not_covered_is_one_line_and_exit_2(name: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(private(name, federation={"rounds": 1, "clients_per_round": 2})))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert name in err and refused(name) in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize("name", REFUSED)
def test_an_algorithm_whose_upload_is_not_covered_refuses_dp(name: str) -> None:
    config = load_config(private(name, federation={"rounds": 1, "clients_per_round": 2}))
    with pytest.raises(PrivacyConfigError) as info:
        build_experiment(config)
    message = str(info.value)
    assert name in message and refused(name) in message and "\n" not in message


def test_a_plugin_that_does_not_say_what_it_uploads_is_refused_naming_dp_upload() -> None:
    """The reason is the class's own (``dp_refused``); a class that says nothing is told what to set."""
    from fedfew.privacy.coverage import refused_because

    class Quiet(Algorithm):
        pass

    class Loud(Algorithm):
        dp_refused = "it keeps every upload"

    assert "set dp_upload on the class" in refused_because(Quiet)
    assert refused_because(Loud) == "it keeps every upload"
    assert refused_because(type("Child", (Loud,), {})) != "it keeps every upload"  # a subclass says its own


@pytest.mark.parametrize("name,options", [("fedavg", {"score_uploads": True}), ("frl-oneshot", {"stage": "preparation"}),
                                          ("fedfsl-mi-adv", {"reference": "exclusive"}),
                                          ("frl", {"classifier": "linear", "gamma": 1.0})])
def test_options_that_leak_refuse_dp(name: str, options: dict[str, Any]) -> None:
    config = private(name)
    config["algorithm"]["options"].update(options)
    if name == "fedavg":
        config.update(task="classification", partition={"name": "iid", "num_clients": 4},
                      model={"name": "mlp", "options": {"hidden": 16}})
    with pytest.raises(PrivacyConfigError, match=name):
        build_experiment(load_config(config))


def test_a_plugin_algorithm_that_says_nothing_is_refused() -> None:
    from fedfew.algorithms.fedavg import FedAvg
    from fedfew.interface.algorithm import ALGORITHMS

    @register("silent-upload-test")
    class Silent(FedAvg):
        dp_upload = None  # type: ignore[assignment]

    try:
        config = private("fedavg")
        config["algorithm"]["name"] = "silent-upload-test"
        with pytest.raises(PrivacyConfigError, match="does not say what its upload is"):
            build_experiment(load_config(config))
    finally:
        ALGORITHMS._items.pop("silent-upload-test", None)


# -- privacy off: nothing changes ---------------------------------------------------------------------------------
def test_stored_cells_keep_their_keys_and_privacy_makes_a_new_one() -> None:
    records = sorted((REPO / "studies" / "store").glob("*/*.json"))
    assert records, "no stored records to check"
    for path in records[:: max(1, len(records) // 20)]:
        record = json.loads(path.read_text())
        private_cell = record["config"].get("privacy", {}).get("mechanism", "none") != "none"
        if private_cell:  # issue 51 changed what a DP cell's guarantee means: its key moved, to be re-run
            assert config_hash(load_config(record["config"])) != record["config_hash"], path
        else:
            assert config_hash(load_config(record["config"])) == record["config_hash"], path
    config = load_config(json.loads(records[0].read_text())["config"])
    assert config_hash(config.model_copy(update={"privacy": PrivacyConfig()})) == config_hash(config)
    on = config.model_copy(update={"privacy": PrivacyConfig.model_validate(CENTRAL)})
    assert config_hash(on) != config_hash(config)


# -- Flower: the deployment runtime and the Simulation Engine ------------------------------------------------
@pytest.mark.flower
@pytest.mark.parametrize("engine", ["flower", "flower-sim"])
def test_flower_equals_inprocess_with_privacy_on(engine: str, tmp_path: Path) -> None:
    """The clip happens on the SuperNodes (each client's own process), the noise and the adaptive clip
    in the ServerApp: the numbers are the in-process ones."""
    pytest.importorskip("flwr")
    sets = ["--set", f"runtime.engine={engine}"]
    if engine == "flower-sim":
        pytest.importorskip("ray")
        temp = tempfile.mkdtemp(prefix="fr", dir="/tmp")  # short: Ray's socket paths
        sets += ["--set", "flower.sim.init_args.num_cpus=2", "--set", f"flower.sim.init_args._temp_dir={temp}"]
    config = private("fl-proto", ADAPTIVE)
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "fedfew.cli.main", "run", str(path), "--quiet", *sets, "--out",
                           str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    (folder,) = list((tmp_path / "out").iterdir())
    summary = json.loads((folder / "summary.json").read_text())
    inprocess = run_experiment(load_config(config), tmp_path / "inprocess", progress=False)
    assert summary["test"] == inprocess["test"] and summary["privacy"] == inprocess["privacy"]
    rows = [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{k: v for k, v in h.items() if k != "seconds"} for h in inprocess["history"]]
    assert len({r["dp_clip"] for r in rows}) == 2  # the adaptive clip moved


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
    config["privacy"].update(dict(changes))
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
