"""AdFL (one-shot FL with self-adversarial data) and the one-shot baselines: MI-FGSM against
hand-computed steps, targeted samples on an easy problem, the coherence score's invariants, and the
ensemble's softmax averaging."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedfew.algorithms.adfl import AdFLOptions, adversarial_samples, coherence_scores, judgement_matrix
from fedfew.algorithms.oneshot import ensemble_predictions, member_probabilities, top_n
from fedfew.algorithms.parts.common import TrainOptions, train_epochs
from fedfew.config.validation import ConfigError, load_config
from fedfew.core.seeding import torch_generator
from fedfew.data import LabelledDataset
from fedfew.engine.round import simulate_round
from fedfew.fewshot.adversarial import mi_fgsm
from fedfew.interface.algorithm import ClientResult, EvalData
from fedfew.interface.protocol import initial_server_state
from fedfew.interface.state import get_state
from fedfew.run.experiment import build_experiment


def linear(weight: list[list[float]], bias: list[float] | None = None) -> nn.Linear:
    w = torch.tensor(weight)
    layer = nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(torch.tensor(bias) if bias is not None else torch.zeros(w.shape[0]))
    return layer


# -- MI-FGSM ---------------------------------------------------------------------------------------


def test_mi_fgsm_first_step_by_hand() -> None:
    # logits = W x with W = [[1, 0, -1], [0, 2, 1]], x0 = (.5, .5, .5): logits (0, 1.5), target 0.
    # dCE/dx = W^T (softmax - e_0) = (-p1, 2 p1, 2 p1) with p1 = sigmoid(1.5) = 0.81757;
    # normalised by its L1 norm 5 p1: (-0.2, 0.4, 0.4); x1 = x0 - 0.1 sign(g1) = (0.6, 0.4, 0.4).
    model = linear([[1.0, 0.0, -1.0], [0.0, 2.0, 1.0]])
    x0 = torch.full((1, 3), 0.5)
    x1 = mi_fgsm(model, x0, torch.tensor([0]), steps=1, step_size=0.1, decay=1.0)
    assert torch.allclose(x1, torch.tensor([[0.6, 0.4, 0.4]]), atol=1e-6)
    # the clip: from (0.95, 0.02, 0.5) a step of 0.1 leaves the box and is clipped back to [0, 1]
    x1 = mi_fgsm(model, torch.tensor([[0.95, 0.02, 0.5]]), torch.tensor([0]), steps=1, step_size=0.1)
    assert torch.allclose(x1, torch.tensor([[1.0, 0.0, 0.4]]), atol=1e-6)


def test_mi_fgsm_momentum_matches_an_independent_implementation() -> None:
    # Several steps with decay 0.7 on a random linear model, against the analytic gradient
    # W^T (softmax(Wx + b) - e_target) accumulated by hand (no autograd), for a batch of two.
    # (Seed 4 gives a case where a gradient component changes sign, so the momentum matters.)
    gen = torch.Generator().manual_seed(4)
    weight, bias = torch.randn(4, 5, generator=gen), torch.randn(4, generator=gen)
    model = linear(weight.tolist(), bias.tolist())
    start = torch.rand(2, 5, generator=gen)
    targets = torch.tensor([2, 0])
    steps, alpha, mu = 6, 0.07, 0.7
    x, g = start.clone().double(), torch.zeros(2, 5, dtype=torch.float64)
    w, b = weight.double(), bias.double()
    for _ in range(steps):
        p = torch.softmax(x @ w.T + b, dim=-1)
        grad = (p - F.one_hot(targets, 4).double()) @ w
        g = mu * g + grad / grad.abs().sum(dim=1, keepdim=True)
        x = (x - alpha * g.sign()).clamp(0, 1)
    got = mi_fgsm(model, start, targets, steps=steps, step_size=alpha, decay=mu)
    assert torch.allclose(got.double(), x, atol=1e-5)
    # the momentum matters: without it the result differs
    assert not torch.allclose(mi_fgsm(model, start, targets, steps, alpha, decay=0.0).double(), x, atol=1e-3)


def test_mi_fgsm_leaves_the_model_as_it_was() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mi_fgsm(model, torch.rand(2, 3), torch.tensor([0, 1]), steps=3, step_size=0.1)
    assert model.training and all(p.requires_grad and p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="clip"):
        mi_fgsm(model, torch.rand(1, 3), torch.tensor([0]), steps=1, step_size=0.1, clip=(1.0, 0.0))


def easy_problem(seed: int = 0, n: int = 400, classes: int = 4) -> LabelledDataset:
    """16-pixel 'images' in [0, 1]: class k lights up pixels 4k..4k+3 on top of faint noise."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    inputs = 0.3 * torch.rand(n, 16, generator=gen)
    for k in range(classes):
        inputs[labels == k, 4 * k : 4 * k + 4] += 0.7
    return LabelledDataset(inputs, labels, [str(k) for k in range(classes)], name="easy")


@functools.cache
def trained_classifier(seed: int = 0, permute: tuple[int, ...] | None = None) -> nn.Module:
    """A small MLP trained on the easy problem (labels optionally permuted); cached, never modified
    (mi_fgsm leaves a model as it was)."""
    data = easy_problem(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    labels = data.labels if permute is None else torch.tensor(permute)[data.labels]
    train_epochs(model, data, labels, TrainOptions(local_epochs=20, optimizer="adam", lr=0.01, batch_size=32),
                 torch.Generator().manual_seed(seed))
    return model


@pytest.mark.parametrize("step_size", [1.0, 0.05])
def test_sample_from_noise_is_classified_as_its_target_by_its_source(step_size: float) -> None:
    model = trained_classifier()
    data = easy_problem(seed=1)
    assert (model(data.inputs).argmax(-1) == data.labels).float().mean() > 0.95  # the problem is learnt
    noise = torch.rand(4, 16, generator=torch.Generator().manual_seed(7))
    targets = torch.arange(4)
    assert not torch.equal(model(noise).argmax(-1), targets)  # noise alone is not the answer
    samples = mi_fgsm(model, noise, targets, steps=30, step_size=step_size, decay=1.0)
    assert torch.equal(model(samples).argmax(-1), targets)
    assert samples.min() >= 0 and samples.max() <= 1


# -- coherence score ---------------------------------------------------------------------------------


def loop_coherence(j: torch.Tensor) -> tuple[list[float], list[float]]:
    """Eqs. (3) and (4) as written: sums over the other models and the classes."""
    m_count, c_count = j.shape[0], j.shape[2]
    was = [sum(float(j[k, m, c]) for k in range(m_count) if k != m for c in range(c_count)) for m in range(m_count)]
    pred = [sum(float(j[m, k, c]) for k in range(m_count) if k != m for c in range(c_count)) for m in range(m_count)]
    return was, pred


def test_coherence_matches_the_equations_and_excludes_self_predictions() -> None:
    j = torch.rand(4, 4, 3, generator=torch.Generator().manual_seed(0))
    was, pred, cs = coherence_scores(j)
    want_was, want_pred = loop_coherence(j)
    assert torch.allclose(was, torch.tensor(want_was)) and torch.allclose(pred, torch.tensor(want_pred))
    assert torch.allclose(cs, was + pred)
    # a model's judgement of its own samples (the diagonal) changes nothing
    changed = j.clone()
    for m in range(4):
        changed[m, m] = torch.tensor([1.0, 0.0, 1.0]) * (m + 5)
    for a, b in zip(coherence_scores(changed), (was, pred, cs)):
        assert torch.allclose(a, b)
    # while an off-diagonal judgement does: model 0 recognising model 2's sample raises both
    changed[0, 2, 1] += 0.5
    was2, pred2, _ = coherence_scores(changed)
    assert math.isclose(float(was2[2] - was[2]), 0.5, rel_tol=1e-5)
    assert math.isclose(float(pred2[0] - pred[0]), 0.5, rel_tol=1e-5)


def test_judgement_matrix_entries() -> None:
    # model 0 predicts class 0 everywhere, model 1 class 1: s_k(x, c) = p_k(x)_c iff k predicts c
    m0, m1 = linear([[0.0], [0.0]], [2.0, 0.0]), linear([[0.0], [0.0]], [0.0, 2.0])
    states = [get_state(m0), get_state(m1)]
    samples = torch.zeros(2, 2, 1)  # [sources, classes, input]
    j = judgement_matrix(linear([[0.0], [0.0]]), states, samples)
    p = 1 / (1 + math.exp(-2.0))
    want = torch.tensor([[[p, 0.0], [p, 0.0]], [[0.0, p], [0.0, p]]])
    assert torch.allclose(j, want, atol=1e-6)


def test_coherence_of_identical_models_is_symmetric_and_maximal() -> None:
    model = trained_classifier()
    states = [get_state(model)] * 4
    options = AdFLOptions(attack_steps=30, step_size=1.0)
    # identical models judging identical samples: every score equal, "was predicted" = "predicted others"
    one = adversarial_samples(model, states[:1], 4, (16,), options, torch.Generator().manual_seed(0))
    j = judgement_matrix(model, states, one.expand(4, -1, -1))
    was, pred, cs = coherence_scores(j)
    assert torch.allclose(was, pred) and torch.allclose(cs, cs[0].expand(4))
    # each model's own samples (fresh noise per model): the score reaches the bound 2 (M-1) C,
    # since every s_k(x, c) <= 1
    samples = adversarial_samples(model, states, 4, (16,), options, torch.Generator().manual_seed(1))
    _, _, cs = coherence_scores(judgement_matrix(model, states, samples))
    bound = 2 * (4 - 1) * 4
    assert bool((cs <= bound + 1e-6).all()) and bool((cs > 0.95 * bound).all())
    # a model that learnt the classes under other names disagrees: it ranks last, the others share the top
    odd = trained_classifier(seed=0, permute=(1, 2, 3, 0))
    mixed = [get_state(model)] * 3 + [get_state(odd)]
    samples = adversarial_samples(model, mixed, 4, (16,), options, torch.Generator().manual_seed(2))
    _, _, cs = coherence_scores(judgement_matrix(model, mixed, samples))
    assert int(cs.argmin()) == 3 and float(cs[3]) < 0.5 * float(cs[:3].min())
    assert float(cs[:3].max() - cs[:3].min()) < 0.05 * bound


# -- ensembles and selection -------------------------------------------------------------------------


def test_ensemble_output_is_the_mean_of_member_softmaxes() -> None:
    members = [linear(torch.randn(3, 5, generator=torch.Generator().manual_seed(s)).tolist()) for s in range(3)]
    states = [get_state(m) for m in members]
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(9))
    probs = member_probabilities(linear([[0.0] * 5] * 3), states, x, batch_size=3)
    want = torch.stack([torch.softmax(m(x), -1) for m in members])
    assert torch.allclose(probs, want, atol=1e-6)
    assert torch.equal(ensemble_predictions(probs, "ensemble"), want.mean(0).argmax(-1))


def test_vote_counts_predictions_and_breaks_ties_by_mean_softmax() -> None:
    # three members, one sample: votes 0, 0, 1 -> 0 though member 2 is very sure of class 1
    probs = torch.tensor([[[0.5, 0.4, 0.1]], [[0.5, 0.4, 0.1]], [[0.0, 1.0, 0.0]]])
    assert ensemble_predictions(probs, "vote").tolist() == [0]
    assert ensemble_predictions(probs, "ensemble").tolist() == [1]
    # two members, a tie 0 vs 2: the larger mean softmax (class 2) wins
    tie = torch.tensor([[[0.6, 0.0, 0.4]], [[0.05, 0.0, 0.95]]])
    assert ensemble_predictions(tie, "vote").tolist() == [2]


def test_top_n_is_best_first_with_random_tie_breaks() -> None:
    scores = torch.tensor([0.1, 0.9, 0.5, 0.9, 0.3])
    firsts = set()
    for seed in range(20):
        chosen = top_n(scores, 3, torch.Generator().manual_seed(seed))
        assert set(chosen[:2]) == {1, 3} and chosen[2] == 2
        firsts.add(chosen[0])
    assert firsts == {1, 3}


# -- the algorithms end to end on a tiny federation ------------------------------------------------


def tiny_config(**algorithm: object) -> dict:
    options = {"local_epochs": 2, "batch_size": 32, "ensemble_size": 2, **algorithm.pop("options", {})}  # type: ignore[dict-item]
    return {
        "seed": 1, "task": "classification", "dataset": {"name": "digits"},
        "classification": {"test_fraction": 0.2},
        "partition": {"name": "label_skew", "num_clients": 5,
                      "options": {"classes_per_client": 4, "samples_per_client": 60}},
        "model": {"name": "mlp", "options": {"hidden": 16}, "channels_last": False},
        "algorithm": {"name": algorithm.get("name", "adfl"), "options": options},
        "federation": {"rounds": 1, "clients_per_round": 5}, "runtime": {"threads": 1, "progress": False},
    }


def one_round(config: dict, cv_folds: int = 0):
    experiment = build_experiment(load_config(config))
    alg = experiment.algorithm
    server = initial_server_state(alg, torch_generator(1, "server-init"))
    outcome = simulate_round(alg, server, experiment.clients, {}, list(range(5)), 1, 0)
    return experiment, outcome


def test_adfl_round_scores_every_client_and_evaluates_its_ensemble() -> None:
    experiment, outcome = one_round(tiny_config(options={"attack_steps": 5}))
    server = outcome.server
    assert sorted(server["coherence"]) == [0, 1, 2, 3, 4]
    best = sorted(server["coherence"], key=server["coherence"].get, reverse=True)[:2]
    assert set(server["member_ids"]) == set(best) and len(server["members"]) == 2
    result = experiment.algorithm.evaluate(server, experiment.test, torch.Generator())
    probs = member_probabilities(experiment.algorithm.model, server["members"], experiment.test.dataset.inputs)
    want = float((probs.mean(0).argmax(-1) == experiment.test.dataset.labels).double().mean())
    assert result["accuracy"] == pytest.approx(want)
    # the CS-weighted variant averages all models by their scores
    weighted = load_config(tiny_config(options={"attack_steps": 5, "combine": "weighted"}))
    alg = build_experiment(weighted).algorithm
    merged = alg.aggregate(outcome.server, outcome.results, torch_generator(1, "aggregate", 0))
    cs = torch.tensor([merged["coherence"][i] for i in range(5)], dtype=torch.float64)
    key = "encoder.1.weight"
    want_w = sum((cs[i] / cs.sum()) * outcome.results[i].upload["model"][key].double() for i in range(5))
    assert torch.allclose(merged["model"][key].double(), want_w, atol=1e-6) and merged["members"] == []


def test_oneshot_average_of_all_is_fedavg_with_one_round() -> None:
    train = {"local_epochs": 2, "batch_size": 32, "optimizer": "adam", "lr": 0.001}
    fedavg_cfg = tiny_config(name="fedavg", options=train)
    fedavg_cfg["algorithm"]["options"].pop("ensemble_size")
    _, fedavg = one_round(fedavg_cfg)
    _, oneshot = one_round(tiny_config(name="oneshot", options={**train, "selection": "all", "combine": "average"}))
    assert all(torch.equal(fedavg.server["model"][k], oneshot.server["model"][k]) for k in fedavg.server["model"])


def test_cross_validation_scores_do_not_change_the_returned_model() -> None:
    _, plain = one_round(tiny_config(name="oneshot", options={"selection": "random"}))
    experiment, with_cv = one_round(tiny_config(name="oneshot", options={"selection": "cv", "cv_folds": 5, "cv_epochs": 1}))
    for cid in range(5):
        a, b = plain.results[cid].upload, with_cv.results[cid].upload
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        assert "cv_score" not in a and 0.0 <= float(b["cv_score"]) <= 1.0
    scores = {cid: float(r.upload["cv_score"]) for cid, r in with_cv.results.items()}
    best = sorted(scores.values(), reverse=True)[:2]
    assert sorted((scores[i] for i in with_cv.server["member_ids"]), reverse=True) == best


def test_data_size_selection_takes_the_largest_clients() -> None:
    experiment = build_experiment(load_config(tiny_config(name="oneshot", options={"selection": "data_size"})))
    alg = experiment.algorithm
    state = get_state(alg.model)
    results = {cid: ClientResult(upload={"model": state}, num_samples=n) for cid, n in enumerate([5, 50, 7, 40, 9])}
    server = alg.aggregate(initial_server_state(alg, torch.Generator()), results, torch.Generator().manual_seed(0))
    assert server["member_ids"] == [1, 3]


def test_impossible_options_are_named() -> None:
    with pytest.raises(ConfigError, match="cv_folds"):
        load_config(tiny_config(name="oneshot", options={"selection": "cv"}))
    with pytest.raises(ConfigError, match="input_range"):
        load_config(tiny_config(options={"input_range": [1.0, 0.0]}))
    config = tiny_config()
    config.update({"task": "fewshot", "splits": {"train": "base", "val": None, "test": "novel"}})
    config["partition"] = {"name": "iid", "num_clients": 5}
    with pytest.raises(ValueError, match="task: classification"):
        build_experiment(load_config(config))
    experiment = build_experiment(load_config(tiny_config(options={"ensemble_size": 9})))
    _, outcome = one_round(tiny_config(options={"attack_steps": 1}))
    with pytest.raises(ValueError, match="ensemble_size=9"):
        experiment.algorithm.aggregate(outcome.server, outcome.results, torch.Generator())
    with pytest.raises(ValueError, match="no test data"):
        experiment.algorithm.evaluate({"members": [outcome.results[0].upload["model"]]}, EvalData("test"),
                                      torch.Generator())


def test_committed_configs_are_valid_for_every_compared_method() -> None:
    """Every method (row) of the AdFL studies applies to every committed AdFL config, CIFAR-10's included."""
    from pathlib import Path

    import yaml

    from fedfew.study.study_file import load_study

    repo = Path(__file__).resolve().parents[2]
    configs = sorted((repo / "configs" / "adfl").glob("*.yaml"))
    assert len(configs) == 4
    studies = [load_study(p)[0] for p in sorted((repo / "studies").glob("adfl_*.yaml"))]
    assert len(studies) == 3
    for study in studies:
        for method in study.methods.values():
            overrides = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix(chr(10) + '...')}"
                         for k, v in method.set.items()]
            for path in configs:
                config = load_config(path, overrides)
                assert config.task == "classification" and config.federation.rounds == 1
                assert config.partition.num_clients == config.federation.clients_per_round == 50


def test_mnist15k_joins_two_disjoint_parts(shared_data) -> None:
    from fedfew.data import load_dataset

    data = load_dataset("mnist15k", shared_data)
    assert len(data) == 15_000 and data.input_shape == (1, 28, 28)
    assert int((data.extras["source"] == 1).sum()) == 5_000
    assert float(data.inputs.min()) == 0.0 and float(data.inputs.max()) == 1.0


# -- the selection report in the test metrics (oneshot_report.py) -----------------------------------


def test_ranks_share_ties_and_correlations_match_hand_values() -> None:
    from fedfew.algorithms.parts.oneshot_report import descending_ranks, pearson, spearman

    assert descending_ranks(torch.tensor([3.0, 1.0, 3.0, 2.0])).tolist() == [1.5, 4.0, 1.5, 3.0]
    assert descending_ranks(torch.zeros(4)).tolist() == [2.5] * 4  # a selection that scores nothing: all mid
    # x = 1, 2, 3; y = 2, 4, 7: deviations (-1, 0, 1) and (-7/3, -1/3, 8/3); sum of products 5,
    # norms sqrt(2) and sqrt(114/9): r = 5 / sqrt(2 * 114 / 9) = 15 / sqrt(228)
    assert pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 7.0])) == pytest.approx(15 / math.sqrt(228))
    assert spearman(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 7.0])) == pytest.approx(1.0)
    assert spearman(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([9.0, 4.0, 7.0])) == pytest.approx(-0.5)
    assert pearson(torch.tensor([1.0, 2.0]), torch.tensor([5.0, 5.0])) is None


def test_corrupted_clients_rank_by_the_servers_score_and_count_when_selected() -> None:
    from fedfew.algorithms.parts.oneshot_report import corruption_metrics

    scores = {0: 5.0, 1: 1.0, 2: 3.0, 3: 3.0, 4: 0.0}  # ranks 1, 4, 2.5, 2.5, 5
    out = corruption_metrics([0, 1, 2, 3, 4], scores, [1, 4], [0, 2])
    assert out == {"corrupt_selected": 0, "corrupt_ranks": {"1": 4.0, "4": 5.0}, "corrupt_rank_mean": 4.5,
                   "corrupt_rank_best": 4.0}
    # no scores (random, all): only how many are in the combination; a corrupted client that did not reply is left out
    assert corruption_metrics([0, 1, 2], None, [1, 7], [1, 2]) == {"corrupt_selected": 1}
    assert corruption_metrics([0, 1, 2], scores, [], [0]) == {}


def test_adfl_reports_scores_ranks_and_each_clients_accuracy_without_changing_its_result() -> None:
    corrupt = {"corrupt": {"clients": [0, 1], "kind": "flip"}}
    config = tiny_config(options={"attack_steps": 5, "report_clients": True})
    config["partition"]["options"].update(corrupt)
    experiment, outcome = one_round(config)
    server, alg, test = outcome.server, experiment.algorithm, experiment.test
    metrics = alg.evaluate(server, test, torch.Generator())
    coherence = server["coherence"]
    assert metrics["client_scores"] == {str(i): coherence[i] for i in range(5)}
    order = sorted(range(5), key=lambda i: -coherence[i])  # no ties among real scores
    assert metrics["corrupt_ranks"] == {str(c): float(order.index(c) + 1) for c in (0, 1)}
    assert metrics["corrupt_selected"] == len({0, 1} & set(server["member_ids"]))
    assert metrics["own_success"] == server["own_success"]
    probs = member_probabilities(alg.model, [outcome.results[i].upload["model"] for i in range(5)], test.dataset.inputs)
    own = (probs.argmax(-1) == test.dataset.labels).double().mean(1)
    assert metrics["client_accuracy"] == {str(i): pytest.approx(float(own[i])) for i in range(5)}
    scores = torch.tensor([coherence[i] for i in range(5)], dtype=torch.float64)
    assert metrics["score_accuracy_pearson"] == pytest.approx(float(torch.corrcoef(torch.stack([scores, own]))[0, 1]))
    held = {int(c) for i in server["member_ids"] for c in experiment.clients[i].train.labels.unique()}
    assert metrics["member_classes"] == len(held)
    # the report changes neither the selection nor the accuracy: the same run without it
    config["algorithm"]["options"].pop("report_clients")
    _, plain = one_round(config)
    assert plain.server["member_ids"] == server["member_ids"] and "client_states" not in plain.server
    assert alg.evaluate(plain.server, test, torch.Generator())["accuracy"] == metrics["accuracy"]
    assert "client_accuracy" not in alg.evaluate(plain.server, test, torch.Generator())
    # the untrained control (nothing returned yet) reports nothing of the selection
    control = alg.evaluate(initial_server_state(alg, torch_generator(1, "server-init")), test, torch.Generator())
    assert not {"client_scores", "corrupt_selected", "own_success"} & set(control)


def test_oneshot_reports_cv_scores_and_no_scores_for_random_or_all() -> None:
    cv = tiny_config(name="oneshot", options={"selection": "cv", "cv_folds": 2, "cv_epochs": 1})
    cv["partition"]["options"]["corrupt"] = {"clients": [2], "kind": "noise"}
    experiment, outcome = one_round(cv)
    metrics = experiment.algorithm.evaluate(outcome.server, experiment.test, torch.Generator())
    assert metrics["client_scores"] == {str(i): float(outcome.results[i].upload["cv_score"]) for i in range(5)}
    assert set(metrics["corrupt_ranks"]) == {"2"} and "client_accuracy" not in metrics
    fedavg = tiny_config(name="oneshot", options={"selection": "all", "combine": "average"})
    fedavg["partition"]["options"]["corrupt"] = {"clients": [2], "kind": "noise"}
    experiment, outcome = one_round(fedavg)
    metrics = experiment.algorithm.evaluate(outcome.server, experiment.test, torch.Generator())
    assert metrics["corrupt_selected"] == 1 and "client_scores" not in metrics and "corrupt_ranks" not in metrics
