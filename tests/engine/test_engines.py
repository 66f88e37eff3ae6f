"""Engines run every algorithm unchanged: worker processes give exactly the in-process numbers; the
state store bounds memory by spilling to disk with the same numbers; the CUDA path where a GPU is."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from fedfew.config.validation import load_config
from fedfew.engine.tasks import ClientTask
from fedfew.engine.workers import WorkersEngine
from fedfew.interface.algorithm import Algorithm, ClientData, ClientResult, Options
from fedfew.run.experiment import build_experiment
from tests.tiny import ALGORITHM_SETUPS, simulate, tiny_config


def run(config: dict[str, Any], overrides: list[str], states_dir: Path | None = None) -> dict[str, Any]:
    cfg = load_config(config, overrides)
    simulator = build_experiment(cfg).simulator(states_dir=states_dir)
    out = simulate(simulator, cfg)
    return {"history": out["history"], "test": out["test"], "selected": out["selected_round"],
            "engine": type(simulator.engine).__name__}


def test_every_registered_algorithm_has_a_small_config() -> None:
    """The engine, fault, resume and Flower tests run every algorithm through tests/tiny.py."""
    from fedfew.algorithms import register_all
    register_all()  # the built-in algorithms, registered
    from fedfew.interface.registration import ALGORITHMS

    assert set(ALGORITHMS.names()) == set(ALGORITHM_SETUPS)


@pytest.mark.parametrize("name", sorted(ALGORITHM_SETUPS))
def test_two_workers_equal_one_process(name: str) -> None:
    config = tiny_config(name, federation={"rounds": 2, "dropout": 0.25})
    inprocess = run(config, ["runtime.workers=0"])
    one = run(config, ["runtime.workers=1"])
    two = run(config, ["runtime.workers=2"])
    assert two["engine"] == "WorkersEngine"
    assert two["history"] == inprocess["history"] == one["history"]
    assert two["test"] == inprocess["test"] == one["test"]


class WhereIsMyData(Algorithm):
    """Reports, from wherever a client update runs, the process and the address of the client's data."""

    name = "where-is-my-data"

    def init_server(self, generator: torch.Generator) -> Any:
        return {}

    def broadcast(self, server: Any, client_id: int) -> dict[str, Any]:
        return {}

    def client_update(self, payload: dict[str, Any], state: Any, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        return ClientResult(upload={}, state=state,
                            metrics={"pid": float(os.getpid()), "address": float(data.train.inputs.data_ptr())})


def test_workers_are_stopped_and_share_the_data() -> None:
    """The workers are forked after the data is built: each client's tensors are at the same address in
    the worker as here (inherited copy-on-write, never pickled or copied), and the updates ran in the
    workers, not here."""
    cfg = load_config(tiny_config("fl-proto"), ["runtime.workers=2"])
    experiment = build_experiment(cfg)
    simulator = experiment.simulator()
    engine = simulator.engine
    assert isinstance(engine, WorkersEngine)
    pids = engine.pids
    assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    simulator.run(1, 4, 1)
    engine.close()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()

    probe = WhereIsMyData(Options(), experiment.context)
    with WorkersEngine(probe, experiment.clients, 0, workers=2) as workers:
        replies = workers.execute(ClientTask(round=0, round_key="0"), {c.client_id: {} for c in experiment.clients})
        pids = set(workers.pids)
    assert sorted(replies.results) == [c.client_id for c in experiment.clients]
    for client in experiment.clients:
        metrics = replies.results[client.client_id].metrics
        assert int(metrics["pid"]) in pids and int(metrics["pid"]) != os.getpid()
        assert int(metrics["address"]) == client.train.inputs.data_ptr()  # the parent's tensor, shared


@pytest.mark.parametrize("name", ["f2l", "fml", "local"])
def test_states_spilled_to_disk_give_the_same_numbers(name: str, tmp_path: Path) -> None:
    config = tiny_config(name, federation={"rounds": 2})
    memory = run(config, ["runtime.client_states=memory"])
    disk = run(config, ["runtime.client_states=disk"], states_dir=tmp_path)
    assert disk["history"] == memory["history"] and disk["test"] == memory["test"]
    assert len(list(tmp_path.glob("client-*.safetensors"))) >= 4  # the states live in files


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
@pytest.mark.parametrize("name", sorted(ALGORITHM_SETUPS))
def test_every_algorithm_runs_on_cuda(name: str) -> None:
    config = tiny_config(name, federation={"rounds": 2})
    cpu = run(config, ["runtime.device=cpu"])
    gpu = run(config, ["runtime.device=cuda"])
    for cpu_row, gpu_row in zip(cpu["history"], gpu["history"], strict=True):  # fp32: no TF32 shortcuts on cuda
        if cpu_row.get("train_loss") is not None:
            assert gpu_row["train_loss"] == pytest.approx(cpu_row["train_loss"], rel=1e-3)
    assert gpu["test"]["accuracy"] == pytest.approx(cpu["test"]["accuracy"], abs=0.15)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
@pytest.mark.parametrize("name", sorted(ALGORITHM_SETUPS))
def test_every_algorithm_starts_from_the_same_numbers_on_cuda(name: str) -> None:
    """Models are initialised from the CPU's random numbers wherever they live: the server's initial
    state on cuda is the CPU's, bit for bit (a module built under the cuda default device would draw
    from the CUDA generator instead)."""
    from fedfew.interface.serialize import flatten as flatten_tree

    states = {}
    for device in ("cpu", "cuda"):
        simulator = build_experiment(load_config(tiny_config(name), [f"runtime.device={device}"])).simulator()
        try:
            states[device] = flatten_tree(simulator.state.server, dedup=False)[0]
        finally:
            simulator.engine.close()
    assert sorted(states["cuda"]) == sorted(states["cpu"])
    for key, tensor in states["cpu"].items():
        assert torch.equal(states["cuda"][key].cpu(), tensor), key


def test_tf32_off_cuda_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.cli.main import demo_config_path, main

    assert main(["run", str(demo_config_path()), "--set", "runtime.precision=tf32", "--set", "runtime.device=cpu",
                 "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "runtime.precision=tf32" in err


def test_cuda_asked_without_a_gpu_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from fedfew.cli.main import demo_config_path, main

    assert main(["run", str(demo_config_path()), "--set", "runtime.device=cuda", "--out", str(tmp_path),
                 "--quiet"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
