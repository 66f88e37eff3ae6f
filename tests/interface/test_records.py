"""The records of the algorithm contract (fedfew.interface.records): a ClientResult's defaults are not
shared between instances."""

from __future__ import annotations

from fedfew.interface.algorithm import ClientResult


def test_client_result_defaults_are_independent() -> None:
    a, b = ClientResult(upload={}), ClientResult(upload={})
    a.metrics["x"] = 1.0
    assert b.metrics == {}
