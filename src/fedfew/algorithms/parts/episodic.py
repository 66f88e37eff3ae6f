"""FedAvg over episodic meta-learning: the shared base of fl-maml (FedFSL-naive), fl-proto,
fedfsl-prox and the FedFSL-MI variants.

Round t (FedFSL, Algorithm 1): the server sends w^t; client k sets w_k = w^t and takes
``local_steps`` outer steps, each on ``meta_batch`` episodes sampled from its own data, with Adam on
the episodic loss (eq. 8); the server averages the returned models weighted by |B_k|, the number of
episodes each client trained on (eq. 10), or by samples or uniformly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypedDict, TypeVar

import torch
from pydantic import Field, model_validator

from fedfew.algorithms.parts.batched_episodic import episodic_update_batch, why_not_batched
from fedfew.algorithms.parts.common import local_sampler, make_optimizer
from fedfew.algorithms.parts.optimizers import Adam
from fedfew.fewshot.episodes import Episode
from fedfew.fewshot.evaluation import accuracy
from fedfew.fewshot.learners import MAML, EpisodicLearner, ProtoNet, proximal_term
from fedfew.interface.aggregation import weighted_average, weights_for
from fedfew.interface.algorithm import (
    Algorithm,
    ClientData,
    ClientResult,
    Context,
    EvalData,
    Options,
    Parts,
    Payload,
)
from fedfew.interface.state import StateDict, get_state, load_state_
from fedfew.models.base import FewShotModel


class EpisodicOptions(Options):
    local_steps: int = Field(5, ge=1, description="outer steps a client takes per round")
    meta_batch: int = Field(1, ge=1, description="episodes of the client's data averaged into each outer step's loss")
    optimizer: Literal["adam", "sgd"] = Field("adam", description="the outer (meta) optimiser, new every round")
    lr: float = Field(1e-3, gt=0, description="learning rate of the outer optimiser")
    weight_decay: float = Field(0.0, ge=0, description="weight decay of the outer optimiser")
    aggregation: Literal["episodes", "samples", "uniform"] = Field(
        "episodes", description="the server's weights: episodes trained |B_k| (FedFSL eq. 10), samples n_k, or uniform")
    mu: float = Field(0.0, ge=0, description="FedProx's weight: adds mu/2 ||w - w^t||^2 to every outer step's "
                      "loss (0: off)")
    keep_optimizer: bool = Field(False, description="keep the outer Adam's moments in the client's private state "
                                 "from round to round instead of a new optimiser every round (ours: a centralised "
                                 "learner's one optimiser, for the one-client calibration runs)")
    lr_halving_episodes: int | None = Field(None, ge=1, description="halve the outer learning rate every this many "
                                            "episodes the client has trained (Prototypical Networks: 2,000; "
                                            "None: a constant rate)")

    @model_validator(mode="after")
    def _kept_moments_are_adams(self) -> EpisodicOptions:
        if self.keep_optimizer and self.optimizer != "adam":
            raise ValueError(f"keep_optimizer keeps Adam's moments; optimizer is {self.optimizer}")
        return self

    def carries_state(self) -> bool:
        """Whether a client's private state carries its optimiser or its episode count."""
        return self.keep_optimizer or self.lr_halving_episodes is not None


class MAMLOptions(EpisodicOptions):
    inner_lr: float = Field(0.01, gt=0, description="alpha: step size of the inner adaptation on the support set (eq. 5)")
    inner_steps: int = Field(1, ge=1, description="inner gradient steps on each training episode's support set")
    test_inner_steps: int = Field(10, ge=0, description="inner gradient steps on each evaluation episode's "
                                  "support set (0: score the unadapted model)")
    first_order: bool = Field(False, description="drop the second derivatives from the meta-gradient (FOMAML)")



def build_learner(options: Options) -> EpisodicLearner:
    if isinstance(options, MAMLOptions):
        return MAML(options.inner_lr, options.inner_steps, options.test_inner_steps, options.first_order)
    return ProtoNet()


class EpisodicClientState(TypedDict, total=False):
    """A client's private state in :class:`EpisodicFedAvg` (None until it carries something)."""

    episodes: int  # episodes trained so far (``lr_halving_episodes``)
    optimizer: dict[str, list[torch.Tensor]]  # Adam's moments (``keep_optimizer``)
    model: StateDict  # the client's own model (fsl-local)


#: The options of an :class:`EpisodicFedAvg` subclass.
EpisodicOptionsT = TypeVar("EpisodicOptionsT", bound=EpisodicOptions)


class EpisodicFedAvg(Algorithm[EpisodicOptionsT]):
    """FedAvg whose local update is episodic meta-training with ``self.learner`` (options: an
    :class:`EpisodicOptions`; a subclass names its own, ``class FLMAML(EpisodicFedAvg[MAMLOptions])``)."""
    #: The model is averaged: differential privacy clips its change (fedfew.privacy).
    dp_upload: str | None = "model-delta"
    #: Training episodes are drawn from ``context.episode``, whose query count may differ from the
    #: evaluation's (``episodes.train_query``; MAML trains on K queries a class, Finn et al. 2017).
    takes_training_query = True

    def __init__(self, options: EpisodicOptionsT, context: Context) -> None:
        super().__init__(options, context)
        self.learner = build_learner(options)
        self.model = self.new_model()  # the one workspace model of this process

    def new_model(self) -> FewShotModel:
        n_out = self.context.episode.n_way if self.learner.head == "n_way" else None
        return self.context.make_model(n_out)

    def init_server(self, generator: torch.Generator) -> Parts:
        return {"model": get_state(self.new_model())}

    # -- client ---------------------------------------------------------------------------
    def local_objective(self, payload: Payload, episode: Episode) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss one episode contributes to the local objective; subclasses add terms."""
        loss, logits = self.learner.loss(self.model, episode)
        acc = float((logits.argmax(-1) == episode.query_labels).float().mean())
        return loss, {"loss": float(loss.detach()), "accuracy": acc}

    def client_update(self, payload: Payload, state: EpisodicClientState | None, data: ClientData,
                      generator: torch.Generator) -> ClientResult:
        opts = self.options
        sampler = local_sampler(data.train, self.context.episode)
        if sampler is None:  # too little data for any episode: sit this round out
            return ClientResult.sat_out(state, data.num_samples)
        model = load_state_(self.model, payload["model"])
        model.train()
        anchor = {k: v.clone() for k, v in payload["model"].items()} if opts.mu > 0 else None
        optimizer = make_optimizer(opts.optimizer, model.parameters(), opts.lr, weight_decay=opts.weight_decay)
        trained_before = 0 if state is None else int(state.get("episodes", 0))
        if opts.keep_optimizer and state is not None and "optimizer" in state and isinstance(optimizer, Adam):
            optimizer.load_state(state["optimizer"])
        sums: dict[str, float] = {}
        for step in range(opts.local_steps):
            if opts.lr_halving_episodes is not None:
                done = trained_before + step * opts.meta_batch
                optimizer.lr = opts.lr * 0.5 ** (done // opts.lr_halving_episodes)
            optimizer.zero_grad(set_to_none=True)
            total = torch.zeros(())
            for _ in range(opts.meta_batch):
                loss, metrics = self.local_objective(payload, sampler.sample(generator))
                total = total + loss / opts.meta_batch
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
            if anchor is not None:
                total = total + proximal_term(model, anchor, opts.mu)
            total.backward()
            optimizer.step()
        episodes = opts.local_steps * opts.meta_batch
        if opts.carries_state():
            state = {**(state or {}), "episodes": trained_before + episodes}
            if opts.keep_optimizer and isinstance(optimizer, Adam):
                state["optimizer"] = optimizer.state()
        return ClientResult(
            upload={"model": get_state(model)},
            state=state,
            metrics={k: v / episodes for k, v in sums.items()},
            num_samples=data.num_samples,
            num_episodes=episodes,
        )

    def batching_unsupported(self) -> str | None:
        cls = type(self)  # a subclass that changes the update has no batched form of it
        if cls.client_update is not EpisodicFedAvg.client_update or cls.local_objective is not EpisodicFedAvg.local_objective:
            return f"{self.name} changes the episodic client update and has no batched form"
        if self.options.carries_state():
            return f"{self.name} with keep_optimizer or lr_halving_episodes keeps a client state the batched form has not"
        return why_not_batched(self)

    def client_update_batch(self, payloads: Sequence[Payload], states: Sequence[EpisodicClientState | None],
                            data: Sequence[ClientData], generators: Sequence[torch.Generator]) -> list[ClientResult]:
        """:meth:`client_update` of many clients as one computation (``runtime.batch_clients``)."""
        return episodic_update_batch(self, payloads, states, data, generators)

    # -- server ---------------------------------------------------------------------------
    def aggregate(self, server: Parts, results: dict[int, ClientResult],
                  generator: torch.Generator) -> Parts:
        sent = [r for r in results.values() if "model" in r.upload]
        if not sent:
            return server
        weights = weights_for(self.options.aggregation, [r.num_samples for r in sent], [r.num_episodes for r in sent])
        return {**server, "model": weighted_average([r.upload["model"] for r in sent], weights)}

    #: The score is the mean over independent episodes of the server's model: engines may split them.
    splits_evaluation = True

    def episode_scores(self, server: Parts, data: EvalData, indices: Sequence[int]) -> list[float]:
        """Query accuracy on each of the evaluation episodes ``indices`` (what :meth:`evaluate` averages)."""
        if data.episodes is None:
            raise ValueError(f"no {data.split} episodes to evaluate on")
        model = load_state_(self.model, server["model"])
        model.eval()
        scores = [accuracy(self.learner.predict(model, data.episodes[i]), data.episodes[i].query_labels)
                  for i in indices]
        model.train()
        return scores

    def episode_predictions(self, server: Parts, data: EvalData, indices: Sequence[int]) -> list[torch.Tensor]:
        """The predicted query labels behind :meth:`episode_scores` (``eval.per_class``)."""
        if data.episodes is None:
            raise ValueError(f"no {data.split} episodes to evaluate on")
        model = load_state_(self.model, server["model"])
        model.eval()
        predictions = [self.learner.predict(model, data.episodes[i]).argmax(-1) for i in indices]
        model.train()
        return predictions
