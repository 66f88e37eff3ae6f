"""``runtime.batch_clients`` (fedfew.engine.batched): a round's clients as one batched computation give
the sequential path's numbers up to floating-point summation order.

Stated tolerance (fp32): per-round mean client losses and accuracies within a relative 1e-4 of the
sequential run's, the same clients asked / trained / failed and the same bytes; the final server
model's logits on test images within 1e-3 (relative to their scale) and its parameters within a
relative 1e-3 in L2, except the convolution biases that BatchNorm cancels: they change no output,
their gradients are rounding noise, and Adam turns that noise into steps of its learning rate."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fedfew.config.validation import load_config
from fedfew.run.experiment import build_experiment
from tests.tiny import simulate, tiny_config

#: (algorithm, extra options): the episodic family the batched path supports.
SUPPORTED = [
    ("fl-maml", {}),  # second-order MAML
    ("fl-maml", {"first_order": True}),  # FOMAML (the peers' workload)
    ("fl-proto", {}),
    ("fedfsl-prox", {"mu": 0.5}),  # the two-layer classifier and a proximal term
]


def run(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    cfg = load_config(config, overrides)
    experiment = build_experiment(cfg)
    simulator = experiment.simulator()
    out = simulate(simulator, cfg)
    model = experiment.algorithm.new_model()
    model.load_state_dict(simulator.server["model"])
    images = experiment.test.episodes[0].query  # type: ignore[union-attr]
    with torch.no_grad():
        logits = model(images)
    return {"history": out["history"], "test": out["test"], "engine": type(simulator.engine).__name__,
            "model": simulator.server["model"], "logits": logits}


def assert_rows_close(sequential: dict[str, Any], batched: dict[str, Any], rel: float = 1e-4) -> None:
    assert set(sequential) == set(batched)
    for key, value in sequential.items():
        if isinstance(value, float):
            assert batched[key] == pytest.approx(value, rel=rel, abs=1e-7), key
        else:
            assert batched[key] == value, key


@pytest.mark.parametrize(("name", "options"), SUPPORTED, ids=[f"{n}{'-fo' if o.get('first_order') else ''}"
                                                               for n, o in SUPPORTED])
def test_batched_clients_equal_the_sequential_path(name: str, options: dict[str, Any]) -> None:
    config = tiny_config(name, federation={"rounds": 2, "dropout": 0.25})
    config["algorithm"]["options"].update(options)
    sequential = run(config, [])
    batched = run(config, ["runtime.batch_clients=true"])
    assert batched["engine"] == "BatchedEngine" and sequential["engine"] == "InProcessEngine"
    assert len(sequential["history"]) == 2
    assert any(row["clients"]["failed"] for row in sequential["history"])  # faults drawn the same way
    for seq_row, bat_row in zip(sequential["history"], batched["history"], strict=True):
        assert_rows_close(seq_row, bat_row)
    assert_rows_close(sequential["test"], batched["test"])
    scale = float(sequential["logits"].abs().max())
    assert (batched["logits"] - sequential["logits"]).abs().max() <= 1e-3 * scale
    # Conv4's convolution biases feed BatchNorm, which subtracts them again: they change no output, their
    # gradients are rounding noise, and Adam turns noise into steps of size lr. Compare the others.
    kept = [k for k in sorted(sequential["model"]) if not re.fullmatch(r"encoder\.\d+\.0\.bias", k)]
    assert len(kept) < len(sequential["model"])
    flat = [torch.cat([m[k].reshape(-1) for k in kept]) for m in (sequential["model"], batched["model"])]
    assert torch.linalg.vector_norm(flat[1] - flat[0]) <= 1e-3 * torch.linalg.vector_norm(flat[0])


def test_the_run_folders_metrics_agree(tmp_path: Path) -> None:
    """Through the command line: metrics.jsonl of a batched run against a sequential one."""
    from fedfew.cli.main import main

    config = tiny_config("fl-maml", federation={"rounds": 2})
    config["algorithm"]["options"]["first_order"] = True
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    rows = {}
    for label, extra in (("sequential", []), ("batched", ["--set", "runtime.batch_clients=true"])):
        out = tmp_path / label
        assert main(["run", str(path), "--out", str(out), "--quiet", *extra]) == 0
        (metrics,) = out.rglob("metrics.jsonl")
        rows[label] = [json.loads(line) for line in metrics.read_text().splitlines()]
        for row in rows[label]:
            row.pop("seconds", None)
    assert len(rows["sequential"]) == 2
    for seq_row, bat_row in zip(rows["sequential"], rows["batched"], strict=True):
        assert_rows_close(seq_row, bat_row)


def test_an_algorithm_without_a_batched_update_is_a_one_line_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.cli.main import main

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fedavg")))
    assert main(["run", str(path), "--set", "runtime.batch_clients=true", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "runtime.batch_clients" in err and "fedavg" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
@pytest.mark.parametrize(("name", "options"), SUPPORTED)
def test_batched_clients_on_cuda_equal_the_cpu(name: str, options: dict[str, Any]) -> None:
    config = tiny_config(name, federation={"rounds": 2})
    config["algorithm"]["options"].update(options)
    cpu = run(config, [])
    gpu = run(config, ["runtime.batch_clients=true", "runtime.device=cuda"])
    assert gpu["engine"] == "BatchedEngine"
    for cpu_row, gpu_row in zip(cpu["history"], gpu["history"], strict=True):
        assert gpu_row["clients"] == cpu_row["clients"]
        assert gpu_row["train_loss"] == pytest.approx(cpu_row["train_loss"], rel=1e-3)
    assert gpu["test"]["accuracy"] == pytest.approx(cpu["test"]["accuracy"], abs=0.05)
