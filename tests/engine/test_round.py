"""One round (fedfew.engine.round): client updates do not depend on the order the clients run in."""

from __future__ import annotations

import torch

from fedfew.algorithms.fedavg import FedAvg, FedAvgOptions
from fedfew.engine.round import simulate_round
from fedfew.interface.protocol import initial_server_state
from tests.helpers import classification_setup


def test_client_updates_do_not_depend_on_order() -> None:
    data, ctx, clients = classification_setup(3)
    algorithm = FedAvg(FedAvgOptions(batch_size=8), ctx)
    server = initial_server_state(algorithm, torch.Generator().manual_seed(0))
    forward = simulate_round(algorithm, server, clients, {}, [0, 1, 2], seed=0, round_key=0)
    backward = simulate_round(algorithm, server, clients, {}, [2, 1, 0], seed=0, round_key=0)
    for name in forward.server["model"]:
        assert torch.allclose(forward.server["model"][name], backward.server["model"][name], atol=1e-6)
