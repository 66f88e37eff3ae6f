"""Which algorithms differential privacy covers (fedfew.privacy.coverage): an upload not covered, options
that leak and a plugin that does not say what it uploads are refused in one line, exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fedfew.cli.main import main
from fedfew.config.validation import load_config
from fedfew.interface.algorithm import Algorithm
from fedfew.interface.registration import ALGORITHMS, register
from fedfew.privacy import (
    PrivacyConfigError,
)
from fedfew.run.experiment import build_experiment
from tests.privacy.common import private

#: The built-in algorithms whose upload DP does not cover (with their tiny configs' options).
REFUSED = ["frl-scratch", "local", "oneshot", "adfl"]


def refused(name: str) -> str:
    """Why DP refuses a registered algorithm, as its class declares it (Algorithm.dp_refused)."""
    return vars(ALGORITHMS.get(name))["dp_refused"]


@pytest.mark.parametrize("name", ["adfl", "local"])
def test_an_upload_not_covered_is_one_line_and_exit_2(name: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(private(name, federation={"rounds": 1, "clients_per_round": 2})))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert name in err and refused(name) in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize("name", REFUSED)
def test_an_algorithm_whose_upload_is_not_covered_refuses_dp(name: str) -> None:
    config = load_config(private(name, federation={"rounds": 1, "clients_per_round": 2}))
    with pytest.raises(PrivacyConfigError) as info:
        build_experiment(config)
    message = str(info.value)
    assert name in message and refused(name) in message and "\n" not in message


def test_a_plugin_that_does_not_say_what_it_uploads_is_refused_naming_dp_upload() -> None:
    """The reason is the class's own (``dp_refused``); a class that says nothing is told what to set."""
    from fedfew.privacy.coverage import refused_because

    class Quiet(Algorithm):
        pass

    class Loud(Algorithm):
        dp_refused = "it keeps every upload"

    assert "set dp_upload on the class" in refused_because(Quiet)
    assert refused_because(Loud) == "it keeps every upload"
    assert refused_because(type("Child", (Loud,), {})) != "it keeps every upload"  # a subclass says its own


@pytest.mark.parametrize("name,options", [("fedavg", {"score_uploads": True}), ("frl-oneshot", {"stage": "preparation"}),
                                          ("fedfsl-mi-adv", {"reference": "exclusive"}),
                                          ("frl", {"classifier": "linear", "gamma": 1.0})])
def test_options_that_leak_refuse_dp(name: str, options: dict[str, Any]) -> None:
    config = private(name)
    config["algorithm"]["options"].update(options)
    if name == "fedavg":
        config.update(task="classification", partition={"name": "iid", "num_clients": 4},
                      model={"name": "mlp", "options": {"hidden": 16}})
    with pytest.raises(PrivacyConfigError, match=name):
        build_experiment(load_config(config))


def test_a_plugin_algorithm_that_says_nothing_is_refused() -> None:
    from fedfew.algorithms.fedavg import FedAvg
    from fedfew.interface.registration import ALGORITHMS

    @register("silent-upload-test")
    class Silent(FedAvg):
        dp_upload = None  # type: ignore[assignment]

    try:
        config = private("fedavg")
        config["algorithm"]["name"] = "silent-upload-test"
        with pytest.raises(PrivacyConfigError, match="does not say what its upload is"):
            build_experiment(load_config(config))
    finally:
        ALGORITHMS._items.pop("silent-upload-test", None)
