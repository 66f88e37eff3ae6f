"""``runtime.engine: flower-sim``: fedfew's Flower apps on Flower's Simulation Engine (Ray backend).

The same ClientApp handlers as the deployment runtime (:mod:`fedfew.flower.handlers`) and the same
server-side engine (:class:`~fedfew.flower.engine.FlowerEngine`), but the SuperNodes are virtual: one
per fedfew client (Flower's ``partition-id`` is the client id), their ClientApps run in long-lived Ray
actors (``flower.sim.num_cpus`` / ``num_gpus`` per actor decide how many run at once), and each
node's private state stays in its ``context.state``, which the Simulation Engine keeps for the node.

Why ``run_simulation`` and not ``flwr run``: ``flwr run`` on a simulation federation goes through a
SuperLink that installs the app's dependencies at run time (PyPI; offline it fails and still exits 0)
and hands the ServerApp a separate process, so this process could not drive the rounds. ``run_simulation``
(deprecated in 1.42, still the Python entry point of the same engine) runs the ServerApp in a thread of
this process. The ServerApp here does no work of its own: it hands its Grid to this engine and waits,
so the training loop, checkpoints and evaluation are exactly those of every other engine.

What the virtual nodes need of :mod:`fedfew.run.experiment` (a layer above this one) is the
:class:`~fedfew.engine.base.ExperimentBuilder` the experiment hands its engine: a node runs in a Ray
actor, another process, so it gets the builder by the name the builder gives (``where``), through the
actors' environment, and loads it there.

Ray: a private instance (``address`` unset), or a cluster joined at ``flower.sim.address``
(``ray start --head`` / ``ray start --address``). The client data is written once to a cache folder
the virtual nodes read (on other machines of a cluster a node builds it from its own copy of the data
at the same path). When the run ends, fails or is interrupted, the simulation is stopped, Ray is shut
down (for a cluster: this driver disconnects; its actors end with it) and every process this one
started is ended by PID.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from importlib import import_module
from pathlib import Path
from queue import Empty, Queue
from typing import Any, Protocol

from flwr.app import Context, Message
from flwr.app.typing import ConfigRecordValues
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedfew.core.config_schema import ExperimentSchema, FlowerSimConfig
from fedfew.core.errors import UsageError
from fedfew.core.processes import descendant_pids, end
from fedfew.data.offline import offline_environment
from fedfew.engine.base import ExperimentBuilder, Faults
from fedfew.flower import handlers
from fedfew.flower.engine import FlowerEngine, FlowerRunError
from fedfew.flower.node import CachedExperiment, cache_client
from fedfew.flower.secagg import secure_aggregation_mod
from fedfew.interface.compute import Compute
from fedfew.interface.state_store import ClientStates
from fedfew.privacy.secure_sum import BuiltExperiment, SecureSettings

log = logging.getLogger(__name__)

CACHE_ENV, ROOT_ENV, BUILDER_ENV = "FEDFEW_SIM_CACHE", "FEDFEW_SIM_DATA_ROOT", "FEDFEW_SIM_BUILDER"


class SimulationSetupError(UsageError):
    """The Simulation Engine cannot start with these settings (Ray unreachable, resources not there)."""


# -- the ClientApp: fedfew's handlers, each virtual SuperNode one client --------------------------------
def _as_fedfew_node(context: Context) -> Context:
    """A virtual SuperNode's node config says ``partition-id``; fedfew's handlers read ``client-id``,
    ``data-root`` and ``cache-dir``."""
    node = context.node_config
    if "client-id" not in node:
        node["client-id"] = int(node["partition-id"])
    for key, variable in (("cache-dir", CACHE_ENV), ("data-root", ROOT_ENV)):  # set by _init_ray's runtime_env
        value = os.environ.get(variable)
        if value:
            node.setdefault(key, value)
    return context


def node_builder() -> ExperimentBuilder:
    """The experiment builder of the run, in a virtual node's process: loaded by the name the
    simulation put in the actors' environment (:attr:`ExperimentBuilder.where`)."""
    where = os.environ.get(BUILDER_ENV)
    if not where:
        raise SimulationSetupError(f"this virtual node has no experiment builder (${BUILDER_ENV} is not set)")
    module, _, attribute = where.partition(":")
    builder = getattr(import_module(module), attribute)
    assert isinstance(builder, ExperimentBuilder), where
    return builder


sim_client_app = ClientApp()


@sim_client_app.query()
def _query(msg: Message, context: Context) -> Message:
    # The server wrote this node's cache; a node of a cluster without it builds it at its first task.
    return handlers.hello(msg, _as_fedfew_node(context), node_builder(), prepare=False)


@sim_client_app.train(mods=[secure_aggregation_mod])  # Flower's SecAgg+ on the rounds that ask for it
def _train(msg: Message, context: Context) -> Message:
    return handlers.train(msg, _as_fedfew_node(context), node_builder())


@sim_client_app.evaluate()
def _evaluate(msg: Message, context: Context) -> Message:
    return handlers.evaluate(msg, _as_fedfew_node(context), node_builder())


# -- Ray -----------------------------------------------------------------------------------------------
def _check_reachable(address: str) -> None:
    if address in ("local", "auto") or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=3):
            pass
    except (OSError, ValueError):
        raise SimulationSetupError(f"flower.sim.address: no Ray cluster answers at {address!r} (start one with "
                                   "`ray start --head --port=PORT`, or leave the address unset for a private "
                                   "Ray instance)") from None


def _init_ray(settings: FlowerSimConfig, env: dict[str, str], startup_timeout: float) -> None:
    import ray

    if settings.address:
        _check_reachable(settings.address)
    if ray.is_initialized():
        raise SimulationSetupError("Ray is already initialised in this process: runtime.engine=flower-sim starts "
                                   "(or joins) its own; set flower.sim.address to join a cluster")
    pythonpath = os.pathsep.join([p for p in sys.path if p] + [os.environ.get("PYTHONPATH", "")])
    # ray.init's keyword arguments, with flower.sim.init_args (any of ray.init's) over fedfew's defaults.
    args: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False,
                            **settings.init_args}
    args["address"] = settings.address or "local"
    args["runtime_env"] = {"env_vars": {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1", **env}}
    # ray.init installs its own SIGTERM/SIGINT handlers in this process (which abort it): keep ours,
    # so that a SIGTERM or Ctrl-C stops the run as on every other engine (checkpointed, exit 130).
    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} if main_thread else {}
    try:
        with offline_environment(RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0"):  # quiet: no GPU env override asked
            ray.init(**args)
    except (ConnectionError, TimeoutError, ValueError, RuntimeError) as err:
        raise SimulationSetupError(f"flower.sim: Ray did not start or connect: {str(err).splitlines()[0]}") from None
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
    total = ray.cluster_resources()
    needs = {"CPU": settings.num_cpus, "GPU": settings.num_gpus}
    for resource, need in needs.items():
        key = "num_cpus" if resource == "CPU" else "num_gpus"
        if need > 0 and total.get(resource, 0.0) < need:
            ray.shutdown()
            raise SimulationSetupError(f"flower.sim.{key}: each client needs {need:g} {resource}, but the Ray "
                                       f"cluster has {total.get(resource, 0.0):g}")
        free = _wait_for_free(resource, need, startup_timeout)
        if free < need:  # its actors would wait for ever
            ray.shutdown()
            raise SimulationSetupError(f"flower.sim.{key}: each client needs {need:g} {resource}, but only "
                                       f"{free:g} of the cluster's {total.get(resource, 0.0):g} were free within "
                                       f"{startup_timeout:g} s (flower.startup_timeout; another job holds them)")


def _wait_for_free(resource: str, need: float, timeout: float, poll: float = 0.25) -> float:
    """How much of ``resource`` the joined cluster has free, once ``need`` of it is or ``timeout`` seconds
    have passed. Why wait: a job that has just ended (a driver that disconnected, such as the run or the
    simulation before this one) frees its actors' resources only when Ray has ended those actors, which
    takes seconds on a busy machine; a job that still runs holds them until it ends."""
    import ray

    deadline = time.monotonic() + timeout
    told = False
    while (free := float(ray.available_resources().get(resource, 0.0))) < need and time.monotonic() < deadline:
        if not told:
            log.warning("flower.sim: waiting up to %g s (flower.startup_timeout) for %g %s of the Ray cluster, "
                        "held now by another job", timeout, need, resource)
            told = True
        time.sleep(poll)
    return free


# -- a running simulation ---------------------------------------------------------------------------
class Simulation:
    """Ray (started or joined), and Flower's Simulation Engine with ``num_nodes`` virtual SuperNodes
    running in a thread of this process, whose ServerApp hands over its Grid and waits until
    :meth:`close`. Several runs may use one in turn (each run's ``query`` starts the nodes afresh)."""

    def __init__(self, num_nodes: int, settings: FlowerSimConfig, data_root: str | None = None,
                 startup_timeout: float = 300.0, *, builder: ExperimentBuilder) -> None:
        from flwr.simulation import run_simulation

        self.builder = builder
        self.cache_dir = Path(tempfile.mkdtemp(prefix="fedfew-sim-cache-"))
        self.data_root = data_root
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors: Queue[BaseException] = Queue()
        self._before = descendant_pids(os.getpid())
        try:
            _init_ray(settings, {CACHE_ENV: str(self.cache_dir), BUILDER_ENV: builder.where,
                                 **({ROOT_ENV: data_root} if data_root else {})}, startup_timeout)
            grids: Queue[Grid] = Queue()
            server = ServerApp()

            @server.main()
            def _serve(grid: Grid, context: Context) -> None:  # hands the Grid over, waits for the end
                grids.put(grid)
                self._done.wait()

            resources: dict[str, ConfigRecordValues] = {"num_cpus": settings.num_cpus, "num_gpus": settings.num_gpus}

            def simulate() -> None:
                try:
                    run_simulation(server, sim_client_app, num_nodes, backend_config={"client_resources": resources})
                except BaseException as err:  # reported to the waiting side
                    self._errors.put(err)
                finally:
                    self._done.set()

            logging.getLogger("flwr").setLevel(logging.ERROR)  # its INFO lines and deprecation banner
            self._thread = threading.Thread(target=simulate, name="flower-sim", daemon=True)
            self._thread.start()
            self.grid = self._wait_for_grid(grids, startup_timeout)
        except BaseException:
            self.close()
            raise

    def _wait_for_grid(self, grids: Queue[Grid], timeout: float) -> Grid:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return grids.get(timeout=0.2)
            except Empty:
                if not self._errors.empty():
                    err = self._errors.get()
                    raise FlowerRunError(f"Flower's Simulation Engine did not start: {err}") from err
                if self._done.is_set() or time.monotonic() > deadline:
                    raise FlowerRunError("Flower's Simulation Engine did not start within "
                                         f"{timeout:.0f} s (flower.startup_timeout)") from None

    def close(self) -> None:
        """End the ServerApp thread (the simulation then stops its actors and shuts Ray down), then end
        by PID every process started since (Ray's actors can outlive the simulation)."""
        import ray

        self._done.set()
        started = descendant_pids(os.getpid()) - self._before
        if self._thread is not None:
            self._thread.join(timeout=60)
        if ray.is_initialized():
            ray.shutdown()
        end(started | (descendant_pids(os.getpid()) - self._before))
        shutil.rmtree(self.cache_dir, ignore_errors=True)

    def __enter__(self) -> Simulation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the engine ------------------------------------------------------------------------------------
class SimExperiment(CachedExperiment, BuiltExperiment, Protocol):
    """What the simulation's engine reads of a built experiment (``fedfew.run.experiment.Experiment``, a layer
    above this one): its config, and what the clients' cache files and secure aggregation read."""

    @property
    def config(self) -> ExperimentSchema: ...


class FlowerSimEngine(FlowerEngine):
    """The Flower engine talking to the virtual SuperNodes of a :class:`Simulation`: its own, started
    here with ``builder`` and stopped by :meth:`close`, unless one is given (with its own builder)."""

    name = "flower-sim"

    def __init__(self, experiment: SimExperiment, faults: Faults | None, compute: Compute, run_dir: Path | None,
                 simulation: Simulation | None = None, builder: ExperimentBuilder | None = None) -> None:
        config = experiment.config
        self._owned = simulation is None
        self.simulation = simulation
        try:
            if simulation is None:
                if builder is None:
                    raise ValueError("FlowerSimEngine needs a simulation or an experiment builder to start one")
                self.simulation = simulation = Simulation(len(experiment.clients), config.flower.sim,
                                                          config.dataset.root, config.flower.startup_timeout,
                                                          builder=builder)
            for client in experiment.clients:  # the virtual nodes read these instead of the dataset
                cache_client(config, experiment, client.client_id, simulation.data_root, simulation.cache_dir,
                             simulation.builder)
            log_path = None
            if run_dir is not None:
                (run_dir / "flower").mkdir(parents=True, exist_ok=True)
                log_path = run_dir / "flower" / "messages.jsonl"
            f = config.flower
            super().__init__(simulation.grid, experiment.algorithm, config.seed, config.model_dump(mode="json"),
                             len(experiment.clients), faults, compute, f.round_timeout, f.startup_timeout, log_path,
                             SecureSettings.from_config(f.secure_aggregation, experiment))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._owned and self.simulation is not None:
            self.simulation.close()


def start_simulation_engine(experiment: SimExperiment, states: ClientStates | None, faults: Faults, compute: Compute,
                            builder: ExperimentBuilder, states_dir: Path | None = None) -> FlowerSimEngine:
    """The engine factory for ``runtime.engine: flower-sim`` (the run folder is ``states_dir``'s parent)."""
    return FlowerSimEngine(experiment, faults, compute, states_dir.parent if states_dir is not None else None,
                           builder=builder)
