"""FML (Shen et al. 2020): the DML losses of eq. 3 against hand-computed values, the teacher side
carrying no gradient, the reduction to FedAvg at beta = 1, privacy of the local model, heterogeneous
private models, the dynamic alpha/beta schedule and new participants. Tiny MLP/CNN1 on 8x8 digits."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from fedfew.algorithms.fml import FML, DynamicWeights, FMLOptions, dml_losses, kl_batchmean
from fedfew.config.validation import ConfigError, load_config
from fedfew.core.seeding import torch_generator
from fedfew.interface.protocol import initial_client_state, initial_server_state
from fedfew.interface.state import payload_bytes
from fedfew.run.experiment import build_experiment

TRAIN = {"local_epochs": 1, "batch_size": 16, "lr": 0.05, "momentum": 0.9}


def config(algorithm: str, options: dict[str, Any], rounds: int = 3, clients: int = 3, partition: str = "iid",
           model: str = "mlp") -> Any:
    return load_config({
        "name": "test-fml",
        "seed": 7,
        "task": "classification",
        "dataset": {"name": "digits"},
        "classification": {"test_fraction": 0.2, "client_val_fraction": 0.1},
        "partition": {"name": partition, "num_clients": clients},
        "model": {"name": model, "options": {"hidden": 16} if model == "mlp" else {}},
        "algorithm": {"name": algorithm, "options": options},
        "federation": {"rounds": rounds, "clients_per_round": clients},
        "eval": {"every": 1},
        "runtime": {"threads": 1, "progress": False},
    })


def run(algorithm: str, options: dict[str, Any], rounds: int = 3, **kwargs: Any):
    simulator = build_experiment(config(algorithm, options, rounds, **kwargs)).simulator()
    outcome = simulator.run(rounds, simulator_clients(simulator))
    return simulator, outcome


def simulator_clients(simulator) -> int:
    return len(simulator.clients)


# -- eq. 3: the losses ----------------------------------------------------------------------------


def test_kl_batchmean_matches_hand_computed_values():
    teacher_p = torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]])
    student_q = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [0.7, 0.2, 0.1]])
    # KL(p || q) = sum_c p_c log(p_c / q_c), by hand per sample:
    kl_1 = 0.5 * math.log(0.5 * 3) + 2 * 0.25 * math.log(0.25 * 3)  # = 0.058892
    kl_2 = 0.1 * math.log(0.1 / 0.7) + 0.2 * math.log(1.0) + 0.7 * math.log(0.7 / 0.1)  # = 0.6 ln 7
    assert kl_1 == pytest.approx(0.0588916, abs=1e-6) and kl_2 == pytest.approx(1.1675462, abs=1e-6)
    # Logits are any shift of log-probabilities; shift them to check that nothing depends on it.
    value = kl_batchmean(student_q.log() + 3.0, teacher_p.log() - 1.0)
    assert float(value) == pytest.approx((kl_1 + kl_2) / 2, abs=1e-6)
    # batchmean, not the per-element mean of nn.KLDivLoss(): that one is C = 3 times smaller.
    per_element = (teacher_p * (teacher_p.log() - student_q.log())).mean()
    assert float(value) == pytest.approx(3 * float(per_element), abs=1e-6)


def test_dml_losses_are_eq3_with_hand_computed_values():
    local_p = torch.tensor([[0.6, 0.3, 0.1]])
    meme_p = torch.tensor([[0.2, 0.5, 0.3]])
    target = torch.tensor([1])
    alpha, beta = 0.3, 0.8
    ce_local, ce_meme = -math.log(0.3), -math.log(0.5)
    kl_meme_local = 0.2 * math.log(0.2 / 0.6) + 0.5 * math.log(0.5 / 0.3) + 0.3 * math.log(0.3 / 0.1)
    kl_local_meme = 0.6 * math.log(0.6 / 0.2) + 0.3 * math.log(0.3 / 0.5) + 0.1 * math.log(0.1 / 0.3)
    loss_local, loss_meme, parts = dml_losses(local_p.log(), meme_p.log(), target, alpha, beta)
    assert float(loss_local) == pytest.approx(alpha * ce_local + (1 - alpha) * kl_meme_local, abs=1e-6)
    assert float(loss_meme) == pytest.approx(beta * ce_meme + (1 - beta) * kl_local_meme, abs=1e-6)
    assert parts["kl_local"] == pytest.approx(kl_meme_local, abs=1e-6)
    assert parts["kl_meme"] == pytest.approx(kl_local_meme, abs=1e-6)


def test_no_gradient_flows_into_the_teacher_side():
    gen = torch.Generator().manual_seed(0)
    local_logits = torch.randn(4, 5, generator=gen, requires_grad=True)
    meme_logits = torch.randn(4, 5, generator=gen, requires_grad=True)
    targets = torch.tensor([0, 1, 2, 3])
    loss_local, loss_meme, _ = dml_losses(local_logits, meme_logits, targets, 0.5, 0.5)
    loss_local.backward(retain_graph=True)
    assert meme_logits.grad is None and local_logits.grad is not None
    local_logits.grad = None
    loss_meme.backward()
    assert local_logits.grad is None and meme_logits.grad is not None
    # The student's KL gradient is (q - p) / B: the teacher p enters as a constant.
    student = torch.randn(4, 5, generator=gen, requires_grad=True)
    teacher = torch.randn(4, 5, generator=gen, requires_grad=True)
    kl_batchmean(student, teacher).backward()
    expected = (student.softmax(-1) - teacher.softmax(-1)) / 4
    assert torch.allclose(student.grad, expected.detach(), atol=1e-6)
    assert teacher.grad is None


# -- reduction to FedAvg ------------------------------------------------------------------------


def test_beta_one_gives_fedavg_global_model_exactly():
    fedavg_sim, fedavg_out = run("fedavg", {**TRAIN, "aggregation": "uniform"})
    # Heterogeneous private models on purpose: with beta = 1 the meme must ignore them entirely.
    fml_sim, fml_out = run("fml", {**TRAIN, "beta": 1.0, "alpha": 0.5, "local_models": ["cnn1", "mlp", "cnn1"]})
    for name, tensor in fedavg_sim.server["model"].items():
        assert torch.equal(tensor, fml_sim.server["model"][name]), name
    assert fml_out["test"]["accuracy"] == fedavg_out["test"]["accuracy"]
    # ... and any beta < 1 moves it away (so the check above can fail).
    other_sim, _ = run("fml", {**TRAIN, "beta": 0.9, "local_models": ["cnn1", "mlp", "cnn1"]})
    assert any(not torch.equal(t, other_sim.server["model"][k]) for k, t in fedavg_sim.server["model"].items())


def test_aggregation_is_the_plain_average_of_memes():
    experiment = build_experiment(config("fml", TRAIN))
    fml: FML = experiment.algorithm
    server = initial_server_state(fml, torch_generator(0, "s"))
    from fedfew.interface.algorithm import ClientResult

    a = {k: torch.ones_like(v) for k, v in server["model"].items()}
    b = {k: 3 * torch.ones_like(v) for k, v in server["model"].items()}
    new = fml.aggregate(server, {0: ClientResult({"model": a}, num_samples=10),
                                 1: ClientResult({"model": b}, num_samples=1000)}, torch_generator(0, "a"))
    assert all(torch.allclose(t, torch.full_like(t, 2.0)) for t in new["model"].values())  # not n_k-weighted
    assert new["round"] == server["round"] + 1


# -- privacy --------------------------------------------------------------------------------------


def test_local_model_never_in_the_upload():
    simulator, outcome = run("fml", TRAIN, rounds=2)  # local and global share the architecture here
    fml: FML = simulator.algorithm
    global_bytes = payload_bytes(simulator.server["model"])
    assert outcome["comm"].up == [len(simulator.clients) * global_bytes] * 2  # memes only, nothing else
    experiment = build_experiment(config("fml", TRAIN))
    fml = experiment.algorithm
    client = experiment.clients[0]
    server = initial_server_state(fml, torch_generator(1, "s"))
    state = initial_client_state(fml, client, torch_generator(1, "c"))
    result = fml.client_update(fml.broadcast(server, 0), state, client, torch_generator(1, "u"))
    assert set(result.upload) == {"model"}
    local = result.state["model"]
    assert set(result.upload["model"]) == set(local)  # same architecture: check by value
    differs = [not torch.equal(result.upload["model"][k], local[k]) for k in local if local[k].is_floating_point()]
    assert all(differs), "an uploaded tensor equals the private local model's"
    assert not any(result.upload["model"][k].data_ptr() == local[k].data_ptr() for k in local)


# -- heterogeneous private models ---------------------------------------------------------------


def test_heterogeneous_local_models_train_in_one_run():
    options = {**TRAIN, "lr": 0.1, "local_epochs": 2, "local_models": {0: "cnn1", 2: "mlp"},
               "local_model_options": {"mlp": {"hidden": 8}}}
    simulator = build_experiment(config("fml", options, rounds=2)).simulator()
    initial = {cid: {k: v.clone() for k, v in s["model"].items()} for cid, s in simulator.client_states.items()}
    outcome = simulator.run(2, 3)
    states = simulator.client_states
    assert [states[c]["architecture"] for c in range(3)] == ["cnn1", None, "mlp"]
    assert any("weight" in k and v.dim() == 4 for k, v in states[0]["model"].items())  # a conv net
    assert states[2]["model"]["encoder.1.weight"].shape[0] == 8  # mlp with hidden 8
    assert states[1]["model"]["encoder.1.weight"].shape[0] == 16  # the global mlp (hidden 16)
    for cid in range(3):
        assert states[cid]["rounds"] == 2
        assert any(not torch.equal(initial[cid][k], v) for k, v in states[cid]["model"].items())
    test = outcome["test"]
    assert 0.0 <= test["local_min"] <= test["local_accuracy"] <= test["local_max"] <= 1.0
    assert test["local_accuracy"] > 0.3 and test["accuracy"] > 0.3  # learnt something in 2 rounds


def test_bad_options_are_clear_errors():
    with pytest.raises(ConfigError, match="local_models"):
        config("fml", {"local_models": ["mlp", "no-such-net"]})
    with pytest.raises(ConfigError, match="dynamic"):
        config("fml", {"alpha": 0.7, "dynamic": {"rounds": 5}})
    with pytest.raises(ConfigError, match="local_model_options"):
        config("fml", {"local_model_options": {"cnn2": {}}})
    with pytest.raises(ValueError, match="local_models lists 2 models but client 2"):
        build_experiment(config("fml", {"local_models": ["mlp", "mlp"]})).simulator()
    with pytest.raises(ValueError, match="classification"):
        load = config("fml", {})
        build_experiment(load.model_copy(update={"task": "fewshot"}))


# -- dynamic alpha / beta (section 6) ---------------------------------------------------------------


def test_dynamic_schedule_moves_alpha_down_and_beta_up():
    schedule = DynamicWeights(alpha=(0.9, 0.5), beta=(0.5, 0.9), rounds=4)
    assert schedule.at(0) == pytest.approx((0.9, 0.5))
    assert schedule.at(2) == pytest.approx((0.7, 0.7))
    assert schedule.at(4) == schedule.at(10) == pytest.approx((0.5, 0.9))
    experiment = build_experiment(config("fml", {**TRAIN, "dynamic": {"rounds": 4}}))
    fml: FML = experiment.algorithm
    assert fml.broadcast({"model": {}, "round": 1}, 0)["alpha"] == pytest.approx(0.8)
    assert fml.broadcast({"model": {}, "round": 1}, 0)["beta"] == pytest.approx(0.6)
    assert FMLOptions().weights_at(3) == (0.5, 0.5)


# -- new participants (Fig. 4) --------------------------------------------------------------------


def test_newcomer_sits_out_then_adapts():
    simulator, outcome = run("fml", {**TRAIN, "newcomers": [2]}, rounds=2)
    fml: FML = simulator.algorithm
    assert simulator.client_states[2]["rounds"] == 0
    per_client = payload_bytes(simulator.server["model"])
    assert outcome["comm"].up == [2 * per_client] * 2 and outcome["comm"].down == [2 * per_client] * 2
    assert set(fml.local_accuracies(simulator.client_states, simulator.clients)) == {0, 1}
    newcomer = simulator.clients[2]
    before = {k: v.clone() for k, v in simulator.server["model"].items()}
    curve = fml.adapt_newcomer(simulator.server, newcomer, torch_generator(0, "new"), init="global", epochs=3)
    assert [row["epoch"] for row in curve] == [0, 1, 2, 3]
    # Starting from the global model, the local model at epoch 0 is the global model.
    assert curve[0]["local_accuracy"] == curve[0]["meme_accuracy"]
    assert all(torch.equal(before[k], v) for k, v in simulator.server["model"].items())  # server untouched
    fresh = fml.adapt_newcomer(simulator.server, newcomer, torch_generator(0, "new"), init="fresh", epochs=3)
    assert fresh[-1]["local_accuracy"] > fresh[0]["local_accuracy"]


def test_newcomer_with_other_architecture_cannot_start_from_global():
    experiment = build_experiment(config("fml", {**TRAIN, "local_models": {1: "cnn1"}}))
    fml: FML = experiment.algorithm
    server = initial_server_state(fml, torch_generator(0, "s"))
    with pytest.raises(ValueError, match="init='fresh'"):
        fml.adapt_newcomer(server, experiment.clients[1], torch_generator(0, "n"), init="global", epochs=1)


# -- per-client scores (the catfish table's columns) -------------------------------------------------


def test_local_by_client_holds_each_trained_clients_own_score():
    simulator, outcome = run("fml", {**TRAIN, "local_models": {0: "cnn1"}}, rounds=2)
    fml: FML = simulator.algorithm
    test = outcome["test"]
    by_hand = fml.local_accuracies(simulator.client_states, simulator.clients)  # each private model, scored again
    assert test["local_by_client"] == {str(cid): score for cid, score in sorted(by_hand.items())}
    assert list(test["local_by_client"]) == ["0", "1", "2"]
    values = list(test["local_by_client"].values())
    assert test["local_accuracy"] == pytest.approx(sum(values) / 3)
    assert (test["local_min"], test["local_max"]) == (min(values), max(values))


# -- FedAvg's uploads scored as its "local models" (Fig. 5) --------------------------------------------


def test_fedavg_score_uploads_scores_the_last_uploads_and_changes_no_training_number():
    from fedfew.fewshot.evaluation import dataset_accuracy
    from fedfew.interface.protocol import update_generator

    plain_sim, plain = run("fedavg", {**TRAIN, "aggregation": "uniform"}, rounds=2)
    simulator = build_experiment(config("fedavg", {**TRAIN, "aggregation": "uniform", "score_uploads": True},
                                        rounds=2)).simulator()
    simulator.run(1, 3)
    server_after_round_1 = {k: v.clone() for k, v in simulator.server["model"].items()}
    scored = simulator.run(2, 3)
    # Opt-in and off the training path: the global models and every round's test score are the same.
    for name, tensor in plain_sim.server["model"].items():
        assert torch.equal(tensor, simulator.server["model"][name]), name
    assert [h["test_accuracy"] for h in scored["history"]] == [h["test_accuracy"] for h in plain["history"]]
    assert scored["test"]["accuracy"] == plain["test"]["accuracy"] and "local_accuracy" not in plain["test"]
    # Each client's score is its round-2 upload (the round-1 global model after its local epoch),
    # rebuilt here by its own update from the same payload and generator, on its validation set.
    fedavg = simulator.algorithm
    for client in simulator.clients:
        result = fedavg.client_update({"model": server_after_round_1}, None, client,
                                      update_generator(simulator.seed, "1", client.client_id))
        model = fedavg.new_model()
        model.load_state_dict(result.upload["model"])
        expected = dataset_accuracy(model, client.val.inputs, client.val.labels, client.val.lengths)
        assert scored["test"]["local_by_client"][str(client.client_id)] == expected
    with pytest.raises(ValueError, match="score_uploads"):
        load = config("fedavg", {"score_uploads": True})
        build_experiment(load.model_copy(update={"task": "fewshot"}))


# -- the newcomer phase (Fig. 4 in the run) -------------------------------------------------------


def test_newcomer_phase_reports_each_start_and_way_per_epoch_after_the_last_round():
    options = {**TRAIN, "newcomers": [2]}
    plain_sim, plain = run("fml", options, rounds=2)
    simulator, outcome = run("fml", {**options, "adapt_newcomers": {"epochs": 2}}, rounds=2)
    test = outcome["test"]
    # The phase changes nothing that trains or is sent: same global model, bytes and global scores.
    assert test["accuracy"] == plain["test"]["accuracy"] and outcome["comm"].down == plain["comm"].down
    assert [h["test_accuracy"] for h in outcome["history"]] == [h["test_accuracy"] for h in plain["history"]]
    assert "test_newcomer_fresh_dml_accuracy" not in outcome["history"][0]  # only after the last round
    assert "test_newcomer_fresh_dml_accuracy" in outcome["history"][-1]
    assert test["local_by_client"].keys() == {"0", "1"}  # the newcomer has no trained private model
    fml: FML = simulator.algorithm
    newcomer = simulator.clients[2]
    for init in ("fresh", "global"):
        for by, alpha in (("dml", None), ("ce", 1.0)):
            curve = fml.adapt_newcomer(simulator.server, newcomer, torch_generator(7, "newcomer", 2, init),
                                       init=init, epochs=2, alpha=alpha)
            by_epoch = test[f"newcomer_{init}_{by}_by_epoch"]
            assert by_epoch == {str(row["epoch"]): row["local_accuracy"] for row in curve}
            assert test[f"newcomer_{init}_{by}_accuracy"] == by_epoch["2"]
    # Both ways start from the same model (paired): from the global model, epoch 0 is its accuracy.
    from fedfew.fewshot.evaluation import dataset_accuracy

    global_model = fml.new_global_model()
    global_model.load_state_dict(simulator.server["model"])
    on_joining = dataset_accuracy(global_model, newcomer.val.inputs, newcomer.val.labels, newcomer.val.lengths)
    assert test["newcomer_global_dml_by_epoch"]["0"] == test["newcomer_global_ce_by_epoch"]["0"] == on_joining
    assert test["newcomer_fresh_dml_by_epoch"]["0"] == test["newcomer_fresh_ce_by_epoch"]["0"]
    assert test["newcomer_global_dml_by_epoch"] != test["newcomer_global_ce_by_epoch"]  # the ways differ
    with pytest.raises(ConfigError, match="adapt_newcomers needs newcomers"):
        config("fml", {"adapt_newcomers": {"epochs": 1}})
    with pytest.raises(ConfigError, match="adapt_newcomers"):
        config("fml", {"newcomers": [2], "adapt_newcomers": {"by": ["sgd"]}})
