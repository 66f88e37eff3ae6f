"""``runtime.precision: auto`` (fedfew.interface.precision): bf16 only where the hardware computes it natively, an
explicit bf16 on a CPU without it warned about once with the slowdown's order, and the summary and the
record's environment say which precision ran and why. The decision is tested with both answers of the
hardware (the CPU's flags, the GPU's bf16 support), whatever this machine has."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fedfew.config.validation import load_config
from fedfew.interface import precision
from fedfew.interface.precision import choose_precision, native_bf16
from fedfew.run.environment import run_environment
from fedfew.run.runner import run_experiment
from tests.tiny import tiny_config

NATIVE = {"fpu", "avx2", "avx512f", "avx512_bf16"}
AMX = {"fpu", "avx2", "amx_bf16", "amx_tile"}
AVX2_ONLY = {"fpu", "sse4_2", "avx2", "fma"}


@pytest.mark.parametrize("flags, ran", [(NATIVE, "bf16"), (AMX, "bf16"), (AVX2_ONLY, "fp32")])
def test_auto_on_a_cpu_picks_bf16_only_with_native_support(flags: set[str], ran: str) -> None:
    chosen = choose_precision("auto", "cpu", flags=flags)
    assert chosen.ran == ran and chosen.asked == "auto"
    assert ("has native bf16" in chosen.why) == (ran == "bf16"), chosen.why


@pytest.mark.parametrize("supported, ran", [(True, "bf16"), (False, "fp32")])
def test_auto_on_a_gpu_asks_torch(supported: bool, ran: str) -> None:
    chosen = choose_precision("auto", "cuda", cuda_bf16=supported)
    assert chosen.ran == ran and "torch.cuda.is_bf16_supported" in chosen.why


def test_unreadable_cpu_flags_mean_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda: None)
    assert native_bf16("cpu")[0] is False
    assert choose_precision("auto", "cpu").ran == "fp32"


def test_explicit_bf16_without_native_support_warns_once_with_the_slowdown(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(precision, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="fedfew.interface.precision"):
        for _ in range(3):
            chosen = choose_precision("bf16", "cpu", flags=AVX2_ONLY)
            assert chosen.ran == "bf16"  # as asked
        choose_precision("bf16", "cpu", flags=NATIVE)  # native: no warning
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "8x slower than fp32" in warnings[0] and "auto" in warnings[0], warnings


def test_fp32_and_tf32_run_as_asked() -> None:
    assert choose_precision("fp32", "cpu").ran == "fp32"
    assert choose_precision("tf32", "cuda").ran == "tf32"


def test_a_run_with_auto_records_which_precision_ran_and_why(tmp_path: Path) -> None:
    config = load_config(tiny_config("fl-proto", runtime={"threads": 1, "progress": False, "precision": "auto"}))
    expected = choose_precision("auto", "cpu")  # this machine's answer
    summary = run_experiment(config, tmp_path, progress=False)
    assert summary["precision"] == expected.to_json()
    environment = run_environment(config)
    assert environment["precision"] == expected.ran and environment["precision_why"] == expected.why


def test_fp32_summaries_and_environments_are_as_before(tmp_path: Path) -> None:
    config = load_config(tiny_config("fl-proto"))
    assert "precision_why" not in run_environment(config) and run_environment(config)["precision"] == "fp32"
