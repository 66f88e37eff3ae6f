"""One-shot federated learning: one round, then the server combines the returned models.

The baselines of AdFL (FedCSIS 2023, doi:10.15439/2023F1102) and of Guha et al. (2019, "One-shot
federated learning"), all sharing AdFL's client step:

1. the server sends one initial global model to every client;
2. each client trains it on all its local data for E epochs (AdFL: Adam, lr 1e-3, E = 15) and
   returns it; with ``cv_folds`` = K > 1 it also reports a K-fold cross-validation accuracy
   (Guha et al.: each fold trains a fresh copy of the initial model on (K-1)/K of the data and
   scores the held-out 1/K; the returned model is the one trained on all the data);
3. the server selects models (``selection``) and combines them (``combine``):

   * ``selection``: ``all``; ``random`` (n models drawn uniformly, the "random ensemble");
     ``cv`` (the n with the best cross-validation score, Guha et al.'s "CV selection");
     ``data_size`` (the n with the most samples, Guha et al.'s "data selection"); n is
     ``ensemble_size``. Ties (equal data sizes, equal scores) are broken at random.
   * ``combine``: ``ensemble`` (the prediction is the argmax of the mean of the members'
     softmax outputs), ``vote`` (majority of the members' argmax predictions; a tie goes to the
     class with the larger mean softmax), or ``average`` (one model, the sample-weighted parameter
     average of the selected models: with ``selection: all`` this is FedAvg with a single round).

An ensemble is not one state dict: the server keeps its members' states (``server["members"]``) and
``evaluate`` averages their softmax outputs on the test set.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, TypeVar

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from fedfew.algorithms.parts.common import TrainOptions, evaluate_model, train_epochs
from fedfew.algorithms.parts.oneshot_report import client_metrics, corruption_metrics
from fedfew.core.jsontypes import JSONObject
from fedfew.data.dataset import LabelledDataset
from fedfew.fewshot.evaluation import accuracy
from fedfew.interface.aggregation import weighted_average
from fedfew.interface.algorithm import Algorithm, ClientData, ClientResult, Context, EvalData, Payload
from fedfew.interface.registration import register
from fedfew.interface.state import StateDict, get_state, load_state_
from fedfew.models.base import FewShotModel


class OneShotOptions(TrainOptions):
    """The client step (AdFL: Adam, lr 1e-3, 15 local epochs) and the server's combination rule."""

    local_epochs: int = Field(15, ge=1, description="E: epochs each client trains the initial model on all its "
                              "data (AdFL: 15)")
    optimizer: Literal["sgd", "adam"] = Field("adam", description="the clients' optimiser (AdFL: adam)")
    lr: float = Field(1e-3, gt=0, description="the clients' learning rate (AdFL: 1e-3)")
    selection: Literal["all", "random", "cv", "data_size"] = Field("random", description=(
        "which returned models the server keeps: all; random (n drawn uniformly); cv (the n best by "
        "cross-validation, Guha et al.); data_size (the n with the most samples); n is ensemble_size"))
    combine: Literal["ensemble", "vote", "average"] = Field("ensemble", description=(
        "how the kept models classify: ensemble (argmax of their mean softmax), vote (majority of their "
        "argmaxes) or average (one model, their sample-weighted parameter average)"))
    ensemble_size: int = Field(5, ge=1, description="n, the number of models kept (AdFL: 5, 10% of 50 clients)")
    cv_folds: int = Field(0, ge=0, description="K of the clients' K-fold cross-validation (0: the clients "
                          "report no score; else at least 2)")
    cv_epochs: int | None = Field(None, ge=1, description="epochs of each cross-validation fold (None: "
                                  "local_epochs, as Guha et al.)")
    report_clients: bool = Field(False, description=(
        "score every returned model in the test metrics (its own accuracy, the selection score's correlation "
        "with it, the all-client ensemble, the members' classes: oneshot_report.py). The server then keeps "
        "every returned model and each client also uploads its label counts (8 bytes a class, counted in "
        "bytes sent up); the selection and its accuracy are unchanged. Off: neither"))


    @model_validator(mode="after")
    def _check_cv(self) -> OneShotOptions:
        if self.cv_folds == 1:
            raise ValueError("algorithm.options.cv_folds must be 0 (no cross-validation) or at least 2")
        if getattr(self, "selection", None) == "cv" and self.cv_folds < 2:
            raise ValueError("algorithm.options.selection=cv needs algorithm.options.cv_folds >= 2 (Guha et al.: 5)")
        return self


def top_n(scores: torch.Tensor, n: int, generator: torch.Generator) -> list[int]:
    """Positions of the ``n`` largest ``scores``, best first; equal scores are ordered at random."""
    order = torch.randperm(len(scores), generator=generator, device=generator.device).to(scores.device)
    ranked = order[torch.sort(scores[order], descending=True, stable=True).indices]
    return ranked[:n].tolist()


@torch.no_grad()
def member_probabilities(model: nn.Module, states: list[StateDict], inputs: torch.Tensor,
                         batch_size: int = 1000) -> torch.Tensor:
    """[members, samples, classes] softmax outputs of each member state (loaded into ``model``)."""
    was_training = model.training
    model.eval()
    out = []
    for state in states:
        load_state_(model, state)
        out.append(torch.cat([F.softmax(model(inputs[i : i + batch_size]), dim=-1)
                              for i in range(0, len(inputs), batch_size)]))
    model.train(was_training)
    return torch.stack(out)


def ensemble_predictions(probabilities: torch.Tensor, rule: Literal["ensemble", "vote"]) -> torch.Tensor:
    """Class predictions of an ensemble from its members' [members, samples, classes] softmax
    outputs: the argmax of their mean ("ensemble"), or the majority of their argmax votes ("vote",
    ties going to the class with the larger mean softmax)."""
    mean = probabilities.mean(0)
    if rule == "ensemble":
        return mean.argmax(-1)
    votes = F.one_hot(probabilities.argmax(-1), probabilities.shape[-1]).sum(0).to(mean.dtype)
    # Vote counts differ by at least 1 and half the mean softmax by at most 1/2: it only breaks ties.
    return (votes + 0.5 * mean).argmax(-1)


def cross_validation_score(model: nn.Module, initial: StateDict, data: LabelledDataset, options: TrainOptions,
                           folds: int, generator: torch.Generator) -> float:
    """Guha et al.'s local K-fold cross-validation: the mean held-out accuracy of K copies of the
    initial model, each trained on the other K-1 folds of a random partition of the data."""
    n = len(data)
    if n < folds:
        raise ValueError(f"algorithm.options.cv_folds={folds} exceeds a client's {n} samples")
    parts = torch.tensor_split(torch.randperm(n, generator=generator, device=generator.device), folds)
    scores = []
    for k in range(folds):
        held = parts[k]
        kept = torch.cat([parts[j] for j in range(folds) if j != k])
        train, val = data.subset(kept), data.subset(held)
        load_state_(model, initial)
        train_epochs(model, train, train.labels, options, generator)
        model.eval()
        with torch.no_grad():
            args = (val.inputs,) if val.lengths is None else (val.inputs, val.lengths)
            scores.append(accuracy(model(*args), val.labels))
        model.train()
    return float(sum(scores) / len(scores))


class OneShotServer(TypedDict, total=False):
    """The server state of the one-shot family (checkpointed as this dict): the combined model or
    ensemble, and what the selection recorded."""

    #: The combined model (the initial one until aggregation; the weighted average for ``average``).
    model: StateDict
    #: The ensemble's models (empty for one combined model).
    members: list[StateDict]
    member_ids: list[int]
    #: Each returned model's selection score (OneShot's selections).
    selection_scores: dict[int, float]
    #: With ``report_clients``: every returned model and its label counts.
    client_states: dict[int, StateDict]
    label_counts: dict[int, torch.Tensor]
    #: AdFL's scores of each returned model (eqs. 3-5) and its own-target success rate.
    coherence: dict[int, float]
    was_predicted: dict[int, float]
    predicted_others: dict[int, float]
    own_success: float

#: The options of a :class:`OneShot` subclass.
OneShotOptionsT = TypeVar("OneShotOptionsT", bound=OneShotOptions)


@register("oneshot", help="One-shot FL: one round; FedAvg, random / CV / data-size ensembles (Guha et al.)")
class OneShot(Algorithm[OneShotOptionsT]):
    """One round of local training, then selection and combination on the server (module docstring)."""
    secure_sum = None
    secure_sum_refused = ("the server keeps, ranks or ensembles individual uploads: it needs each client's "
                          "model, not their sum")
    dp_refused = ("oneshot uploads whole models once and the server keeps or ensembles individual "
                  "models: DP-FedAvg's noised average does not apply")

    def __init__(self, options: OneShotOptionsT, context: Context) -> None:
        super().__init__(options, context)
        if context.task != "classification":
            raise ValueError(f"{self.name} is a classification method: set task: classification "
                             f"(got task: {context.task})")
        self.model = self.new_model()

    def new_model(self) -> FewShotModel:
        return self.context.make_model(self.context.num_classes)

    # -- server ------------------------------------------------------------------------------
    def init_server(self, generator: torch.Generator) -> OneShotServer:
        return {"model": get_state(self.new_model()), "members": [], "member_ids": []}

    def selection_scores(self, ids: list[int], results: dict[int, ClientResult],
                         generator: torch.Generator) -> torch.Tensor:
        """One score per client in ``ids``; the top ``ensemble_size`` are selected."""
        selection = self.options.selection
        if selection in ("all", "random"):
            return torch.zeros(len(ids), dtype=torch.float64)  # every order equally likely
        if selection == "data_size":
            return torch.tensor([float(results[i].num_samples) for i in ids], dtype=torch.float64)
        if selection == "cv":
            missing = [i for i in ids if "cv_score" not in results[i].upload]
            if missing:
                raise ValueError(f"clients {missing[:5]} reported no cv_score; set algorithm.options.cv_folds")
            return torch.tensor([float(results[i].upload["cv_score"]) for i in ids], dtype=torch.float64)
        raise ValueError(f"unknown selection {selection!r}")

    def aggregate(self, server: OneShotServer, results: dict[int, ClientResult],
                  generator: torch.Generator) -> OneShotServer:
        ids = sorted(results)
        scores = self.selection_scores(ids, results, generator)
        if self.options.selection == "all":
            chosen = list(range(len(ids)))
        else:
            if self.options.ensemble_size > len(ids):
                raise ValueError(f"algorithm.options.ensemble_size={self.options.ensemble_size} exceeds the "
                                 f"{len(ids)} clients that returned a model")
            chosen = top_n(scores, self.options.ensemble_size, generator)
        return self.with_clients(self.combine(server, ids, results, chosen, scores), ids, results)

    def with_clients(self, server: OneShotServer, ids: list[int], results: dict[int, ClientResult]) -> OneShotServer:
        """With ``report_clients``: ``server`` plus every returned model and label counts, for the
        per-client test metrics (oneshot_report.py); otherwise ``server`` itself."""
        if not self.options.report_clients:
            return server
        return {**server, "client_states": {i: results[i].upload["model"] for i in ids},
                "label_counts": {i: results[i].upload["label_counts"] for i in ids if "label_counts" in results[i].upload}}

    def client_scores(self, server: OneShotServer) -> dict[int, float] | None:
        """Each returned model's score by this selection (None before aggregation, and for the
        selections that score nothing: ``all``, ``random``)."""
        if self.options.selection in ("all", "random"):
            return None
        return server.get("selection_scores") or None

    def returned_ids(self, server: OneShotServer) -> list[int]:
        """The clients whose models the server combined from ([] before aggregation)."""
        return sorted(server.get("selection_scores", {}))

    def combine(self, server: OneShotServer, ids: list[int], results: dict[int, ClientResult],
                chosen: list[int], scores: torch.Tensor) -> OneShotServer:
        states = [results[ids[j]].upload["model"] for j in chosen]
        member_ids = [ids[j] for j in chosen]
        record: OneShotServer = {"member_ids": member_ids, "selection_scores": dict(zip(ids, scores.tolist()))}
        if self.options.combine == "average":
            weights = [results[ids[j]].num_samples for j in chosen]
            return {**server, **record, "model": weighted_average(states, weights), "members": []}
        return {**server, **record, "members": states}

    # -- client ------------------------------------------------------------------------------
    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        model = load_state_(self.model, payload["model"])
        metrics = train_epochs(model, data.train, data.train.labels, self.options, generator)
        upload: Payload = {"model": get_state(model)}
        if self.options.report_clients:  # for the report of which classes the members hold, never for selection
            upload["label_counts"] = torch.bincount(data.train.labels, minlength=self.context.num_classes)
        if self.options.cv_folds:
            # The folds draw from their own generator, seeded after the main training, so the
            # returned model is the same with or without cross-validation.
            cv_generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator,
                                                                                device=generator.device)))
            cv_options = self.options.model_copy(update={"local_epochs": self.options.cv_epochs or self.options.local_epochs})
            score = cross_validation_score(self.model, payload["model"], data.train, cv_options,
                                           self.options.cv_folds, cv_generator)
            upload["cv_score"] = torch.tensor(score, dtype=torch.float32)
            metrics["cv_score"] = score
        return ClientResult(upload=upload, state=state, metrics=metrics, num_samples=data.num_samples)

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, server: OneShotServer, data: EvalData, generator: torch.Generator) -> dict[str, Any]:
        return {**self.evaluate_combination(server, data), **self.selection_report(server, data)}

    def evaluate_combination(self, server: OneShotServer, data: EvalData) -> dict[str, float]:
        """The combined model's (or ensemble's) scores on ``data``."""
        if not server.get("members"):
            return evaluate_model(load_state_(self.model, server["model"]), data)
        if data.dataset is None:
            raise ValueError(f"no {data.split} data to evaluate on")
        probabilities = member_probabilities(self.model, server["members"], data.dataset.inputs)
        rule: Literal["ensemble", "vote"] = "vote" if self.options.combine == "vote" else "ensemble"
        predictions = ensemble_predictions(probabilities, rule)
        members = (probabilities.argmax(-1) == data.dataset.labels).double().mean(1)
        return {"accuracy": float((predictions == data.dataset.labels).double().mean()),
                "member_accuracy_mean": float(members.mean()), "member_accuracy_max": float(members.max())}

    def selection_report(self, server: OneShotServer, data: EvalData) -> JSONObject:
        """What the selection did (oneshot_report.py): the scores, the corrupted clients' ranks and,
        with ``report_clients``, every returned model's own accuracy. Draws nothing."""
        ids = self.returned_ids(server)
        if not ids:  # the untrained control: nothing was returned
            return {}
        scores = self.client_scores(server)
        members = list(server.get("member_ids", []))
        out: JSONObject = {} if scores is None else {"client_scores": {str(i): float(scores[i]) for i in ids}}
        out.update(corruption_metrics(ids, scores, self.context.corrupt_clients, members))
        states = server.get("client_states")
        if states and data.dataset is not None:
            probabilities = member_probabilities(self.model, [states[i] for i in ids], data.dataset.inputs)
            out.update(client_metrics(ids, scores, probabilities, data.dataset.labels, server.get("label_counts", {}),
                                      members))
        return out
