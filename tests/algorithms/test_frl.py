"""FRL (Park et al. 2021): prototypes, GPAL, the first-order meta-update, R + 1 rounds of bytes per
episode, the deployment protocol and its classifier, and the baselines' pieces.

Under client-level DP (our extension, docs/privacy.md): the global prototypes are a noised sum over
every class with a fixed divisor, every release of an episode is accounted, workers give the
in-process numbers, resume equals the run never stopped, and what FRL does not implement is refused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedfew.algorithms.frl import (
    FRL,
    FRLOptions,
    PrototypeFL,
    aggregate_prototypes,
    class_means,
    distance_loss,
    gpal_objective,
    local_prototypes,
    merged_head,
    prototype_loss,
    split_support_query,
    task_label_rows,
    with_prepared_head,
)
from fedfew.algorithms.frl_baselines import FRLOneShot, OneShotFineTuneOptions, OneShotFL, OneShotTrainOptions
from fedfew.algorithms.parts.frl_deployment import (
    DeploymentOptions,
    draw_groups,
    evaluate_deployment,
    held_out_positions,
    participant_positions,
    with_fresh_head,
)
from fedfew.algorithms.per_fedavg import (
    FRLPerFedAvg,
    FRLPerFedAvgDistance,
    PerFedAvgOptions,
    first_outputs_loss,
    per_fedavg_step,
    prototype_batch_loss,
    task_targets,
)
from fedfew.config.validation import ConfigError, PrivacyConfig, load_config
from fedfew.data import LabelledDataset
from fedfew.engine.base import InProcessEngine
from fedfew.engine.simulator import Simulator
from fedfew.fewshot.episodes import fixed_episodes
from fedfew.interface.algorithm import ClientData, ClientResult, Context, EpisodeShape, EvalData
from fedfew.interface.protocol import initial_server_state
from fedfew.interface.state import payload_bytes
from fedfew.models import FewShotModel
from fedfew.privacy.accounting import epsilon
from fedfew.privacy.clipping import PROTOTYPES
from fedfew.run.experiment import build_experiment
from tests.helpers import blob_dataset, context_for, cut_and_resumed
from tests.privacy.common import CENTRAL, LOCAL, SEEDED, private, simulated


def tiny_context(data: LabelledDataset, hidden: int = 6) -> Context:
    return context_for(data, model="mlp", hidden=hidden)


def frl_options(**changes) -> FRLOptions:
    return FRLOptions(**{"lr": 0.1, "meta_lr": 0.05, "gamma": 0.5, "batch_size": 8, **changes})


# -- prototypes and losses -----------------------------------------------------------------------
def test_prototype_loss_matches_hand_computation() -> None:
    features = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 1.0]])
    prototypes = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    targets = torch.tensor([0, 1, 0])
    # squared distances [0, 4], [4, 0], [1, 5]: each row's loss is log(1 + e^-4)
    expected = math.log(1 + math.exp(-4))
    assert float(prototype_loss(features, targets, prototypes)) == pytest.approx(expected, rel=1e-5)
    shifted = prototype_loss(features, torch.tensor([1, 1, 0]), prototypes)  # first sample now wrong
    assert float(shifted) == pytest.approx((math.log(1 + math.exp(4)) + 2 * expected) / 3, rel=1e-5)


def test_local_prototypes_are_class_means_of_embeddings() -> None:
    data = blob_dataset(classes=4, per_class=5)
    part = data.subset(torch.tensor([0, 1, 2, 10, 11, 12, 13]))  # classes 0 and 2
    model = tiny_context(data).make_model(None)
    found = local_prototypes(model, part)
    with torch.no_grad():
        features = model.features(part.inputs)
    assert found["classes"].tolist() == [0, 2]
    assert found["counts"].tolist() == [3.0, 4.0]
    assert torch.allclose(found["prototypes"][0], features[:3].mean(0), atol=1e-6)
    assert torch.allclose(found["prototypes"][1], features[3:].mean(0), atol=1e-6)
    with pytest.raises(ValueError, match="no sample"):
        class_means(features, torch.tensor([0] * 7), 2)


def test_global_prototypes_are_support_size_weighted_means() -> None:
    a = {"classes": torch.tensor([0, 1]), "prototypes": torch.tensor([[1.0, 0.0], [0.0, 2.0]]), "counts": torch.tensor([3.0, 1.0])}
    b = {"classes": torch.tensor([1, 4]), "prototypes": torch.tensor([[0.0, 6.0], [5.0, 5.0]]), "counts": torch.tensor([3.0, 2.0])}
    merged = aggregate_prototypes([a, b])
    assert merged["classes"].tolist() == [0, 1, 4]
    # class 1: (1 * [0, 2] + 3 * [0, 6]) / 4 = [0, 5]
    assert torch.allclose(merged["prototypes"], torch.tensor([[1.0, 0.0], [0.0, 5.0], [5.0, 5.0]]))
    uniform = aggregate_prototypes([a, b], torch.ones(2))
    assert torch.allclose(uniform["prototypes"][1], torch.tensor([0.0, 4.0]))

    # The same through PrototypeFL.aggregate, where the counts come with the clients' uploads.
    data = blob_dataset(classes=4, per_class=5)
    inner = PrototypeFL(frl_options(), tiny_context(data))
    state = {k: v.clone() for k, v in inner.model.state_dict().items()}
    results = {0: ClientResult({"model": state, "prototypes": a}, num_samples=4),
               1: ClientResult({"model": state, "prototypes": b}, num_samples=5)}
    server = inner.aggregate({}, results, torch.Generator())
    assert torch.allclose(server["prototypes"]["prototypes"], merged["prototypes"])


def test_global_prototypes_are_the_class_means_when_models_agree() -> None:
    """With a zero learning rate every client keeps theta, so G must be the mean feature of each class
    over all clients' support samples."""
    data = blob_dataset(classes=4, per_class=6)
    inner = PrototypeFL(frl_options(lr=1e-30), tiny_context(data))
    parts = [torch.tensor([0, 1, 2, 6, 7]), torch.tensor([3, 4, 5, 8, 9, 10, 11])]  # classes 0,1 / 0,1
    clients = [ClientData(i, data.subset(p)) for i, p in enumerate(parts)]
    server = inner.start({k: v.clone() for k, v in inner.model.state_dict().items()}, 4, torch.Generator())
    from fedfew.engine.round import simulate_round

    outcome = simulate_round(inner, server, clients, {}, [0, 1], seed=0, round_key=0)
    with torch.no_grad():
        features = inner.model.features(data.inputs[:12])
    assert torch.allclose(outcome.server["prototypes"]["prototypes"][0], features[:6].mean(0), atol=1e-5)
    assert torch.allclose(outcome.server["prototypes"]["prototypes"][1], features[6:12].mean(0), atol=1e-5)


def test_round_zero_has_no_gpal_term_and_later_rounds_do() -> None:
    data = blob_dataset(classes=4, per_class=6)
    client = ClientData(0, data.subset(torch.arange(12)))
    state = get_fresh_state(data)
    uploads = {}
    for gamma in (1.0, 0.3):  # round 0: f = L_local whatever gamma (eq. 3's "for r = 0")
        inner = PrototypeFL(frl_options(gamma=gamma), tiny_context(data))
        result = inner.client_update({"model": state}, None, client, torch.Generator().manual_seed(1))
        assert "gpal_loss" not in result.metrics
        uploads[gamma] = result.upload["model"]
    assert all(torch.equal(uploads[1.0][k], uploads[0.3][k]) for k in uploads[1.0])

    # From round 1 on eq. 3: f = gamma L_local + (1 - gamma) L_aux (gamma = 1: no GPAL).
    global_prototypes = {"classes": torch.tensor([0, 1]), "prototypes": torch.randn(2, 6, generator=torch.Generator().manual_seed(3))}
    with_gpal = {}
    for gamma in (1.0, 0.3):
        inner = PrototypeFL(frl_options(gamma=gamma), tiny_context(data))
        result = inner.client_update({"model": state, "prototypes": global_prototypes}, None, client,
                                     torch.Generator().manual_seed(1))
        with_gpal[gamma] = result
    assert "gpal_loss" in with_gpal[0.3].metrics and "gpal_loss" not in with_gpal[1.0].metrics
    assert with_gpal[0.3].metrics["loss"] == pytest.approx(
        0.3 * with_gpal[0.3].metrics["local_loss"] + 0.7 * with_gpal[0.3].metrics["gpal_loss"], rel=1e-5)
    assert not all(torch.equal(with_gpal[1.0].upload["model"][k], with_gpal[0.3].upload["model"][k]) for k in state)


def identity_context(dim: int = 2, classes: int = 2) -> Context:
    """A head-less model whose features are its inputs (an identity linear encoder)."""
    def make(num_classes: int | None) -> FewShotModel:
        encoder = nn.Linear(dim, dim)
        with torch.no_grad():
            encoder.weight.copy_(torch.eye(dim))
            encoder.bias.zero_()
        return FewShotModel(encoder, dim, None if num_classes is None else nn.Linear(dim, num_classes))

    return Context(seed=0, make_model=make, make_model_named=lambda n, c: make(c), input_shape=(dim,),
                   num_classes=classes, train_classes=list(range(classes)), episode=EpisodeShape(2, 1, 1))


@pytest.mark.parametrize("form", ["convex", "additive"])
def test_eq3_combines_local_and_global_prototype_losses_as_written(form: str) -> None:
    # Features = inputs (identity encoder). Samples (0,0), (2,0), (0,1) with labels 0, 1, 0.
    # Local prototypes c_0 = (0,0), c_1 = (2,0): squared distances [0,4], [4,0], [1,5], so every row's
    # cross-entropy is log(1 + e^-4) and L_local = log(1 + e^-4).
    # Global prototypes G_0 = (0,1), G_1 = (2,0): distances [1,4], [5,0], [0,5]; rows
    # log(1 + e^-3), log(1 + e^-5), log(1 + e^-5): L_aux = (log(1 + e^-3) + 2 log(1 + e^-5)) / 3.
    # Eq. 3 with gamma = 0.3: convex 0.3 L_local + 0.7 L_aux; the authors' code's additive L_local + 0.7 L_aux.
    ctx = identity_context()
    data = LabelledDataset(torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1, 0]), ["a", "b"])
    local = math.log(1 + math.exp(-4))
    aux = (math.log(1 + math.exp(-3)) + 2 * math.log(1 + math.exp(-5))) / 3
    expected = {"convex": 0.3 * local + 0.7 * aux, "additive": local + 0.7 * aux}[form]
    inner = PrototypeFL(frl_options(gamma=0.3, gpal_form=form), ctx)
    downloaded = {"classes": torch.tensor([0, 1]), "prototypes": torch.tensor([[0.0, 0.0], [2.0, 0.0]])}
    global_prototypes = {"classes": torch.tensor([0, 1]), "prototypes": torch.tensor([[0.0, 1.0], [2.0, 0.0]])}
    loss, metrics = inner.local_loss(inner.model, data, torch.arange(3), downloaded, global_prototypes)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    assert metrics["local_loss"] == pytest.approx(local, rel=1e-5)
    assert metrics["gpal_loss"] == pytest.approx(aux, rel=1e-5)
    # Round 0 (no global prototypes) and gamma = 1 are L_local alone in both forms.
    loss0, _ = inner.local_loss(inner.model, data, torch.arange(3), downloaded, None)
    assert float(loss0.detach()) == pytest.approx(local, rel=1e-5)
    assert float(gpal_objective(torch.tensor(local), torch.tensor(aux), 1.0, form)) == pytest.approx(local)


def test_eq2_as_printed_leaves_the_own_class_out_of_the_log_sum() -> None:
    # logits = -squared distances: rows [0, -4] (label 0), [-4, 0] (label 1), [-1, -5] (label 0).
    # Printed eq. 2, d_y + log sum_{c' != y} exp(-d_c'): 0 - 4 = -4, 0 - 4 = -4, 1 - 5 = -4: mean -4.
    logits = torch.tensor([[0.0, -4.0], [-4.0, 0.0], [-1.0, -5.0]])
    targets = torch.tensor([0, 1, 0])
    assert float(distance_loss(logits, targets, "others")) == pytest.approx(-4.0)
    assert float(distance_loss(logits, targets, "all")) == pytest.approx(math.log(1 + math.exp(-4)), rel=1e-5)
    # Unbounded below: doubling the embedding (distances x 4) makes it -16; ProtoNet's form tends to 0.
    assert float(distance_loss(4 * logits, targets, "others")) == pytest.approx(-16.0)
    # One prototype: the log-sum over the other classes is empty and dropped, d_y alone.
    assert float(distance_loss(torch.tensor([[-2.0], [-3.0]]), torch.tensor([0, 0]), "others")) == pytest.approx(2.5)


def get_fresh_state(data: LabelledDataset) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {k: v.clone() for k, v in tiny_context(data).make_model(None).state_dict().items()}


# -- the meta-update and the episode -----------------------------------------------------------
def test_meta_update_moves_theta0_by_minus_beta_times_the_query_gradient_at_thetaR() -> None:
    data = blob_dataset(classes=4, per_class=6)
    ctx = tiny_context(data)
    options = frl_options(meta_lr=0.3, gamma=0.4)
    frl = FRL(options, ctx)
    torch.manual_seed(1)
    phi = {k: v.clone() for k, v in ctx.make_model(None).state_dict().items()}
    torch.manual_seed(2)
    theta_r = {k: v.clone() for k, v in ctx.make_model(None).state_dict().items()}
    g = {"classes": torch.tensor([0, 1, 2]), "prototypes": torch.randn(3, 6, generator=torch.Generator().manual_seed(4))}
    query = data.subset(torch.tensor([0, 1, 2, 6, 7, 8]))
    support = data.subset(torch.tensor([3, 4, 9, 10]))
    result = frl.client_update({"model": theta_r, "prototypes": g}, {"initial": phi},
                               ClientData(0, query, val=support), torch.Generator())

    # The query loss at theta^R, written out independently: eq. 3 of query prototypes and GPAL.
    model = ctx.make_model(None)
    params = {k: v.clone().requires_grad_() for k, v in theta_r.items()}
    features = functional_call(model.encoder, {k.removeprefix("encoder."): v for k, v in params.items()}, (query.inputs,))
    targets = torch.tensor([0, 0, 0, 1, 1, 1])
    protos = torch.stack([features[:3].mean(0), features[3:].mean(0)])
    local = F.cross_entropy(-((features[:, None] - protos[None]) ** 2).sum(-1), targets)
    gpal = F.cross_entropy(-((features[:, None] - g["prototypes"][None]) ** 2).sum(-1), targets)
    grads = torch.autograd.grad(0.4 * local + 0.6 * gpal, list(params.values()))
    for (name, grad) in zip(params, grads):
        expected = phi[name] - 0.3 * grad
        assert torch.allclose(result.upload["model"][name], expected, atol=1e-6, rtol=0), name
    assert result.num_samples == len(query) + len(support)
    assert result.metrics["query_loss"] == pytest.approx(float((0.4 * local + 0.6 * gpal).detach()), rel=1e-5)

    # One participant: the server's phi^{t+1} is its phi_k.
    server = frl.aggregate({}, {0: result}, torch.Generator())
    assert all(torch.equal(server["model"][k], result.upload["model"][k]) for k in phi)


def shard_clients(data: LabelledDataset, classes_per_client: list[list[int]]) -> list[ClientData]:
    return [ClientData(i, data.subset(data.indices_of_classes(cls))) for i, cls in enumerate(classes_per_client)]


def test_an_episode_is_R_plus_one_rounds_of_bytes_and_changes_phi() -> None:
    data = blob_dataset(classes=8, per_class=6)
    ctx = tiny_context(data)
    rounds = 3
    frl = FRL(frl_options(rounds=rounds), ctx)
    clients = shard_clients(data, [[0, 1], [2, 3]])
    server = initial_server_state(frl, torch.Generator().manual_seed(0))
    outcome = frl.play_round(server, InProcessEngine(frl, clients, 0), [0, 1], 0)
    model = payload_bytes(server["model"])
    d, c = 6, 4  # feature size; classes in the episode
    g_down = c * 8 + c * d * 4  # global prototypes: int64 class ids + float32 rows
    local_up = 2 * 8 + 2 * d * 4 + 2 * 4  # each client's 2 classes: ids, rows, counts
    assert outcome.bytes_down == 2 * (rounds + 1) * model + 2 * rounds * g_down  # G from round 1 and at the meta step
    assert outcome.bytes_up == 2 * (rounds + 1) * model + 2 * rounds * local_up
    assert not all(torch.equal(server["model"][k], outcome.server["model"][k]) for k in server["model"])
    assert "round1_gpal_loss" in next(iter(outcome.results.values())).metrics


def test_support_query_split_halves_each_class() -> None:
    labels = torch.tensor([0] * 6 + [1] * 5 + [2])
    support, query = split_support_query(labels, 0.5, torch.Generator().manual_seed(0))
    assert set(support.tolist()).isdisjoint(query.tolist())
    assert sorted(support.tolist() + query.tolist()) == list(range(12))
    assert torch.bincount(labels[support], minlength=3).tolist() == [3, 2, 1]  # 5 -> round(2.5)=2; 1 -> support
    assert torch.bincount(labels[query], minlength=3).tolist() == [3, 3, 0]


def test_impossible_options_are_named() -> None:
    with pytest.raises(ConfigError, match="gamma"):
        load_config({"algorithm": {"name": "frl", "options": {"classifier": "linear", "gamma": 0.8}}})
    with pytest.raises(ConfigError, match="gamma"):
        load_config({"algorithm": {"name": "frl", "options": {"gamma": 1.5}}})
    with pytest.raises(ConfigError, match="seen_classes"):
        load_config({"algorithm": {"name": "frl", "options": {"deployment": {"classes": 3, "seen_classes": 4}}}})


# -- deployment ------------------------------------------------------------------------------------
def deployment_setup(dim: int = 12, classes: int = 12, per_class: int = 40):
    """Clusters far apart (one-hot centres x 50, noise 0.1), an identity encoder, a tiny learning rate:
    distance to the global prototypes must classify every query sample."""
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(classes).repeat_interleave(per_class)
    inputs = 50.0 * F.one_hot(labels, dim).float() + 0.1 * torch.randn(len(labels), dim, generator=g)
    data = LabelledDataset(inputs, labels, [str(c) for c in range(classes)], name="clusters",
                           splits={"base": list(range(6)), "val": [], "novel": list(range(6, 12))})

    def make(num_classes: int | None) -> FewShotModel:
        encoder = nn.Linear(dim, dim)
        with torch.no_grad():
            encoder.weight.copy_(torch.eye(dim))
            encoder.bias.zero_()
        return FewShotModel(encoder, dim, None if num_classes is None else nn.Linear(dim, num_classes))

    ctx = Context(seed=0, make_model=make, make_model_named=lambda n, c: make(c), input_shape=(dim,),
                  num_classes=classes, train_classes=list(range(6)), episode=EpisodeShape(5, 1, 1))
    test = EvalData("test", episodes=fixed_episodes(data, list(range(6, 12)), 5, 1, 1, 1, 0))
    return data, ctx, test


@pytest.mark.parametrize("iid", [False, True])
def test_distance_classifier_is_exact_on_separated_clusters(iid: bool) -> None:
    data, ctx, test = deployment_setup()
    options = frl_options(lr=1e-9, deployment=DeploymentOptions(groups=4, iid=iid, samples_per_class=20))
    frl = FRL(options, ctx)
    prepared = {k: v.clone() for k, v in ctx.make_model(None).state_dict().items()}
    result = evaluate_deployment(frl.prototype_fl, prepared, options.deployment, 3, test, ctx)
    assert result["accuracy"] == 1.0 and result["groups"] == 4
    # An encoder that maps every cluster to the same point is not exact: the check can fail.
    collapsed = {"encoder.weight": torch.ones(12, 12), "encoder.bias": torch.zeros(12)}
    result = evaluate_deployment(frl.prototype_fl, collapsed, options.deployment, 3, test, ctx)
    assert result["accuracy"] < 0.5


def test_groups_are_seeded_and_have_the_papers_structure() -> None:
    data, ctx, _ = deployment_setup()
    novel = list(range(6, 12))
    options = DeploymentOptions(groups=5, clients=10, classes=5, samples_per_class=40)
    groups = draw_groups(data, novel, options, seed=3, split="test")
    again = draw_groups(data, novel, options, seed=3, split="test")
    other = draw_groups(data, novel, options, seed=4, split="test")
    assert all(torch.equal(a.support[i], b.support[i]) for a, b in zip(groups, again) for i in range(10))
    assert any(not torch.equal(a.classes, b.classes) or not torch.equal(a.support[0], b.support[0])
               for a, b in zip(groups, other))
    labels = data.labels
    for group in groups:
        assert len(group.classes) == 5 and set(group.classes.tolist()) <= set(novel)
        used = torch.cat(group.support + group.query)
        assert len(used) == len(set(used.tolist())) == 5 * 40  # disjoint, all samples of the 5 classes
        for s, q in zip(group.support, group.query):
            assert len(torch.unique(labels[s])) <= 2  # two single-class shards
            assert set(torch.unique(labels[q]).tolist()) == set(torch.unique(labels[s]).tolist())
            assert len(s) == len(q)  # half support, half query
    iid = draw_groups(data, novel, options.model_copy(update={"iid": True}), seed=3, split="test")
    for s in iid[0].support:
        assert len(torch.unique(labels[s])) == 5 and len(s) == 5 * 2


def test_seen_classes_use_only_samples_no_participant_holds() -> None:
    data, ctx, _ = deployment_setup()
    held = [ClientData(0, data.subset(torch.arange(0, 30))), ClientData(1, data.subset(torch.arange(40, 70)))]
    free = held_out_positions(data, [0, 1, 2], participant_positions(held))
    assert free[0].tolist() == list(range(30, 40)) and free[1].tolist() == list(range(70, 80))
    assert 2 not in free  # no participant holds class 2: it is not a seen class
    options = DeploymentOptions(groups=3, clients=2, classes=3, seen_classes=2, samples_per_class=10)
    for group in draw_groups(data, list(range(6, 12)), options, seed=0, split="test", seen=free):
        assert sum(int(c) < 6 for c in group.classes) == 2
        used = torch.cat(group.support + group.query)
        assert not set(used.tolist()) & (set(range(30)) | set(range(40, 70)))


def test_fresh_head_keeps_the_encoder_and_is_xavier() -> None:
    data = blob_dataset(classes=4, per_class=5)
    ctx = tiny_context(data, hidden=30)
    prepared = {k: v + 1.0 for k, v in ctx.make_model(3).state_dict().items()}  # a |C_b| = 3 head
    state = with_fresh_head(ctx.make_model(5), prepared, torch.Generator().manual_seed(0))
    assert state["head.weight"].shape == (5, 30)
    bound = math.sqrt(6.0 / (30 + 5))
    assert float(state["head.weight"].abs().max()) <= bound and float(state["head.weight"].std()) > bound / 4
    assert float(state["head.bias"].abs().max()) == 0.0
    assert all(torch.equal(state[k], prepared[k]) for k in state if k.startswith("encoder."))


# -- baselines ---------------------------------------------------------------------------------------
def test_per_fedavg_steps_match_their_formulas() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    data = LabelledDataset(torch.randn(9, 3, dtype=torch.float64), torch.tensor([0, 1] * 4 + [0]), ["a", "b"])
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    batches = (torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8]))

    def loss(p, batch):
        return F.cross_entropy(functional_call(model, p, (data.inputs[batch],)), data.labels[batch])

    def grad(p, batch, create_graph=False):
        live = {k: v.detach().requires_grad_() if not create_graph else v for k, v in p.items()}
        return dict(zip(live, torch.autograd.grad(loss(live, batch), list(live.values()), create_graph=create_graph)))

    alpha, beta = 0.1, 0.2
    g = grad(params, batches[0])
    tmp = {k: params[k] - alpha * g[k] for k in params}
    outer = grad(tmp, batches[1])
    fo = per_fedavg_step(model, params, data, data.labels, batches[:2],
                         PerFedAvgOptions(variant="fo", alpha=alpha, beta=beta))
    for k in params:
        assert torch.allclose(fo[k], params[k] - beta * outer[k], atol=1e-12)

    # HF: (I - alpha H(w; D'')) v with the exact Hessian-vector product from double backward.
    live = {k: v.clone().requires_grad_() for k, v in params.items()}
    g3 = torch.autograd.grad(loss(live, batches[2]), list(live.values()), create_graph=True)
    hvp = torch.autograd.grad(sum((a * outer[k]).sum() for a, k in zip(g3, live)), list(live.values()))
    hf = per_fedavg_step(model, params, data, data.labels, batches,
                         PerFedAvgOptions(variant="hf", alpha=alpha, beta=beta, delta=1e-5))
    for (k, h) in zip(params, hvp):
        exact = params[k] - beta * (outer[k] - alpha * h)
        assert torch.allclose(hf[k], exact, atol=1e-8)
        assert not torch.allclose(hf[k], fo[k], atol=1e-8)


def test_one_shot_keeps_the_best_cross_validated_models() -> None:
    data = blob_dataset(classes=4, per_class=5)
    ctx = tiny_context(data)
    algorithm = FRLOneShot(OneShotFineTuneOptions(keep=2, stage="preparation"), ctx)
    results = {i: ClientResult({"model": {"w": torch.full((2,), float(i))}, "cv_score": torch.tensor(score)},
                               num_samples=n)
               for i, (score, n) in enumerate([(0.9, 10), (0.2, 10), (0.8, 30), (0.5, 10)])}
    server = algorithm.aggregate({}, results, torch.Generator())
    assert server["kept"] == [0, 2]
    assert torch.allclose(server["model"]["w"], torch.full((2,), (0 * 10 + 2 * 30) / 40))
    with pytest.raises(ValueError, match="keep"):
        FRLOneShot(OneShotFineTuneOptions(keep=5, stage="preparation"), ctx).aggregate({}, results, torch.Generator())


def test_one_shot_runs_at_deployment_after_fedavg_preparation() -> None:
    """The paper: pretrained via FedAvg in preparation, one-shot FL (CV selection) at deployment."""
    data = blob_dataset(classes=4, per_class=5)
    ctx = tiny_context(data)
    algorithm = FRLOneShot(OneShotFineTuneOptions(keep=2), ctx)  # stage: deployment (default)
    # Preparation is FedAvg: the sample-weighted average of every upload, CV scores or not.
    results = {i: ClientResult({"model": {"w": torch.full((2,), float(i))}}, num_samples=n)
               for i, n in enumerate([10, 10, 30, 10])}
    server = algorithm.aggregate({}, results, torch.Generator())
    assert torch.allclose(server["model"]["w"], torch.full((2,), (0 * 10 + 1 * 10 + 2 * 30 + 3 * 10) / 60))
    # A deployment round keeps the `keep` best by CV score: clients 0 (0.9) and 2 (0.8), weighted
    # 10 : 30, so w = (0 * 10 + 2 * 30) / 40 = 1.5.
    fl = algorithm.deployment(3)
    assert isinstance(fl, OneShotFL) and fl.options.keep == 2
    scored = {i: ClientResult({"model": {"w": torch.full((2,), float(i))}, "cv_score": torch.tensor(score)},
                              num_samples=n)
              for i, (score, n) in enumerate([(0.9, 10), (0.2, 10), (0.8, 30), (0.5, 10)])}
    round_server = fl.aggregate({"model": None}, scored, torch.Generator())
    assert round_server["kept"] == [0, 2]
    assert torch.allclose(round_server["model"]["w"], torch.full((2,), 1.5))
    # A client's deployment update trains the model and reports a cross-validation accuracy in [0, 1].
    start = fl.start(get_state_of(ctx.make_model(3)), 3, torch.Generator().manual_seed(0))
    client = ClientData(0, relabel(data.subset(torch.arange(15))))
    result = fl.client_update(fl.broadcast(start, 0), None, client, torch.Generator().manual_seed(0))
    assert 0.0 <= float(result.upload["cv_score"]) <= 1.0
    assert not torch.equal(result.upload["model"]["head.weight"], start["model"]["head.weight"])
    single = ClientData(1, relabel(data.subset(torch.tensor([0]))))  # one sample: cannot be cross-validated
    assert float(fl.client_update(fl.broadcast(start, 1), None, single, torch.Generator()).upload["cv_score"]) == 0.0
    with pytest.raises(ValueError, match="deployment.clients"):
        OneShotFL(OneShotTrainOptions(keep=5), ctx, 3).aggregate({}, scored, torch.Generator())


def test_one_shot_ensemble_classifies_by_the_kept_models_mean_softmax() -> None:
    """``combine: ensemble`` (Guha et al.'s CV ensemble): after the last round the query is classified
    by the argmax of the kept models' mean softmax, computed here by hand from each member's logits;
    the next round still starts from their average; with one kept model it equals ``combine: average``."""
    data = blob_dataset(classes=3, per_class=6)
    ctx = tiny_context(data)
    query = relabel(data.subset(torch.arange(18)))
    ensemble, average = (OneShotFL(OneShotTrainOptions(keep=2, combine=c), ctx, 3) for c in ("ensemble", "average"))
    members = [with_fresh_head(ensemble.model, get_state_of(ctx.make_model(3)), torch.Generator().manual_seed(s))
               for s in range(3)]
    scored = {i: ClientResult({"model": members[i], "cv_score": torch.tensor(score)}, num_samples=n)
              for i, (score, n) in enumerate([(0.9, 10), (0.1, 10), (0.8, 30)])}
    server = ensemble.aggregate({"model": None}, scored, torch.Generator())
    assert server["kept"] == [0, 2] and len(server["members"]) == 2
    assert set(ensemble.broadcast(server, 0)) == {"model"}  # the members stay on the server
    by_hand = []
    for m in (members[0], members[2]):
        model = ctx.make_model(3)
        model.load_state_dict(m)
        model.eval()
        with torch.no_grad():
            by_hand.append(F.softmax(model(query.inputs), dim=-1))
    mean = torch.stack(by_hand).mean(0)
    assert torch.allclose(ensemble.classify(server, query).exp(), mean, atol=1e-6)
    averaged = average.aggregate({"model": None}, scored, torch.Generator())
    assert "members" not in averaged
    assert torch.equal(averaged["model"]["head.weight"], server["model"]["head.weight"])  # the next round's start
    # The two readings differ in what classifies, not in what the next round trains from:
    assert not torch.allclose(F.softmax(average.classify(averaged, query), -1), mean, atol=1e-4)
    single = {0: scored[0]}
    one = OneShotFL(OneShotTrainOptions(keep=1, combine="ensemble"), ctx, 3)
    assert torch.equal(one.classify(one.aggregate({"model": None}, single, torch.Generator()), query).argmax(-1),
                       average.classify({"model": members[0]}, query).argmax(-1))
    with pytest.raises(ValueError, match="combine"):
        load_config("configs/frl/femnist_oneshot.yaml", ["algorithm.options.combine=vote"])


def get_state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def relabel(data: LabelledDataset) -> LabelledDataset:
    """Labels as indices 0..c-1 of the classes present (as a deployment group's clients hold them)."""
    classes, labels = torch.unique(data.labels, return_inverse=True)
    return LabelledDataset(data.inputs, labels, [str(int(c)) for c in classes])


def test_distance_based_per_fedavg_step_matches_its_formula() -> None:
    # FO Per-FedAvg with f(w; D) = the prototype loss of D against D's own class means, written out.
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    data = LabelledDataset(torch.randn(8, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 0, 1, 1, 0]), ["a", "b"])
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    batches = (torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6, 7]))

    def loss(p, batch):
        features = functional_call(model, p, (data.inputs[batch],))
        labels = data.labels[batch]
        protos = torch.stack([features[labels == c].mean(0) for c in (0, 1)])
        return F.cross_entropy(-((features[:, None] - protos[None]) ** 2).sum(-1), labels)

    def grad(p, batch):
        live = {k: v.detach().requires_grad_() for k, v in p.items()}
        return dict(zip(live, torch.autograd.grad(loss(live, batch), list(live.values()))))

    alpha, beta = 0.1, 0.2
    g = grad(params, batches[0])
    outer = grad({k: params[k] - alpha * g[k] for k in params}, batches[1])
    step = per_fedavg_step(model, params, data, data.labels, batches,
                           PerFedAvgOptions(variant="fo", alpha=alpha, beta=beta), prototype_batch_loss)
    for k in params:
        assert torch.allclose(step[k], params[k] - beta * outer[k], atol=1e-12)


def test_distance_based_per_fedavg_deploys_with_global_prototypes() -> None:
    data, ctx, test = deployment_setup()
    options = PerFedAvgOptions(alpha=1e-9, beta=1e-9, deployment=DeploymentOptions(groups=3, samples_per_class=20))
    algorithm = FRLPerFedAvgDistance(options, ctx)
    server = initial_server_state(algorithm, torch.Generator().manual_seed(0))
    assert "head.weight" not in server["model"]  # a head-less encoder: prototypes classify
    result = algorithm.evaluate(server, test, torch.Generator())
    assert result["accuracy"] == 1.0 and result["groups"] == 3  # separated clusters, identity encoder


def test_frl_runs_in_the_simulator_and_is_reproducible() -> None:
    data = blob_dataset(classes=8, per_class=12)
    ctx = tiny_context(data)
    clients = shard_clients(data, [[0, 1], [2, 3], [0, 2], [1, 3]])
    test = EvalData("test", episodes=fixed_episodes(data, list(range(4, 8)), 3, 1, 1, 1, 0))
    options = frl_options(deployment=DeploymentOptions(groups=3, clients=3, classes=3, samples_per_class=12))
    outcomes = []
    for _ in range(2):
        simulator = Simulator(FRL(options, ctx), clients, seed=0, test=test)
        outcomes.append(simulator.run(rounds=2, clients_per_round=2))
    a, b = outcomes
    assert a["test"]["accuracy"] == b["test"]["accuracy"] and 0.0 <= a["test"]["accuracy"] <= 1.0
    assert a["comm"].down == b["comm"].down and len(a["comm"].down) == 2
    assert np.isfinite(a["history"][-1]["train_query_loss"])


def test_task_label_rows_are_maml_labels_spread_over_the_deployment_rows() -> None:
    g = torch.Generator().manual_seed(0)
    # n >= tau: labels 0..n-1 in a random order (a permutation).
    draws = [task_label_rows(6, 3, g) for _ in range(20)]
    assert all(sorted(d.tolist()) == list(range(6)) for d in draws)
    assert len({tuple(d.tolist()) for d in draws}) > 1  # the order changes from task to task
    # n < tau: distinct rows among the first tau, every one of them used over many tasks.
    small = [task_label_rows(2, 5, g) for _ in range(50)]
    assert all(len(set(d.tolist())) == 2 and max(d.tolist()) < 5 for d in small)
    assert set().union(*[set(d.tolist()) for d in small]) == set(range(5))


def test_prepared_head_is_cut_to_the_task_and_written_back_into_its_rows() -> None:
    data = blob_dataset(classes=8, per_class=4)
    ctx = tiny_context(data)
    prepared = get_state_of(ctx.make_model(4))  # a 4-row meta-learned head
    state = with_prepared_head(ctx.make_model(3), prepared)
    assert torch.equal(state["head.weight"], prepared["head.weight"][:3])
    assert torch.equal(state["head.bias"], prepared["head.bias"][:3])
    assert all(torch.equal(state[k], prepared[k]) for k in state if not k.startswith("head."))
    moved = {k: v + 1.0 for k, v in state.items()}
    merged = merged_head(prepared, moved)
    assert torch.equal(merged["head.weight"][:3], moved["head.weight"])
    assert torch.equal(merged["head.weight"][3], prepared["head.weight"][3])  # a row the task did not use
    assert torch.equal(merged["encoder.1.weight"], moved["encoder.1.weight"])
    with pytest.raises(ValueError, match="rows"):
        with_prepared_head(ctx.make_model(5), prepared)


def linear_frl(head_init: str, ctx: Context) -> FRL:
    return FRL(frl_options(classifier="linear", gamma=1.0, head_init=head_init,
                           deployment=DeploymentOptions(groups=2, clients=2, classes=3, samples_per_class=8)), ctx)


def test_meta_learned_head_is_part_of_phi_and_moves_in_the_meta_update() -> None:
    data = blob_dataset(classes=8, per_class=6)
    ctx = tiny_context(data)
    clients = shard_clients(data, [[0, 1], [2], [1, 3]])
    fresh = torch.Generator().manual_seed(7)
    # head_init: meta: phi has a |C_b| = 4-row head, an episode moves it.
    frl = linear_frl("meta", ctx)
    server = initial_server_state(frl, torch.Generator().manual_seed(0))
    assert server["model"]["head.weight"].shape[0] == 4
    outcome = frl.play_round(server, InProcessEngine(frl, clients, 0), [0, 1, 2], 0)
    after = outcome.server["model"]
    assert not torch.allclose(after["head.weight"], server["model"]["head.weight"])
    assert not torch.allclose(after["head.bias"], server["model"]["head.bias"])
    # A deployment group starts from the first tau = 3 rows of the prepared head.
    start = frl.inner_algorithm(3).start(after, 3, fresh)
    assert torch.equal(start["model"]["head.weight"], after["head.weight"][:3])
    # head_init: xavier: phi has no head; the group's head is the same fresh Xavier draw before and
    # after preparation: nothing the episode learnt reaches it.
    old = linear_frl("xavier", ctx)
    server = initial_server_state(old, torch.Generator().manual_seed(0))
    assert "head.weight" not in server["model"]
    outcome = old.play_round(server, InProcessEngine(old, clients, 0), [0, 1, 2], 0)
    assert "head.weight" not in outcome.server["model"]
    before = old.inner_algorithm(3).start(server["model"], 3, torch.Generator().manual_seed(7))
    later = old.inner_algorithm(3).start(outcome.server["model"], 3, torch.Generator().manual_seed(7))
    assert torch.equal(before["model"]["head.weight"], later["model"]["head.weight"])
    assert not torch.equal(before["model"]["encoder.1.weight"], later["model"]["encoder.1.weight"])


def test_meta_update_of_the_linear_variant_includes_the_head_hand_checked() -> None:
    """phi_k = phi^t - beta grad_theta CE(theta^R; Q_k), head included, written out independently."""
    data = blob_dataset(classes=8, per_class=6)
    ctx = tiny_context(data)
    frl = linear_frl("meta", ctx)
    torch.manual_seed(1)
    phi = get_state_of(ctx.make_model(3))  # the rows the episode uses
    torch.manual_seed(2)
    theta_r = get_state_of(ctx.make_model(3))
    query = relabel(data.subset(torch.tensor([0, 1, 6, 7, 12, 13])))  # labels 0, 0, 1, 1, 2, 2
    result = frl.client_update({"model": theta_r}, {"initial": phi}, ClientData(0, query), torch.Generator())
    model = ctx.make_model(3)
    params = {k: v.clone().requires_grad_() for k, v in theta_r.items()}
    loss = F.cross_entropy(functional_call(model, params, (query.inputs,)), query.labels)
    grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
    for name in params:
        assert torch.allclose(result.upload["model"][name], phi[name] - 0.05 * grads[name], atol=1e-6), name
    assert "head.weight" in grads and float(grads["head.weight"].abs().sum()) > 0
    # The server writes the averaged rows into phi's 4-row head, leaving row 3 as it was.
    full = {**phi, "head.weight": torch.cat([phi["head.weight"], torch.ones(1, phi["head.weight"].shape[1])]),
            "head.bias": torch.cat([phi["head.bias"], torch.ones(1)])}
    server = frl.aggregate({"model": full}, {0: result}, torch.Generator())
    assert torch.equal(server["model"]["head.weight"][:3], result.upload["model"]["head.weight"])
    assert torch.equal(server["model"]["head.weight"][3], torch.ones(phi["head.weight"].shape[1]))


def test_episode_labels_are_maml_rows_of_the_participants_classes() -> None:
    from fedfew.algorithms.frl import frl_split

    data = blob_dataset(classes=8, per_class=6)
    client = ClientData(0, data.subset(data.indices_of_classes([1, 3])))
    split = frl_split(client, seed=0, round_key="0", episode="0", fraction=0.5, half="support",
                      classes=[0, 1, 2, 3], rows=[2, 0, 3, 1], width=4)
    original = data.labels[data.indices_of_classes([1, 3])]
    assert split.train.num_classes == 4
    assert set(split.train.labels.tolist()) == {0, 1}  # class 1 -> row 0, class 3 -> row 1
    assert len(split.train) == len(original) // 2


def test_per_fedavg_meta_head_step_matches_the_formula_on_maml_rows() -> None:
    """FO Per-FedAvg with head_init: meta, one local step written out: a client holding global
    classes {1, 3} maps them to two random rows of the tau = 3 deployment rows (drawn from the
    update's generator), and w <- w - beta grad CE_{3 outputs}(w - alpha grad CE_{3 outputs}(w; D); D')."""
    data = blob_dataset(classes=8, per_class=6)
    ctx = tiny_context(data)
    options = PerFedAvgOptions(variant="fo", alpha=0.1, beta=0.2, batch_size=5, local_steps=1,
                               deployment=DeploymentOptions(groups=1, clients=2, classes=3))
    algorithm = FRLPerFedAvg(options, ctx)
    server = initial_server_state(algorithm, torch.Generator().manual_seed(0))
    client = ClientData(0, data.subset(data.indices_of_classes([1, 3])))
    result = algorithm.client_update(algorithm.broadcast(server, 0), None, client, torch.Generator().manual_seed(5))

    g = torch.Generator().manual_seed(5)
    task_label_rows(2, 3, g)  # the initial draw, replaced by the step's own
    rows = task_label_rows(2, 3, g)
    targets = rows[(client.train.labels == 3).long()]  # class 1 -> rows[0], class 3 -> rows[1]
    d1, d2 = (torch.randperm(len(client.train), generator=g)[:5] for _ in range(2))
    model = ctx.make_model(4)
    w = {k: v.clone() for k, v in server["model"].items()}

    def grad(p, batch):
        live = {k: v.clone().requires_grad_() for k, v in p.items()}
        logits = functional_call(model, live, (client.train.inputs[batch],))[:, :3]
        return dict(zip(live, torch.autograd.grad(F.cross_entropy(logits, targets[batch]), list(live.values()))))

    g1 = grad(w, d1)
    g2 = grad({k: w[k] - 0.1 * g1[k] for k in w}, d2)
    for k in w:
        assert torch.allclose(result.upload["model"][k], w[k] - 0.2 * g2[k], atol=1e-6), k
    assert not torch.allclose(result.upload["model"]["head.weight"][:3], w["head.weight"][:3])
    assert torch.equal(result.upload["model"]["head.weight"][3], w["head.weight"][3])  # beyond max(n, tau)
    # The helpers: targets on distinct rows, the loss over the first `width` outputs only.
    draw, width = task_targets(client.train.labels, 3)
    assert width == 3 and set(draw(torch.Generator().manual_seed(0)).tolist()) <= {0, 1, 2}
    with torch.no_grad():
        loss = first_outputs_loss(3)(model, w, client.train, targets, torch.arange(4))
        logits = functional_call(model, w, (client.train.inputs[:4],))
    assert float(loss) == pytest.approx(float(F.cross_entropy(logits[:, :3], targets[:4])), rel=1e-6)
    assert float(loss) != pytest.approx(float(F.cross_entropy(logits, targets[:4])), rel=1e-3)  # 4 outputs differ


@pytest.mark.parametrize("head_init", ["meta", "xavier"])
def test_per_fedavg_deployment_head(head_init: str) -> None:
    data = blob_dataset(classes=8, per_class=6)
    ctx = tiny_context(data)
    options = PerFedAvgOptions(head_init=head_init, deployment=DeploymentOptions(groups=1, clients=2, classes=3))
    algorithm = FRLPerFedAvg(options, ctx)
    prepared = {k: v + 1.0 for k, v in initial_server_state(algorithm, torch.Generator().manual_seed(0))["model"].items()}
    start = algorithm.deployment(3).start(prepared, 3, torch.Generator().manual_seed(1))["model"]
    if head_init == "meta":
        assert torch.equal(start["head.weight"], prepared["head.weight"][:3])
    else:
        assert float(start["head.bias"].abs().max()) == 0.0  # a fresh Xavier layer
    with pytest.raises(ValueError, match="deployment.classes"):
        FRLPerFedAvg(PerFedAvgOptions(deployment=DeploymentOptions(classes=5)), ctx)  # |C_b| = 4 rows


def frozen_first_parameter(ctx: Context) -> Context:
    """``ctx`` whose models have their first parameter frozen (as a frozen word-vector table is)."""
    import dataclasses

    def make(num_classes: int | None) -> FewShotModel:
        model = ctx.make_model(num_classes)
        next(model.parameters()).requires_grad_(False)
        return model

    return dataclasses.replace(ctx, make_model=make)


def test_frl_and_per_fedavg_leave_a_frozen_parameter_alone() -> None:
    """FRL's meta-gradient used to fail on a frozen parameter ("One of the differentiated Tensors does
    not require grad": FRL on HuffPost with frozen GloVe), and Per-FedAvg moved it: both now update only
    what trains."""
    data = blob_dataset(classes=8, per_class=12)
    ctx = frozen_first_parameter(tiny_context(data))
    frozen = next(n for n, _ in ctx.make_model(None).named_parameters())
    clients = shard_clients(data, [[0, 1], [2, 3], [0, 2], [1, 3]])
    deployment = DeploymentOptions(groups=1, clients=2, classes=3, samples_per_class=12)
    frl = FRL(frl_options(deployment=deployment), ctx)
    simulator = Simulator(frl, clients, seed=0)
    before = {k: v.clone() for k, v in simulator.server["model"].items()}
    simulator.run(rounds=2, clients_per_round=2)
    after = simulator.server["model"]
    assert torch.equal(after[frozen], before[frozen]) and not torch.equal(after["encoder.3.weight"],
                                                                          before["encoder.3.weight"])

    per_fedavg = FRLPerFedAvg(PerFedAvgOptions(variant="fo", alpha=0.1, beta=0.2, batch_size=5, local_steps=2,
                                               deployment=deployment), ctx)
    server = initial_server_state(per_fedavg, torch.Generator().manual_seed(0))
    client = ClientData(0, data.subset(data.indices_of_classes([1, 3])))
    result = per_fedavg.client_update(per_fedavg.broadcast(server, 0), None, client, torch.Generator().manual_seed(1))
    moved = {k for k, v in result.upload["model"].items() if not torch.equal(v, server["model"][k])}
    assert frozen not in moved and moved


ROUNDS = 2  # R, the inner rounds of an episode (the tiny config's)


def frl(privacy: dict[str, Any] | None = None, **federation: Any) -> dict[str, Any]:
    config = private("frl", privacy, federation={"rounds": 2, "clients_per_round": 2, **federation})
    assert config["algorithm"]["options"]["rounds"] == ROUNDS
    return config


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
