"""The federated engine: algorithm interface, aggregation, state handling and the simulator."""

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
from fedfew.engine.simulator import CommLog, Simulator, client_schedule, run_round
from fedfew.engine.state import StateDict, clone_state, get_state, load_state_, payload_bytes

__all__ = [
    "ALGORITHMS", "Algorithm", "ClientData", "ClientResult", "CommLog", "Context", "EpisodeShape",
    "EvalData", "Options", "Simulator", "StateDict", "average_tensors", "client_schedule", "clone_state",
    "get_state", "load_state_", "normalise", "payload_bytes", "register", "run_round", "weighted_average",
    "weights_for",
]
