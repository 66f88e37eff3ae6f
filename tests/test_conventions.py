"""The engine template and registry, the command line's conventions (logging, exit codes, tracebacks,
--version) and the deprecated ``runtime.workers`` alias."""

from __future__ import annotations

import logging
import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedfew.cli.main import logging_to_stderr, main
from fedfew.config.validation import load_config
from fedfew.core.errors import ConfigError
from fedfew.engine.base import ENGINES, Delivery, Engine, EngineSetup, Faults, InProcessEngine
from fedfew.engine.tasks import ClientTask, run_client_task
from fedfew.run.experiment import build_experiment
from tests.tiny import simulate, tiny_config


# -- the engine template -------------------------------------------------------------------------------
class CountingEngine(Engine):
    """An engine that implements only ``deliver`` (in this process) and counts what it is given."""

    name = "counting"
    built: list[CountingEngine] = []  # every instance, deployment groups' included

    def __init__(self, setup: EngineSetup) -> None:
        CountingEngine.built.append(self)
        super().__init__(setup.algorithm, setup.seed, setup.states, setup.faults, setup.compute)
        self.clients = setup.clients
        self.delivered: list[list[int]] = []

    @classmethod
    def build(cls, setup: EngineSetup, options: Any) -> Engine:
        return cls(setup)

    def deliver(self, task: ClientTask, payloads: Mapping[int, dict[str, Any]]) -> Delivery:
        self.delivered.append(sorted(payloads))
        return Delivery({cid: run_client_task(self.algorithm, task, self.clients[cid], payloads[cid],
                                              self.state_of(task.namespace, cid), self.seed)
                         for cid in sorted(payloads)})


@pytest.fixture
def counting_engine() -> Any:
    ENGINES.register("counting", help="a test engine")(CountingEngine)
    yield CountingEngine
    ENGINES._items.pop("counting")
    ENGINES._help.pop("counting")


def run(config: dict[str, Any], overrides: list[str]) -> tuple[list[dict[str, Any]], Engine]:
    cfg = load_config(config, overrides)
    simulator = build_experiment(cfg).simulator()
    out = simulate(simulator, cfg)
    return out["history"], simulator.engine


def test_an_engine_that_only_delivers_gets_faults_late_replies_and_counts_from_the_base(counting_engine) -> None:
    """A registered engine chosen by name: the base draws the faults (a failed client is never
    delivered to), drops the stragglers' replies and counts bytes, so the numbers equal in-process."""
    config = tiny_config("fl-proto", federation={"rounds": 2, "dropout": 0.25, "stragglers": 0.25})
    reference, _ = run(config, [])
    history, engine = run(config, ["runtime.engine=counting"])
    assert isinstance(engine, CountingEngine) and history == reference
    for row, delivered in zip(history, engine.delivered):
        clients = row["clients"]
        assert delivered == sorted(set(clients["asked"]) - set(clients["failed"]))  # failed: nothing sent
        assert clients["late"] and set(clients["late"]).isdisjoint(clients["replied"])  # late: dropped


def test_frl_deployment_groups_run_on_the_configured_engine(counting_engine) -> None:
    """FRL's deployment groups (new clients the algorithm makes) get engines of the configured kind,
    with the numbers of the in-process engine."""
    config = tiny_config("frl", federation={"rounds": 1})
    reference = load_config(config)
    simulator = build_experiment(reference).simulator()
    expected = simulator.run(1, 4, 1)
    CountingEngine.built.clear()
    cfg = load_config(config, ["runtime.engine=counting"])
    simulator = build_experiment(cfg).simulator()
    got = simulator.run(1, 4, 1)
    deployments = [e for e in CountingEngine.built if e.states is None]
    assert deployments and all(e.delivered for e in deployments)  # each group's rounds went through it
    assert got["test"] == expected["test"]


def test_an_engine_checks_the_config_parts_only_it_understands(counting_engine) -> None:
    """The config check asks the named engine (``Engine.check_config``, through the registry): an engine
    plugin refuses what it cannot run with its own one-line message, and inherits the base's refusals
    of what runs only in this process."""
    config = tiny_config("fl-proto")

    class PickyEngine(CountingEngine):
        @classmethod
        def check_config(cls, config: Any) -> None:
            super().check_config(config)
            if config.federation.rounds > 1:
                raise ValueError("federation.rounds: the picky engine runs one round (got "
                                 f"{config.federation.rounds})")

    ENGINES.register("picky", help="a test engine")(PickyEngine)
    try:
        with pytest.raises(ConfigError, match=r"federation\.rounds: the picky engine runs one round \(got 2\)"):
            load_config(config, ["runtime.engine=picky", "federation.rounds=2"])
        assert load_config(config, ["runtime.engine=picky", "federation.rounds=1"]).runtime.engine == "picky"
        with pytest.raises(ConfigError, match="runtime.batch_clients runs a round's clients together in this process"):
            load_config(config, ["runtime.engine=picky", "federation.rounds=1", "runtime.batch_clients=true"])
    finally:
        ENGINES._items.pop("picky")
        ENGINES._help.pop("picky")
    assert load_config(config, ["runtime.batch_clients=true"]).runtime.batch_clients  # in process: allowed


def test_faults_are_drawn_once_for_every_engine() -> None:
    faults = Faults(dropout=0.25, stragglers=0.25)
    failed, late = faults.draw(list(range(8)), seed=3, round_key="7")
    assert len(failed) == 2 and len(late) == 2 and not failed & late
    assert faults.draw(list(range(8)), seed=3, round_key="7") == (failed, late)  # seed and round key alone


def test_the_engines_are_registered_by_name() -> None:
    from fedfew.config.engines import ENGINES as BY_NAME  # the built-in engines, loaded on first use

    assert {"inprocess", "workers", "flower"} <= set(BY_NAME.names())
    assert BY_NAME.get("inprocess") is InProcessEngine and BY_NAME.get("flower").runs_elsewhere
    assert BY_NAME.get("flower") is ENGINES.get("flower")  # registered where plugins register theirs
    assert load_config(tiny_config("fl-proto"), ["runtime.engine=workers"]).engine_options().workers == 2


def test_bad_engine_names_and_options_are_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    assert main(["run", str(config), "--out", str(tmp_path), "--quiet", "--set", "runtime.engine=worker"]) == 2
    err = capsys.readouterr().err
    assert "runtime.engine" in err and "'workers'" in err and len(err.strip().splitlines()) == 1
    assert main(["run", str(config), "--out", str(tmp_path), "--quiet", "--set", "runtime.engine=workers",
                 "--set", "runtime.engine_options={workers: 0}"]) == 2
    assert "runtime.engine_options.workers" in capsys.readouterr().err


def test_runtime_workers_is_a_deprecated_alias(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fedfew"):
        config = load_config(tiny_config("fl-proto"), ["runtime.workers=3"])
    assert config.runtime.engine == "workers" and config.runtime.engine_options == {"workers": 3}
    assert any("runtime.workers is deprecated" in r.getMessage() for r in caplog.records)
    back = load_config(config.model_dump(mode="json"), ["runtime.workers=0"])  # the old way back to one process
    assert back.runtime.engine == "inprocess" and back.runtime.engine_options == {}
    assert "workers" not in config.model_dump()["runtime"]  # a run folder records the new form


# -- logging ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("level,shown", [(logging.DEBUG, ["debug", "note", "warning"]),
                                         (logging.INFO, ["note", "warning"]),
                                         (logging.WARNING, ["warning"])])
def test_the_command_line_prints_fedfew_log_records_one_line_each(level: int, shown: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    log = logging.getLogger("fedfew.some.module")
    with logging_to_stderr(level):
        log.debug("a debug line")
        log.info("a note")
        log.warning("a warning")
    err = capsys.readouterr().err.splitlines()
    expected = {"debug": "fedfew: debug: a debug line", "note": "fedfew: a note", "warning": "fedfew: warning: a warning"}
    assert err == [expected[k] for k in shown]
    log.warning("after the command: not printed by fedfew")
    assert "after the command" not in capsys.readouterr().err


# -- exit codes and tracebacks ------------------------------------------------------------------------------
BROKEN = '''
from fedfew.data import DATASETS


@DATASETS.register("broken-{kind}", help="a loader with a bug")
def load(root, **options):
    raise {kind}("a bug in a loader")
'''


@pytest.mark.parametrize("kind", ["ValueError", "ZeroDivisionError"])
def test_a_bug_is_exit_1_with_one_line_and_the_traceback_in_a_file(kind: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A ValueError from a bug is not a usage error: exit 1, one line naming the file that holds the
    traceback; --traceback prints it as well."""
    plugin = tmp_path / f"broken_{kind}.py"
    plugin.write_text(BROKEN.format(kind=kind))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_config("fl-proto", dataset={"name": f"broken-{kind}"})))
    args = ["run", str(config), "--out", str(tmp_path / "out"), "--quiet", "--plugin", str(plugin)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"unexpected {kind}: a bug in a loader (traceback in " in err
    saved = Path(err.strip().rsplit("traceback in ", 1)[1].rstrip(")"))
    assert "Traceback" in saved.read_text() and "a bug in a loader" in saved.read_text()
    saved.unlink()
    assert main(["--traceback", *args]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and f"{kind}: a bug in a loader" in err
    Path(err.split("traceback in ", 1)[1].split(")", 1)[0]).unlink()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import fedfew

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"fedfew {fedfew.__version__}"


def test_library_code_leaves_the_environment_as_it_found_it() -> None:
    from fedfew.data.offline import offline_environment

    before = dict(os.environ)
    with offline_environment(FEDFEW_TEST_OFFLINE="1", PATH="not used"):
        assert os.environ["FEDFEW_TEST_OFFLINE"] == "1" and os.environ["PATH"] == before["PATH"]
    assert dict(os.environ) == before
    source = Path(__file__).parents[1] / "src" / "fedfew"
    writes = [str(p) for p in source.rglob("*.py") if p.name != "offline.py"
              and any(w in p.read_text() for w in ("os.environ[", "environ.setdefault", "environ.update", "putenv"))]
    assert writes == [], textwrap.shorten(str(writes), 200)
