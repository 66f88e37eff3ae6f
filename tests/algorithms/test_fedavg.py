"""FedAvg and FedProx (fedfew.algorithms.fedavg): one client and one step is centralised SGD, FedProx at
mu = 0 is FedAvg, and the bytes sent are 2 x parameters x clients x rounds x 4."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedfew.algorithms.fedavg import FedAvg, FedAvgOptions, FedProx, FedProxOptions
from fedfew.engine.round import simulate_round
from fedfew.engine.simulator import Simulator
from fedfew.interface.protocol import initial_server_state
from fedfew.interface.state import get_state, load_state_, payload_bytes
from fedfew.models import count_parameters
from tests.helpers import classification_setup


def test_fedavg_one_client_one_step_equals_centralised_sgd() -> None:
    data, ctx, clients = classification_setup(1)
    options = FedAvgOptions(local_epochs=1, batch_size=len(data), lr=0.1)
    algorithm = FedAvg(options, ctx)
    server = initial_server_state(algorithm, torch.Generator().manual_seed(0))
    outcome = simulate_round(algorithm, server, clients, {}, [0], seed=0, round_key=0)

    central = ctx.make_model(data.num_classes)
    load_state_(central, server["model"])
    optimiser = torch.optim.SGD(central.parameters(), lr=0.1)
    F.cross_entropy(central(data.inputs), data.labels).backward()
    optimiser.step()
    for name, value in get_state(central).items():
        assert torch.allclose(outcome.server["model"][name], value, atol=1e-6), name


def test_fedprox_with_mu_zero_equals_fedavg() -> None:
    data, ctx, clients = classification_setup(3)
    results = []
    for cls, opts in ((FedAvg, FedAvgOptions(batch_size=8, lr=0.05)), (FedProx, FedProxOptions(batch_size=8, lr=0.05, mu=0.0))):
        sim = Simulator(cls(opts, ctx), clients, seed=5)
        sim.run(rounds=3, clients_per_round=3)
        results.append(sim.server["model"])
    for name in results[0]:
        assert torch.equal(results[0][name], results[1][name]), name
    # and a positive mu really changes the result
    sim = Simulator(FedProx(FedProxOptions(batch_size=8, lr=0.05, mu=1.0), ctx), clients, seed=5)
    sim.run(rounds=3, clients_per_round=3)
    assert any(not torch.equal(sim.server["model"][n], results[0][n]) for n in results[0])


def test_fedavg_bytes_are_two_x_params_x_clients_x_rounds_x_4() -> None:
    data, ctx, clients = classification_setup(4)
    algorithm = FedAvg(FedAvgOptions(batch_size=8), ctx)
    sim = Simulator(algorithm, clients, seed=0)
    sim.run(rounds=3, clients_per_round=4)
    params = count_parameters(algorithm.model)
    assert sim.comm.total == 2 * params * 4 * 3 * 4
    assert payload_bytes({"a": torch.zeros(3, dtype=torch.float64), "b": [torch.zeros(2)], "c": 7}) == 3 * 8 + 2 * 4
