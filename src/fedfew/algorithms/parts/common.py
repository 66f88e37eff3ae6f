"""Pieces shared by several algorithms: local episode sampling, minibatch training, FedAvg's client
update, evaluation."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from fedfew.algorithms.parts.optimizers import SGD, Adam, LocalOptimizer
from fedfew.core.jsontypes import JSONObject
from fedfew.data.dataset import LabelledDataset
from fedfew.fewshot.episodes import Episode, EpisodeError, EpisodeSampler
from fedfew.fewshot.evaluation import dataset_accuracy, episode_scores, mean_ci95
from fedfew.fewshot.learners import EpisodicLearner, ProtoNet
from fedfew.interface.algorithm import ClientResult, EpisodeShape, EvalData, Options, Payload
from fedfew.interface.state import get_state, load_state_


def local_sampler(data: LabelledDataset, shape: EpisodeShape) -> EpisodeSampler | None:
    """The episode sampler for a client's own data.

    Non-IID clients often lack N classes with K + Q samples. We keep N and K and lower Q (down to 1);
    if fewer than N classes have K + 1 samples we lower N (down to 2). A client that cannot form a
    2-way K-shot 1-query task returns None and sits the round out. The papers are silent on this;
    dropping such clients entirely would bias the federation towards IID clients.
    """
    counts = data.class_counts()
    need = shape.k_shot + 1
    usable = counts[counts >= need]
    if len(usable) < 2:
        return None
    n_way = min(shape.n_way, len(usable))
    q = max(1, min(shape.q_query, int(usable.sort(descending=True).values[n_way - 1]) - shape.k_shot))
    try:
        return EpisodeSampler(data, n_way, shape.k_shot, q)
    except EpisodeError:  # pragma: no cover - guarded by the counts above
        return None


def make_optimizer(name: str, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> LocalOptimizer:
    """A client's local optimiser: torch.optim's SGD or Adam step without its class (see
    fedfew.algorithms.parts.optimizers: the same arithmetic, without the 1.2 s import of torch._dynamo)."""
    if name == "sgd":
        return SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return Adam(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; use sgd or adam")


class TrainOptions(Options):
    """Minibatch training on a client's samples (FedAvg, FedProx, FML, AdFL)."""

    local_epochs: int = Field(1, ge=1, description="E: passes over the client's own samples per round")
    batch_size: int = Field(32, ge=1, description="B: samples per local minibatch step")
    optimizer: Literal["sgd", "adam"] = Field("sgd", description="the clients' local optimiser")
    lr: float = Field(0.01, gt=0, description="learning rate of the local optimiser")
    momentum: float = Field(0.0, ge=0, description="SGD momentum of the local optimiser (adam ignores it)")
    weight_decay: float = Field(0.0, ge=0, description="L2 weight decay of the local optimiser")



def minibatches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    order = torch.randperm(n, generator=generator, device=generator.device)
    return list(order.split(batch_size))


def label_map(train_classes: list[int], num_classes: int) -> torch.Tensor:
    """Global class id -> index among ``train_classes`` (-1 for the others)."""
    mapping = torch.full((num_classes,), -1, dtype=torch.long)
    mapping[torch.as_tensor(train_classes, dtype=torch.long)] = torch.arange(len(train_classes))
    return mapping


def train_epochs(
    model: nn.Module,
    data: LabelledDataset,
    targets: torch.Tensor,
    options: TrainOptions,
    generator: torch.Generator,
    extra_loss: Callable[[nn.Module], torch.Tensor] | None = None,
) -> dict[str, float]:
    """``options.local_epochs`` passes of minibatch training with cross-entropy on ``targets``
    (plus ``extra_loss(model)``, e.g. FedProx's proximal term). Returns the mean loss and accuracy."""
    model.train()
    optimizer = make_optimizer(options.optimizer, model.parameters(), options.lr, options.momentum, options.weight_decay)
    total_loss, correct, seen = 0.0, 0, 0
    for _ in range(options.local_epochs):
        for batch in minibatches(len(data), options.batch_size, generator):
            args = (data.inputs[batch],) if data.lengths is None else (data.inputs[batch], data.lengths[batch])
            logits = model(*args)
            loss = F.cross_entropy(logits, targets[batch])
            if extra_loss is not None:
                loss = loss + extra_loss(model)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += float(loss.detach()) * len(batch)
            correct += int((logits.argmax(-1) == targets[batch]).sum())
            seen += len(batch)
    return {"loss": total_loss / max(seen, 1), "accuracy": correct / max(seen, 1)}


def model_update(model: nn.Module, payload: Payload, state: object, num_samples: int,
                 train: Callable[[nn.Module], dict[str, float]]) -> ClientResult:
    """FedAvg's client update, shared by every algorithm whose clients train the one global model:
    w = w^t (the payload's ``model`` copied into ``model``, this process's workspace model), ``train(w)``
    on the client's own data (it returns the metrics), and w back as the upload. The private state
    passes through; a caller that keeps or sends more adds it to the result."""
    model = load_state_(model, payload["model"])
    metrics = train(model)
    return ClientResult(upload={"model": get_state(model)}, state=state, metrics=metrics, num_samples=num_samples)


def evaluate_episodes(model: nn.Module, learner: EpisodicLearner, data: EvalData) -> dict[str, float]:
    """Mean query accuracy and 95% CI of ``learner.predict`` over the fixed episodes."""
    if data.episodes is None:
        raise ValueError(f"no {data.split} episodes to evaluate on")
    model.eval()
    score = mean_ci95(episode_scores(data.episodes, lambda ep: learner.predict(model, ep)))
    model.train()
    return {"accuracy": score.mean, "ci95": score.ci95}


def evaluate_model(model: nn.Module, data: EvalData, fewshot_learner: EpisodicLearner | None = None) -> dict[str, float]:
    """Few-shot episodes (prototype classifier on the encoder's features unless another learner is
    given) or plain accuracy on a labelled set."""
    if data.episodes is not None:
        return evaluate_episodes(model, fewshot_learner or ProtoNet(), data)
    if data.dataset is None:
        raise ValueError(f"no {data.split} data to evaluate on")
    d = data.dataset
    return {"accuracy": dataset_accuracy(model, d.inputs, d.labels, d.lengths)}


def per_client_table(scores: dict[int, list[float]]) -> dict[str, float]:
    """Average of per-client score lists (equal length, one per fixed episode; keyed by client id):
    the mean over clients, a CI over the per-episode client means, and the worst and best client."""
    if not scores:
        raise ValueError("no client has a model to evaluate")
    table = torch.tensor([scores[cid] for cid in sorted(scores)], dtype=torch.float64)
    summary = mean_ci95(table.mean(0).tolist())
    return {"accuracy": summary.mean, "ci95": summary.ci95, "client_min": float(table.mean(1).min()),
            "client_max": float(table.mean(1).max())}


def local_scores(local: dict[int, float]) -> JSONObject:
    """Test metrics of the clients' own models, each scored on its own private validation set (keyed
    by client id): the mean over clients (``local_accuracy``), its 1.96 std / sqrt(n) over clients
    (``local_ci95``), the worst and best client, and every client's score (``local_by_client``, keys
    the client ids as strings, ascending), so that a study can report one client or a chosen few
    (``test.local_by_client.0``, ``test.local_by_client[1,2]``). Empty when no client has a model."""
    if not local:
        return {}
    summary = mean_ci95(local.values())
    return {"local_accuracy": summary.mean, "local_ci95": summary.ci95, "local_min": min(local.values()),
            "local_max": max(local.values()), "local_by_client": {str(cid): local[cid] for cid in sorted(local)}}


def episode_accuracy(logits: torch.Tensor, episode: Episode) -> float:
    return float((logits.argmax(-1) == episode.query_labels).float().mean())
