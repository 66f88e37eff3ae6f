"""Who takes part in a private round (fedfew.privacy.sampling): the secret Poisson sample includes each
client with probability q, is not the seed's and is not written down, and no generator of the private
path derives from the config seed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fedfew.config.validation import load_config
from fedfew.engine.schedule import client_schedule
from fedfew.interface.algorithm import ClientResult
from fedfew.privacy import (
    ClientSpec,
    privatize,
)
from fedfew.privacy.clipping import DELTA, WITHIN
from fedfew.privacy.sampling import ParticipantSampler
from fedfew.run.experiment import build_experiment
from tests.privacy.common import CENTRAL, aggregation, private, simulated


def test_no_generator_of_the_private_path_derives_from_the_config_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every seeded generator the noise could come from raises: a secure run's server noise, count
    noise, local noise and participants are drawn without them (they once were its source)."""
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
    """Were a DP run's clients client_schedule(seed), or listed in metrics.jsonl, anyone with the seed or
    the results would know who took part, and the Poisson amplification would not hold."""
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
