"""A Ray cluster of two nodes on 127.0.0.1 for tests: a head (``ray start --head``) and a second raylet
(``ray start --address``), each with one CPU, in a private temp folder; stopped by the PIDs of exactly
its own processes (every one carries a marker in its environment), never ``ray stop``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

MARKER = "FEDFEW_TEST_RAY_CLUSTER"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def marked_pids(marker: str) -> set[int]:
    """PIDs of live processes whose environment carries ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def pids_using(folder: str) -> set[int]:
    """PIDs of live processes with a file open under ``folder`` (Ray's processes keep their logs in
    their session folder, whatever their environment or process title)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd).startswith(folder):
                    found.add(int(entry.name))
                    break
        except OSError:
            continue
    return found


def _alive(pids: set[int]) -> set[int]:
    from fedfew.core.processes import alive

    return {p for p in pids if alive(p)}


class RayCluster:
    def __init__(self, cpus_per_node: int = 1) -> None:
        self.marker = uuid.uuid4().hex
        self.temp = tempfile.mkdtemp(prefix="fr", dir="/tmp")  # short: Ray's socket paths are length-limited
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        ray = str(Path(os.environ.get("VIRTUAL_ENV", "")) / "bin" / "ray") if os.environ.get("VIRTUAL_ENV") else "ray"
        import shutil
        import sys

        ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or ray
        env = {**os.environ, MARKER: self.marker, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
        common = [f"--num-cpus={cpus_per_node}", "--num-gpus=0", "--disable-usage-stats"]
        try:
            subprocess.run([ray, "start", "--head", f"--port={self.port}", "--node-ip-address=127.0.0.1",
                            f"--temp-dir={self.temp}", "--include-dashboard=false", *common],
                           env=env, check=True, capture_output=True, timeout=180)
            subprocess.run([ray, "start", f"--address={self.address}", "--node-ip-address=127.0.0.1", *common],
                           env=env, check=True, capture_output=True, timeout=180)
        except BaseException:
            self.stop()
            raise

    def pids(self) -> set[int]:
        """Its processes: those carrying the marker or holding files in its temp folder, and everything
        below them (Ray's agents start with an environment of their own)."""
        from fedfew.core.processes import descendant_pids

        marked = marked_pids(self.marker) | pids_using(self.temp)
        return marked.union(*(descendant_pids(pid) for pid in marked))

    def stop(self) -> None:
        """SIGTERM every process of this cluster, then SIGKILL what is left."""
        known = self.pids()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            known |= self.pids()
            for pid in known:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 3  # Ray's agents ignore SIGTERM: SIGKILL follows
            while _alive(known) and time.monotonic() < deadline:
                time.sleep(0.2)
        self.left = _alive(known)
        import shutil

        shutil.rmtree(self.temp, ignore_errors=True)

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
