"""What a private run's epsilon assumes about participation (``privacy.accounting``, issue 51) and who
takes part (fedfew.privacy.sampling):

* each accounting against Google's dp-accounting's own numbers, two settings each, to 1% (poisson is
  Opacus's accountant, the other two dp-accounting's RDP), and against Flower's ``RdpAccountant``
  (``flwr.serverapp``, which wraps dp-accounting) where both support the setting;
* the secret Poisson sample: its inclusion rate is q, it is not the seed's, and a DP run's history
  holds counts of clients, not which;
* the defaults: poisson under DP, none in research mode and under local-dp, each saying why.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from fedfew.config.validation import PrivacyConfig, load_config
from fedfew.engine.schedule import client_schedule
from fedfew.privacy import PrivateAggregation
from fedfew.privacy.accounting import accounted_epsilon, solve_for
from fedfew.privacy.sampling import ParticipantSampler
from fedfew.run.experiment import build_experiment
from tests.test_privacy import CENTRAL, Averaged, private, simulated

DELTA = 1e-5


def dp_accounting_epsilon(event: Any, count: int, replace_one: bool) -> float:
    from dp_accounting import privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    relation = privacy_accountant.NeighboringRelation
    own = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=relation.REPLACE_ONE if replace_one else relation.ADD_OR_REMOVE_ONE)
    own.compose(event, count)
    return float(own.get_epsilon(DELTA))


def aggregation(accounting: str | None, per_round: int, num_clients: int, rounds: int, z: float,
                **privacy: Any) -> PrivateAggregation:
    config = PrivacyConfig.model_validate({**CENTRAL, "noise_multiplier": z, "delta": DELTA, "accounting": accounting,
                                           **privacy})
    return PrivateAggregation(config, Averaged(None, None), num_clients, per_round, rounds)  # type: ignore[arg-type]


# -- each accounting against dp-accounting --------------------------------------------------------------------
@pytest.mark.parametrize("z,m,n,rounds", [(1.1, 10, 100, 50), (0.9, 64, 1000, 200)])
def test_poisson_accounting_is_dp_accounting_s_poisson_sampled_gaussian(z: float, m: int, n: int, rounds: int) -> None:
    from dp_accounting import dp_event

    expected = dp_accounting_epsilon(dp_event.PoissonSampledDpEvent(m / n, dp_event.GaussianDpEvent(z)), rounds, False)
    agg = aggregation(None, m, n, rounds, z)
    assert agg.accounting == "poisson"  # the default under DP
    assert agg.epsilon(rounds) == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("z,m,n,rounds", [(1.1, 10, 100, 50), (2.0, 10, 64, 100)])
def test_without_replacement_is_dp_accounting_s_bound_at_replace_one_with_z_over_two(z: float, m: int, n: int,
                                                                                    rounds: int) -> None:
    """A fixed m without replacement: replacing one client's data moves the sum by up to 2C, so the
    replace-one bound is given z / 2; on main the Poisson bound at q = m / N was reported instead,
    several times smaller."""
    from dp_accounting import dp_event

    event = dp_event.SampledWithoutReplacementDpEvent(n, m, dp_event.GaussianDpEvent(z / 2))
    expected = dp_accounting_epsilon(event, rounds, True)
    agg = aggregation("without_replacement", m, n, rounds, z)
    assert agg.epsilon(rounds) == pytest.approx(expected, rel=0.01)
    assert agg.report(rounds)["adjacency"] == "replace one client's data"
    assert agg.epsilon(rounds) > 1.5 * aggregation("poisson", m, n, rounds, z).epsilon(rounds)


@pytest.mark.parametrize("z,most", [(1.1, 50), (3.0, 17)])
def test_no_amplification_composes_the_most_rounds_a_client_took_part_in(z: float, most: int) -> None:
    from dp_accounting import dp_event

    expected = dp_accounting_epsilon(dp_event.GaussianDpEvent(z), most, False)
    agg = aggregation("none", 10, 100, 60, z)
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
    agg = aggregation(accounting, m, n, rounds, z)
    assert agg.epsilon(rounds) == pytest.approx(theirs.get_epsilon(DELTA), rel=0.01)


# -- the secret sample -------------------------------------------------------------------------------------------
def test_the_secret_poisson_sample_includes_each_client_with_probability_q() -> None:
    sampler = ParticipantSampler(50, 10, poisson=True)
    draws = [sampler.draw(r) for r in range(2000)]
    inclusion = np.zeros(50)
    for d in draws:
        inclusion[d] += 1
    rate = inclusion / len(draws)
    # each client's rate is a binomial mean: 2000 draws at q = 0.2 have sd 0.009; 5 sd over 50 clients
    assert np.all(np.abs(rate - 0.2) < 0.045) and abs(rate.mean() - 0.2) < 0.005
    sizes = [len(d) for d in draws]
    assert len(set(sizes)) > 3 and np.var(sizes) == pytest.approx(50 * 0.2 * 0.8, rel=0.15)  # Binomial(N, q)


def test_under_dp_the_participants_are_not_the_seed_s_and_are_not_written(tmp_path: Any) -> None:
    """On main a DP run's clients were client_schedule(seed) and metrics.jsonl listed them: anyone with
    the seed or the results knew who took part, and the Poisson amplification did not hold."""
    config = private("fl-proto", federation={"rounds": 3, "clients_per_round": 3})  # an empty run: 1 in 10^7
    cfg = load_config(config)
    experiment = build_experiment(cfg)
    assert experiment.privacy is not None
    sampler = experiment.privacy.sampler(cfg.seed)
    assert sampler is not None and sampler.secret and sampler.poisson
    out = simulated(config)
    for record in out["history"]:
        assert all(isinstance(v, int) for v in record["clients"].values()), record["clients"]  # counts only
    seeded = simulated(private("fl-proto", {**CENTRAL, "noise": "seeded"}, federation={"rounds": 3,
                                                                                        "clients_per_round": 2}))
    schedule = client_schedule(4, 2, 3, cfg.seed)
    assert [h["clients"]["asked"] for h in seeded["history"]] == schedule  # research mode: the seed's, as before
    assert "the server is trusted to keep the sample secret" in out["privacy"]["participation"]


def test_the_defaults_say_what_they_assume() -> None:
    secure = aggregation(None, 2, 8, 10, 1.0)
    seeded = aggregation(None, 2, 8, 10, 1.0, noise="seeded")
    local = aggregation(None, 2, 8, 10, 1.0, mechanism="local-dp")
    assert (secure.accounting, seeded.accounting, local.accounting) == ("poisson", "none", "none")
    assert "seed" in seeded.participation_note() and "local-dp" in local.participation_note()
    assert seeded.sampler(0) is None  # the simulator's seeded schedule
    poisson = aggregation("poisson", 2, 8, 10, 1.0, noise="seeded").sampler(0)
    assert poisson is not None and not poisson.secret and poisson.draw(4) == poisson.draw(4)
    assert seeded.report(10)["covers"]["noise"] == "seeded"
    assert "reproducible noise" in seeded.report(10)["covers"]["short"]
    assert secure.epsilon(10) < secure.epsilon_no_amplification(10)


def test_an_epsilon_too_large_to_mean_anything_is_said(caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import fedfew.privacy.mechanism

    monkeypatch.setattr(fedfew.privacy.mechanism, "_SAID", set())
    with caplog.at_level("WARNING", logger="fedfew.privacy"):
        agg = aggregation(None, 2, 8, 100, 0.05)
    assert agg.epsilon(100) > 50 and "protects nothing" in caplog.text
    assert "protects nothing" in agg.report(100)["warning"]


def test_sampling_rate_one_has_no_sample() -> None:
    agg = aggregation(None, 8, 8, 10, 1.0)
    assert agg.sampler(0) is None and not agg.sample_secret
    assert agg.epsilon(10) == pytest.approx(agg.epsilon_no_amplification(10), rel=1e-6)
    assert math.isfinite(agg.epsilon(10))
