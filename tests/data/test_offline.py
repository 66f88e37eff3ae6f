"""Hugging Face libraries without the network (fedfew.data.offline): the environment is changed only
inside the block, and no other library module writes to it."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path


def test_library_code_leaves_the_environment_as_it_found_it() -> None:
    from fedfew.data.offline import offline_environment

    before = dict(os.environ)
    with offline_environment(FEDFEW_TEST_OFFLINE="1", PATH="not used"):
        assert os.environ["FEDFEW_TEST_OFFLINE"] == "1" and os.environ["PATH"] == before["PATH"]
    assert dict(os.environ) == before
    source = Path(__file__).parents[2] / "src" / "fedfew"
    writes = [str(p) for p in source.rglob("*.py") if p.name != "offline.py"
              and any(w in p.read_text() for w in ("os.environ[", "environ.setdefault", "environ.update", "putenv"))]
    assert writes == [], textwrap.shorten(str(writes), 200)
