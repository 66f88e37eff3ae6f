"""The study the study tests run (fl-proto and fl-maml on the bundled digits, two budgets), how they
write it, run the command line on it and put hand-made records in its store, and a table cell
computed by hand."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedfew.cli.main import main
from fedfew.study.collect import StudyResults
from fedfew.study.grid import cells
from fedfew.study.store import CodeVersion, ResultStore, make_record
from fedfew.study.study_file import load_study
from fedfew.study.study_sections import CONTROL

REPO = Path(__file__).resolve().parents[2]
T2 = 4.302652729911275  # Student's t(0.975, 2), from a table
T1 = 12.706204736174705  # t(0.975, 1)


def angular(percents: list[float], t: float) -> str:
    """A table cell by hand: the mean and the 95% interval of Student's t (quantile ``t``) on the angular
    scale asin(sqrt(p)), ends clipped to [0, pi/2] and mapped back, in percent."""
    a = [math.asin(math.sqrt(v / 100)) for v in percents]
    centre = sum(a) / len(a)
    half = t * math.sqrt(sum((x - centre) ** 2 for x in a) / (len(a) - 1)) / math.sqrt(len(a))
    low, high = max(0.0, centre - half), min(math.pi / 2, centre + half)
    return f"{sum(percents) / len(percents):.2f} [{100 * math.sin(low) ** 2:.2f}, {100 * math.sin(high) ** 2:.2f}]"


DIGITS_STUDY = {
    "name": "digits-check",
    "title": "fl-proto vs fl-maml on the bundled digits",
    "config": str(REPO / "src/fedfew/configs/demo.yaml"),
    "set": {"partition.num_clients": 3, "federation.clients_per_round": 3, "model.options.hidden": 8,
            "episodes.q_query": 3, "episodes.test_episodes": 20, "eval.every": 100, "runtime.threads": 1},
    "methods": {"fl-proto": {"algorithm.name": "fl-proto", "algorithm.options": {"local_steps": 1, "lr": 0.001}},
                "fl-maml": {"set": {"algorithm.options.local_steps": 1}, "label": "FL-MAML"}},
    "settings": {"non-IID 1-shot": {}, "IID 1-shot": {"partition.name": "iid"}},
    "seeds": [0, 1],
    "budgets": {"smoke": {"set": {"federation.rounds": 1}, "settings": ["IID 1-shot"]},
                "cpu": {"set": {"federation.rounds": 2}}},
    "control": {"method": "fl-maml"},
    "paper": [{"source": "Table 9 (made up for the test)", "values": {"fl-proto": {"IID 1-shot": 63.4}}}],
    "claims": [{"setting": "IID 1-shot", "order": ["fl-proto", CONTROL]}],
}


def dumped(cell: Any) -> dict[str, Any]:
    """A cell's resolved config as a store record holds it (a record is checked against its config's hash)."""
    from fedfew.config.validation import dump_config

    return yaml.safe_load(dump_config(cell.config))


def write_study(folder: Path, data: dict, name: str = "study.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


#: Another `fedfew study run`'s claim on a cell (its cell folder: the one argument), taken as that
#: process takes it (claims.claim_cell) and held until killed.
HOLD_CLAIM = """
import sys, time
from pathlib import Path
from fedfew.study.claims import claim_cell
with claim_cell(Path(sys.argv[1])) as owner:
    assert owner is None, owner
    print("claimed", flush=True)
    time.sleep(120)
"""


def _as_older_code(store: ResultStore, source: str = "000000000000") -> None:
    """Relabel every record of ``store`` as made by older code (what a commit does to a store)."""
    for path in store.folder.glob("*.json"):
        record = json.loads(path.read_text())
        path.unlink()
        store.put({**record, "code": {**record["code"], "source": source}})


HANDMADE = CodeVersion("0.0.0", "handmade0000", None)


def put(store_dir: Path, study_path: Path, budget: str = "smoke", accuracy: float = 0.5) -> None:
    study, root = load_study(study_path)
    store = ResultStore(store_dir, study.name)
    for cell in cells(study, root, budget):
        store.put(make_record(study.name, budget, cell.method, cell.setting, cell.seed, cell.config_hash,
                              dumped(cell), HANDMADE, {"test": {"accuracy": accuracy}}, 60.0))


def budgets_study() -> dict:
    """The digits study with a third budget that scales fl-proto alone (per_method) and runs it alone."""
    return {**DIGITS_STUDY, "budgets": {**DIGITS_STUDY["budgets"], "x2": {
        "set": {"federation.rounds": 2, "eval.every": 3}, "per_method": {"fl-proto": {"federation.rounds": 4}},
        "methods": ["fl-proto"], "settings": ["IID 1-shot"], "control": False, "no_control": "a test budget", "note": "fl-proto at twice cpu"}}}


def put_values(store_dir: Path, study_path: Path, budget: str, values: dict[tuple[str, str, int], float]) -> None:
    """Hand-made records (test accuracy as a fraction) for cells of ``budget``, keyed as the grid keys them."""
    from fedfew.study.store import CodeVersion, make_record

    study, root = load_study(study_path)
    store = ResultStore(store_dir, study.name)
    code = CodeVersion("0.0.0", "handmade0000", None)
    for cell in cells(study, root, budget):
        value = values.get((cell.method, cell.setting, cell.seed))
        if value is not None:
            store.put(make_record(study.name, budget, cell.method, cell.setting, cell.seed, cell.config_hash, dumped(cell), code,
                                  {"test": {"accuracy": value}}, 60.0))


#: The digits study cut to one row, one column and no control: one cell per seed, seconds each.
ONE_ROW = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [], "seeds": [0],
           "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}


def _store_args(tmp_path: Path) -> list[str]:
    return ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]


def _errors(err: str) -> list[str]:
    return [line for line in err.strip().splitlines() if not line.startswith("fedfew: warning:")]


def _put(store_dir: Path, study_path: Path, budget: str, values: dict[tuple[str, str, int], float],
         summary: dict[str, Any] | None = None, history: bool = False,
         selected: dict[tuple[str, str, int], int] | None = None) -> None:
    """Hand-made records (test accuracy as a fraction, the selected round) for cells of ``budget``."""
    study, root = load_study(study_path)
    store = ResultStore(store_dir, study.name)
    for cell in cells(study, root, budget):
        key = (cell.method, cell.setting, cell.seed)
        if key not in values:
            continue
        rounds = cell.config.federation.rounds
        made = {"test": {"accuracy": values[key]}, "rounds": rounds,
                "selected_round": (selected or {}).get(key, rounds), **(summary or {})}
        rows = [{"round": rounds, "test_accuracy": values[key], "train_loss": 1.0}] if history and rounds else None
        store.put(make_record(study.name, budget, cell.method, cell.setting, cell.seed, cell.config_hash, dumped(cell),
                              HANDMADE, made, 60.0, rows))


#: The digits study with an untrained row of fl-proto: its own control.
OWN_CONTROL = {**DIGITS_STUDY,
               "methods": {**DIGITS_STUDY["methods"],
                           "fl-proto, untrained": {"untrained_of": "fl-proto", "label": "(control) prototypes"}},
               "settings": {"non-IID 1-shot": {"per_method": {"fl-proto": {"episodes.q_query": 2}}},
                            "IID 1-shot": {"partition.name": "iid"}},
               "claims": [{"setting": "IID 1-shot", "order": ["fl-proto", "fl-proto, untrained"]},
                          {"setting": "IID 1-shot", "order": ["fl-maml", CONTROL]}]}


def _results(tmp_path: Path, data: dict, values: dict[tuple[str, str], dict[int, float]]) -> StudyResults:
    study, _ = load_study(write_study(tmp_path, data))
    results = StudyResults(study, "cpu", None, cells_total=12, cells_found=12, methods=list(study.methods),
                           settings=list(study.settings))
    results.values = values
    return results


CHAIN = {**DIGITS_STUDY, "claims": [
    {"setting": "IID 1-shot", "order": ["fl-proto", "fl-maml", CONTROL], "source": "a chain"},
    {"setting": "IID 1-shot", "order": ["fl-proto", CONTROL], "id": "proto-trained"},
    {"setting": "non-IID 1-shot", "order": ["fl-proto", "fl-maml"]},
]}


CHAIN_VALUES = {("fl-proto", "IID 1-shot"): {0: 60.0, 1: 61.0, 2: 60.5},
                ("fl-maml", "IID 1-shot"): {0: 59.0, 1: 62.0, 2: 58.0},  # proto - maml: 1, -1, 2.5: not resolved
                (CONTROL, "IID 1-shot"): {0: 50.0, 1: 50.5, 2: 50.2},  # maml - control: 9, 11.5, 7.8
                ("fl-proto", "non-IID 1-shot"): {0: 40.0, 1: 42.0, 2: 41.0},
                ("fl-maml", "non-IID 1-shot"): {0: 30.0, 1: 31.0, 2: 30.9}}


INTERVAL = re.compile(r"(-?\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\]")
