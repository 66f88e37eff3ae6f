"""The server side of differential privacy (fedfew.privacy.mechanism): the central noise has standard
deviation z C on the sum (z_Delta C with adaptive clipping, Andrew et al.'s Theorem 1); on every
engine the same numbers with DP on (in process = workers = flower and flower-sim, marked ``flower``),
resume equals the run never stopped (research mode, ``privacy.noise: seeded``), and the guarantee is
reported everywhere."""

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

from fedfew.cli.main import main
from fedfew.config.validation import load_config
from fedfew.interface.algorithm import ClientResult
from fedfew.interface.protocol import initial_client_state, initial_server_state
from fedfew.privacy import (
    epsilon,
    l2_norm,
    privatize,
)
from fedfew.privacy.clipping import DELTA, WITHIN
from fedfew.run.experiment import build_experiment
from fedfew.run.runner import run_experiment
from tests.helpers import cut_and_resumed
from tests.privacy.common import ADAPTIVE, CENTRAL, LOCAL, SEEDED, aggregation, private, simulated
from tests.tiny import tiny_config

REPO = Path(__file__).resolve().parents[2]


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
