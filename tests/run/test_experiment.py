"""From a validated config to a built experiment (fedfew.run.experiment): the training episodes' shape,
held-out test samples (``splits.test: {classes, holdout}``), ``model.init_seed``, the data's loading
time, the refusals of what the data or the algorithm cannot do (one class in all, ``eval.per_class``),
and ``runtime.compile`` (marked ``slow``): the compiled step gives the eager numbers within float32
rounding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from fedfew.config.validation import ConfigError, load_config
from fedfew.models import build_model
from fedfew.run.experiment import build_experiment, training_episode
from fedfew.run.runner import run_experiment
from fedfew.study.grid import config_hash
from tests.cli.common import one_line
from tests.tiny import simulate, tiny_config

HELD = {"classes": ["5", "6", 7], "holdout": 0.25}  # names or ids


def _experiment(test: object = HELD, **sections: object):
    config = tiny_config("fl-maml", splits={"train": "base", "val": None, "test": test},
                         dataset={"name": "digits", "options": {"class_split": {"base": "rest"}}}, **sections)
    return build_experiment(load_config(config))


def test_held_out_samples_are_tested_on_and_never_trained_on() -> None:
    experiment = _experiment()
    labels = experiment.dataset.labels
    counts = torch.bincount(labels, minlength=10)
    trained = torch.cat([c.train.positions for c in experiment.clients])
    assert len(set(trained.tolist())) == len(trained)  # the partition gives each sample to one client
    tested = {p for ep in experiment.test.episodes for p in torch.cat([ep.support_index, ep.query_index]).tolist()}
    assert tested and not tested & set(trained.tolist())  # no test sample is a training sample
    assert {int(labels[p]) for p in tested} <= {5, 6, 7}
    for c in range(10):  # classes 5, 6, 7: all but round(0.25 n) samples train; the others train whole
        in_training = int((labels[trained] == c).sum())
        held = round(0.25 * int(counts[c])) if c in (5, 6, 7) else 0
        assert in_training == int(counts[c]) - held, c
    # the same seed holds out the same samples; another seed others
    assert [ep.query_index.tolist() for ep in _experiment().test.episodes] == \
        [ep.query_index.tolist() for ep in experiment.test.episodes]
    other = _experiment(seed=1)
    assert set(torch.cat([c.train.positions for c in other.clients]).tolist()) != set(trained.tolist())


def test_a_named_split_is_unchanged_and_bad_holdouts_are_one_line_errors() -> None:
    assert load_config(tiny_config("fl-maml")).splits.model_dump()["test"] == "novel"  # old configs' keys stay
    with pytest.raises(ConfigError, match=r"splits\.test\.classes: unknown class 'five'"):
        _experiment({"classes": ["five", "6"], "holdout": 0.5})
    with pytest.raises(ConfigError, match=r"splits\.test\.holdout"):
        load_config(tiny_config("fl-maml", splits={"test": {"classes": [5, 6], "holdout": 1.0}}))
    with pytest.raises(ConfigError, match=r"episodes: .*3-way"):  # too few held-out samples for the episodes
        _experiment({"classes": [5, 6, 7], "holdout": 0.005})
    with pytest.raises(ConfigError, match=r"splits\.test\.holdot: unknown key.*holdout"):
        load_config(tiny_config("fl-maml", splits={"test": {"classes": [5, 6], "holdot": 0.5}}))


def run(overrides: list[str]) -> dict[str, Any]:
    config = tiny_config("fl-maml", federation={"rounds": 1}, episodes={"n_way": 3, "k_shot": 1, "q_query": 2,
                                                                       "test_episodes": 3})
    config["algorithm"]["options"].update({"first_order": True, "local_steps": 1, "test_inner_steps": 1})
    cfg = load_config(config, overrides)
    return simulate(build_experiment(cfg).simulator(), cfg)


def assert_close(eager: dict[str, Any], compiled: dict[str, Any]) -> None:
    for row_e, row_c in zip(eager["history"], compiled["history"], strict=True):
        assert set(row_e) == set(row_c)
        for key, value in row_e.items():
            if isinstance(value, float):
                assert row_c[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
            else:
                assert row_c[key] == value, key
    assert compiled["test"]["accuracy"] == pytest.approx(eager["test"]["accuracy"], abs=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("batched", [False, True], ids=["sequential", "batched"])
def test_the_compiled_step_equals_the_eager_one(batched: bool) -> None:
    extra = ["runtime.batch_clients=true"] if batched else []
    assert_close(run(extra), run([*extra, "runtime.compile=default"]))


@pytest.mark.slow
def test_the_graph_captured_setting_equals_the_eager_one_on_the_cpu() -> None:
    # "reduce-overhead" captures CUDA graphs on a GPU; on the CPU it is inductor without graphs: the
    # same compiled step the GPU session replays (benchmarks/gpu_checks.sh, the graph-captured setting)
    extra = ["runtime.batch_clients=true"]
    assert_close(run(extra), run([*extra, "runtime.compile=reduce-overhead"]))


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_the_graph_captured_batched_step_on_cuda_equals_the_eager_one() -> None:
    # benchmarks/gpu_checks.sh runs this (-k cuda): CUDA graphs captured at the first round, replayed after
    extra = ["runtime.batch_clients=true", "runtime.device=cuda", "federation.rounds=2"]
    assert_close(run(extra), run([*extra, "runtime.compile=reduce-overhead"]))


def test_an_arrays_file_of_one_class_says_how_many_classes_it_has(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "one.npz", x=np.random.default_rng(0).random((50, 1, 8, 8), dtype=np.float32),
             y=np.zeros(50, dtype=np.int64))
    config = tiny_config("fl-proto", dataset={"name": "arrays", "options": {"path": str(tmp_path / "one.npz")}})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    line = one_line(capsys, "run", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"))
    assert "1 class(es) in all" in line, line


def test_the_time_to_load_the_data_is_reported_beside_the_run(tmp_path: Path) -> None:
    from fedfew.run.experiment import dataset_cache
    from fedfew.run.results import markdown_table

    config = load_config(tiny_config("fl-proto", federation={"rounds": 0}))
    with dataset_cache():
        first = run_experiment(config, tmp_path, progress=False)
        second = run_experiment(config, tmp_path, progress=False)  # the data comes from the cache
    assert first["data_seconds"] > 0 and second["data_seconds"] == first["data_seconds"]
    assert "| data s |" in markdown_table([first]).splitlines()[0]


def test_init_seed_builds_the_model_of_torch_manual_seed() -> None:
    config = tiny_config("fl-maml")
    config["model"]["init_seed"] = 7
    experiment = build_experiment(load_config(config))
    server = experiment.simulator().server["model"]
    torch.manual_seed(7)
    reference = build_model("conv4", experiment.context.input_shape, 3, hidden=8)
    assert all(torch.equal(server[k], v) for k, v in reference.state_dict().items())
    other = build_experiment(load_config(tiny_config("fl-maml"))).simulator().server["model"]
    assert not all(torch.equal(server[k], other[k]) for k in server)


def proto(**options: object) -> dict:
    config = tiny_config("fl-proto", partition={"name": "iid", "num_clients": 1, "options": {}},
                         federation={"rounds": 3, "clients_per_round": 1})
    config["algorithm"]["options"].update(options)
    return config


def test_the_training_shape_is_the_evaluations_unless_given() -> None:
    config = load_config(proto())
    assert (training_episode(config).n_way, training_episode(config).q_query) == (3, 3)
    wide = load_config({**proto(), "episodes": {**proto()["episodes"], "train_way": 5, "train_query": 2}})
    assert (training_episode(wide).n_way, training_episode(wide).k_shot, training_episode(wide).q_query) == (5, 1, 2)
    assert config_hash(config) == config_hash(load_config({**proto(), "episodes": {
        **proto()["episodes"], "train_way": None, "train_query": None}}))  # a stored cell keeps its key


def test_a_training_way_is_refused_for_an_algorithm_with_an_n_way_head(tmp_path: Path) -> None:
    config = tiny_config("fl-maml")
    config["episodes"] = {**config["episodes"], "train_way": 5}
    with pytest.raises(ConfigError, match=r"episodes.train_way: fl-maml .*only a head-less learner \(fl-proto\)"):
        run_experiment(load_config(config), tmp_path, progress=False)


def test_a_training_query_count_is_taken_by_the_episodic_family_only(tmp_path: Path) -> None:
    config = tiny_config("fl-maml")
    config["episodes"] = {**config["episodes"], "train_query": 1}
    run_experiment(load_config(config), tmp_path / "maml", progress=False)
    f2l = tiny_config("f2l")
    f2l["episodes"] = {**f2l["episodes"], "train_query": 1}
    with pytest.raises(ConfigError, match=r"episodes.train_query: f2l .*episodic FedAvg family"):
        run_experiment(load_config(f2l), tmp_path / "f2l", progress=False)


def test_per_class_is_refused_where_the_score_is_not_the_servers_episodes() -> None:
    for algorithm in ("local", "fml"):  # clients' own models; a classification task
        with pytest.raises(ConfigError, match=r"eval\.per_class"):
            build_experiment(load_config(tiny_config(algorithm, eval={"every": 1, "per_class": True})))
