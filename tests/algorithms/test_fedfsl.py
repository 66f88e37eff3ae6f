"""FedFSL (Fan & Huang 2021): the KL of eq. 13 against hand-computed values, the MI term vanishing at
w_k = w_g, the k-exclusive model w_{-k} of eq. 11, the two stages of Algorithm 2 touching only their
own parameters, theta' staying on the client, and fedfsl-prox at mu = 0 being fl-maml.
Tiny MLPs on Gaussian blobs (tests/helpers.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from fedfew.algorithms.fedfsl import (
    FedFSLMI,
    FedFSLMIOptions,
    FedFSLProx,
    FedFSLProxOptions,
    exclusive_average,
    prediction_kl,
)
from fedfew.algorithms.fedfsl_adv import FedFSLAdvOptions, FedFSLMIAdv
from fedfew.algorithms.fl_maml import FLMAML
from fedfew.algorithms.parts.episodic import MAMLOptions
from fedfew.config.validation import ConfigError, load_config
from fedfew.core.seeding import torch_generator
from fedfew.engine.simulator import Simulator
from fedfew.fewshot.episodes import EpisodeSampler, fixed_episodes
from fedfew.interface.algorithm import ClientResult, EvalData
from fedfew.interface.protocol import initial_server_state
from fedfew.interface.state import get_state, load_state_
from tests.helpers import blob_dataset, clients_from, context_for

MAML = {"local_steps": 2, "lr": 0.01, "inner_lr": 0.1, "inner_steps": 1, "test_inner_steps": 2}


def setup(n_clients: int = 3):
    data = blob_dataset(classes=8, per_class=12)
    ctx = context_for(data, n_way=3, k_shot=1, q_query=4)
    pool = data.split("base")
    clients = clients_from(pool, list(torch.randperm(len(pool), generator=torch.Generator().manual_seed(0))
                                      .chunk(n_clients)))
    test = EvalData("test", episodes=fixed_episodes(data, data.splits["novel"], 3, 1, 4, 4, seed=0))
    return data, ctx, pool, clients, test


def episode(pool: Any, seed: int = 0):
    return EpisodeSampler(pool, 3, 1, 4).sample(torch_generator(seed, "test-episode"))


def constant_state(template: dict[str, torch.Tensor], value: float) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(v, value) for k, v in template.items()}


# --- eq. 13: the KL between predictions ------------------------------------------------------


def test_prediction_kl_matches_hand_computed_values() -> None:
    p = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    q = torch.log(torch.tensor([[0.25, 0.75], [0.5, 0.5]]))
    row1 = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    row2 = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    assert prediction_kl(p, q).item() == pytest.approx((row1 + row2) / 2, abs=1e-6)
    # KL(p || q) is not symmetric, and logits are shift invariant (softmax inside).
    reverse = (0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
               + 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)) / 2
    assert prediction_kl(q, p).item() == pytest.approx(reverse, abs=1e-6)
    assert prediction_kl(p + 3.0, q - 1.0).item() == pytest.approx((row1 + row2) / 2, abs=1e-6)
    assert prediction_kl(p, p).item() == 0.0


def test_mi_term_is_zero_at_the_global_model_and_positive_elsewhere() -> None:
    _, ctx, pool, _, _ = setup()
    algorithm = FedFSLMI(FedFSLMIOptions(**MAML, gamma=0.2), ctx)
    global_state = initial_server_state(algorithm, torch_generator(0, "init"))["model"]
    ep = episode(pool)
    load_state_(algorithm.reference_model, global_state)
    load_state_(algorithm.model, global_state)
    loss, metrics = algorithm.local_objective({"model": global_state}, ep)
    assert metrics["mi_kl"] == 0.0
    assert loss.item() == pytest.approx(algorithm.learner.loss(algorithm.model, ep)[0].item(), abs=1e-7)

    with torch.no_grad():
        for p in algorithm.model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    loss, metrics = algorithm.local_objective({"model": global_state}, ep)
    fsl_loss = algorithm.learner.loss(algorithm.model, ep)[0].item()
    assert metrics["mi_kl"] > 1e-4
    # the objective is exactly L_k + gamma * KL, and the KL carries gradient to the client model only
    assert loss.item() == pytest.approx(fsl_loss + 0.2 * metrics["mi_kl"], abs=1e-6)
    loss.backward()
    assert all(p.grad is None for p in algorithm.reference_model.parameters())


# --- eq. 11: the k-exclusive model -----------------------------------------------------------


def test_exclusive_average_excludes_exactly_client_k() -> None:
    template = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    models = {0: constant_state(template, 1.0), 1: constant_state(template, 2.0), 2: constant_state(template, 4.0)}
    weights = {0: 1.0, 1: 1.0, 2: 2.0}
    expected = {0: (2.0 + 2 * 4.0) / 3, 1: (1.0 + 2 * 4.0) / 3, 2: (1.0 + 2.0) / 2}
    for k, value in expected.items():
        w_minus_k = exclusive_average(models, weights, k)
        for tensor in w_minus_k.values():
            torch.testing.assert_close(tensor, torch.full_like(tensor, value))
        # client k's own model has no influence on w_{-k}
        changed = {**models, k: constant_state(template, 1e6)}
        for name, tensor in exclusive_average(changed, weights, k).items():
            assert torch.equal(tensor, w_minus_k[name])
    assert exclusive_average({3: models[0]}, {3: 1.0}, 3) is None


def test_server_sends_each_client_the_average_of_the_others() -> None:
    _, ctx, _, clients, _ = setup()
    algorithm = FedFSLMI(FedFSLMIOptions(**MAML, reference="exclusive"), ctx)
    server = initial_server_state(algorithm, torch_generator(0, "init"))
    assert "reference" not in algorithm.broadcast(server, 0)  # nothing uploaded yet: w^t is used
    template = server["model"]
    results = {cid: ClientResult(upload={"model": constant_state(template, float(cid + 1))}, num_episodes=2 + cid,
                                 num_samples=10) for cid in range(3)}
    server = algorithm.aggregate(server, results, torch_generator(0, "agg"))
    for k in range(3):
        others = [c for c in range(3) if c != k]
        value = sum((c + 1) * (2 + c) for c in others) / sum(2 + c for c in others)
        reference = algorithm.broadcast(server, k)["reference"]
        for tensor in reference.values():
            torch.testing.assert_close(tensor, torch.full_like(tensor, value))
    # the global model is still the average over everybody (eq. 10)
    everyone = sum((c + 1) * (2 + c) for c in range(3)) / sum(2 + c for c in range(3))
    for tensor in server["model"].values():
        torch.testing.assert_close(tensor, torch.full_like(tensor, everyone))


def test_exclusive_reference_costs_one_more_model_down_after_round_one() -> None:
    _, ctx, _, clients, test = setup()
    algorithm = FedFSLMI(FedFSLMIOptions(**MAML, reference="exclusive"), ctx)
    out = Simulator(algorithm, clients, seed=0, test=test).run(rounds=2, clients_per_round=3)
    model_bytes = sum(t.numel() * t.element_size() for t in get_state(algorithm.model).values())
    assert out["comm"].down == [3 * model_bytes, 6 * model_bytes]
    assert 0.0 <= out["test"]["accuracy"] <= 1.0


# --- Algorithm 2: the two stages -------------------------------------------------------------


def adv_algorithm(**options: Any) -> tuple[FedFSLMIAdv, Any, dict[str, torch.Tensor]]:
    _, ctx, pool, _, _ = setup()
    algorithm = FedFSLMIAdv(FedFSLAdvOptions(**MAML, **options), ctx)
    global_state = initial_server_state(algorithm, torch_generator(0, "init"))["model"]
    load_state_(algorithm.model, global_state)
    load_state_(algorithm.reference_model, global_state)
    algorithm.init_second_classifier(torch_generator(0, "theta-prime"))
    return algorithm, pool, global_state


def snapshot(algorithm: FedFSLMIAdv) -> dict[str, dict[str, torch.Tensor]]:
    return {
        "generator": {k: v.clone() for k, v in algorithm.model.encoder.state_dict().items()},
        "theta": {k: v.clone() for k, v in algorithm.model.head.state_dict().items()},
        "theta_prime": {k: v.clone() for k, v in algorithm.second_head.state_dict().items()},
    }


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("first_order", [False, True])
def test_stage_one_moves_only_the_classifiers_and_stage_two_only_the_generator(first_order: bool) -> None:
    algorithm, pool, _ = adv_algorithm(first_order=first_order)
    episodes = [episode(pool, 0), episode(pool, 1)]
    references = [algorithm.reference_logits(ep) for ep in episodes]
    classifier_opt = torch.optim.Adam(algorithm.classifier_parameters(), lr=0.01)
    generator_opt = torch.optim.Adam(algorithm.generator_parameters(), lr=0.01)

    before = snapshot(algorithm)
    algorithm.stage_one(episodes, references, classifier_opt)
    after_one = snapshot(algorithm)
    assert not changed(before["generator"], after_one["generator"])  # Theta bit-identical
    assert changed(before["theta"], after_one["theta"]) and changed(before["theta_prime"], after_one["theta_prime"])

    algorithm.stage_two(episodes, references, generator_opt)
    after_two = snapshot(algorithm)
    assert changed(after_one["generator"], after_two["generator"])
    assert not changed(after_one["theta"], after_two["theta"])  # theta and theta' bit-identical
    assert not changed(after_one["theta_prime"], after_two["theta_prime"])


def test_adversarial_objective_is_the_sum_of_its_terms() -> None:
    algorithm, pool, _ = adv_algorithm(gamma=0.2)
    ep = episode(pool)
    reference = algorithm.reference_logits(ep)
    loss, logits = algorithm.learner.loss(algorithm.model, ep)
    loss2, logits2 = algorithm.learner.loss(algorithm.second_view, ep)
    disc, mi = prediction_kl(logits, logits2).item(), prediction_kl(reference, logits).item()
    assert disc > 0  # theta' is a perturbed copy of theta: the symmetry is broken
    for weight in (-0.1, 0.1):  # stage 1 (-eta) and stage 2 (+lambda)
        total, metrics = algorithm.adversarial_objective([ep], [reference], weight, anchor=None)
        assert total.item() == pytest.approx(loss.item() + loss2.item() + weight * disc + 0.2 * mi, abs=1e-5)
        assert metrics["discrepancy"] == pytest.approx(disc, abs=1e-6)


def test_stage_mi_false_is_eqs_15_16_as_printed() -> None:
    """Without the MI term in the stages (stage_mi: false) the objective is L + L' + weight * KL, exactly the
    objective with gamma = 0, although gamma (0.2) still weighs nothing else here."""
    printed, pool, _ = adv_algorithm(gamma=0.2, stage_mi=False)
    ours, _, _ = adv_algorithm(gamma=0.2)
    ep = episode(pool)
    loss, logits = printed.learner.loss(printed.model, ep)
    loss2, logits2 = printed.learner.loss(printed.second_view, ep)
    # a reference away from the local model, so that the MI term is not zero
    reference = (logits + torch.randn(logits.shape, generator=torch.Generator().manual_seed(0))).detach()
    disc, mi = prediction_kl(logits, logits2).item(), prediction_kl(reference, logits).item()
    assert mi > 0.05
    for weight in (-0.1, 0.1):
        total, metrics = printed.adversarial_objective([ep], [reference], weight, anchor=None)
        assert total.item() == pytest.approx(loss.item() + loss2.item() + weight * disc, abs=1e-5)
        assert "mi_kl" not in metrics
        with_mi, _ = ours.adversarial_objective([ep], [reference], weight, anchor=None)
        assert with_mi.item() == pytest.approx(total.item() + 0.2 * mi, abs=1e-5)


def test_second_classifier_initialisation() -> None:
    algorithm, _, _ = adv_algorithm(second_classifier="perturb", perturb_std=0.1)
    for theta, theta2 in zip(algorithm.model.head.parameters(), algorithm.second_head.parameters()):
        relative = (theta2 - theta).pow(2).mean().sqrt() / theta.pow(2).mean().sqrt()
        assert 0.03 < relative.item() < 0.3  # about perturb_std
    fresh, _, _ = adv_algorithm(second_classifier="fresh")
    first = [p.clone() for p in fresh.second_head.parameters()]
    fresh.init_second_classifier(torch_generator(0, "theta-prime"))  # same generator: same theta'
    assert all(torch.equal(a, b) for a, b in zip(first, fresh.second_head.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(first, fresh.model.head.parameters()))


def test_only_generator_and_classifier_are_uploaded_and_averaged() -> None:
    _, ctx, _, clients, test = setup()
    algorithm = FedFSLMIAdv(FedFSLAdvOptions(**MAML), ctx)
    simulator = Simulator(algorithm, clients, seed=0, test=test)
    out = simulator.run(rounds=1, clients_per_round=3)
    keys = set(simulator.server["model"])
    assert keys == set(get_state(algorithm.model))
    assert keys == {f"encoder.{k}" for k in algorithm.model.encoder.state_dict()} | {
        f"head.{k}" for k in algorithm.model.head.state_dict()}
    model_bytes = sum(t.numel() * t.element_size() for t in simulator.server["model"].values())
    assert out["comm"].up == [3 * model_bytes]  # theta' never leaves the client
    assert len(list(algorithm.model.head)) == 3  # Linear, ReLU, Linear


def test_adv_local_update_is_reproducible() -> None:
    _, ctx, _, clients, _ = setup()
    algorithm = FedFSLMIAdv(FedFSLAdvOptions(**MAML, generator_steps=2), ctx)
    payload = {"model": initial_server_state(algorithm, torch_generator(0, "init"))["model"]}
    a = algorithm.client_update(payload, None, clients[0], torch_generator(3, "c")).upload["model"]
    b = algorithm.client_update(payload, None, clients[0], torch_generator(3, "c")).upload["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], payload["model"][k]) for k in a)


def test_adv_update_leaves_frozen_encoder_parameters_alone() -> None:
    # Frozen pretrained word vectors are the usual case; a frozen encoder layer stands in for them.
    _, ctx, _, clients, _ = setup()
    algorithm = FedFSLMIAdv(FedFSLAdvOptions(**MAML), ctx)
    frozen = next(algorithm.model.encoder.parameters())
    frozen.requires_grad_(False)
    name = next(n for n, p in algorithm.model.named_parameters() if p is frozen)
    payload = {"model": initial_server_state(algorithm, torch_generator(0, "init"))["model"]}
    upload = algorithm.client_update(payload, None, clients[0], torch_generator(3, "c")).upload["model"]
    assert torch.equal(upload[name], payload["model"][name])
    assert any(not torch.equal(upload[k], payload["model"][k]) for k in upload if k != name)


# --- fedfsl-prox -----------------------------------------------------------------------------


def test_prox_with_mu_zero_is_fl_maml() -> None:
    _, ctx, _, clients, test = setup()

    def final_state(algorithm: Any) -> dict[str, torch.Tensor]:
        simulator = Simulator(algorithm, clients, seed=11, test=test)
        simulator.run(rounds=2, clients_per_round=3)
        return simulator.server["model"]

    naive = final_state(FLMAML(MAMLOptions(**MAML), ctx))
    prox0 = final_state(FedFSLProx(FedFSLProxOptions(**MAML, mu=0.0, classifier="linear"), ctx))
    prox1 = final_state(FedFSLProx(FedFSLProxOptions(**MAML, mu=1.0, classifier="linear"), ctx))
    assert all(torch.equal(naive[k], prox0[k]) for k in naive)
    assert any(not torch.equal(naive[k], prox1[k]) for k in naive)  # the term does act


def test_the_papers_network_is_the_default() -> None:
    """Section 5.1: every method's classifier is two fully connected layers with a ReLU."""
    _, ctx, _, _, _ = setup()
    for algorithm in (FedFSLMI(FedFSLMIOptions(**MAML), ctx), FedFSLProx(FedFSLProxOptions(**MAML, mu=0.0), ctx)):
        head = algorithm.model.head
        assert isinstance(head, torch.nn.Sequential) and [type(m) for m in head] == [
            torch.nn.Linear, torch.nn.ReLU, torch.nn.Linear]
    linear = FedFSLMI(FedFSLMIOptions(**MAML, classifier="linear"), ctx).model.head
    assert isinstance(linear, torch.nn.Linear)


# --- options ---------------------------------------------------------------------------------


def test_impossible_options_are_clear_errors() -> None:
    with pytest.raises(ValidationError, match="perturb_std"):
        FedFSLAdvOptions(second_classifier="perturb", perturb_std=0.0)
    FedFSLAdvOptions(second_classifier="fresh", perturb_std=0.0)  # fine: no perturbation needed
    with pytest.raises(ValidationError, match="mu"):
        FedFSLProxOptions(mu=-0.1)
    with pytest.raises(ConfigError, match="reference"):
        load_config({"algorithm": {"name": "fedfsl-mi", "options": {"reference": "others"}}})
    with pytest.raises(ConfigError, match="perturb_std"):
        load_config({"algorithm": {"name": "fedfsl-mi-adv", "options": {"perturb_std": 0}}})


# --- the 2-D feature generator of the MNIST picture ------------------------------------------


@pytest.mark.parametrize("encoder", ["conv", "mlp"])
def test_feature2d_gives_two_dimensional_features(encoder: str) -> None:
    from fedfew.models import build_model

    model = build_model("feature2d", (1, 28, 28), None, encoder=encoder)
    assert model.feature_dim == 2
    assert model.features(torch.randn(4, 1, 28, 28)).shape == (4, 2)
    with pytest.raises(ValueError, match="encoder"):
        build_model("feature2d", (1, 28, 28), None, encoder="transformer")
