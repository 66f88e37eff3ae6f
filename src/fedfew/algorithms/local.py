"""local (FSL-local): each client meta-trains alone on its own data; nothing is communicated.

Each client keeps its own model as private state, trained exactly like one client of fl-maml (or
fl-proto with ``learner: proto``). Meta-test scores every client's model on the same fixed episodes
and reports the mean over clients (FedFSL and F2L, Table 1/3, "Local").
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from fedfew.algorithms.parts.common import per_client_table
from fedfew.algorithms.parts.episodic import EpisodicClientState, EpisodicFedAvg, MAMLOptions
from fedfew.fewshot.evaluation import accuracy
from fedfew.fewshot.learners import ProtoNet
from fedfew.interface.algorithm import (
    ClientData,
    ClientResult,
    ClientScores,
    Context,
    EvalData,
    Parts,
    Payload,
)
from fedfew.interface.registration import register
from fedfew.interface.state import get_state, load_state_


class LocalOptions(MAMLOptions):
    learner: Literal["maml", "proto"] = Field("maml", description=(
        "how each client meta-trains alone: \"maml\" (as one client of fl-maml) or \"proto\" (as fl-proto)"))



@register("local", help="FSL-local: every client meta-trains alone; scores averaged over clients")
class Local(EpisodicFedAvg[LocalOptions]):
    secure_sum = None
    secure_sum_refused = "its clients upload nothing: nothing to sum"
    dp_refused = "local's clients train alone and upload nothing; its score comes from their private models"

    dp_upload: str | None = None  # nothing is averaged: the clients' models are their own (fedfew.privacy.coverage)
    seeds_init_server = False  # its server state is empty: no model, no seeding (nothing drawn)
    seeds_init_client_state = True  # each client builds its own model from its own seed

    def __init__(self, options: LocalOptions, context: Context) -> None:
        super().__init__(options, context)
        if options.learner == "proto":
            self.learner = ProtoNet()
            self.model = self.new_model()

    def init_server(self, generator: torch.Generator) -> Parts:
        return {}

    def init_client_state(self, client: ClientData, generator: torch.Generator) -> EpisodicClientState:
        return {"model": get_state(self.new_model())}

    def broadcast(self, server: Parts, client_id: int) -> Payload:
        return {}

    def client_update(self, payload: Payload, state: EpisodicClientState | None, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        assert state is not None  # init_client_state gave the client its model
        result = super().client_update({"model": state["model"]}, state, data, generator)
        assert isinstance(result.state, dict)  # the state given, or EpisodicFedAvg's update of it
        new_state = {**result.state, "model": result.upload["model"]} if "model" in result.upload else state
        return ClientResult(upload={}, state=new_state, metrics=result.metrics,
                            num_samples=result.num_samples, num_episodes=result.num_episodes, skipped=result.skipped)

    def aggregate(self, server: Parts, results: dict[int, ClientResult],
                  generator: torch.Generator) -> Parts:
        return server

    evaluates_clients = True

    def evaluate_client(self, payload: Payload, state: EpisodicClientState, client: ClientData, data: EvalData,
                        generator: torch.Generator) -> ClientScores:
        if data.episodes is None:
            raise ValueError("local is a few-shot method: it needs evaluation episodes")
        model = load_state_(self.model, state["model"])
        model.eval()
        return {"scores": [accuracy(self.learner.predict(model, ep), ep.query_labels) for ep in data.episodes]}

    def combine_evaluations(self, server: Parts, scores: dict[int, ClientScores], data: EvalData,
                            generator: torch.Generator) -> dict[str, float]:
        return per_client_table({cid: s["scores"] for cid, s in scores.items()})
