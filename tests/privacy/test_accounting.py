"""Privacy accounting (fedfew.privacy.accounting): epsilon is the accountant's own number (and, at
sampling rate 1, the RDP-to-(epsilon, delta) conversion worked by hand); a target epsilon solves to a
multiplier just within it; each ``privacy.accounting`` against Google's dp-accounting's own numbers
and Flower's ``RdpAccountant``; and the defaults say what they assume."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from fedfew.config.validation import PrivacyConfig
from fedfew.core.errors import UsageError
from fedfew.privacy import (
    PrivateAggregation,
    epsilon,
)
from fedfew.privacy.accounting import EPSILON_TOLERANCE, accounted_epsilon, solve_for
from tests.privacy.common import CENTRAL, Averaged, aggregation

DELTA = 1e-5


def dp_accounting_epsilon(event: Any, count: int, replace_one: bool) -> float:
    from dp_accounting import privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    relation = privacy_accountant.NeighboringRelation
    own = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=relation.REPLACE_ONE if replace_one else relation.ADD_OR_REMOVE_ONE)
    own.compose(event, count)
    return float(own.get_epsilon(DELTA))


def accounted_aggregation(accounting: str | None, per_round: int, num_clients: int, rounds: int, z: float,
                **privacy: Any) -> PrivateAggregation:
    config = PrivacyConfig.model_validate({**CENTRAL, "noise_multiplier": z, "delta": DELTA, "accounting": accounting,
                                           **privacy})
    return PrivateAggregation(config, Averaged(None, None), num_clients, per_round, rounds)  # type: ignore[arg-type]


# -- each accounting against dp-accounting --------------------------------------------------------------------
@pytest.mark.parametrize("z,m,n,rounds", [(1.1, 10, 100, 50), (0.9, 64, 1000, 200)])
def test_poisson_accounting_is_dp_accounting_s_poisson_sampled_gaussian(z: float, m: int, n: int, rounds: int) -> None:
    from dp_accounting import dp_event

    expected = dp_accounting_epsilon(dp_event.PoissonSampledDpEvent(m / n, dp_event.GaussianDpEvent(z)), rounds, False)
    agg = accounted_aggregation(None, m, n, rounds, z)
    assert agg.accounting == "poisson"  # the default under DP
    assert agg.epsilon(rounds) == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("z,m,n,rounds", [(1.1, 10, 100, 50), (2.0, 10, 64, 100)])
def test_without_replacement_is_dp_accounting_s_bound_at_replace_one_with_z_over_two(z: float, m: int, n: int,
                                                                                    rounds: int) -> None:
    """A fixed m without replacement: replacing one client's data moves the sum by up to 2C, so the
    replace-one bound is given z / 2, not the Poisson bound at q = m / N (several times smaller)."""
    from dp_accounting import dp_event

    event = dp_event.SampledWithoutReplacementDpEvent(n, m, dp_event.GaussianDpEvent(z / 2))
    expected = dp_accounting_epsilon(event, rounds, True)
    agg = accounted_aggregation("without_replacement", m, n, rounds, z)
    assert agg.epsilon(rounds) == pytest.approx(expected, rel=0.01)
    assert agg.report(rounds)["adjacency"] == "replace one client's data"
    assert agg.epsilon(rounds) > 1.5 * accounted_aggregation("poisson", m, n, rounds, z).epsilon(rounds)


@pytest.mark.parametrize("z,most", [(1.1, 50), (3.0, 17)])
def test_no_amplification_composes_the_most_rounds_a_client_took_part_in(z: float, most: int) -> None:
    from dp_accounting import dp_event

    expected = dp_accounting_epsilon(dp_event.GaussianDpEvent(z), most, False)
    agg = accounted_aggregation("none", 10, 100, 60, z)
    server = agg.init_server({"model": {}})
    for r in range(60):  # client 3 in the first ``most`` rounds, the others fewer
        server = agg.count_participation(server, [3, 4] if r < most else [5] if r % 4 == 0 else [])
    assert agg.most_participated(server, 60) == most
    assert agg.epsilon(60, server) == pytest.approx(expected, rel=0.01)
    report = agg.report(60, server)
    assert report["most_rounds_of_a_client"] == most and report["epsilon_no_amplification"] == report["epsilon"]


def test_a_target_epsilon_is_solved_under_each_accounting() -> None:
    for accounting in ("poisson", "without_replacement", "none"):
        z = solve_for(accounting, "rdp", 4.0, 100, 10, 50, DELTA)
        reached = accounted_epsilon(accounting, "rdp", z, 100, 10, 50, DELTA)
        assert 4.0 - 0.011 <= reached <= 4.0, accounting


# -- against Flower's accountant ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method,accounting", [("POISSON", "poisson"), ("WITHOUT_REPLACEMENT", "without_replacement"),
                                               ("NO_AMPLIFICATION", "none")])
def test_each_accounting_matches_flower_s_rdp_accountant(method: str, accounting: str) -> None:
    pytest.importorskip("dp_accounting")
    flwr = pytest.importorskip("flwr.serverapp")
    from flwr.supercore.privacy_accounting import GaussianPrivacyEvent, NeighboringRelation
    from flwr.supercore.privacy_accounting import PrivacyConfig as FlowerPrivacy
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    z, m, n, rounds = 1.1, 10, 100, 50
    replace_one = accounting == "without_replacement"
    relation = NeighboringRelation.REPLACE_ONE if replace_one else NeighboringRelation.ADD_OR_REMOVE_ONE
    theirs = RdpAccountant(FlowerPrivacy(target_delta=DELTA, population_size=n, neighboring_relation=relation,
                                         sampling_method=getattr(flwr.SamplingMethod, method)))
    # Flower's event carries the multiplier of its own adjacency: z / 2 at replace-one (sensitivity 2C).
    theirs.compose(GaussianPrivacyEvent(noise_multiplier=z / 2 if replace_one else z, sample_size=m,
                                        population_size=n), rounds)
    agg = accounted_aggregation(accounting, m, n, rounds, z)
    assert agg.epsilon(rounds) == pytest.approx(theirs.get_epsilon(DELTA), rel=0.01)


def test_the_defaults_say_what_they_assume() -> None:
    secure = accounted_aggregation(None, 2, 8, 10, 1.0)
    seeded = accounted_aggregation(None, 2, 8, 10, 1.0, noise="seeded")
    local = accounted_aggregation(None, 2, 8, 10, 1.0, mechanism="local-dp")
    assert (secure.accounting, seeded.accounting, local.accounting) == ("poisson", "none", "none")
    assert "seed" in seeded.participation_note() and "local-dp" in local.participation_note()
    assert seeded.sampler(0) is None  # the simulator's seeded schedule
    poisson = accounted_aggregation("poisson", 2, 8, 10, 1.0, noise="seeded").sampler(0)
    assert poisson is not None and not poisson.secret and poisson.draw(4) == poisson.draw(4)
    assert seeded.report(10)["covers"]["noise"] == "seeded"
    assert "reproducible noise" in seeded.report(10)["covers"]["short"]
    assert secure.epsilon(10) < secure.epsilon_no_amplification(10)


def test_an_epsilon_too_large_to_mean_anything_is_said(caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import fedfew.privacy.mechanism

    monkeypatch.setattr(fedfew.privacy.mechanism, "_SAID", set())
    with caplog.at_level("WARNING", logger="fedfew.privacy"):
        agg = accounted_aggregation(None, 2, 8, 100, 0.05)
    assert agg.epsilon(100) > 50 and "protects nothing" in caplog.text
    assert "protects nothing" in agg.report(100)["warning"]


def test_sampling_rate_one_has_no_sample() -> None:
    agg = accounted_aggregation(None, 8, 8, 10, 1.0)
    assert agg.sampler(0) is None and not agg.sample_secret
    assert agg.epsilon(10) == pytest.approx(agg.epsilon_no_amplification(10), rel=1e-6)
    assert math.isfinite(agg.epsilon(10))


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
