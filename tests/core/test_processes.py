"""fedfew.core.processes: the process questions the Flower launcher and the study claims ask."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from fedfew.core.processes import alive, descendant_pids


def test_a_zombie_child_is_not_a_descendant_and_a_running_one_is() -> None:
    """An ended child not yet reaped (a zombie) is no process left to end: leak checks after a Ray or
    Flower shutdown must not count it, while a running child is counted until it ends."""
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while alive(ended.pid) and time.monotonic() < deadline:  # until it has exited, unreaped
            time.sleep(0.05)
        assert not alive(ended.pid) and os.path.exists(f"/proc/{ended.pid}")  # a zombie: exited, not reaped
        found = descendant_pids(os.getpid())
        assert running.pid in found
        assert ended.pid not in found
    finally:
        running.kill()
        running.wait()
        ended.wait()
    assert running.pid not in descendant_pids(os.getpid())
