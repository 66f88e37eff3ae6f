"""Studies (issue 20): the verdict rule against hand-computed cases, the study file's validation, a
whole study on the bundled digits through the command line (store, skip, resume, report), the
generated docs blocks, and changing the partition from the command line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedfew.cli.main import main
from fedfew.config.validation import ConfigError, load_config
from fedfew.core.errors import UsageError
from fedfew.study.claims import CLAIM_FILE, claim_cell, claim_owner
from fedfew.study.docs import render_pages, study_files
from fedfew.study.figures import setting_panels
from fedfew.study.grid import cells, config_hash
from fedfew.study.store import ResultStore, current_code, metric, stored_elsewhere
from fedfew.study.study_file import load_study
from fedfew.study.study_sections import CONTROL
from fedfew.study.verdict import HOLDS, NOT_RESOLVED, REVERSED, compare, judge_order, t_interval

REPO = Path(__file__).resolve().parents[1]
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


# -- the verdict rule, by hand ---------------------------------------------------------------------
def test_interval_is_students_t_over_seeds() -> None:
    one = t_interval([50.0])
    assert one.mean == 50.0 and one.half_width is None
    two = t_interval([50.0, 52.0])  # sd = sqrt(2), sd / sqrt(2) = 1
    assert two.mean == 51.0 and two.half_width == pytest.approx(T1)
    three = t_interval([1.0, 2.0, 3.0])  # sd 1
    assert three.half_width == pytest.approx(T2 / math.sqrt(3))


def test_paired_difference_holds_reverses_or_is_not_resolved() -> None:
    a = {0: 60.0, 1: 62.0, 2: 61.0}
    b = {0: 57.0, 1: 58.0, 2: 59.0}
    # d = 3, 4, 2: mean 3, sd 1, half-width 4.3027 / sqrt 3 = 2.484: [0.52, 5.48] excludes 0
    v = compare(a, b, "A", "B")
    assert v.verdict == HOLDS
    assert v.difference.mean == pytest.approx(3.0) and v.difference.half_width == pytest.approx(T2 / math.sqrt(3))
    assert compare(b, a).verdict == REVERSED
    # d = 1, -1, 3: mean 1, sd 2, half-width 4.968: the interval holds 0
    assert compare({0: 51.0, 1: 49.0, 2: 53.0}, {0: 50.0, 1: 50.0, 2: 50.0}).verdict == NOT_RESOLVED
    # The seeds are paired: a large shared seed effect cancels (d = 1, 1.1, 0.9 although the means overlap)
    assert compare({0: 40.0, 1: 60.1, 2: 80.9}, {0: 39.0, 1: 59.0, 2: 80.0}).verdict == HOLDS
    # one paired seed (the others unpaired) is never enough
    assert compare({0: 90.0, 1: 91.0}, {0: 10.0, 2: 11.0}).verdict == NOT_RESOLVED
    assert compare({}, {0: 1.0}).verdict == NOT_RESOLVED


def test_an_order_holds_only_when_every_neighbouring_pair_holds() -> None:
    a, b, c = {0: 3.0, 1: 4.0, 2: 5.0}, {0: 2.0, 1: 3.0, 2: 4.1}, {0: 1.0, 1: 2.0, 2: 3.0}
    assert judge_order({"a": a, "b": b, "c": c}, ["a", "b", "c"])[0] == HOLDS
    noisy = {0: 1.5, 1: 3.5, 2: 2.0}  # b - noisy = 0.5, -0.5, 2.1: not resolved
    verdict, pairs = judge_order({"a": a, "b": b, "n": noisy}, ["a", "b", "n"])
    assert verdict == NOT_RESOLVED and [p.verdict for p in pairs] == [HOLDS, NOT_RESOLVED]
    assert judge_order({"a": a, "b": b, "c": c}, ["a", "c", "b"])[0] == REVERSED


# -- the study file ----------------------------------------------------------------------------------
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


@pytest.mark.parametrize("change, expected", [
    ({"mehtods": {}}, "mehtods: unknown key"),
    ({"budgets": {"cpu": {}}}, "needs a 'smoke' budget"),
    ({"budgets": {"smoke": {"sets": {}}}}, "budgets.smoke.sets: unknown key"),
    ({"claims": [{"setting": "IID 1-shot", "order": ["fl-proto", "fedavg"]}]}, "'fedavg' is not one of"),
    ({"claims": [{"setting": "IID 5-shot", "order": ["fl-proto", "fl-maml"]}]}, "'IID 5-shot' is not one of"),
    ({"seeds": ["zero"]}, "seeds.0"),
    ({"methods": "fl-proto"}, "methods"),
    ({"paper": [{"source": "T", "values": {"fl-proto": {"IID": 1.0}}}]}, "'IID' is not one of"),
    ({"metric": "test.local_by_client[1,"}, "metric: 'test.local_by_client[1,' is not a metric path"),
    ({"settings": {"IID 1-shot": {"metric": "test..x"}}}, "settings.IID 1-shot.metric: 'test..x' is not a metric"),
    ({"methods": {"fl-proto": {"metric": "test.ci95"}, "fl-maml": {}},
      "settings": {"IID 1-shot": {"metric": "test.accuracy"}}}, "metric: set it on methods or on settings, not both"),
    ({"tables": [{"metric": "test.x", "title": "x", "methods": ["fedavg"]}]}, "tables[0].methods: 'fedavg' is not one of"),
    ({"tables": [{"metric": "test.x"}]}, "tables.0.title: required key missing"),
])
def test_a_bad_study_file_is_one_line_naming_the_key_and_file(change: dict, expected: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, **change})
    code, _, err = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store")], capsys)
    assert code == 2 and expected in err and str(path) in err and len(err.strip().splitlines()) == 1


def test_bad_command_line_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    store = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs")]
    for argv, expected in (
        (["study", "run", str(tmp_path / "nope.yaml")], "does not exist"),
        (["study", "run", str(path), "--budget", "huge", *store], "budget 'huge' does not exist"),
        (["study", "run", str(path), "--seeds", "0,one", *store], "--seeds '0,one'"),
        (["study", "run", str(path), "--set", "federation.rouns=2", *store], "federation.rouns"),
        (["study", "run", str(path), "--set", "model.name=nonet", "--budget", "smoke", *store], "cell fl-proto"),
    ):
        code, _, err = run_cli(argv, capsys)
        errors = [line for line in err.strip().splitlines() if not line.startswith("fedfew: warning:")]
        assert code == 2 and expected in err and len(errors) == 1 and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "store").exists() and not (tmp_path / "runs").exists()  # nothing ran


def test_cells_are_the_grid_in_table_order_with_the_control_last(tmp_path: Path) -> None:
    study, root = load_study(write_study(tmp_path, DIGITS_STUDY))
    grid = cells(study, root, "cpu")
    assert [(c.method, c.setting, c.seed) for c in grid[:3]] == [
        ("fl-proto", "non-IID 1-shot", 0), ("fl-proto", "non-IID 1-shot", 1), ("fl-proto", "IID 1-shot", 0)]
    assert len(grid) == 2 * 2 * 2 + 2 * 2 and {c.method for c in grid[-4:]} == {CONTROL}
    control = grid[-1].config
    assert control.federation.rounds == 0 and control.algorithm.name == "fl-maml"
    iid = grid[2].config
    assert iid.partition.name == "iid" and iid.partition.options == {}  # the demo's alpha dropped (item 5)
    assert iid.algorithm.name == "fl-proto" and iid.federation.rounds == 2 and iid.seed == 0
    # the seed is part of the key, the run folder's label and the thread count are not
    assert grid[0].config_hash != grid[1].config_hash
    assert config_hash(iid) == config_hash(iid.model_copy(update={
        "name": "renamed", "runtime": iid.runtime.model_copy(update={"threads": 2, "workers": 2})}))


def test_a_settings_per_method_overrides_reach_only_that_method_after_its_own_set(tmp_path: Path) -> None:
    """A column can mean the same budget in each method's own unit (FRL's Fig. 2: an FRL episode is
    R + 1 rounds): its per_method overrides apply to that method only, after the method's own set and
    before the budget's; the control (the control method's cell at round 0) gets them too."""
    data = {**DIGITS_STUDY, "settings": {
        "short": {"per_method": {"fl-proto": {"federation.rounds": 3, "algorithm.options.local_steps": 2}}},
        "long": {"set": {"federation.rounds": 5}, "per_method": {"fl-maml": {"episodes.k_shot": 2}}}}}
    data["budgets"] = {"smoke": {}, "cpu": {"set": {"eval.every": 7}}}
    data["claims"] = [{"setting": "short", "order": ["fl-proto", CONTROL]}]
    data["paper"] = []
    study, root = load_study(write_study(tmp_path, data))
    grid = {(c.method, c.setting, c.seed): c.config for c in cells(study, root, "cpu")}
    proto_short, maml_short = grid[("fl-proto", "short", 0)], grid[("fl-maml", "short", 0)]
    # the method's own set says local_steps 1: the column's per_method (later) wins, for fl-proto only
    assert proto_short.federation.rounds == 3 and proto_short.algorithm.options["local_steps"] == 2
    assert maml_short.federation.rounds == 30 and maml_short.algorithm.options["local_steps"] == 1  # demo's rounds
    assert grid[("fl-maml", "long", 0)].episodes.k_shot == 2 and grid[("fl-proto", "long", 0)].episodes.k_shot == 1
    assert grid[("fl-maml", "long", 0)].federation.rounds == 5 and proto_short.eval.every == 7  # budget after
    control = grid[(CONTROL, "long", 0)]
    assert control.episodes.k_shot == 2 and control.federation.rounds == 0
    for where, change, expected in (
            ("settings", {"short": {"per_method": {"fedavg": {}}}}, "settings.short.per_method: 'fedavg' is not one of"),
            ("methods", {**DIGITS_STUDY["methods"], "fl-maml": {"per_method": {"fl-proto": {}}}},
             "only a setting takes per-method overrides")):
        path = write_study(tmp_path, {**data, where: change}, name="bad.yaml")
        with pytest.raises(UsageError, match=expected):
            load_study(path)


# -- a whole study through the command line -----------------------------------------------------------
def test_study_run_stores_skips_resumes_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, DIGITS_STUDY)
    store_dir, runs = tmp_path / "store", tmp_path / "runs"
    args = ["--store", str(store_dir), "--runs", str(runs), "--budget", "smoke"]
    code, out, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0, err
    assert "[6/6]" in err and "left" in err  # progress: cells done / total and the time left
    store = ResultStore(store_dir, "digits-check")
    records = store.records()
    assert len(records) == 6  # 2 methods x 1 setting x 2 seeds + the control on 2 seeds
    assert {r["budget"] for r in records} == {"smoke"} and all(r["code"]["source"] for r in records)
    first = {r["config_hash"]: r["metrics"]["test"]["accuracy"] for r in records}
    folders = sorted(p for p in runs.rglob("status.json"))
    assert len(folders) == 6
    # each record keeps the evaluated rounds (a 1-round smoke run: round 1, its test score) and the
    # initial model's score; a control (round 0) has no rounds
    trained = [r for r in records if r["method"] != CONTROL]
    assert all([h["round"] for h in r["history"]] == [1] and "test_accuracy" in r["history"][0] for r in trained)
    assert all("clients" not in h and "bytes_down" not in h for r in trained for h in r["history"])
    assert all(r["metrics"]["initial_score"]["split"] == "test" for r in records)
    assert all("history" not in r for r in records if r["method"] == CONTROL)
    curve = tmp_path / "curve.png"
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(store_dir), "--budget", "smoke",
                            "--curve", "test_accuracy", str(curve)], capsys)
    assert code == 0 and f"curves of test_accuracy: {curve}" in out and curve.is_file()

    # again: everything is in the store, nothing runs
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0 and "6 already in" in err and len(sorted(runs.rglob("status.json"))) == 6

    # an interrupted study: a record never written, a run folder left 'interrupted' -> resumed, same numbers
    victim = next(r for r in records if r["method"] == "fl-proto")
    (store.folder / f"{victim['config_hash']}-{victim['code']['source']}.json").unlink()
    run_folder = next(p.parent for p in folders if json.loads((p.parent / "summary.json").read_text())["seed"]
                      == victim["seed"] and "fl-proto" in p.parent.name)
    status = json.loads((run_folder / "status.json").read_text())
    (run_folder / "status.json").write_text(json.dumps({**status, "status": "interrupted"}))
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0 and "5 already in" in err and "[6/6]" in err
    again = {r["config_hash"]: r["metrics"]["test"]["accuracy"] for r in store.records()}
    assert again == first

    # the report: our mean over the two seeds, the paper's number with its table, the control, the verdict
    figure = tmp_path / "bars.png"
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(store_dir), "--budget", "smoke",
                            "--figure", str(figure)], capsys)
    assert code == 0 and figure.is_file()
    proto = sorted(100 * r["metrics"]["test"]["accuracy"] for r in records if r["method"] == "fl-proto")
    mean, half = sum(proto) / 2, T1 * abs(proto[1] - proto[0]) / 2  # sd/sqrt(2) = |a - b| / 2
    assert f"| fl-proto | {angular(proto, T1)} | 63.40 |" in out
    assert "paper (Table 9 (made up for the test))" in out and "| FL-MAML |" in out
    assert "(control) untrained, round 0" in out
    assert "| fl-proto > (control) untrained, round 0 | IID 1-shot |" in out

    # a metric no stored run writes (a typo): one line naming it, not a table of "—" (issue 53); one that
    # only some runs write is "—" where absent (the further tables below)
    other = write_study(tmp_path, {**DIGITS_STUDY, "metric": "test.nonesuch"}, name="other-metric.yaml")
    code, out, err = run_cli(["study", "report", str(other), "--store", str(store_dir), "--budget", "smoke"], capsys)
    assert code == 2 and "metric test.nonesuch: none of the 6 stored cells" in err and not out

    # further tables of the same cells (``tables``): another metric each, scaled as asked, "—" where absent
    tables = [{"metric": "test.accuracy", "title": "Accuracy as a fraction", "methods": ["fl-proto"]},
              {"metric": "test.nonesuch", "title": "Nothing", "scale": 100, "settings": ["IID 1-shot"]}]
    more = write_study(tmp_path, {**DIGITS_STUDY, "tables": tables}, name="more-tables.yaml")
    code, out, _ = run_cli(["study", "report", str(more), "--store", str(store_dir), "--budget", "smoke"], capsys)
    assert code == 0 and f"| fl-proto | {angular(proto, T1)} | 63.40 |" in out  # the main table as before
    assert "Accuracy as a fraction (`test.accuracy`; mean ± 95% interval over seeds):" in out
    assert f"| fl-proto | {mean / 100:.2f} ± {half / 100:.2f} |" in out 
    assert "| FL-MAML |" not in out.split("as a fraction")[1].split("Nothing")[0]  # only the rows asked for
    assert "Nothing (`test.nonesuch` x 100;" in out and "| FL-MAML | — |" in out


def test_a_cell_that_cannot_run_leaves_the_others_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An impossible partition in one method's cells (more shards than the digits hold): those cells fail
    with their one line each, the other method's cells run into the store, and the study exits 2 with
    one line; running it again retries only the failed cells."""
    study = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [], "seeds": [0],
             "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"],
                         "shards": {"algorithm.name": "fl-proto", "algorithm.options": {"local_steps": 1},
                                    "partition.name": "shards",
                                    "partition.options": {"shards_per_client": 500, "shard_size": 100}}},
             "settings": {"non-IID 1-shot": {}}, "budgets": {"smoke": {"set": {"federation.rounds": 1}}, "cpu": {}}}
    path = write_study(tmp_path, study)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and "1 of 2 cells failed (first: shards / non-IID 1-shot / seed 0: " in lines[-1]
    assert any(line.startswith("[1/2] fl-proto") or line.startswith("[2/2] fl-proto") for line in lines)
    assert any(": failed: " in line and "shards" in line for line in lines)
    assert len(ResultStore(tmp_path / "store", "digits-check").records()) == 1
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 2 and "1 already in" in err and "1 of 2 cells failed" in err


def test_a_cell_another_process_is_running_is_left_to_it_not_failed(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Two `fedfew study run` processes sharing a study: a cell another live process has claimed (the
    flock on its cell folder's claim file, with its pid inside) is left to that process, neither run nor
    failed; once that process is gone (the OS drops its claim), the same command stores the cell."""
    study = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [], "seeds": [0, 1],
             "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}
    path = write_study(tmp_path, study)
    store_dir, runs = tmp_path / "store", tmp_path / "runs"
    args = ["--store", str(store_dir), "--runs", str(runs), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(store_dir, "digits-check")
    victim = next(r for r in store.records() if r["seed"] == 1)
    (store.folder / f"{victim['config_hash']}-{victim['code']['source']}.json").unlink()
    [cell_folder] = [p for p in (runs / "digits-check").iterdir() if p.name.startswith(victim["config_hash"])]
    holder = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(cell_folder)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        code, out, err = run_cli(["study", "run", str(path), *args], capsys)
        assert code == 0, err
        assert f"fl-proto / IID 1-shot / seed 1: running in another process (pid {holder.pid}); left to it" in err
        assert "1 cells were running in other processes" in err and "1 left to other processes" in out
        assert "failed" not in err and len(store.records()) == 1
    finally:
        holder.kill()
        holder.wait()
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0 and "[2/2]" in err and "other processes" not in err
    again = {r["config_hash"]: r["metrics"]["test"]["accuracy"] for r in store.records()}
    assert again[victim["config_hash"]] == victim["metrics"]["test"]["accuracy"]


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


def test_a_claim_names_its_holder_and_ends_with_it(tmp_path: Path) -> None:
    """A claim holds the holder's pid for the others to name; once released (or its holder gone) it is
    free again, whatever pid the file still names, and the next holder writes its own."""
    folder = tmp_path / "cell"
    assert claim_owner(folder) is None and not folder.exists()  # a look makes no folder
    with claim_cell(folder) as owner:
        assert owner is None and (folder / CLAIM_FILE).read_text() == str(os.getpid())
        assert claim_owner(folder) == os.getpid()  # another look (its own descriptor) finds it held
    assert claim_owner(folder) is None
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (folder / CLAIM_FILE).write_text(str(dead.pid))  # what a killed holder leaves: its pid, no lock
    with claim_cell(folder) as owner:
        assert owner is None and (folder / CLAIM_FILE).read_text() == str(os.getpid())


def test_a_store_from_other_code_is_refused_and_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [],
                                  "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}, "seeds": [0]})
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    [record_path] = (tmp_path / "store" / "digits-check").glob("*.json")
    record = json.loads(record_path.read_text())
    old = {**record, "code": {**record["code"], "source": "000000000000"}, "finished": "2000-01-01T00:00:00Z"}
    record_path.unlink()
    written = ResultStore(tmp_path / "store", "digits-check").put(old)
    before = written.read_bytes()
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 2 and "other code" in err and "--new-code" in err and len(err.strip().splitlines()) == 1
    assert written.read_bytes() == before and len(list(written.parent.glob("*.json"))) == 1
    assert run_cli(["study", "run", str(path), *args, "--new-code"], capsys)[0] == 0
    assert len(list(written.parent.glob("*.json"))) == 2 and written.read_bytes() == before
    # the report shows the newest code version's results and says which
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke"],
                           capsys)
    assert code == 0 and f"sources {record['code']['source']}" in out and "000000000000" not in out


def _as_older_code(store: ResultStore, source: str = "000000000000") -> None:
    """Relabel every record of ``store`` as made by older code (what a commit does to a store)."""
    for path in store.folder.glob("*.json"):
        record = json.loads(path.read_text())
        path.unlink()
        store.put({**record, "code": {**record["code"], "source": source}})


def test_verify_lets_older_records_stand_when_the_numbers_are_the_same(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    study = {**DIGITS_STUDY, "claims": [], "seeds": [0, 1]}
    path = write_study(tmp_path, study)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    _as_older_code(store)
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 2  # other code: refused

    # one cell per method (fl-proto, fl-maml, the control) re-run at this code: the same numbers
    code, out, err = run_cli(["study", "verify", str(path), *args, "--runs", str(tmp_path / "again")], capsys)
    assert code == 0, err
    assert "re-running 3 of the 6 cells stored by sources 000000000000" in err and err.count("the same") == 3
    assert "gives the numbers of sources 000000000000 on all 3 re-run cells" in out
    (equivalence,) = store.equivalences()
    assert equivalence["equal_to"]["source"] == "000000000000" and len(equivalence["cells"]) == 3
    # the study is complete at this version: nothing runs, the report shows all six and says why
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0 and "6 already in" in err
    code, out, _ = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store"), "--budget", "smoke"],
                           capsys)
    assert code == 0 and "6/6 cells in the store" in out
    assert "3 of the 6 records were made by older code (000000000000)" in out and "on 3 re-run cells" in out


def test_verify_records_nothing_when_a_number_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = {**DIGITS_STUDY, "claims": [], "control": None, "no_control": "a test study of one row", "seeds": [0],
             "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}
    path = write_study(tmp_path, study)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    (record_path,) = store.folder.glob("*.json")
    record = json.loads(record_path.read_text())
    record["metrics"]["test"]["accuracy"] += 0.01  # what another code's numbers look like
    record_path.write_text(json.dumps(record))
    _as_older_code(store)
    code, _, err = run_cli(["study", "verify", str(path), *args, "--runs", str(tmp_path / "again")], capsys)
    assert code == 1 and "DIFFERENT" in err and "other numbers than sources 000000000000 on 1 of 1" in err
    assert store.equivalences() == [] and len(store.records()) == 1  # nothing written: the report is unchanged
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 2  # still other code
    code, _, err = run_cli(["study", "verify", str(path), *args, "--per-method", "0"], capsys)
    assert code == 2 and "--per-method" in err


def test_a_cell_stopped_before_a_verified_commit_continues_its_older_run(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.study.store import current_code

    study = {**DIGITS_STUDY, "claims": [], "control": None, "no_control": "a test study of one row", "seeds": [0, 1],
             "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]}}
    path = write_study(tmp_path, study)
    runs = tmp_path / "runs"
    args = ["--store", str(tmp_path / "store"), "--runs", str(runs), "--budget", "smoke"]
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    store = ResultStore(tmp_path / "store", "digits-check")
    source = current_code().source
    for folder in (runs / "digits-check").iterdir():  # the runs as the older code left them
        folder.rename(folder.with_name(folder.name.replace(source, "000000000000")))
    _as_older_code(store)
    (seed1,) = [p for p in store.folder.glob("*.json") if json.loads(p.read_text())["seed"] == 1]
    config_hash, stored = json.loads(seed1.read_text())["config_hash"], json.loads(seed1.read_text())["metrics"]
    seed1.unlink()  # seed 1's cell "stopped" before the commit: its run folder is there, its record is not
    code, _, err = run_cli(["study", "verify", str(path), *args, "--runs", str(tmp_path / "again")], capsys)
    assert code == 0, err
    assert run_cli(["study", "run", str(path), *args], capsys)[0] == 0
    assert not (runs / "digits-check" / f"{config_hash}-{source}").exists()  # continued the older folder
    (record,) = [r for r in store.records() if r["config_hash"] == config_hash]
    assert record["code"]["source"] == source and record["metrics"]["test"] == stored["test"]


def test_a_budget_with_its_own_metric_reads_the_last_evaluated_round_of_the_same_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    smoke = {"set": {"federation.rounds": 2, "eval.every": 1, "eval.track_test": True}, "settings": ["IID 1-shot"],
             "seeds": [0]}
    study = {**DIGITS_STUDY, "claims": [], "control": None, "no_control": "a test study of one row",
             "budgets": {"smoke": smoke, "smoke-last": {**smoke, "metric": "history.last.test_accuracy"},
                         "cpu": {}}}
    path = write_study(tmp_path, study)
    store_args = ["--store", str(tmp_path / "store")]
    assert run_cli(["study", "run", str(path), *store_args, "--runs", str(tmp_path / "runs"), "--budget", "smoke"],
                   capsys)[0] == 0
    code, out, err = run_cli(["study", "report", str(path), *store_args, "--budget", "smoke-last"], capsys)
    assert code == 0, err
    assert "2/2 cells in the store" in out and "at the last evaluated round" in out  # the same cells, read again
    for record in ResultStore(tmp_path / "store", "digits-check").records():
        last = record["history"][-1]
        assert last["round"] == 2 and metric(record, "history.last.test_accuracy") == last["test_accuracy"]
        assert metric(record, "history.1.test_accuracy") == record["history"][0]["test_accuracy"]
        label = "FL-MAML" if record["method"] == "fl-maml" else record["method"]
        assert f"| {label} | {100 * last['test_accuracy']:.2f} (1 seed) |" in out
    assert metric({"metrics": {}}, "history.last.test_accuracy") is None  # a record without rounds: no value
    # The untrained control (a round-0 run) evaluated one round, round 0: that is its last round.
    control = {"metrics": {"rounds": 0, "test": {"accuracy": 0.25, "ci95": 0.01}}}
    assert metric(control, "history.last.test_accuracy") == metric(control, "history.0.test_accuracy") == 0.25
    assert metric({"metrics": {"rounds": 3, "test": {"accuracy": 0.5}}}, "history.last.test_accuracy") is None
    bad = write_study(tmp_path, {**study, "budgets": {**study["budgets"], "smoke-last": {"metric": "history.last["}}},
                      "bad.yaml")
    with pytest.raises(UsageError, match="smoke-last"):
        load_study(bad)


def test_versions_verified_against_one_older_version_count_each_others_records(tmp_path: Path) -> None:
    """B and C were each verified equal to A (C after B, against the version holding most cells):
    for C, B's records count too, and a report names C, the most recently verified."""
    from fedfew.study.store import FORMAT, CodeVersion

    a, b, c = (CodeVersion("0.1.0", source, None) for source in ("aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"))
    store = ResultStore(tmp_path, "chain")
    for cell_hash, code, finished in (("h1", a, "2026-01-01T00:00:00Z"), ("h2", b, "2026-01-02T00:00:00Z")):
        store.put({"format": FORMAT, "config_hash": cell_hash, "code": code.to_json(), "finished": finished,
                   "metrics": {}})
    for new, old, when in ((b, a, "2026-01-02T00:00:00Z"), (c, a, "2026-01-03T00:00:00Z")):
        store.put_equivalence({"code": new.to_json(), "equal_to": old.to_json(), "cells": [], "verified": when})
    assert store.equal_codes(c) == {a.key, b.key} and store.equal_codes(b) == {a.key, c.key}
    assert set(store.by_hash(c)) == {"h1", "h2"}
    assert store.newer_equal(b) == c and store.newer_equal(a) == c
    assert store.equal_codes(CodeVersion("0.1.0", "dddddddddddd", None)) == set()  # unlinked: nothing counts


def test_verify_counts_new_metrics_as_new_not_different() -> None:
    from fedfew.study.verify import same_numbers

    stored = {"accuracy": 0.5, "ci95": 0.1, "parts": {"a": 1.0}}
    assert same_numbers(stored, {**stored, "per_class": {"5": 0.9}})  # a key the older code did not report
    assert same_numbers(stored, {**stored, "parts": {"a": 1.0, "b": 2.0}})
    assert not same_numbers(stored, {**stored, "accuracy": 0.5000001})
    assert not same_numbers(stored, {"accuracy": 0.5, "parts": {"a": 1.0}})  # a stored number gone
    assert not same_numbers(stored, {**stored, "parts": {"a": 1.5}})
def test_a_column_with_its_own_metric_reads_the_same_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A setting with ``metric`` (FedFSL Fig. 6's per-digit columns) shares its cells with the plain
    column: each config runs once, and its column shows the record's value at that path."""
    from fedfew.data import load_dataset

    digits = load_dataset("digits")
    name = digits.class_names[digits.splits["novel"][0]]
    data = {**DIGITS_STUDY, "set": {**DIGITS_STUDY["set"], "eval.per_class": True},
            "settings": {"all": {}, f"class {name}": {"metric": f"test.per_class.{name}"}},
            "budgets": {"smoke": {"set": {"federation.rounds": 1}, "seeds": [0], "methods": ["fl-maml"]},
                        "cpu": {}},
            "paper": [], "claims": []}
    path = write_study(tmp_path, data)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0, err
    assert "4 cells (2 distinct runs), 0 already in" in err
    records = ResultStore(tmp_path / "store", "digits-check").records()
    assert len(records) == 2 and len(list((tmp_path / "runs").rglob("status.json"))) == 2  # fl-maml and the control
    trained = next(r for r in records if r["method"] != CONTROL)
    code, out, _ = run_cli(["study", "report", str(path), *args[:2], "--budget", "smoke"], capsys)
    assert code == 0 and "4/4 cells in the store" in out and f"class {name}: `test.per_class.{name}`" in out
    row = next(line for line in out.splitlines() if line.startswith("| FL-MAML |"))
    accuracy, per_class = trained["metrics"]["test"]["accuracy"], trained["metrics"]["test"]["per_class"][name]
    assert row == f"| FL-MAML | {100 * accuracy:.2f} (1 seed) | {100 * per_class:.2f} (1 seed) |"
    # A budget without that column names the study's metric only (not the metric of a column it leaves out).
    data["budgets"]["smoke-all"] = {**data["budgets"]["smoke"], "settings": ["all"]}
    path = write_study(tmp_path, data)
    code, out, _ = run_cli(["study", "report", str(path), *args[:2], "--budget", "smoke-all"], capsys)
    assert code == 0 and "2/2 cells in the store" in out and "Ours: test accuracy (%), mean" in out
    assert "per_class" not in out


# -- generated docs ------------------------------------------------------------------------------------
def test_docs_blocks_are_what_the_store_gives(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "studies").mkdir()
    (tmp_path / "docs").mkdir()
    write_study(tmp_path / "studies", {**DIGITS_STUDY, "config": str(REPO / "src/fedfew/configs/demo.yaml")},
                "digits.yaml")
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Page\n\n<!-- study:digits-check begin -->\n51.2 typed by hand\n<!-- study:digits-check end -->\n"
                    "after\n")
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    text = page.read_text()
    assert "typed by hand" not in text and "*Not yet run at the cpu budget* (12 cells)" in text
    assert text.endswith("<!-- study:digits-check end -->\nafter\n")
    assert render_pages(tmp_path)[page] == text  # what the docs test compares
    compute = tmp_path / "docs" / "compute.md"
    compute.write_text("<!-- studies:compute begin -->\n1 h typed by hand\n<!-- studies:compute end -->\n")
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    rows = [line for line in compute.read_text().splitlines() if line.startswith("| ")]
    assert "typed by hand" not in compute.read_text()
    assert rows[1:] == ["| `studies/digits.yaml` | cpu | 0/12 | — | 0.0 | — |", "| all | | | | 0.0 | |"]
    # a block at another budget than the docs budget, beside the docs budget's
    page.write_text(text + "<!-- study:digits-check@smoke begin -->\n<!-- study:digits-check@smoke end -->\n")
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    text = page.read_text()
    assert "*Not yet run at the cpu budget* (12 cells)" in text and "*Not yet run at the smoke budget*" in text
    assert "--budget smoke`, then" in text
    page.write_text(text.replace("digits-check@smoke", "digits-check@nonesuch"))
    code, _, err = run_cli(["study", "docs", "--root", str(tmp_path)], capsys)
    assert code == 2 and "study:digits-check@nonesuch names no budget" in err and len(err.strip().splitlines()) == 1
    page.write_text(text.replace("<!-- study:digits-check", "<!-- study:nonesuch"))
    code, _, err = run_cli(["study", "docs", "--root", str(tmp_path)], capsys)
    assert code == 2 and "study:nonesuch" in err


def test_committed_docs_match_the_committed_store() -> None:
    """Every docs page's study blocks are exactly what `fedfew study docs` makes from studies/store."""
    pages = render_pages(REPO)
    assert pages, "no docs page has a study block"
    for page, text in pages.items():
        assert page.read_text() == text, f"{page} differs from the store: run `fedfew study docs`"


def test_every_committed_study_is_valid_at_every_budget() -> None:
    files = study_files(REPO)
    assert files
    for path in files:
        study, root = load_study(path)
        for budget in study.budgets:
            assert cells(study, root, budget), (path, budget)


# -- item 5: changing the partition from the command line ------------------------------------------------
SUITED = {"fewshot": ("iid", "dirichlet", "shards", "dirichlet_classes", "label_skew"),
          "classification": ("iid", "dirichlet", "shards", "label_skew")}


def experiment_configs() -> list[str]:
    """The committed experiment configs (configs/f2l/methods.yaml and adaptation.yaml hold rows for a
    study to put in place, not configs)."""
    from fedfew.config.validation import ExperimentConfig

    return sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").rglob("*.yaml")
                  if set(yaml.safe_load(p.read_text())) <= set(ExperimentConfig.model_fields))


@pytest.mark.parametrize("config_path", experiment_configs())
def test_every_config_takes_every_suited_partition_from_the_command_line(config_path: str) -> None:
    base = load_config(REPO / config_path)
    for name in SUITED[base.task]:
        config = load_config(REPO / config_path, [f"partition.name={name}"])
        assert config.partition.name == name
        if name == base.partition.name:
            assert config.partition.options == base.partition.options  # unchanged name: options kept


def test_overridden_options_are_kept_and_still_checked() -> None:
    config = load_config(REPO / "configs/fedfsl/omniglot.yaml", ["partition.name=shards",
                                                                  "partition.options.shards_per_client=3"])
    assert config.partition.options == {"shards_per_client": 3}
    with pytest.raises(ConfigError, match="partition.options.alpha"):
        load_config(REPO / "configs/fedfsl/omniglot.yaml", ["partition.name=iid", "partition.options.alpha=2"])
    with pytest.raises(ConfigError, match="partition.options.alpah"):  # a typo in the file's own partition
        load_config({"partition": {"name": "dirichlet", "options": {"alpah": 1}}})


def test_switching_the_engine_drops_the_other_engines_options() -> None:
    """`--set runtime.engine=inprocess` on a config written for the workers engine (benchmarks/peers.yaml,
    a study's `--set runtime.engine=...`): the workers' option goes, as a partition's do."""
    config = load_config(REPO / "benchmarks/peers.yaml", ["runtime.engine=inprocess"])
    assert config.runtime.engine == "inprocess" and config.runtime.engine_options == {}
    kept = load_config(REPO / "benchmarks/peers.yaml")
    assert kept.runtime.engine == "workers" and kept.runtime.engine_options
    with pytest.raises(ConfigError, match="runtime.engine_options.workers"):  # set on the command line: checked
        load_config(REPO / "benchmarks/peers.yaml", ["runtime.engine=inprocess", "runtime.engine_options.workers=3"])


def test_an_iid_override_of_a_dirichlet_config_runs(tmp_path: Path) -> None:
    from fedfew.run.runner import run_experiment

    config = load_config(REPO / "src/fedfew/configs/demo.yaml", [
        "partition.name=iid", "partition.num_clients=2", "federation.rounds=1", "federation.clients_per_round=2",
        "model.options.hidden=8", "episodes.test_episodes=5", "algorithm.name=fl-proto",
        "algorithm.options={local_steps: 1}"])
    summary = run_experiment(config, tmp_path, progress=False)
    assert summary["rounds"] == 1 and 0.0 <= summary["test"]["accuracy"] <= 1.0


# -- every committed study at its smoke budget ---------------------------------------------------------
def _smoke_study(path: Path) -> object:
    """The study as a test parameter; one whose smoke cells read frozen sentence vectors is marked
    ``sentence_vectors``: its first run encodes every text of the dataset (HuffPost's 36,900 headlines:
    about 3.5 min on one thread, cached after), so the default suite leaves it to `make
    test-sentence-studies`, which CI runs."""
    study, root = load_study(path)
    encoders = {c.config.dataset.options.get("sentence_encoder") for c in cells(study, root, "smoke")} - {None}
    marks = [pytest.mark.sentence_vectors] if encoders else []
    return pytest.param(str(path.relative_to(REPO)), marks=marks)


@pytest.mark.parametrize("study_path", [_smoke_study(p) for p in study_files(REPO)])
def test_every_committed_study_runs_at_the_smoke_budget(study_path: str, tmp_path: Path, shared_data: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Each study's smoke budget runs end to end on the real data (skipped without ../shared/data) and
    its report holds every smoke cell; the committed store is not touched."""
    study, root = load_study(REPO / study_path)
    needed = {c.config.dataset.name for c in cells(study, root, "smoke")}
    missing = [name for name in needed if name in DATA_FOLDERS and not (shared_data / DATA_FOLDERS[name]).exists()]
    if missing:
        pytest.skip(f"{study_path}: no {', '.join(missing)} data in {shared_data}")
    monkeypatch.setenv("FEDFEW_DATA", str(shared_data))
    store = tmp_path / "store"
    code, _, err = run_cli(["study", "run", str(REPO / study_path), "--budget", "smoke", "--store", str(store),
                            "--runs", str(tmp_path / "runs")], capsys)
    assert code == 0, err
    code, out, _ = run_cli(["study", "report", str(REPO / study_path), "--budget", "smoke", "--store", str(store)],
                           capsys)
    total = len(cells(study, root, "smoke"))
    assert code == 0 and f"{total}/{total} cells in the store" in out


#: Where each dataset the studies use lives under the data folder (for a clean skip without it).
DATA_FOLDERS = {"omniglot": "omniglot", "femnist": "femnist", "mnist": "mnist", "huffpost": "text",
                "cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python", "fc100": "cifar-100-python",
                "miniimagenet": "miniimagenet", "20newsgroups": "20newsgroups", "reuters": "text"}


def test_the_source_hash_covers_what_computes_numbers_not_the_study_layer(tmp_path: Path) -> None:
    """A change to an algorithm makes a new code version; a change to how studies run or report
    (fedfew/study/), to the command line, or to an algorithm's docstring does not: the resolved config is
    in each cell's key already (tests/test_study_records.py edits the real package)."""
    from fedfew.core.codeversion import source_hash

    package = tmp_path / "fedfew"
    (package / "study").mkdir(parents=True)
    (package / "algorithms").mkdir()
    (package / "algorithms" / "fedavg.py").write_text("LR = 0.1\n")
    (package / "study" / "report.py").write_text("DIGITS = 2\n")
    (package / "cli.py").write_text("USAGE = 'fedfew run'\n")
    first = source_hash(package)
    (package / "study" / "report.py").write_text("DIGITS = 3\n")
    (package / "cli.py").write_text("USAGE = 'fedfew run CONFIG'\n")
    (package / "algorithms" / "fedavg.py").write_text('"""FedAvg."""\nLR = 0.1  # the paper\'s\n')
    assert source_hash(package) == first
    (package / "algorithms" / "fedavg.py").write_text("LR = 0.2\n")
    assert source_hash(package) != first
    (package / "algorithms" / "fedavg.py").write_text("LR = 0.1\n")
    (package / "algorithms" / "fedavg_copy.py").write_text("LR = 0.1\n")  # a new module counts too
    assert source_hash(package) != first


def test_a_curve_is_the_mean_over_seeds_at_the_rounds_every_seed_has() -> None:
    from fedfew.study.figures import mean_curve

    per_seed = {0: [{"round": 2, "test_accuracy": 0.5}, {"round": 4, "test_accuracy": 0.6}],
                1: [{"round": 2, "test_accuracy": 0.7}, {"round": 4, "train_loss": 1.0}]}
    (point,) = mean_curve(per_seed, "test_accuracy")  # round 4: seed 1 has no test score
    assert point[0] == 2 and point[1] == pytest.approx(60.0)
    assert f"{point[1]:.2f} [{point[2]:.2f}, {point[3]:.2f}]" == angular([50.0, 70.0], T1)  # inside [0, 100]


def test_winners_are_the_best_mean_and_the_methods_the_paired_rule_cannot_separate(tmp_path: Path) -> None:
    """Hand-made values: in IID 1-shot fl-proto's mean is highest and fl-maml is 2 points below on every
    seed (a paired difference with zero spread: separated); in the other column fl-maml is best and
    fl-proto's differences (+3, -1) straddle 0: not separated. The control is never the best."""
    from fedfew.study.collect import StudyResults
    from fedfew.study.study_file import load_study
    from fedfew.study.winners import winners, winners_markdown

    study, _ = load_study(write_study(tmp_path, DIGITS_STUDY))
    results = StudyResults(study, "cpu", None, cells_total=10, cells_found=10, methods=list(study.methods),
                           settings=list(study.settings))
    results.values = {("fl-proto", "IID 1-shot"): {0: 60.0, 1: 62.0}, ("fl-maml", "IID 1-shot"): {0: 58.0, 1: 60.0},
                      ("fl-proto", "non-IID 1-shot"): {0: 50.0, 1: 52.0},
                      ("fl-maml", "non-IID 1-shot"): {0: 53.0, 1: 51.0},
                      (CONTROL, "IID 1-shot"): {0: 90.0, 1: 90.0}}
    assert winners(results) == [("non-IID 1-shot", "fl-maml", ["fl-proto"], None),
                                ("IID 1-shot", "fl-proto", [], results.interval(CONTROL, "IID 1-shot"))]
    text = winners_markdown(results, "studies/study.yaml")
    assert f"| IID 1-shot | fl-proto: {angular([60, 62], T1)} | none | 90.00 [90.00, 90.00] |" in text
    assert f"| non-IID 1-shot | FL-MAML: {angular([53, 51], T1)} | fl-proto | — |" in text


def test_a_figure_of_many_settings_is_cut_into_even_panels_in_order() -> None:
    names = [f"s{i}" for i in range(12)]
    assert setting_panels(names) == [names[0:4], names[4:8], names[8:12]]  # the benchmark's 12 columns
    assert setting_panels(names[:6]) == [names[0:3], names[3:6]]
    assert setting_panels(names[:5]) == [names[0:3], names[3:5]]
    assert setting_panels(names[:4]) == [names[:4]] and setting_panels(names[:1]) == [names[:1]]
    for n in range(1, 13):
        panels = setting_panels(names[:n])
        assert [s for panel in panels for s in panel] == names[:n] and max(map(len, panels)) <= 4


def test_winners_judge_only_complete_settings_and_leave_apart_rows_out(tmp_path: Path) -> None:
    """A setting with a cell not yet stored has no best (the rows that ran first would win); a row the
    study keeps apart (``winners.apart``: scored by another protocol) is shown in its own column and never
    named best, even with the highest mean."""
    from fedfew.study.collect import StudyResults
    from fedfew.study.study_file import load_study
    from fedfew.study.winners import winners, winners_markdown

    data = {**DIGITS_STUDY, "winners": {"apart": ["fl-proto"], "why": "another protocol"}}
    study, _ = load_study(write_study(tmp_path, data))
    results = StudyResults(study, "cpu", None, cells_total=12, cells_found=9, methods=list(study.methods),
                           settings=list(study.settings), missing={"IID 1-shot": 3})
    results.values = {("fl-proto", "non-IID 1-shot"): {0: 90.0, 1: 92.0},
                      ("fl-maml", "non-IID 1-shot"): {0: 53.0, 1: 51.0},
                      ("fl-maml", "IID 1-shot"): {0: 60.0, 1: 62.0}}
    assert winners(results) == [("non-IID 1-shot", "fl-maml", [], None), ("IID 1-shot", None, [], None)]
    text = winners_markdown(results, "studies/study.yaml")
    assert "| setting | best (mean [95% interval]) | not separated from the best | apart: another protocol |" in text
    assert f"| non-IID 1-shot | FL-MAML: {angular([53, 51], T1)} | none | fl-proto: {angular([90, 92], T1)} | — |" in text
    assert "| IID 1-shot | incomplete (3 cells not yet run) | | fl-proto: — | — |" in text
    bad = {**DIGITS_STUDY, "winners": {"apart": ["fedavg"]}}
    with pytest.raises(UsageError, match="winners.apart: 'fedavg' is not one of"):
        load_study(write_study(tmp_path, bad, name="bad.yaml"))


# -- metric paths: one key, or the mean of chosen keys (FML's per-client scores) -----------------------
def test_a_metric_path_reads_one_key_or_the_mean_of_the_chosen_keys() -> None:
    record = {"metrics": {"test": {"accuracy": 0.5, "local_by_client": {"0": 0.9, "1": 0.6, "2": 0.3, "3": 0.1}}}}
    assert metric(record, "test.accuracy") == 0.5
    assert metric(record, "test.local_by_client.0") == 0.9
    assert metric(record, "test.local_by_client[1,2,3]") == pytest.approx((0.6 + 0.3 + 0.1) / 3)
    assert metric(record, "test.local_by_client[2]") == 0.3
    assert metric(record, "test.local_by_client[1,7]") is None  # never a mean over fewer clients than named
    assert metric(record, "test.local_by_client") is None  # a mapping is not a number
    assert metric(record, "test.accuracy[0]") is None and metric(record, "test.nothing.0") is None


def test_columns_reading_other_numbers_of_the_same_runs_run_each_config_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {**DIGITS_STUDY, "settings": {"IID": {"partition.name": "iid"},
                                         "IID, its interval": {"set": {"partition.name": "iid"}, "metric": "test.ci95"}},
            "budgets": {"smoke": {"set": {"federation.rounds": 1}, "seeds": [0], "control": False, "no_control": "a test budget"}, "cpu": {}},
            "claims": [], "paper": [], "control": None, "no_control": "a test study of one row"}
    path = write_study(tmp_path, data)
    args = ["--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"), "--budget", "smoke"]
    code, _, err = run_cli(["study", "run", str(path), *args], capsys)
    assert code == 0, err
    assert "4 cells (2 distinct runs)" in err
    records = ResultStore(tmp_path / "store", "digits-check").records()
    assert len(records) == 2 and len(list((tmp_path / "runs").rglob("status.json"))) == 2
    study, root = load_study(path)
    assert study.metric_of("fl-proto", "IID, its interval") == "test.ci95" and study.metric_of("fl-proto", "IID") \
        == "test.accuracy"
    from fedfew.study.collect import collect

    results = collect(study, root, tmp_path / "store", "smoke")
    by_method = {r["config"]["algorithm"]["name"]: r["metrics"]["test"] for r in records}
    assert results.values[("fl-proto", "IID")] == {0: 100 * by_method["fl-proto"]["accuracy"]}
    assert results.values[("fl-proto", "IID, its interval")] == {0: 100 * by_method["fl-proto"]["ci95"]}
    assert results.cells_found == 4 and results.wall_seconds == pytest.approx(sum(r["wall_seconds"] for r in records))


def test_a_run_another_study_stored_is_copied_not_run_again(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Two studies sharing a row (the same config and code under other labels): the second copies the
    first's record, names where it came from, and its compute counts only what it ran itself."""
    smoke = {"smoke": {"set": {"federation.rounds": 1}, "seeds": [0], "settings": ["IID 1-shot"], "control": False, "no_control": "a test budget"},
             "cpu": {}}
    first = write_study(tmp_path, {**DIGITS_STUDY, "budgets": smoke, "claims": [], "paper": [], "control": None, "no_control": "a test study of one row"},
                        name="first.yaml")
    proto = DIGITS_STUDY["methods"]["fl-proto"]
    second_data = {**DIGITS_STUDY, "name": "digits-second", "budgets": smoke, "claims": [], "paper": [], "control": None, "no_control": "a test study of one row",
                   "methods": {"the same proto": proto, "fl-maml 2 steps": {"set": {"algorithm.options.local_steps": 2}}}}
    second = write_study(tmp_path, second_data, name="second.yaml")
    store_dir, runs = tmp_path / "store", tmp_path / "runs"
    args = ["--store", str(store_dir), "--runs", str(runs), "--budget", "smoke"]
    assert run_cli(["study", "run", str(first), *args], capsys)[0] == 0
    code, out, err = run_cli(["study", "run", str(second), *args], capsys)
    assert code == 0, err
    assert "1 cells run, 0 already stored, 1 copied from other studies' stores" in out
    original = next(r for r in ResultStore(store_dir, "digits-check").records() if r["method"] == "fl-proto")
    copied = next(r for r in ResultStore(store_dir, "digits-second").records() if r["method"] == "the same proto")
    assert copied["reused_from"] == f"digits-check/{original['config_hash']}-{original['code']['source']}.json"
    assert copied["reused_from"] in err and "copied, not run again" in err
    assert copied["metrics"] == original["metrics"] and copied["study"] == "digits-second"
    assert not (runs / "digits-second" / f"{copied['config_hash']}-{copied['code']['source']}").exists()
    assert len(list((runs / "digits-second").rglob("status.json"))) == 1  # only the 2-step FL-MAML ran

    from fedfew.study.collect import collect
    from fedfew.study.report import markdown

    study, root = load_study(second)
    results = collect(study, root, store_dir, "smoke")
    ran = next(r for r in ResultStore(store_dir, "digits-second").records() if "reused_from" not in r)
    assert results.cells_found == 2 and results.reused == {"digits-check": 1}
    assert results.wall_seconds == pytest.approx(ran["wall_seconds"])
    assert results.reused_seconds == pytest.approx(original["wall_seconds"])
    assert "1 of its runs are another study's, the same config and code, copied from its store (1 from " \
           "digits-check" in markdown(results, "second.yaml")

    # --no-reuse runs every cell; a record that ran is preferred to a copy, and a copy of a copy names
    # the run that was made
    third = write_study(tmp_path, {**second_data, "name": "digits-third"}, name="third.yaml")
    code, out, err = run_cli(["study", "run", str(third), *args, "--no-reuse"], capsys)
    assert code == 0 and "2 cells run" in out and "copied" not in err
    (store_dir / "digits-check" / Path(copied["reused_from"]).name).unlink()  # digits-second's copy is first now
    found = stored_elsewhere(store_dir, "digits-fourth", copied["config_hash"], current_code())
    assert found is not None and found["reused_from"].startswith("digits-third/")
    (store_dir / "digits-third" / Path(found["reused_from"]).name).unlink()  # only the copy is left
    found = stored_elsewhere(store_dir, "digits-fourth", copied["config_hash"], current_code())
    assert found is not None and found["reused_from"] == copied["reused_from"] and found["metrics"] == original["metrics"]


def test_a_loss_curve_is_drawn_in_its_own_unit_and_skips_switched_off_terms() -> None:
    """An accuracy is a fraction shown in percent; a training loss (F2L's L_MI) is not scaled, and a
    round where a variant's term is off (nan) counts as missing for that seed."""
    from fedfew.study.figures import mean_curve

    per_seed = {0: [{"round": 2, "train_l_mi": 1.5}, {"round": 4, "train_l_mi": 1.0}],
                1: [{"round": 2, "train_l_mi": 1.3}, {"round": 4, "train_l_mi": float("nan")}]}
    (point,) = mean_curve(per_seed, "train_l_mi")  # round 4: seed 1's value is nan
    assert point[0] == 2 and point[1] == pytest.approx(1.4)  # not a fraction: Student's t as it is
    assert point[2] == pytest.approx(1.4 - T1 * 0.1) and point[3] == pytest.approx(1.4 + T1 * 0.1)


# -- budgets side by side ------------------------------------------------------------------------------
def budgets_study() -> dict:
    """The digits study with a third budget that scales fl-proto alone (per_method) and runs it alone."""
    return {**DIGITS_STUDY, "budgets": {**DIGITS_STUDY["budgets"], "x2": {
        "set": {"federation.rounds": 2, "eval.every": 3}, "per_method": {"fl-proto": {"federation.rounds": 4}},
        "methods": ["fl-proto"], "settings": ["IID 1-shot"], "control": False, "no_control": "a test budget", "note": "fl-proto at twice cpu"}}}


def test_a_budgets_per_method_overrides_reach_only_that_method_after_the_budgets_set(tmp_path: Path) -> None:
    data = {**budgets_study(), "control": {"method": "fl-proto"}}
    data["budgets"]["x2"] = {**data["budgets"]["x2"], "methods": None, "control": True}
    study, root = load_study(write_study(tmp_path, data))
    grid = {(c.method, c.setting, c.seed): c.config for c in cells(study, root, "x2")}
    proto, maml = grid[("fl-proto", "IID 1-shot", 0)], grid[("fl-maml", "IID 1-shot", 0)]
    assert proto.federation.rounds == 4 and maml.federation.rounds == 2  # per_method wins over the budget's set
    assert proto.eval.every == 3 and maml.eval.every == 3
    control = grid[(CONTROL, "IID 1-shot", 0)]
    assert control.federation.rounds == 0 and control.eval.every == 3  # the control method's entry, then round 0
    # a budget without per_method resolves exactly as before: the cpu cells' keys are unchanged
    plain = {**DIGITS_STUDY}
    before = [c.config_hash for c in cells(*load_study(write_study(tmp_path, plain, "plain.yaml")), "cpu")]
    assert [c.config_hash for c in cells(study, root, "cpu") if c.method != CONTROL] == \
        [h for h, c in zip(before, cells(study, root, "cpu")) if c.method != CONTROL]
    data["budgets"]["x2"]["per_method"] = {"fedavg": {}}
    with pytest.raises(UsageError, match="budgets.x2.per_method: 'fedavg' is not one of"):
        load_study(write_study(tmp_path, data, "bad.yaml"))


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


def test_a_report_over_budgets_puts_them_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hand-made store: smoke (IID 1-shot only), cpu (both settings) and x2 (fl-proto alone, no control).
    Columns: per budget its settings; then the paper's numbers once per setting. A row a budget does
    not run is n/a there; a cell of that budget not in the store is —. Each budget judges its own claims."""
    (tmp_path / "studies").mkdir()
    (tmp_path / "docs").mkdir()
    path = write_study(tmp_path / "studies", budgets_study(), "digits.yaml")
    store_dir = tmp_path / "studies" / "store"
    put_values(store_dir, path, "smoke", {("fl-proto", "IID 1-shot", 0): 0.60, ("fl-proto", "IID 1-shot", 1): 0.62,
                                          (CONTROL, "IID 1-shot", 0): 0.50, (CONTROL, "IID 1-shot", 1): 0.51})
    put_values(store_dir, path, "cpu", {("fl-proto", "IID 1-shot", 0): 0.70, ("fl-proto", "IID 1-shot", 1): 0.70})
    put_values(store_dir, path, "x2", {("fl-proto", "IID 1-shot", 0): 0.80})
    code, out, err = run_cli(["study", "report", str(path), "--store", str(store_dir), "--budgets", "smoke,cpu,x2"],
                             capsys)
    assert code == 0, err
    header = ("| method | IID 1-shot, smoke: ours | non-IID 1-shot, cpu: ours | IID 1-shot, cpu: ours | "
              "IID 1-shot, x2: ours | non-IID 1-shot: paper (Table 9 (made up for the test)) | "
              "IID 1-shot: paper (Table 9 (made up for the test)) |")
    assert header in out
    # smoke: mean 61 and Student's t(0.975, 1) on the angular scale; cpu: no spread; x2: one seed
    assert f"| fl-proto | {angular([60, 62], T1)} | — | 70.00 [70.00, 70.00] | 80.00 (1 seed) | — | 63.40 |" in out
    assert "| FL-MAML | — | — | — | n/a | — | — |" in out
    # the control is the round-0 cell, the same config at smoke and cpu: stored once, shown at both
    control = angular([50, 51], T1)
    assert f"| (control) untrained, round 0 | {control} | — | {control} | n/a | — | — |" in out
    assert "- **smoke**: 4/6 cells, seeds 0, 1, 4.0 min of runs, sources handmade0000" in out
    assert "- **cpu**: 4/12 cells, seeds 0, 1, 4.0 min of runs, sources handmade0000" in out
    assert "- **x2**: 1/2 cells, seeds 0, 1.0 min of runs, sources handmade0000: fl-proto at twice cpu" in out
    # the claim fl-proto > control: at smoke d = 10, 11, at cpu d = 20, 19 (both hold, alone in their
    # family at each budget: Holm is the raw test); x2 has no control
    assert ("| smoke | fl-proto > (control) untrained, round 0 | IID 1-shot | — | **holds** | **holds** | "
            "fl-proto − (control) untrained, round 0: 10.50 ± 6.35 (p ") in out
    assert ("| cpu | fl-proto > (control) untrained, round 0 | IID 1-shot | — | **holds** | **holds** | "
            "fl-proto − (control) untrained, round 0: 19.50 ± 6.35 (p ") in out
    assert "| x2 |" not in out

    # the same in a docs page: study:NAME@a+b+c
    page = tmp_path / "docs" / "page.md"
    page.write_text("<!-- study:digits-check@smoke+cpu+x2 begin -->\n<!-- study:digits-check@smoke+cpu+x2 end -->\n")
    assert run_cli(["study", "docs", "--root", str(tmp_path)], capsys)[0] == 0
    text = page.read_text()
    assert header in text and "`fedfew study report studies/digits.yaml --budgets smoke,cpu,x2`" in text
    assert render_pages(tmp_path)[page] == text
    for marker, expected in (("digits-check@smoke+nonesuch", "names no budget 'nonesuch'"),
                             ("digits-check@smoke+cpu:claims", "several budgets take the table view only")):
        page.write_text(f"<!-- study:{marker} begin -->\n<!-- study:{marker} end -->\n")
        code, _, err = run_cli(["study", "docs", "--root", str(tmp_path)], capsys)
        assert code == 2 and expected in err and len(err.strip().splitlines()) == 1
    for argv, expected in ((["--budgets", "smoke"], "two or more distinct budgets"),
                           (["--budgets", "smoke,huge"], "budget 'huge' does not exist"),
                           (["--budgets", "smoke,cpu", "--figure", "x.png"], "prints the table over budgets only")):
        code, _, err = run_cli(["study", "report", str(path), "--store", str(store_dir), *argv], capsys)
        assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, (argv, err)


# -- the time a study has left -------------------------------------------------------------------------
def test_time_left_is_each_pending_cells_stored_time_of_its_method(tmp_path: Path) -> None:
    """The estimate adds, per pending cell, the median stored time of its method and setting among the
    budget's cells (its method's over settings where the setting has none); a copied run's time and
    another budget's are left out, a method the store has no time of counts as this sitting's mean per
    cell, and a cell part-way through counts the fraction of its rounds still to run."""
    from fedfew.study.estimate import time_left, typical_seconds
    from fedfew.study.store import CodeVersion, make_record

    study, root = load_study(write_study(tmp_path, DIGITS_STUDY))
    store = ResultStore(tmp_path / "store", study.name)
    code = CodeVersion("0.0.0", "handmade0000", None)
    grid = {(c.method, c.setting, c.seed): c for c in cells(study, root, "cpu")}
    times = {("fl-proto", "IID 1-shot", 0): 60.0, ("fl-proto", "IID 1-shot", 1): 100.0,
             ("fl-proto", "non-IID 1-shot", 0): 400.0}
    for (method, setting, seed), seconds in times.items():
        c = grid[(method, setting, seed)]
        store.put(make_record(study.name, "cpu", method, setting, seed, c.config_hash, dumped(c), code,
                              {"test": {"accuracy": 0.5}}, seconds))
    copied = grid[("fl-maml", "IID 1-shot", 0)]  # another study's run: its 9,999 s are not this study's
    store.put({**make_record(study.name, "cpu", "fl-maml", "IID 1-shot", 0, copied.config_hash, dumped(copied), code,
                             {"test": {"accuracy": 0.5}}, 9999.0), "reused_from": "other/x.json"})
    smoke = cells(study, root, "smoke")[0]  # another budget's cell: its time does not count either
    store.put(make_record(study.name, "smoke", smoke.method, smoke.setting, smoke.seed, smoke.config_hash, dumped(smoke),
                          code,
                          {"test": {"accuracy": 0.5}}, 7777.0))
    typical = typical_seconds(store, {c.config_hash for c in grid.values()})
    assert typical == {("fl-proto", "IID 1-shot"): 80.0, ("fl-proto", "non-IID 1-shot"): 400.0,
                       ("fl-proto", None): 100.0}
    pending = [grid[("fl-proto", "non-IID 1-shot", 1)], grid[("fl-proto", "IID 1-shot", 1)]]
    assert time_left(pending, typical, []) == 480.0
    maml = grid[("fl-maml", "IID 1-shot", 1)]
    assert time_left(pending + [maml], typical, []) is None  # nothing known of fl-maml yet
    assert time_left(pending + [maml], typical, [30.0, 50.0]) == 520.0  # this sitting's mean for it
    # an interrupted run counts only the rounds it has left; one done (a copy) counts nothing
    rounds = pending[0].config.federation.rounds
    half = {pending[0].config_hash: rounds // 2, pending[1].config_hash: rounds}
    assert time_left(pending, typical, [], half) == pytest.approx(400.0 * (1 - (rounds // 2) / rounds))


def test_status_says_what_each_run_still_to_go_is_doing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`fedfew study status` from the store and the run folders: a stored run counts as stored; a run
    folder that finished but has no record is "finished", one stopped part-way "interrupted at round r",
    one whose claim a live process holds "running" with that pid; a run another study's store holds is
    "copyable". The compute left is, per run, the stored runs' median time times the rounds not done."""
    from fedfew.study.status import budget_status

    study_data = {**DIGITS_STUDY, "control": None, "no_control": "a test study of one row", "claims": [], "paper": [], "seeds": [0, 1, 2, 3],
                  "methods": {"fl-proto": DIGITS_STUDY["methods"]["fl-proto"]},
                  "budgets": {**DIGITS_STUDY["budgets"],
                              "two": {"set": {"federation.rounds": 2, "eval.every": 1}, "settings": ["IID 1-shot"]}}}
    path = write_study(tmp_path, study_data)
    store_dir, runs = tmp_path / "store", tmp_path / "runs"
    args = ["--store", str(store_dir), "--runs", str(runs)]
    assert run_cli(["study", "run", str(path), "--budget", "two", *args], capsys)[0] == 0
    store = ResultStore(store_dir, "digits-check")
    by_seed = {r["seed"]: r for r in store.records()}
    folders = {}
    for seed in (1, 2, 3):  # seed 0 stays stored; the others lose their records
        record = by_seed[seed]
        (store.folder / f"{record['config_hash']}-{record['code']['source']}.json").unlink()
        [folders[seed]] = [p for p in (runs / "digits-check").iterdir() if p.name.startswith(record["config_hash"])]
    for seed, kept_rounds in ((2, 1), (3, 0)):  # stopped after round 1; stopped before round 1
        [run_folder] = [p for p in folders[seed].iterdir() if p.is_dir()]
        metrics = run_folder / "metrics.jsonl"
        lines = [line for line in metrics.read_text().splitlines() if json.loads(line)["round"] <= kept_rounds]
        metrics.write_text("\n".join(lines) + "\n")
        status_file = run_folder / "status.json"
        status_file.write_text(json.dumps({**json.loads(status_file.read_text()), "status": "interrupted"}))
    copy = write_study(tmp_path, {**study_data, "name": "digits-copy"}, "copy.yaml")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(folders[3])],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        study, root = load_study(path)
        status = budget_status(study, root, "two", store_dir, runs, current_code())
        assert (status.runs, status.stored, status.other_code) == (4, 1, 0)
        states = {p.cell.seed: (p.state, p.rounds_done, p.owner) for p in status.pending}
        assert states == {1: ("finished", 2, None), 2: ("interrupted", 1, None), 3: ("running", 0, holder.pid)}
        typical = by_seed[0]["wall_seconds"]
        assert status.seconds_left == pytest.approx(typical * (0 + 0.5 + 1))
        code, out, err = run_cli(["study", "status", str(path), str(copy), "--budget", "two", "--cells", *args], capsys)
        assert code == 0, err
        assert "digits-check @ two: 1/4 runs stored; 3 to go: " in out
        assert f"fl-proto / IID 1-shot / seed 3: running (pid {holder.pid}), round 0/2" in out
        assert "seed 2: interrupted at round 1/2" in out and "seed 1: finished, not yet stored" in out
        assert "digits-copy @ two: 0/4 runs stored; 4 to go: 1 copyable, 3 not started" in out
        assert "0 of 2 study budgets complete" in out
    finally:
        holder.kill()
        holder.wait()
    assert claim_owner(folders[3]) is None  # the status left no claim behind; the dead holder's is gone too
    code, out, _ = run_cli(["study", "status", str(path), "--budget", "nope", *args], capsys)
    assert code == 2


def test_a_resumed_runs_record_counts_each_sitting_once(tmp_path: Path) -> None:
    """A run stopped after round 2 (40 s of rounds so far) and resumed for rounds 3-4 (another 30 s of
    rounds in a sitting of 35 s): the runner's summary before ``seconds_resumed_from`` said 35 + 70 =
    105 s, counting the second sitting's rounds twice; the record takes 40 + 35 = 75 s. A run never
    resumed, or whose summary has ``seconds_resumed_from`` (today's runner), keeps its summary's."""
    from fedfew.study.run_readback import run_seconds

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"round": 1, "seconds": 20.0}, {"round": 2, "seconds": 40.0}, {"round": 3, "seconds": 55.0},
            {"round": 4, "seconds": 70.0}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    (run / "status.json").write_text(json.dumps({"status": "complete", "round": 4}))
    assert run_seconds(run, {"seconds": 75.5}) == 75.5  # never resumed
    (run / "status.json").write_text(json.dumps({"status": "complete", "round": 4, "resumed": 2}))
    assert run_seconds(run, {"seconds": 105.0}) == pytest.approx(75.0)
    (run / "status.json").write_text(json.dumps({"status": "complete", "round": 4, "resumed": 0}))
    assert run_seconds(run, {"seconds": 105.0}) == pytest.approx(35.0)  # resumed from the start: this sitting only
    # A summary that says where its seconds resumed from counts each sitting once already.
    (run / "status.json").write_text(json.dumps({"status": "complete", "round": 4, "resumed": 2}))
    assert run_seconds(run, {"seconds": 75.0, "seconds_resumed_from": 40.0}) == 75.0


def test_a_cell_that_failed_before_its_first_checkpoint_starts_again_with_this_processs_data_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell run with $FEDFEW_DATA unset fails (no data) and leaves a run folder recording the data
    folder it looked in; once $FEDFEW_DATA is right, the same command runs the cell into the store
    instead of resuming that folder (nothing to resume: no checkpoint) and failing again."""
    import numpy as np

    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(8), 6)
    np.savez(data / "blobs.npz", x=(rng.normal(0, 3, (8, 6))[labels] + rng.normal(0, 0.3, (48, 6))).astype(np.float32),
             y=labels)
    config = {"name": "blobs", "seed": 0, "task": "fewshot",
              "dataset": {"name": "arrays", "options": {"path": "blobs.npz",
                                                        "class_split": {"base": 0.5, "val": 0.0, "novel": 0.5, "seed": 0}}},
              "splits": {"train": "base", "val": None, "test": "novel"},
              "partition": {"name": "iid", "num_clients": 2}, "model": {"name": "mlp", "options": {"hidden": 8}},
              "algorithm": {"name": "fl-proto", "options": {"local_steps": 1}},
              "federation": {"rounds": 1, "clients_per_round": 2},
              "episodes": {"n_way": 2, "k_shot": 1, "q_query": 2, "test_episodes": 6}, "eval": {"every": 1},
              "runtime": {"threads": 1}}
    (tmp_path / "blobs.yaml").write_text(yaml.safe_dump(config))
    study = {"name": "blobs-check", "title": "one cell on blobs", "config": str(tmp_path / "blobs.yaml"),
             "methods": {"fl-proto": {}}, "settings": {"IID": {}}, "seeds": [0], "control": None,
             "no_control": "a test study of one cell", "budgets": {"smoke": {}, "cpu": {}}}
    path = write_study(tmp_path, study)
    args = ["study", "run", str(path), "--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"),
            "--budget", "smoke"]
    monkeypatch.setenv("FEDFEW_DATA", str(tmp_path / "nowhere"))
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "1 of 1 cells failed" in err and "nowhere" in err
    monkeypatch.setenv("FEDFEW_DATA", str(data))
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    (record,) = ResultStore(tmp_path / "store", "blobs-check").records()
    assert 0.0 <= record["metrics"]["test"]["accuracy"] <= 1.0
    (cell_folder,) = (tmp_path / "runs" / "blobs-check").iterdir()
    assert len([p for p in cell_folder.iterdir() if p.is_dir()]) == 2  # the failed run stays, beside the new one


def test_method_runs_only_the_named_rows_and_a_wrong_name_is_one_line(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    study = {**DIGITS_STUDY, "seeds": [0], "budgets": {"smoke": {"set": {"federation.rounds": 1}, "settings": ["IID 1-shot"]},
                                                      "cpu": {}}}
    path = write_study(tmp_path, study)
    args = ["study", "run", str(path), "--store", str(tmp_path / "store"), "--runs", str(tmp_path / "runs"),
            "--budget", "smoke"]
    code, _, err = run_cli([*args, "--method", "fl-protto"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--method 'fl-protto'" in err and "did you mean 'fl-proto'?" in err
    code, _, _ = run_cli([*args, "--method", "fl-proto"], capsys)
    assert code == 0
    assert [r["method"] for r in ResultStore(tmp_path / "store", "digits-check").records()] == ["fl-proto"]
    code, _, err = run_cli(args, capsys)  # the other rows, the stored one skipped
    assert code == 0 and "1 already in" in err
    assert sorted(r["method"] for r in ResultStore(tmp_path / "store", "digits-check").records()) == \
        sorted(["fl-proto", "fl-maml", CONTROL])
