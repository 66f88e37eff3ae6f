"""A Flower federation on this machine: a SuperLink and one SuperNode per client as separate OS
processes on 127.0.0.1, the fedfew app submitted with ``flwr run``, and every process stopped
afterwards, on error or Ctrl-C too.

Offline: the SuperLink never installs per-run dependencies (``--disable-runtime-dependency-
installation``; the app runs in this environment) and telemetry and update checks are off. Secure by
default: TLS with a CA and certificate made for the run, and SuperNode authentication (each node's key
registered with the SuperLink before it starts; ``flower.tls: false`` / ``flower.node_auth: false``
turn them off). Everything lives in one folder (``RUN/flower``): certificates, keys, each process's
``FLWR_HOME`` and log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fedfew.core.processes import Identity, descendants, exists, marked, terminate
from fedfew.flower.errors import FlowerPortError, FlowerRunError
from fedfew.flower.security import make_node_key, make_tls

HOST = "127.0.0.1"
APP_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedfew-app"
version = "1.0.0"
description = "fedfew on Flower: every fedfew algorithm from a fedfew config"
license = "MIT"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedfew"

[tool.flwr.app.components]
serverapp = "fedfew.flower.apps.components:server_app"
clientapp = "fedfew.flower.apps.components:client_app"

[tool.flwr.app.config]
fedfew-config = ""
config-file = ""
run-dir = ""
"""


def write_app(folder: Path) -> Path:
    """The Flower app project (a pyproject.toml naming fedfew's ServerApp and ClientApp) in ``folder``,
    for ``flwr run FOLDER <superlink>``; fedfew must be installed where the apps run."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(APP_PYPROJECT)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def check_port(port: int, what: str) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            raise FlowerPortError(f"{what} cannot start: port {port} on {HOST} is already in use (set flower.port "
                                 "to a free port, or 0 to pick one)") from None


#: The environment variable that marks every process of one federation (children inherit it): how the
#: processes Flower started on its own are found and stopped with the rest.
MARKER = "FEDFEW_FLOWER_FEDERATION"


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    known: set[Identity] = field(default_factory=set)  # descendants seen while it ran


@dataclass
class FlowerSettings:
    round_timeout: float = 600.0
    startup_timeout: float = 300.0
    port: int = 0
    tls: bool = True
    node_auth: bool = True


class LocalFederation:
    """SuperLink + SuperNodes on 127.0.0.1; use as a context manager (stops everything on exit)."""

    def __init__(self, folder: Path, num_clients: int, settings: FlowerSettings, data_root: str | None,
                 cache_dir: Path | None = None) -> None:
        self.folder, self.num_clients, self.settings, self.data_root = folder, num_clients, settings, data_root
        self.cache_dir = cache_dir or folder / "cache"
        self.processes: list[Process] = []
        self.bin = Path(sys.executable).parent
        self.port = settings.port or free_port()
        self.tls: dict[str, Path] | None = None
        # Every process started here, and everything they start, carries this in its environment:
        # how stop() finds a child that outlived its parent (a refused SuperNode's SuperExec).
        self.marker = f"fedfew-{uuid.uuid4().hex}"

    # -- environment --------------------------------------------------------------------------------
    def env(self, home: Path) -> dict[str, str]:
        home.mkdir(parents=True, exist_ok=True)
        return {**os.environ, MARKER: self.marker, "FLWR_HOME": str(home),
                "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
                "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1", "PYTHONUNBUFFERED": "1",
                "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"}

    def cli_home(self) -> Path:
        """FLWR_HOME of the ``flwr`` command line, with a connection named "local" to our SuperLink."""
        home = self.folder / "cli"
        home.mkdir(parents=True, exist_ok=True)
        lines = ["[superlink.local]", f'address = "{HOST}:{self.port}"']
        lines += [f'root-certificates = "{self.tls["ca"]}"'] if self.tls else ["insecure = true"]
        (home / "config.toml").write_text("\n".join(lines) + "\n")
        return home

    def spawn(self, name: str, command: list[str], home: Path) -> Process:
        log = self.folder / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(command, env=self.env(home), stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    # -- starting -------------------------------------------------------------------------------------
    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        check_port(self.port, "the SuperLink")
        if self.settings.tls:
            self.tls = make_tls(self.folder / "tls", [HOST, "localhost"])
        # The SuperLink's in-memory state: its SQLite file state answered "database is locked" (HTTP
        # 500) when ten ClientApps started at once on two busy cores, which crashed its executor.
        command = [str(self.bin / "flower-superlink"), "--disable-runtime-dependency-installation",
                   "--host", HOST, "--port", str(self.port)]
        command += self.tls_flags()
        if self.settings.node_auth:
            command.append("--enable-supernode-auth")
        superlink = self.spawn("superlink", command, self.folder / "superlink")
        self.wait_listening(superlink, self.port)
        keys = [self.node_key(k) for k in range(self.num_clients)] if self.settings.node_auth else []
        for k in range(self.num_clients):
            self.start_node(k, keys[k] if keys else None)

    def tls_flags(self) -> list[str]:
        if not self.tls:
            return ["--insecure"]
        return ["--ssl-ca-certfile", str(self.tls["ca"]), "--ssl-certfile", str(self.tls["cert"]),
                "--ssl-keyfile", str(self.tls["key"])]

    def node_key(self, k: int, register: bool = True) -> Path:
        private, public = make_node_key(self.folder / "keys", f"node-{k}")
        if register:
            self.register(public)
        return private

    def register(self, public_key: Path) -> None:
        done = subprocess.run([str(self.bin / "flwr"), "supernode", "register", str(public_key), "local"],
                              env=self.env(self.cli_home()), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise FlowerRunError(f"could not register SuperNode key {public_key.name}: "
                                 f"{(done.stdout + done.stderr).strip().splitlines()[-1:]}")

    def start_node(self, k: int, private_key: Path | None, client_id: int | None = None) -> Process:
        cid = k if client_id is None else client_id
        node_config = f'client-id={cid} cache-dir="{self.cache_dir}"'
        if self.data_root is not None:
            node_config += f' data-root="{self.data_root}"'
        command = [str(self.bin / "flower-supernode"), "--superlink", f"{HOST}:{self.port}",
                   "--port", str(free_port()), "--node-config", node_config]
        command += ["--root-certificates", str(self.tls["ca"])] if self.tls else ["--insecure"]
        if private_key is not None:
            command += ["--auth-supernode-private-key", str(private_key)]
        return self.spawn(f"supernode-{k}", command, self.folder / f"supernode-{k}")

    def wait_listening(self, process: Process, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.popen.poll() is not None:
                tail = process.log.read_text(errors="replace").strip().splitlines()[-3:]
                raise FlowerRunError(f"the {process.name} exited at start ({' | '.join(tail)}); log: {process.log}")
            with socket.socket() as s:
                if s.connect_ex((HOST, port)) == 0:
                    return
            time.sleep(0.1)
        raise FlowerRunError(f"the {process.name} did not listen on {HOST}:{port} within {timeout:.0f} s")

    # -- running the app ------------------------------------------------------------------------------
    def run_app(self, run_config: dict[str, str], on_poll: Callable[[], None] | None = None, app: Path | None = None) -> int:
        """``flwr run`` the fedfew app (``app``, a folder from :func:`write_app`; default: one written
        here) with ``run_config``; returns when the run ends."""
        app = app or write_app(self.folder / "app")
        pairs = " ".join(f'{key}="{value}"' for key, value in run_config.items())
        process = self.spawn("flwr-run", [str(self.bin / "flwr"), "run", str(app), "local", "--stream",
                                          "--run-config", pairs], self.cli_home())
        while process.popen.poll() is None:
            self.note_descendants()
            if on_poll is not None:
                on_poll()
            time.sleep(0.5)
        return process.popen.returncode

    def note_descendants(self) -> None:
        for process in self.processes:
            if process.popen.poll() is None:
                process.known.update(descendants(process.popen.pid))

    # -- stopping -----------------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM every process started here and everything they started, then SIGKILL what is left.
        A second Ctrl-C or SIGTERM while this runs is held, not obeyed: obeyed, it would abandon the
        processes it is stopping (it takes at most about half a minute)."""
        with signals_held():
            self._stop()

    def _stop(self) -> None:
        self.note_descendants()
        for process in reversed(self.processes):
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes:
            try:
                process.popen.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(timeout=10)
        known = {entry for process in self.processes for entry in process.known} | set(marked(MARKER, self.marker))
        for identity in sorted(known):
            terminate(identity)
        deadline = time.monotonic() + 10  # until they are reaped, not only dead (no zombie left to see)
        while time.monotonic() < deadline and any(exists(identity) for identity in known):
            time.sleep(0.1)
        self.processes = []

    def pids(self) -> list[int]:
        return [p.popen.pid for p in self.processes] + sorted({pid for p in self.processes for pid, _ in p.known})

    def __enter__(self) -> LocalFederation:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM ignored for the duration (in the main thread; elsewhere nothing to hold)."""
    held = (signal.SIGINT, signal.SIGTERM)
    try:
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in held}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
