"""From a study and a budget to its cells (fedfew.study.grid): the grid in table order with the control
last, per-method overrides of settings and budgets, untrained rows, seeds on the command line, and
the cells' keys: the workers engine and new keys at their defaults keep every stored key, while
``eval.per_class`` and privacy make new ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedfew.config.validation import PrivacyConfig, load_config
from fedfew.core.errors import UsageError
from fedfew.study.grid import cells, config_hash
from fedfew.study.study_file import load_study
from fedfew.study.study_sections import CONTROL
from tests.privacy.common import CENTRAL
from tests.study.common import (
    DIGITS_STUDY,
    ONE_ROW,
    OWN_CONTROL,
    _errors,
    _store_args,
    budgets_study,
    run_cli,
    write_study,
)
from tests.tiny import tiny_config


def test_the_new_keys_at_their_defaults_keep_every_stored_key() -> None:
    # Their defaults are registered as neutral (left out of the key), so every stored cell keeps its
    # key (the stored records' own hashes: the tests above, and tests/flower/test_secagg.py);
    # any other value is part of it.
    from fedfew.core.config_schema import EvalConfig, RuntimeConfig
    from fedfew.study.grid import NEUTRAL_DEFAULTS, config_hash

    assert NEUTRAL_DEFAULTS[("eval", "initial")] == EvalConfig().initial == "always"
    assert NEUTRAL_DEFAULTS[("runtime", "compile")] == RuntimeConfig().compile == "off"
    config = load_config(tiny_config("fl-proto"))
    assert load_config(tiny_config("fl-proto"), ["runtime.compile=off"]).runtime.compile == "off"  # YAML's false
    for override in ("eval.initial=auto", "runtime.compile=default"):
        assert config_hash(load_config(tiny_config("fl-proto"), [override])) != config_hash(config), override


REPO = Path(__file__).resolve().parents[2]


def test_stored_cells_keep_their_keys_and_per_class_makes_a_new_one() -> None:
    records = sorted((REPO / "studies" / "store").glob("*/*.json"))
    assert records, "no stored records to check"
    for path in records[:: max(1, len(records) // 60)]:  # a spread of studies, a few seconds in all
        record = json.loads(path.read_text())
        if record["config"].get("privacy", {}).get("mechanism", "none") != "none":
            continue  # a DP cell's key moved with its guarantee (test_stored_cells_keep_their_keys_and_privacy_makes_a_new_one)
        config = load_config(record["config"])
        assert config_hash(config) == record["config_hash"], path
    config = load_config(json.loads(records[0].read_text())["config"])
    on = config.model_copy(update={"eval": config.eval.model_copy(update={"per_class": True})})
    assert config_hash(on) != config_hash(config)


# -- privacy off: nothing changes ---------------------------------------------------------------------------------
def test_stored_cells_keep_their_keys_and_privacy_makes_a_new_one() -> None:
    records = sorted((REPO / "studies" / "store").glob("*/*.json"))
    assert records, "no stored records to check"
    for path in records[:: max(1, len(records) // 20)]:
        record = json.loads(path.read_text())
        privacy = record["config"].get("privacy", {})
        stored_before_issue_51 = privacy.get("mechanism", "none") != "none" and "noise" not in privacy
        if stored_before_issue_51:  # a DP cell's guarantee is in its key now: the key moved, to be re-run
            assert config_hash(load_config(record["config"])) != record["config_hash"], path
        else:
            assert config_hash(load_config(record["config"])) == record["config_hash"], path
    config = load_config(json.loads(records[0].read_text())["config"])
    assert config_hash(config.model_copy(update={"privacy": PrivacyConfig()})) == config_hash(config)
    on = config.model_copy(update={"privacy": PrivacyConfig.model_validate(CENTRAL)})
    assert config_hash(on) != config_hash(config)


def test_cells_are_the_grid_in_table_order_with_the_control_last(tmp_path: Path) -> None:
    study, root = load_study(write_study(tmp_path, DIGITS_STUDY))
    grid = cells(study, root, "cpu")
    assert [(c.method, c.setting, c.seed) for c in grid[:3]] == [
        ("fl-proto", "non-IID 1-shot", 0), ("fl-proto", "non-IID 1-shot", 1), ("fl-proto", "IID 1-shot", 0)]
    assert len(grid) == 2 * 2 * 2 + 2 * 2 and {c.method for c in grid[-4:]} == {CONTROL}
    control = grid[-1].config
    assert control.federation.rounds == 0 and control.algorithm.name == "fl-maml"
    iid = grid[2].config
    assert iid.partition.name == "iid" and iid.partition.options == {}  # the demo's alpha dropped
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


@pytest.mark.parametrize("seeds, expected", [("0,0", "--seeds '0,0'"), ("", "--seeds ''"), (" , ", "--seeds ' , '")])
def test_duplicate_or_no_seeds_on_the_command_line_are_refused(seeds: str, expected: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, ONE_ROW)
    code, _, err = run_cli(["study", "run", str(path), *_store_args(tmp_path), "--seeds", seeds], capsys)
    assert code == 2 and expected in err and len(_errors(err)) == 1, err
    assert not (tmp_path / "runs").exists()


# -- workers are not part of a cell's key --------------------------------------------------------------
def test_workers_on_the_command_line_keep_the_cells_keys(tmp_path: Path) -> None:
    study, root = load_study(write_study(tmp_path, ONE_ROW))
    plain = [c.config_hash for c in cells(study, root, "cpu")]
    for workers in ("1", "2", "0"):
        assert [c.config_hash for c in cells(study, root, "cpu", extra=[f"runtime.workers={workers}"])] == plain
    assert [c.config_hash for c in cells(study, root, "cpu", extra=["runtime.engine=workers",
                                                                     "runtime.engine_options.workers=3"])] == plain


def test_a_record_of_a_section_older_than_its_newest_field_hashes_to_its_key() -> None:
    """A store record holds the config as it was dumped when it ran: a section without the fields added
    since (privacy's noise and accounting) is as neutral as one holding them at their defaults, so
    the record's own config still hashes to the key it is filed under."""
    from fedfew.config.validation import PrivacyConfig, load_config
    from fedfew.study.grid import config_hash, dump_hash
    from tests.tiny import tiny_config

    config = load_config(tiny_config("fl-proto"))
    dump = config.model_dump(mode="json")
    older = {**dump, "privacy": {k: v for k, v in dump["privacy"].items() if k not in ("noise", "accounting")}}
    assert dump_hash(older) == dump_hash(dump) == config_hash(config)
    assert set(PrivacyConfig().model_dump()) > set(older["privacy"])
    private = {**dump, "privacy": {**older["privacy"], "mechanism": "central-dp"}}
    assert dump_hash(private) != dump_hash(dump)  # a section with a field off its default is not neutral


def test_an_untrained_of_row_is_its_methods_cell_at_round_0(tmp_path: Path) -> None:
    study, root = load_study(write_study(tmp_path, OWN_CONTROL))
    assert study.methods["fl-proto"].control == "fl-proto, untrained"  # the method takes it as its control
    assert study.methods["fl-proto, untrained"].untrained
    grid = {(c.method, c.setting, c.seed): c.config for c in cells(study, root, "cpu")}
    for setting in ("non-IID 1-shot", "IID 1-shot"):
        trained, untrained = grid["fl-proto", setting, 0], grid["fl-proto, untrained", setting, 0]
        assert untrained.federation.rounds == 0 and trained.federation.rounds == 2
        # everything else, the setting's per-method entry for fl-proto included, is fl-proto's
        assert untrained.model_dump(exclude={"name", "federation"}) == trained.model_dump(exclude={"name", "federation"})
    assert grid["fl-proto, untrained", "non-IID 1-shot", 0].episodes.q_query == 2
