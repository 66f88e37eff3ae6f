"""The engine base (fedfew.engine.base): an engine that only delivers gets faults, late replies and
counts from the base, whichever engine runs (FRL's deployment groups too); faults are drawn once,
seeded, and only the replies are aggregated."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from fedfew.config.validation import load_config
from fedfew.core.errors import ConfigError
from fedfew.engine.base import ENGINES, Delivery, Engine, EngineSetup, Faults
from fedfew.engine.tasks import ClientTask, run_client_task
from fedfew.run.experiment import build_experiment
from fedfew.run.runner import run_experiment
from tests.run.common import metrics, status
from tests.tiny import ALGORITHM_SETUPS, simulate, tiny_config


# -- client faults ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALGORITHM_SETUPS))
def test_thirty_percent_dropout_completes_and_records_who_replied(name: str, tmp_path: Path) -> None:
    config = load_config(tiny_config(name, federation={"rounds": 2, "clients_per_round": 4, "dropout": 0.3,
                                                       "stragglers": 0.25}))
    summary = run_experiment(config, tmp_path, progress=False)
    rows = metrics(Path(summary["folder"]))
    for row in rows:
        clients = row["clients"]
        if name == "frl-scratch":
            continue  # exchanges nothing in its rounds
        assert len(clients["failed"]) == 1 and len(clients["late"]) == 1  # round(0.3 * 4), round(0.25 * 4)
        assert set(clients["replied"]) == set(clients["asked"]) - set(clients["failed"]) - set(clients["late"])
    assert status(Path(summary["folder"])) == "complete"


def test_faults_are_seeded_and_aggregate_only_the_replies() -> None:
    from fedfew.engine.base import Faults

    faults = Faults(dropout=0.3, stragglers=0.2)
    first = faults.draw(list(range(10)), seed=1, round_key="4")
    assert first == faults.draw(list(range(10)), seed=1, round_key="4")
    assert len(first[0]) == 3 and len(first[1]) == 2 and not first[0] & first[1]
    assert first != faults.draw(list(range(10)), seed=1, round_key="5")


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
