"""Where and in what precision the numbers are computed (fedfew.interface.compute): bf16 gives the fp32
accuracy within three points, and cuda without a GPU is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedfew.config.validation import load_config
from tests.tiny import tiny_config


# -- bf16 precision ------------------------------------------------------------------------------------------
def test_bf16_gives_the_fp32_accuracy_within_three_points() -> None:
    """runtime.precision: bf16 (autocast of matrix products and convolutions) on a small config: the
    test accuracy over the same 150 episodes is within 3 points of fp32's (the 95% interval of either
    is about 4 points), and the numbers are not fp32's (bf16 was really used)."""
    from fedfew.run.experiment import build_experiment

    results = {}
    for precision in ("fp32", "bf16"):
        config = load_config(tiny_config("fl-proto", episodes={"n_way": 3, "k_shot": 1, "q_query": 3,
                                                               "test_episodes": 150}),
                             [f"runtime.precision={precision}", "federation.rounds=3"])
        simulator = build_experiment(config).simulator()
        results[precision] = simulator.run(3, 4, 3)
    fp32, bf16 = results["fp32"], results["bf16"]
    assert abs(bf16["test"]["accuracy"] - fp32["test"]["accuracy"]) <= 0.03, (fp32["test"], bf16["test"])
    assert bf16["history"][0]["train_loss"] != fp32["history"][0]["train_loss"]


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
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "fedfew.cli.main", "run", str(demo_config_path()), "--set",
                           "runtime.device=cuda", "--out", str(tmp_path), "--quiet", *extra],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "runtime.device=cuda" in lines[0] and "no CUDA GPU" in lines[0], done.stderr
