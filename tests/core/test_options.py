"""What every options schema shares (fedfew.core.options): a boolean is never a number, anywhere in the
schema."""

from __future__ import annotations

import pytest

from fedfew.cli.main import demo_config_path
from fedfew.config.validation import ConfigError, load_config


@pytest.mark.parametrize("assignment,key", [
    ("federation.rounds=true", "federation.rounds"),
    ("episodes.n_way=false", "episodes.n_way"),
    ("seed=true", "seed"),
    ("federation.clients_per_round=true", "federation.clients_per_round"),
    ("federation.dropout=true", "federation.dropout"),
    ("algorithm.options.local_steps=true", "algorithm.options.local_steps"),
    ("model.options.hidden=true", "model.options.hidden"),
    ("partition.options.alpha=true", "partition.options.alpha"),
])
def test_booleans_are_not_numbers_anywhere_in_the_schema(assignment: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(demo_config_path(), [assignment])
    load_config(demo_config_path(), ["runtime.progress=false", "eval.track_test=true"])  # real booleans still are
