"""The federated engine: algorithm interface, aggregation, state handling, engines and the simulator."""

from fedfew.engine.aggregation import average_tensors, normalise, weighted_average, weights_for
from fedfew.engine.algorithm import (
    ALGORITHMS,
    Algorithm,
    ClientData,
    ClientResult,
    Context,
    EpisodeShape,
    EvalData,
    Options,
    register,
)
from fedfew.engine.engines import Engine, Faults, InProcessEngine, Replies
from fedfew.engine.simulator import (
    CommLog,
    NothingTrainedError,
    RoundOutcome,
    RunState,
    Simulator,
    client_schedule,
    run_round,
)
from fedfew.engine.state import StateDict, clone_state, get_state, load_state_, payload_bytes
from fedfew.engine.store import ClientStates
from fedfew.engine.tasks import DATA_VIEWS, ClientTask, run_client_task

__all__ = [
    "ALGORITHMS", "Algorithm", "ClientData", "ClientResult", "ClientStates", "ClientTask", "CommLog", "Context",
    "DATA_VIEWS", "Engine", "EpisodeShape", "EvalData", "Faults", "InProcessEngine", "NothingTrainedError",
    "Options", "Replies", "RoundOutcome", "RunState", "Simulator", "StateDict", "average_tensors",
    "client_schedule", "clone_state", "get_state", "load_state_", "normalise", "payload_bytes", "register",
    "run_client_task", "run_round", "weighted_average", "weights_for",
]
