"""Large blocks kept by the process (fedfew.core.allocator): the setting applies and can be turned off."""

from __future__ import annotations

import pytest


def test_the_allocator_setting_applies_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes.util

    from fedfew.core.allocator import ENVIRONMENT, keep_large_blocks

    if ctypes.util.find_library("c") is None or not hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallopt"):
        pytest.skip("not glibc")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert keep_large_blocks() is True
    monkeypatch.setenv(ENVIRONMENT, "0")
    assert keep_large_blocks() is False
    monkeypatch.delenv(ENVIRONMENT)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")  # the user's own setting wins
    assert keep_large_blocks() is False
