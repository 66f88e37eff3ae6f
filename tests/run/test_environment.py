"""Where a run's numbers were computed (fedfew.run.environment): environments compare everything but
fedfew's version."""

from __future__ import annotations

from fedfew.run.environment import describe, same_environment

ENV = {"python": "3.11.7", "torch": "2.13.0+cpu", "numpy": "2.2.1", "fedfew": "0.1.0", "platform": "Linux x86_64",
       "cpu": "Some CPU", "cpu_capability": "AVX512", "device": "cpu", "gpu": None, "cuda": None, "threads": 1,
       "precision": "fp32"}


def test_environments_compare_everything_but_fedfews_version() -> None:
    assert same_environment(ENV, {**ENV, "fedfew": "9.9.9"})
    assert not same_environment(ENV, {**ENV, "cpu_capability": "AVX2"})
    assert not same_environment(ENV, {**ENV, "threads": 2})
    assert not same_environment(None, ENV) and not same_environment(None, None)  # unknown is not the same
    gpu = {**ENV, "device": "cuda", "gpu": "NVIDIA H200", "cuda": "12.8"}
    assert describe(gpu).startswith("NVIDIA H200 (CUDA 12.8), ") and describe(ENV).startswith("Some CPU (AVX512), ")
