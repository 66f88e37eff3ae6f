"""The F2L ledger (configs/f2l/ledger/, docs/f2l.md "Ledger"): every row is its reference config
(base.yaml unless its "# reference:" line names another) with exactly the changes its "# changes:"
line names, so that each row measures one difference on its own; every config validates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedfew.config.validation import load_config

LEDGER = Path(__file__).resolve().parents[2] / "configs" / "f2l" / "ledger"
ROWS = sorted(LEDGER.glob("*.yaml"))


def header(path: Path, key: str) -> str | None:
    found = re.search(rf"^# {key}: (.*)$", path.read_text(), flags=re.M)
    return found.group(1).strip() if found else None


def comparable(path: Path, overrides: list[str] | None = None) -> dict:
    dumped = load_config(path, overrides).model_dump()
    dumped.pop("name")
    return dumped


def test_the_ledger_has_its_rows() -> None:
    names = {p.stem for p in ROWS}
    assert {"base", "eq3_paper", "server_ce_support_query", "mi_normaliser_class", "kd_no_temperature",
            "client_optimizer_reset", "test_classifier_logreg", "train_5_shot", "selection_val200",
            "fl_proto", "fl_maml"} <= names


@pytest.mark.parametrize("path", ROWS, ids=[p.stem for p in ROWS])
def test_each_row_is_its_reference_with_exactly_the_named_changes(path: Path) -> None:
    changes = header(path, "changes")
    reference = header(path, "reference") or "base.yaml"
    if reference == "(none)" or changes == "(none)":
        assert load_config(path).federation.rounds == 200  # a reference row: the paper's budget
        return
    assert changes, f"{path.name} names no changes"
    overrides = [c.strip() for c in changes.split(";")]
    assert comparable(path) == comparable(LEDGER / reference, overrides)
    assert comparable(path) != comparable(LEDGER / reference)  # the change is a change
