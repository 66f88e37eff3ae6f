"""The batched form of :meth:`EpisodicFedAvg.client_update` (``runtime.batch_clients``): the local
updates of many clients as one computation.

Each client keeps everything the sequential update has: its own episode sampler, its own generator
(drawn in the same order, so it samples exactly the sequential path's episodes), its own parameters
(one slice of each stacked parameter, :mod:`fedfew.fewshot.stacked`), its own optimiser state (Adam and
SGD act element by element, so one optimiser over the stacked parameters is one per client) and its
own proximal anchor. Per outer step the clients' episodic losses are summed and differentiated once:
no client's loss depends on another's parameters, so each slice of the gradient is that client's own
gradient. Clients whose episodes have different shapes (a non-IID client with fewer classes gets a
smaller N or Q, :func:`~fedfew.algorithms.parts.common.local_sampler`) run in separate groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from fedfew.algorithms.parts.common import local_sampler, make_optimizer
from fedfew.fewshot.episodes import EpisodeSampler
from fedfew.fewshot.learners import EpisodicLearner
from fedfew.fewshot.stacked import StackedEpisodes, stack_states, unstack, why_not_stackable
from fedfew.interface.algorithm import ClientData, ClientResult, Context, Payload
from fedfew.interface.compute import COMPILE_MODE
from fedfew.models.base import FewShotModel


class EpisodicUpdateOptions(Protocol):
    """The options of :class:`~fedfew.algorithms.parts.episodic.EpisodicOptions` the batched update reads
    (read-only, so that its ``Literal`` optimiser names fit)."""

    @property
    def local_steps(self) -> int: ...
    @property
    def meta_batch(self) -> int: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def lr(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def mu(self) -> float: ...


class EpisodicUpdater(Protocol):
    """What the batched update reads of its algorithm (an
    :class:`~fedfew.algorithms.parts.episodic.EpisodicFedAvg`). A protocol rather than that class, whose
    module imports this one: typing it by the class would close an import cycle."""

    @property
    def name(self) -> str: ...
    @property
    def learner(self) -> EpisodicLearner: ...
    @property
    def model(self) -> FewShotModel: ...
    @property
    def options(self) -> EpisodicUpdateOptions: ...
    @property
    def context(self) -> Context: ...


def stacked_loss_fn(algorithm: EpisodicUpdater) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The learner's ``stacked_loss``, eager or compiled (inductor) per :data:`COMPILE_MODE`. The compiled
    function is made once per algorithm and mode and kept on the algorithm, so a round's static-shape
    episodes reuse the first round's graphs (with "reduce-overhead" on a GPU: CUDA graphs captured once
    and replayed; only the episodes' index tensors change). The inner step's ``autograd.grad`` is a graph
    break: the forward pieces around it compile, each with its compiled backward."""
    mode = COMPILE_MODE.get()
    if mode == "off":
        return algorithm.learner.stacked_loss
    cache: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = algorithm.__dict__.setdefault("_compiled_stacked_loss", {})
    if mode not in cache:
        cache[mode] = torch.compile(algorithm.learner.stacked_loss, mode=None if mode == "default" else mode)
    return cache[mode]  # type: ignore[no-any-return]


def why_not_batched(algorithm: EpisodicUpdater) -> str | None:
    """None when :func:`episodic_update_batch` computes the client update of ``algorithm`` (whose
    class keeps :class:`EpisodicFedAvg`'s update: :meth:`EpisodicFedAvg.batching_unsupported` checks it)."""
    if type(algorithm.learner).stacked_loss is EpisodicLearner.stacked_loss:
        return f"{algorithm.name}'s learner {type(algorithm.learner).__name__} has no stacked form"
    reason = why_not_stackable(algorithm.model)
    return None if reason is None else f"{algorithm.name}'s model cannot be stacked: {reason}"


def episodic_update_batch(algorithm: EpisodicUpdater, payloads: Sequence[Payload], states: Sequence[object],
                          data: Sequence[ClientData], generators: Sequence[torch.Generator]) -> list[ClientResult]:
    results: list[ClientResult | None] = [None] * len(data)
    groups: dict[tuple[int, int, int, tuple[int, ...]], list[tuple[int, EpisodeSampler]]] = {}
    for i, client in enumerate(data):
        sampler = local_sampler(client.train, algorithm.context.episode)
        if sampler is None:  # too little data for any episode: sit this round out
            results[i] = ClientResult.sat_out(states[i], client.num_samples)
            continue
        shape = (sampler.n_way, sampler.k_shot, sampler.q_query, tuple(client.train.inputs.shape[1:]))
        groups.setdefault(shape, []).append((i, sampler))
    for members in groups.values():
        indices = [i for i, _ in members]
        trained = _train_group(algorithm, [payloads[i] for i in indices], [s for _, s in members],
                               [generators[i] for i in indices])
        for i, (upload, metrics) in zip(indices, trained):
            episodes = algorithm.options.local_steps * algorithm.options.meta_batch
            results[i] = ClientResult(upload={"model": upload}, state=states[i], metrics=metrics,
                                      num_samples=data[i].num_samples, num_episodes=episodes)
    return [r for r in results if r is not None]


def _train_group(algorithm: EpisodicUpdater, payloads: list[Payload], samplers: list[EpisodeSampler],
                 generators: list[torch.Generator]) -> list[tuple[dict[str, torch.Tensor], dict[str, float]]]:
    """The sequential update's loop (episodic.py, ``client_update``) over stacked clients of one
    episode shape: per outer step ``meta_batch`` episodes per client, Adam on the summed losses."""
    opts, model = algorithm.options, algorithm.model
    names = [name for name, _ in model.named_parameters()]
    params = {name: p.requires_grad_() for name, p in stack_states([p["model"] for p in payloads], names).items()}
    anchor = stack_states([p["model"] for p in payloads], names) if opts.mu > 0 else None
    optimizer = make_optimizer(opts.optimizer, list(params.values()), opts.lr, weight_decay=opts.weight_decay)
    clients = len(payloads)
    stacked_loss = stacked_loss_fn(algorithm)
    # metrics are summed on the CPU (the default device is the compute device here)
    sums = {key: torch.zeros(clients, dtype=torch.float64, device="cpu") for key in ("loss", "accuracy")}
    for _ in range(opts.local_steps):
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for _ in range(opts.meta_batch):
            episodes = StackedEpisodes([s.sample(g) for s, g in zip(samplers, generators)])
            losses, logits = stacked_loss(model, params, episodes)
            total = total + losses.sum() / opts.meta_batch
            sums["loss"] += losses.detach().double().cpu()
            sums["accuracy"] += (logits.argmax(-1) == episodes.query_labels).float().mean(-1).double().cpu()
        if anchor is not None:  # FedProx's mu/2 ||w_c - w^t||^2 of every client, summed
            total = total + 0.5 * opts.mu * sum((params[n] - anchor[n]).pow(2).sum() for n in names)
        total.backward()
        optimizer.step()
    episodes_run = opts.local_steps * opts.meta_batch
    state_names = list(payloads[0]["model"])
    out = []
    for c in range(clients):
        own = unstack(params, c)
        upload = {name: own[name] if name in own else payloads[c]["model"][name].clone() for name in state_names}
        out.append((upload, {k: float(v[c]) / episodes_run for k, v in sums.items()}))
    return out
