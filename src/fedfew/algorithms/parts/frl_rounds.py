"""The rounds of FL inside an FRL episode (and at deployment): prototype FL with GPAL (eq. 2-3), the
linear variant's FedAvg from the meta-learned head, and the exchanges an episode plays through them."""

from __future__ import annotations

import torch

from fedfew.algorithms.parts.common import make_optimizer, minibatches
from fedfew.algorithms.parts.frl_deployment import DeploymentAlgorithm, LinearFL
from fedfew.algorithms.parts.frl_losses import (
    Prototypes,
    aggregate_prototypes,
    class_means,
    distance_loss,
    features_of,
    gpal_loss,
    gpal_objective,
    local_prototypes,
    rows_of,
    squared_distances,
)
from fedfew.algorithms.parts.frl_options import FRLOptions
from fedfew.algorithms.parts.frl_tasks import with_prepared_head
from fedfew.data.dataset import LabelledDataset
from fedfew.interface.aggregation import weighted_average, weights_for
from fedfew.interface.algorithm import Algorithm, ClientData, ClientResult, Context, Parts, Payload
from fedfew.interface.state import StateDict, get_state, load_state_
from fedfew.models.base import FewShotModel

__all__ = ["EpisodeRound", "MetaHeadLinearFL", "MetaHeadStart", "PrototypeFL", "ReportClasses"]


class MetaHeadStart:
    """Mixin for a :class:`LinearFL`: a group (or an episode) starts from the prepared model's own
    head, cut to its width, instead of a Xavier head."""

    model: FewShotModel
    num_classes: int

    def start(self, prepared: StateDict, num_classes: int, generator: torch.Generator) -> Parts:
        if num_classes != self.num_classes:
            raise ValueError(f"this LinearFL has a {self.num_classes}-way head, the group has {num_classes} classes")
        return {"model": with_prepared_head(self.model, prepared)}


class MetaHeadLinearFL(MetaHeadStart, LinearFL):
    """FedAvg with cross-entropy from the prepared encoder and head (FRL's linear variant, ``head_init: meta``)."""


# -- the R rounds of FL inside an episode (and at deployment) ----------------------------------
class PrototypeFL(DeploymentAlgorithm[FRLOptions]):
    """One round of FRL's inner FL: prototype loss (eq. 2) and GPAL combined by eq. 3 locally; models and
    prototypes averaged on the server. Labels are class indices of the episode (or the group)."""

    def __init__(self, options: FRLOptions, context: Context) -> None:
        super().__init__(options, context)
        self.model = context.make_model(None)

    def start(self, prepared: StateDict, num_classes: int, generator: torch.Generator) -> Parts:
        return {"model": prepared, "prototypes": None}

    def broadcast(self, server: Parts, client_id: int) -> Payload:
        payload: Payload = {"model": server["model"]}
        if server.get("prototypes") is not None:
            payload["prototypes"] = {k: server["prototypes"][k] for k in ("classes", "prototypes")}
        return payload

    def local_loss(self, model: FewShotModel, data: LabelledDataset, batch: torch.Tensor,
                   downloaded: Prototypes | None, global_prototypes: Prototypes | None) -> tuple[torch.Tensor, dict[str, float]]:
        """Eq. 2 on a minibatch, combined with L_aux by eq. 3 when global prototypes were sent (round >= 1)."""
        features = features_of(model, data, batch)
        labels = data.labels[batch]
        if downloaded is not None:  # prototypes of S_k with the downloaded model, held fixed
            targets = rows_of(downloaded["classes"], labels)
            logits = -squared_distances(features, downloaded["prototypes"])
        else:  # the authors' code: prototypes of this minibatch with the current model
            classes, targets = torch.unique(labels, return_inverse=True)
            logits = -squared_distances(features, class_means(features, targets, len(classes)))
        local = distance_loss(logits, targets, self.options.eq2_classes)
        metrics = {"local_loss": float(local.detach()), "accuracy": float((logits.argmax(-1) == targets).float().mean())}
        gpal = None
        if global_prototypes is not None and self.options.gamma < 1:
            gpal = gpal_loss(features, labels, global_prototypes, self.options.eq2_classes)
            metrics["gpal_loss"] = float(gpal.detach())
        loss = gpal_objective(local, gpal, self.options.gamma, self.options.gpal_form)
        metrics["loss"] = float(loss.detach())
        return loss, metrics

    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        opts = self.options
        model = load_state_(self.model, payload["model"])
        model.train()
        support = data.train
        downloaded = local_prototypes(model, support) if opts.local_prototypes == "downloaded" else None
        global_prototypes = payload.get("prototypes")
        optimizer = make_optimizer("sgd", model.parameters(), opts.lr, opts.momentum, opts.weight_decay)
        sums: dict[str, float] = {}
        steps = 0
        for _ in range(opts.local_epochs):
            for batch in minibatches(len(support), opts.batch_size, generator):
                loss, metrics = self.local_loss(model, support, batch, downloaded, global_prototypes)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                steps += 1
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
        upload = {"model": get_state(model), "prototypes": local_prototypes(model, support)}
        return ClientResult(upload=upload, state=state, metrics={k: v / steps for k, v in sums.items()},
                            num_samples=len(support))

    def aggregate(self, server: Parts, results: dict[int, ClientResult],
                  generator: torch.Generator) -> Parts:
        sent = [results[c] for c in sorted(results)]
        weights = weights_for(self.options.aggregation, [r.num_samples for r in sent], [0] * len(sent))
        uniform = torch.ones(len(sent)) if self.options.aggregation == "uniform" else None
        return {"model": weighted_average([r.upload["model"] for r in sent], weights),
                "prototypes": aggregate_prototypes([r.upload["prototypes"] for r in sent], uniform)}

    @torch.no_grad()
    def classify(self, server: Parts, data: LabelledDataset) -> torch.Tensor:
        """Negative squared distance of each sample's features (global model) to the global
        prototypes; a class with no global prototype gets -inf."""
        if server.get("prototypes") is None:
            raise ValueError("no global prototypes yet: deployment needs at least one round")
        model = load_state_(self.model, server["model"])
        model.train()
        found = server["prototypes"]
        logits = torch.full((len(data), data.num_classes), float("-inf"))
        logits[:, found["classes"]] = -squared_distances(features_of(model, data), found["prototypes"])
        return logits


class EpisodeRound(Algorithm):
    """A round of an episode's inner FL: the inner algorithm, whose clients also remember, in round 0,
    the encoder phi^t they downloaded (the private state the meta-update starts from)."""

    def __init__(self, inner: DeploymentAlgorithm, phi_keys: list[str], keep_initial: bool) -> None:
        super().__init__(inner.options, inner.context)
        self.inner, self.phi_keys, self.keep_initial = inner, phi_keys, keep_initial

    def broadcast(self, server: Parts, client_id: int) -> Payload:
        return self.inner.broadcast(server, client_id)

    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        result = self.inner.client_update(payload, None, data, generator)
        if self.keep_initial:
            state = {"initial": {k: payload["model"][k] for k in self.phi_keys}}
        result.state = state
        return result

    def aggregate(self, server: Parts, results: dict[int, ClientResult],
                  generator: torch.Generator) -> object:
        return self.inner.aggregate(server, results, generator)


class ReportClasses(Algorithm):
    """The linear variant's first exchange of an episode: each participant reports the classes it
    holds, and the server takes their union (the width of the episode's head)."""

    def broadcast(self, server: Parts, client_id: int) -> Payload:
        return {}

    def client_update(self, payload: Payload, state: object, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        return ClientResult(upload={"classes": torch.unique(data.train.labels)}, state=state,
                            num_samples=data.num_samples)

    def aggregate(self, server: Parts, results: dict[int, ClientResult],
                  generator: torch.Generator) -> Parts:
        return {"classes": torch.unique(torch.cat([r.upload["classes"] for r in results.values()]))}
