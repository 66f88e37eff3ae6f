"""``runtime.compile``: the clients' step through ``torch.compile`` (inductor, here on the CPU) gives the
eager path's numbers within float32 rounding. Stated tolerance: per-round mean client losses and
accuracies within a relative 1e-4 of the eager run's, the same clients, and the test accuracy within
0.02 (a compiled kernel may sum in another order; a few-shot test score moves by whole queries).
Compiling on the CPU takes tens of seconds, so one tiny FOMAML config, one round."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedfew.config.validation import ConfigError, load_config
from fedfew.run.experiment import build_experiment
from tests.tiny import simulate, tiny_config

pytestmark = pytest.mark.slow


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


@pytest.mark.parametrize("batched", [False, True], ids=["sequential", "batched"])
def test_the_compiled_step_equals_the_eager_one(batched: bool) -> None:
    extra = ["runtime.batch_clients=true"] if batched else []
    assert_close(run(extra), run([*extra, "runtime.compile=default"]))


def test_the_graph_captured_setting_equals_the_eager_one_on_the_cpu() -> None:
    # "reduce-overhead" captures CUDA graphs on a GPU; on the CPU it is inductor without graphs: the
    # same compiled step the GPU session replays (benchmarks/gpu_checks.sh, the graph-captured setting)
    extra = ["runtime.batch_clients=true"]
    assert_close(run(extra), run([*extra, "runtime.compile=reduce-overhead"]))


def test_compile_outside_this_process_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="runtime.compile"):
        load_config(tiny_config("fl-maml"), ["runtime.compile=default", "runtime.workers=2"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_the_graph_captured_batched_step_on_cuda_equals_the_eager_one() -> None:
    # benchmarks/gpu_checks.sh runs this (-k cuda): CUDA graphs captured at the first round, replayed after
    extra = ["runtime.batch_clients=true", "runtime.device=cuda", "federation.rounds=2"]
    assert_close(run(extra), run([*extra, "runtime.compile=reduce-overhead"]))
