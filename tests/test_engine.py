"""The engine's mathematics: aggregation, FedAvg/FedProx equivalences, byte accounting, MAML's
inner step, and reproducibility."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedfew.algorithms.fedavg import FedAvg, FedAvgOptions, FedProx, FedProxOptions
from fedfew.algorithms.fl_maml import FLMAML
from fedfew.algorithms.fl_proto import FLProto
from fedfew.algorithms.parts.episodic import EpisodicOptions, MAMLOptions
from fedfew.engine.round import simulate_round
from fedfew.engine.schedule import client_schedule
from fedfew.engine.simulator import Simulator
from fedfew.fewshot.episodes import Episode, fixed_episodes
from fedfew.fewshot.learners import MAML
from fedfew.interface.aggregation import normalise, weighted_average, weights_for
from fedfew.interface.algorithm import ClientResult, EvalData
from fedfew.interface.protocol import initial_server_state
from fedfew.interface.state import get_state, load_state_, payload_bytes
from fedfew.models import FewShotModel, count_parameters
from tests.helpers import blob_dataset, clients_from, context_for


def test_weights_sum_to_one_and_reject_nonsense() -> None:
    for kind in ("samples", "episodes", "uniform"):
        w = weights_for(kind, [10, 30, 60], [1, 2, 5])
        assert float(w.sum()) == pytest.approx(1.0, abs=1e-12)
    assert weights_for("samples", [10, 30, 60], [0, 0, 0]).tolist() == pytest.approx([0.1, 0.3, 0.6])
    assert weights_for("episodes", [1, 1], [1, 3]).tolist() == pytest.approx([0.25, 0.75])
    with pytest.raises(ValueError):
        normalise([-1.0, 2.0])
    with pytest.raises(ValueError):
        normalise([0.0, 0.0])


def test_weighted_average_of_states() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    avg = weighted_average([a, b], [1, 3])
    assert torch.allclose(avg["w"], torch.tensor([2.5, 5.0]))
    assert int(avg["n"]) == 3  # integer buffers come from the first state


def classification_setup(clients: int = 1):
    data = blob_dataset(classes=4, per_class=10)
    ctx = context_for(data, model="mlp", task="classification")
    parts = list(torch.arange(len(data)).chunk(clients))
    return data, ctx, clients_from(data, parts)


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


def test_maml_inner_step_matches_hand_computed_update() -> None:
    # A linear model on 2-d inputs: logits = x W^T + b.
    head = nn.Linear(2, 2)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.5, -0.2], [0.1, 0.3]]))
        head.bias.copy_(torch.tensor([0.0, 0.1]))
    model = FewShotModel(nn.Identity(), 2, head)
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5]])
    y = torch.tensor([0, 1])
    episode = Episode(x, y, x, y, torch.tensor([0, 1]), torch.arange(2), torch.arange(2))
    alpha = 0.1
    learner = MAML(inner_lr=alpha, inner_steps=1)
    params = dict(model.named_parameters())
    adapted = learner.adapt(model, params, episode, steps=1, create_graph=False)
    # Hand computation: dL/dz = (softmax(z) - onehot(y)) / n; dW = dz^T x; db = sum dz.
    z = x @ head.weight.detach().T + head.bias.detach()
    dz = (torch.softmax(z, 1) - F.one_hot(y, 2).float()) / 2
    expected_w = head.weight.detach() - alpha * dz.T @ x
    expected_b = head.bias.detach() - alpha * dz.sum(0)
    assert torch.allclose(adapted["head.weight"], expected_w, atol=1e-6)
    assert torch.allclose(adapted["head.bias"], expected_b, atol=1e-6)


def test_second_order_maml_differs_from_first_order() -> None:
    data = blob_dataset()
    ctx = context_for(data)
    episode = fixed_episodes(data, data.splits["base"], 3, 1, 5, num=1, seed=0)[0]
    grads = []
    for first_order in (False, True):
        torch.manual_seed(0)
        model = ctx.make_model(3)
        loss, _ = MAML(inner_lr=0.5, inner_steps=2, first_order=first_order).loss(model, episode)
        grads.append(torch.autograd.grad(loss, list(model.parameters())))
    assert any(not torch.allclose(a, b) for a, b in zip(*grads))


def fewshot_run(algorithm_cls, options, seed: int = 3):
    data = blob_dataset(classes=6, per_class=20)
    ctx = context_for(data)
    pool = data.split("base")
    parts = list(torch.randperm(len(pool), generator=torch.Generator().manual_seed(0)).chunk(3))
    clients = clients_from(pool, parts)
    test = EvalData("test", episodes=fixed_episodes(data, data.splits["novel"], 3, 1, 5, num=20, seed=seed))
    sim = Simulator(algorithm_cls(options, ctx), clients, seed=seed, test=test)
    return sim.run(rounds=3, clients_per_round=2, eval_every=1)


@pytest.mark.parametrize("cls, options", [(FLMAML, MAMLOptions(local_steps=2, inner_lr=0.1)),
                                          (FLProto, EpisodicOptions(local_steps=2))])
def test_same_seed_same_metrics(cls, options) -> None:
    a, b = fewshot_run(cls, options), fewshot_run(cls, options)
    strip = lambda history: [{k: v for k, v in h.items() if k != "seconds"} for h in history]  # noqa: E731
    assert strip(a["history"]) == strip(b["history"])
    assert a["test"] == b["test"]
    assert 0.0 <= a["test"]["accuracy"] <= 1.0 and a["test"]["ci95"] >= 0


def test_client_schedule_is_drawn_once_and_reproducible() -> None:
    a = client_schedule(10, 0.3, 5, seed=1)
    assert a == client_schedule(10, 3, 5, seed=1)
    assert all(len(r) == 3 and len(set(r)) == 3 for r in a)
    assert a != client_schedule(10, 3, 5, seed=2)
    with pytest.raises(ValueError):
        client_schedule(10, 11, 1, seed=0)


def test_client_updates_do_not_depend_on_order() -> None:
    data, ctx, clients = classification_setup(3)
    algorithm = FedAvg(FedAvgOptions(batch_size=8), ctx)
    server = initial_server_state(algorithm, torch.Generator().manual_seed(0))
    forward = simulate_round(algorithm, server, clients, {}, [0, 1, 2], seed=0, round_key=0)
    backward = simulate_round(algorithm, server, clients, {}, [2, 1, 0], seed=0, round_key=0)
    for name in forward.server["model"]:
        assert torch.allclose(forward.server["model"][name], backward.server["model"][name], atol=1e-6)


def test_validation_selects_the_round_never_test() -> None:
    data = blob_dataset(classes=9, per_class=20)
    data.splits = {"base": [0, 1, 2], "val": [3, 4, 5], "novel": [6, 7, 8]}
    ctx = context_for(data)
    pool = data.split("base")
    clients = clients_from(pool, list(torch.arange(len(pool)).chunk(2)))
    val = EvalData("val", episodes=fixed_episodes(data, [3, 4, 5], 3, 1, 5, num=10, seed=0, tag="val"))
    test = EvalData("test", episodes=fixed_episodes(data, [6, 7, 8], 3, 1, 5, num=10, seed=0, tag="test"))
    sim = Simulator(FLProto(EpisodicOptions(local_steps=1), ctx), clients, seed=0, val=val, test=test)
    out = sim.run(rounds=4, clients_per_round=2, eval_every=1)
    # Round 0 (the initial model) is a candidate too: the first best wins ties.
    val_curve = [out["initial"]["accuracy"]] + [h["val_accuracy"] for h in out["history"]]
    assert out["selected_round"] == val_curve.index(max(val_curve))
    assert all("test_accuracy" not in h for h in out["history"])


def test_client_result_defaults_are_independent() -> None:
    a, b = ClientResult(upload={}), ClientResult(upload={})
    a.metrics["x"] = 1.0
    assert b.metrics == {}
