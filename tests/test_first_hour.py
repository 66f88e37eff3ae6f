"""A newcomer's first hour (issue 24): the untrained control as a run, round 0 as a selection
candidate, what a run records about its data, intervals for every accuracy, the demo and README."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedfew.cli.main import main
from fedfew.config.validation import load_config
from fedfew.run.experiment import build_experiment
from fedfew.run.runner import run_experiment
from tests.tiny import ALGORITHM_SETUPS, tiny_config


# -- the untrained control: federation.rounds = 0 --------------------------------------------------
@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_SETUPS))
def test_zero_rounds_is_the_untrained_control(algorithm: str, tmp_path: Path) -> None:
    config = load_config(tiny_config(algorithm, federation={"rounds": 0}))
    summary = run_experiment(config, tmp_path, progress=False)
    folder = Path(summary["folder"])
    for name in ("config.yaml", "status.json", "metrics.jsonl", "summary.json", "results.md"):
        assert (folder / name).is_file(), name
    status = json.loads((folder / "status.json").read_text())
    assert status["status"] == "complete"
    written = json.loads((folder / "summary.json").read_text())
    assert written["control"] == "untrained" and written["selected_round"] == 0 and written["rounds"] == 0
    assert written["bytes_down"] == written["bytes_up"] == 0
    # The same evaluation of the same initial model, built afresh.
    experiment = build_experiment(config)
    simulator = experiment.simulator()
    try:
        expected = simulator.evaluate(experiment.test)
    finally:
        simulator.engine.close()
    assert written["test"]["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-12)


def test_zero_rounds_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    assert main(["run", str(config), "--set", "federation.rounds=0", "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (folder,) = (tmp_path / "runs").iterdir()
    assert json.loads((folder / "summary.json").read_text())["control"] == "untrained"
    assert "run failed" not in capsys.readouterr().err


# -- round 0 is a selection candidate; below-untrained warns -----------------------------------
WITH_VAL = {
    "dataset": {"name": "digits", "options": {"class_split": {"base": [0, 1, 2, 3], "val": [4, 5, 6],
                                                              "novel": [7, 8, 9]}}},
    "splits": {"train": "base", "val": "val", "test": "novel"},
    "episodes": {"n_way": 3, "k_shot": 1, "q_query": 3, "test_episodes": 20, "val_episodes": 20},
}


def wrecking(rounds: int = 3, **sections) -> dict:
    """fl-proto whose SGD step (lr 3) wrecks the encoder in every round, yet stays finite."""
    config = tiny_config("fl-proto", federation={"rounds": rounds}, **sections)
    config["algorithm"]["options"].update(optimizer="sgd", lr=3.0)
    return config


def test_round_0_is_selected_when_training_only_hurts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        summary = run_experiment(load_config(wrecking(**WITH_VAL)), tmp_path / "a", progress=False)
    history = summary["history"]
    assert all(h["train_loss"] < float("inf") for h in history)  # wrecked, not diverged to inf/nan
    initial = summary["initial_score"]
    assert initial["split"] == "val"
    assert all(h["val_accuracy"] < initial["accuracy"] for h in history)
    assert summary["selected_round"] == 0 and summary["below_initial"] is True
    assert summary["final_score"] == history[-1]["val_accuracy"] < initial["accuracy"]
    # The selected model is the untrained one: the control run's test score exactly.
    control = run_experiment(load_config(wrecking(0, **WITH_VAL)), tmp_path / "b",
                             progress=False)
    assert summary["test"] == control["test"]
    lines = [r.getMessage() for r in caplog.records if "below the untrained" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and "round 0" in lines[0]
    written = json.loads((Path(summary["folder"]) / "summary.json").read_text())
    assert written["below_initial"] is True and written["initial_score"]["accuracy"] == initial["accuracy"]


def test_without_validation_the_final_model_is_compared_on_test(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        summary = run_experiment(load_config(wrecking()), tmp_path, progress=False)
    assert summary["initial_score"]["split"] == "test" and summary["selected_round"] == 3
    assert summary["final_score"] == summary["test"]["accuracy"] < summary["initial_score"]["accuracy"]
    assert summary["below_initial"] is True
    assert any("below the untrained" in r.getMessage() and "on test" in r.getMessage() for r in caplog.records)


def test_a_run_that_beats_round_0_does_not_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tiny_config("fl-proto", federation={"rounds": 3}, **WITH_VAL)
    config["algorithm"]["options"].update(lr=0.01)
    with caplog.at_level("WARNING"):
        summary = run_experiment(load_config(config), tmp_path, progress=False)
    assert summary["selected_round"] > 0 and summary["selected_score"] > summary["initial_score"]["accuracy"]
    assert summary["below_initial"] is (summary["final_score"] < summary["initial_score"]["accuracy"])
    if not summary["below_initial"]:
        assert not any("below the untrained" in r.getMessage() for r in caplog.records)


# -- the run records its data ----------------------------------------------------------------
def test_run_folder_records_class_split_and_client_counts(tmp_path: Path) -> None:
    config = load_config(tiny_config("fl-proto", federation={"rounds": 1}, **WITH_VAL))
    summary = run_experiment(config, tmp_path, progress=False)
    record = json.loads((Path(summary["folder"]) / "data.json").read_text())
    assert record["class_split"] == {"base": ["0", "1", "2", "3"], "val": ["4", "5", "6"], "novel": ["7", "8", "9"]}
    assert record["splits_used"] == {"train": "base", "val": "val", "test": "novel"}
    assert record["bundled"] is True and record["samples"] == 1797 and record["classes"] == 10
    experiment = build_experiment(config)
    assert len(record["clients"]) == len(experiment.clients) == 4
    for entry, client in zip(record["clients"], experiment.clients):
        labels = client.train.labels.tolist()
        assert entry["classes"] == {str(c): labels.count(c) for c in sorted(set(labels))}
        assert entry["samples"] == len(labels) and set(entry["classes"]) <= {"0", "1", "2", "3"}
    base_samples = sum(int((experiment.dataset.labels == c).sum()) for c in range(4))
    assert sum(e["samples"] for e in record["clients"]) == base_samples  # every base sample dealt once


def test_data_record_names_the_source_file_and_its_size(tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path / "data" / "mine.npz"
    path.parent.mkdir()
    np.savez(path, x=rng.random((60, 4)).astype(np.float32), y=np.repeat(np.arange(6), 10))
    config = tiny_config("fl-proto", federation={"rounds": 0}, model={"name": "mlp", "options": {"hidden": 8}},
                         dataset={"name": "arrays", "root": str(tmp_path / "data"),
                                  "options": {"path": "mine.npz",
                                              "class_split": {"base": [0, 1, 2], "val": [], "novel": [3, 4, 5]}}})
    summary = run_experiment(load_config(config), tmp_path / "runs", progress=False)
    record = json.loads((Path(summary["folder"]) / "data.json").read_text())
    assert record["source"] == str(path) and record["source_bytes"] == path.stat().st_size
    assert record["data_folder"] == str((tmp_path / "data").resolve()) and record["samples"] == 60
    assert record["class_split"]["novel"] == ["3", "4", "5"]


# -- intervals for every accuracy -----------------------------------------------------------------
def test_wilson_interval_by_hand() -> None:
    from fedfew.fewshot.evaluation import wilson

    # 8 of 10, z = 1.96: centre (0.8 + 1.96^2/20) / (1 + 1.96^2/10) = 0.99208 / 1.38416 = 0.716738,
    # half-width 1.96 sqrt(0.8 * 0.2 / 10 + 1.96^2 / 400) / 1.38416 = 1.96 * 0.160012 / 1.38416 = 0.226579.
    low, high = wilson(8, 10)
    assert low == pytest.approx(0.490160, abs=1e-5) and high == pytest.approx(0.943317, abs=1e-5)
    # 0 of 20 does not collapse to a point: [0, 1.96^2 / (20 + 1.96^2)] = [0, 3.8416 / 23.8416] = [0, 0.161130].
    assert wilson(0, 20) == pytest.approx((0.0, 0.161130), abs=1e-6)
    assert wilson(20, 20)[1] == 1.0 and wilson(20, 20)[0] == pytest.approx(1 - 0.161130, abs=1e-6)
    with pytest.raises(ValueError):
        wilson(3, 2)


@pytest.mark.parametrize("algorithm", ["fml", "fedavg", "adfl"])
def test_classification_accuracies_get_a_wilson_interval(algorithm: str, tmp_path: Path) -> None:
    from fedfew.fewshot.evaluation import wilson
    from fedfew.run.results import markdown_table

    config = tiny_config(algorithm)
    if algorithm == "fedavg":
        config = {**config, "task": "classification", "partition": {"name": "iid", "num_clients": 4},
                  "model": {"name": "mlp", "options": {"hidden": 16}}}
    summary = run_experiment(load_config(config), tmp_path, progress=False)
    test = summary["test"]
    n = len(build_experiment(load_config(config)).test.dataset)
    assert test["ci_method"] == f"Wilson, {n} samples"
    assert (test["ci_low"], test["ci_high"]) == pytest.approx(wilson(round(test["accuracy"] * n), n))
    assert test["ci_low"] <= test["accuracy"] <= test["ci_high"]
    row = markdown_table([summary]).splitlines()[2]
    assert f"[{100 * test['ci_low']:.2f}, {100 * test['ci_high']:.2f}]" in row and f"Wilson, {n} samples" in row


def test_episodic_accuracies_say_how_their_interval_was_computed(tmp_path: Path) -> None:
    summary = run_experiment(load_config(tiny_config("fl-proto", federation={"rounds": 1})), tmp_path, progress=False)
    assert summary["test"]["ci_method"] == "normal, 6 episodes" and summary["test"]["ci95"] >= 0
    assert "normal, 6 episodes" in (Path(summary["folder"]) / "results.md").read_text()


# -- the command line a newcomer meets ------------------------------------------------------------
def test_list_columns_stay_aligned_with_long_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "long.py"
    plugin.write_text("from fedfew.data import DATASETS\n\n"
                      "@DATASETS.register('a-dataset-with-a-rather-long-name', help='LONG')\n"
                      "def load(root):\n    raise NotImplementedError\n")
    assert main(["list", "datasets", "--plugin", str(plugin)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    starts = {len(line) - len(line[2:].split(" ", 1)[1].lstrip()) for line in rows}
    assert len(starts) == 1  # every description starts in the same column
    assert any("a-dataset-with-a-rather-long-name  LONG" in line for line in rows)


def test_a_sweep_error_names_the_grid_point(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from fedfew.cli.main import demo_config_path

    code = main(["sweep", str(demo_config_path()), "--grid", "federation.clients_per_round=5,20",
                 "--out", str(tmp_path / "sweep"), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "grid point federation.clients_per_round=20:" in err and "exceeds partition.num_clients=10" in err
    assert not (tmp_path / "sweep").exists()  # nothing ran


@pytest.mark.parametrize("command", ["resume", "evaluate"])
def test_help_examples_are_accepted(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The --set example each command's help gives is one that command takes."""
    import re

    from fedfew.run.rescore import EVALUATE_KEYS

    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    (example,) = re.findall(r"e\.g\. --set (\S+)", help_text)
    key = example.split("=")[0]
    assert key.startswith("runtime.") if command == "resume" else key.startswith(EVALUATE_KEYS)


# -- the bundled Omniglot --------------------------------------------------------------------------
def test_omniglot_mini_is_bundled_with_alphabet_splits() -> None:
    from fedfew.data import load_dataset

    data = load_dataset("omniglot-mini", "/nonexistent")  # no data folder needed
    assert tuple(data.inputs.shape) == (1623 * 20, 1, 28, 28) and data.num_classes == 1623
    assert set(data.inputs.unique().tolist()) == {0.0, 1.0}
    splits = {k: set(v) for k, v in data.splits.items()}
    assert len(splits["base"]) == 964 and len(splits["val"]) == 100 and len(splits["novel"]) == 559
    assert splits["base"] == set(range(964))  # the 30 background alphabets
    assert not (splits["val"] & splits["novel"]) and splits["val"] | splits["novel"] == set(range(964, 1623))
    assert all(data.class_names[c].startswith("evaluation/") for c in splits["novel"])


def test_omniglot_mini_is_made_from_the_original_files(shared_data: Path) -> None:
    """The committed file is what scripts/make_omniglot_mini.py makes from Omniglot's npz release."""
    import importlib.util

    import numpy as np

    from fedfew.data import load_dataset

    spec = importlib.util.spec_from_file_location("make", Path(__file__).parents[1] / "scripts" / "make_omniglot_mini.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    with np.load(shared_data / "omniglot" / "images_evaluation.npz") as archive:
        original = archive["images"][[0, 658]]  # the first and last evaluation characters
    data = load_dataset("omniglot-mini")
    for k, char in enumerate((964, 1622)):
        expected = make.shrink(original[k].reshape(-1, 105, 105))
        mine = data.inputs[data.labels == char][:, 0].numpy().astype(bool)
        assert np.array_equal(mine, expected)


def test_the_time_to_load_the_data_is_reported_beside_the_run(tmp_path: Path) -> None:
    from fedfew.run.experiment import dataset_cache
    from fedfew.run.results import markdown_table

    config = load_config(tiny_config("fl-proto", federation={"rounds": 0}))
    with dataset_cache():
        first = run_experiment(config, tmp_path, progress=False)
        second = run_experiment(config, tmp_path, progress=False)  # the data comes from the cache
    assert first["data_seconds"] > 0 and second["data_seconds"] == first["data_seconds"]
    assert "| data s |" in markdown_table([first]).splitlines()[0]
