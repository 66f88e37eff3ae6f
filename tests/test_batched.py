"""``runtime.batch_clients``: a round's clients as one batched computation give the sequential path's
numbers up to floating-point summation order.

Stated tolerance (fp32): per-round mean client losses and accuracies within a relative 1e-4 of the
sequential run's, the same clients asked / trained / failed and the same bytes; the final server
model's logits on test images within 1e-3 (relative to their scale) and its parameters within a
relative 1e-3 in L2, except the convolution biases that BatchNorm cancels: they change no output,
their gradients are rounding noise, and Adam turns that noise into steps of size lr whatever the
summation order (one grouped convolution here instead of one per client).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fedfew.config.validation import load_config
from fedfew.engine.batched import BatchingUnsupportedError
from fedfew.fewshot.episodes import Episode
from fedfew.fewshot.learners import MAML, ProtoNet
from fedfew.fewshot.stacked import StackedEpisodes, stack_states, stacked_forward, why_not_stackable
from fedfew.models import build_model
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


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("head", [5, None, "mlp"])
def test_stacked_forward_is_each_clients_own_model(channels_last: bool, head: int | str | None) -> None:
    torch.manual_seed(0)
    models = [build_model("conv4", (1, 28, 28), None if head == "mlp" else head, hidden=8,
                          channels_last=channels_last) for _ in range(3)]
    if head == "mlp":
        for m in models:
            m.head = torch.nn.Sequential(torch.nn.Linear(m.feature_dim, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    names = [k for k, _ in models[0].named_parameters()]
    params = stack_states([dict(m.named_parameters()) for m in models], names)
    x = torch.rand(3, 7, 1, 28, 28)
    with torch.no_grad():
        out = stacked_forward(models[0], params, x)
        features = stacked_forward(models[0], params, x, features=True)
        for c, model in enumerate(models):
            torch.testing.assert_close(out[c], model(x[c]), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(features[c], model.features(x[c]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("learner", [MAML(0.1, 2, 2, first_order=False), MAML(0.4, 1, 3, first_order=True),
                                     ProtoNet()], ids=["maml", "fomaml", "proto"])
def test_the_gradient_of_the_summed_losses_is_each_clients_own(learner: Any) -> None:
    torch.manual_seed(1)
    models = [build_model("conv4", (1, 28, 28), 3 if isinstance(learner, MAML) else None, hidden=8)
              for _ in range(3)]
    episodes = [Episode(torch.rand(3, 1, 28, 28), torch.arange(3), torch.rand(6, 1, 28, 28),
                        torch.arange(3).repeat_interleave(2), torch.arange(3), torch.arange(3), torch.arange(6))
                for _ in models]
    names = [k for k, _ in models[0].named_parameters()]
    params = {k: v.requires_grad_() for k, v in stack_states([dict(m.named_parameters()) for m in models],
                                                            names).items()}
    losses, logits = learner.stacked_loss(models[0], params, StackedEpisodes(episodes))
    losses.sum().backward()
    for c, (model, episode) in enumerate(zip(models, episodes)):
        loss, own_logits = learner.loss(model, episode)
        loss.backward()
        torch.testing.assert_close(losses[c], loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(logits[c], own_logits, rtol=1e-4, atol=1e-5)
        # one scale for the whole model: the gradients of the convolution biases BatchNorm cancels are
        # zero up to rounding, so no relative bound holds for them alone
        scale = max(float(p.grad.abs().max()) for p in model.parameters())
        for name, p in model.named_parameters():
            assert float((params[name].grad[c] - p.grad).abs().max()) <= 1e-4 * scale, name


def test_an_algorithm_without_a_batched_update_is_a_one_line_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.cli.main import main

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fedavg")))
    assert main(["run", str(path), "--set", "runtime.batch_clients=true", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "runtime.batch_clients" in err and "fedavg" in err


def test_a_model_that_cannot_be_stacked_is_named() -> None:
    model = build_model("conv4", (1, 28, 28), 5, hidden=8, track_running_stats=True)
    assert "running statistics" in (why_not_stackable(model) or "")
    config = tiny_config("fl-maml")
    config["model"]["options"]["track_running_stats"] = True
    experiment = build_experiment(load_config(config, ["runtime.batch_clients=true"]))
    with pytest.raises(BatchingUnsupportedError, match="runtime.batch_clients: fl-maml's model"):
        experiment.simulator()


def test_batch_clients_with_worker_processes_is_a_config_error() -> None:
    with pytest.raises(Exception, match="runtime.batch_clients"):
        load_config(tiny_config("fl-maml"), ["runtime.batch_clients=true", "runtime.workers=2"])


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


@pytest.mark.parametrize("extra", [[], ["--set", "runtime.batch_clients=true"]], ids=["sequential", "batched"])
def test_cuda_without_a_gpu_is_one_line_and_exit_2(tmp_path: Path, extra: list[str]) -> None:
    """The whole command, as a user runs it: no traceback, one line naming the key, exit 2."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    import os
    import subprocess
    import sys

    from fedfew.cli.main import demo_config_path
    from fedfew.core.errors import UsageError
    from fedfew.interface.compute import DeviceError

    assert issubclass(DeviceError, UsageError)
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "fedfew.cli.main", "run", str(demo_config_path()), "--set",
                           "runtime.device=cuda", "--out", str(tmp_path), "--quiet", *extra],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "runtime.device=cuda" in lines[0] and "no CUDA GPU" in lines[0], done.stderr
