"""Secure aggregation on the Flower engines (``flower.secure_aggregation``): whether an algorithm's
rounds can be carried by a secure sum (each algorithm declares it: :attr:`fedfew.interface.algorithm.
Algorithm.secure_sum`), and the vectors a round's clients sum. No flwr here: the config checks import it; the protocol itself
(Flower's SecAgg+) is :mod:`fedfew.flower.secagg`.

**What is summed.** Each client of a round turns its result into one float vector, Flower's
``secaggplus_mod`` quantises and masks it, and the server learns only the sum over the clients
(docs/privacy.md, "Secure aggregation"). Two kinds of round:

* ``mean`` (no differential privacy): the algorithm's aggregate is the weighted mean
  ``sum_k w_k m_k / sum_k w_k`` of the uploaded models, w_k by the algorithm's ``aggregation`` option
  (samples n_k, episodes |B_k| or 1). Client k sends ``[r_k Delta_k, r_k]`` with Delta_k = m_k - w^t
  (the floating-point tensors that are not frozen, in sorted order) and r_k = w_k / max_weight, so
  the sum gives both ``sum_k r_k Delta_k`` and ``sum_k r_k``, and the server's model is
  ``w^t + sum_k r_k Delta_k / sum_k r_k``: the algorithm's weighted mean. Integer buffers (BatchNorm's
  batch counter) stay at the server's value.
* ``dp`` (``privacy:`` on): the client sends its clipped (noised, local-dp) update ``dp_delta`` and,
  with adaptive clipping, its within-the-clip bit: DP-FedAvg's aggregation is a plain sum of these.

The server gives each client that trained a result carrying the sum divided by the number that
trained (``upload["model"]`` the weighted mean, or ``dp_delta`` the mean update), and the clients that
sat the round out their empty result: the algorithm's aggregate (a weighted mean) and DP-FedAvg's
(a sum) then compute exactly what they compute from the individual uploads, up to the quantisation
(``tests/flower/test_secagg.py`` checks it for every covered algorithm).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypedDict

import numpy as np
import torch

from fedfew.core.errors import ConfigError
from fedfew.interface.algorithm import Algorithm, Payload

if TYPE_CHECKING:
    from fedfew.core.config_schema import SecureAggregationConfig
    from fedfew.interface.algorithm import ClientData, ClientResult
    from fedfew.privacy.mechanism import PrivateAggregation

__all__ = ["SecureAggregationError", "SecureSettings", "check_algorithm", "client_vector",
           "largest_weight", "layout", "protocol_sizes", "refusal", "server_results"]

#: The weighting an algorithm's ``aggregation`` option names, and the client's weight under it.
WEIGHTS = ("samples", "episodes", "uniform")


class SecureSpec(TypedDict, total=False):
    """What the nodes of a secure round are told to send (:meth:`fedfew.flower.secagg.SecureRounds.spec`)."""

    #: ``mean``: the weighted update and r_k; ``dp``: the clipped delta (and the within bit).
    mode: Literal["mean", "dp"]
    weight: str  # the aggregation weighting: samples, episodes or uniform
    max_weight: float
    clipping_range: float
    within: bool  # dp with adaptive clipping: the within-clip bit is the vector's last coordinate
    size: int  # the vector's coordinates


class BuiltExperiment(Protocol):
    """What :meth:`SecureSettings.from_config` reads of a built experiment (``fedfew.run.experiment``)."""

    @property
    def algorithm(self) -> Algorithm: ...
    @property
    def clients(self) -> Collection[ClientData]: ...
    @property
    def privacy(self) -> PrivateAggregation | None: ...


class SecureAggregationError(ConfigError):
    """Secure aggregation asked of an algorithm, engine or setting that cannot honour it (exit 2)."""


def _option(options: object, name: str, default: object = None) -> object:
    return options.get(name, default) if isinstance(options, Mapping) else getattr(options, name, default)


def refusal(kind: type[Algorithm], options: object) -> str | None:
    """None when secure aggregation covers the algorithm class ``kind`` with ``options`` (its validated
    Options); otherwise why not, in words for the user: what the algorithm declares
    (:meth:`~fedfew.interface.algorithm.Algorithm.secure_sum_refusal`), then a weighting this module can
    sum."""
    reason = kind.secure_sum_refusal(options)
    if reason is None and _option(options, "aggregation", "samples") not in WEIGHTS:
        return f"its aggregation {_option(options, 'aggregation')!r} is none of {', '.join(WEIGHTS)}"
    return reason


def check_algorithm(algorithm: Algorithm) -> str:
    """The weighting (``samples``, ``episodes``, ``uniform``) of a built algorithm that secure aggregation
    covers; otherwise :class:`SecureAggregationError`. Beside what the class declares, what the built
    algorithm says: one broadcast / update / average per round (no ``play_round``), no evaluation of the
    clients' own models, and an upload differential privacy may clip (``dp_upload``: the model, and
    nothing else)."""
    name = algorithm.name
    reason = refusal(type(algorithm), algorithm.options)
    if reason is None and type(algorithm).play_round is not Algorithm.play_round:
        reason = "it plays its own rounds (play_round)"
    if reason is None and (algorithm.evaluates_clients or algorithm.dp_upload != "model-delta"):
        reason = "its clients' own models are scored, or it uploads more than its model"
    if reason is not None:
        raise SecureAggregationError(f"flower.secure_aggregation: algorithm {name} cannot run with secure "
                                     f"aggregation: {reason}")
    return str(_option(algorithm.options, "aggregation", "samples"))


@dataclass(frozen=True)
class SecureSettings:
    """``flower.secure_aggregation`` as the engine uses it, with the run's differential privacy (or None)."""

    num_shares: int | float
    reconstruction_threshold: int | float
    max_weight: float  # resolved (never None)
    clipping_range: float
    quantization_range: int
    modulus_range: int
    privacy: PrivateAggregation | None = None

    @classmethod
    def from_config(cls, section: SecureAggregationConfig, experiment: BuiltExperiment) -> SecureSettings | None:
        """The settings of ``flower.secure_aggregation`` for a built experiment (None when it is off), its
        ``max_weight`` resolved: :func:`largest_weight` when the config leaves it out."""
        if not section.enabled:
            return None
        weight = section.max_weight or largest_weight(check_algorithm(experiment.algorithm), experiment.algorithm,
                                                      experiment.clients)
        return cls(section.num_shares, section.reconstruction_threshold, float(weight), section.clipping_range,
                   section.quantization_range, section.modulus_range, experiment.privacy)

    @property
    def step(self) -> float:
        """One quantisation step: a coordinate in [-c, c] is rounded to a multiple of 2c / T."""
        return 2 * self.clipping_range / self.quantization_range


def largest_weight(kind: str, algorithm: Algorithm, clients: Collection[ClientData]) -> float:
    """The largest aggregation weight a client of the run can have, from what the config fixes: 1
    (uniform), the episodes a client trains per round (local_steps x meta_batch), or the largest
    client's training samples in the run's partition (which the server builds from the config too)."""
    if kind == "uniform":
        return 1.0
    if kind == "episodes":
        steps, batch = _option(algorithm.options, "local_steps"), _option(algorithm.options, "meta_batch")
        if not isinstance(steps, int) or not isinstance(batch, int):  # None: the options do not say
            raise SecureAggregationError(f"flower.secure_aggregation.max_weight: {algorithm.name} weights by episodes "
                                         "but does not say how many a client trains: set max_weight")
        return float(steps * batch)
    return float(max((c.num_samples for c in clients), default=1)) or 1.0


def protocol_sizes(clients: int, num_shares: int | float, threshold: int | float) -> tuple[int, int]:
    """(shares per client, shares that unmask one) in a round of ``clients``, as Flower's
    ``SecAggPlusWorkflow.setup_stage`` computes them from ``num_shares`` and ``reconstruction_threshold``."""
    if isinstance(num_shares, float):
        shares = round(num_shares * clients)
        if shares < clients and shares % 2 == 0:
            shares += 1
        if shares <= 2:
            shares = clients
    else:
        shares = num_shares
    needed = max(round(threshold * shares), 2) if isinstance(threshold, float) else threshold
    return shares, needed


# -- the vector --------------------------------------------------------------------------------------
def layout(model: Mapping[str, torch.Tensor], frozen: Collection[str] = ()) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of the tensors a model's update is made of, in the vector's order: the floating-point
    tensors that are not frozen parameters, by sorted name (what :func:`fedfew.privacy.model_delta` takes)."""
    return [(name, tuple(model[name].shape)) for name in sorted(model)
            if torch.is_floating_point(model[name]) and name not in frozen]


def _size(shapes: list[tuple[str, tuple[int, ...]]]) -> int:
    return sum(math.prod(shape) for _, shape in shapes)


def vector_size(spec: SecureSpec, shapes: list[tuple[str, tuple[int, ...]]]) -> int:
    """Coordinates of the round's vector: the update's, then r_k (``mean``) or the within bit (``dp``,
    adaptive clipping)."""
    return _size(shapes) + (1 if spec["mode"] == "mean" or spec.get("within") else 0)


def weight_of(kind: str, result: ClientResult) -> float:
    """w_k: what the algorithm's aggregation weights client ``result`` by."""
    return float(result.num_samples if kind == "samples" else result.num_episodes if kind == "episodes" else 1)


def client_vector(spec: SecureSpec, payload_model: Mapping[str, torch.Tensor], result: ClientResult,
                  frozen: Collection[str] = ()) -> tuple[np.ndarray, bool]:
    """(the vector client ``result`` contributes to the round's masked sum, whether it sat the round out:
    zeros then). Raises :class:`SecureAggregationError` when a coordinate lies outside the clipping range
    (the quantisation would clip it: the sum would silently differ) or the weight exceeds max_weight."""
    from fedfew.privacy.clipping import DELTA, WITHIN, model_delta

    shapes = layout(payload_model, frozen)
    size = vector_size(spec, shapes)
    if spec["mode"] == "mean":
        if result.skipped or "model" not in result.upload:
            return np.zeros(size), True
        weight = weight_of(str(spec["weight"]), result)
        if weight > float(spec["max_weight"]) or weight < 0:
            raise SecureAggregationError(f"a client's aggregation weight ({spec['weight']}) exceeds "
                                         f"flower.secure_aggregation.max_weight={spec['max_weight']:g}: raise it")
        ratio = weight / float(spec["max_weight"])
        delta = model_delta(result.upload["model"], payload_model, frozen)
        parts = [delta[name].reshape(-1).numpy() * ratio for name, _ in shapes] + [np.array([ratio])]
    else:
        if DELTA not in result.upload:
            return np.zeros(size), True
        upload = result.upload
        parts = [upload[DELTA][name].detach().to(torch.float64).reshape(-1).numpy() for name, _ in shapes]
        if spec.get("within"):
            parts.append(np.array([float(upload[WITHIN])]))
    vector = np.concatenate(parts).astype(np.float64)
    if vector.size != size:
        raise SecureAggregationError(f"a client's update has {vector.size} coordinates where the round has {size}")
    peak = float(np.abs(vector).max()) if vector.size else 0.0
    if not math.isfinite(peak) or peak > float(spec["clipping_range"]):
        raise SecureAggregationError(f"flower.secure_aggregation.clipping_range={spec['clipping_range']:g}: a client's "
                                     f"update has a coordinate of magnitude {peak:.4g} beyond it (the quantisation "
                                     "would clip it): raise it")
    return vector, False


@dataclass
class SecureSum:
    """What a round's server learned (the unmasked sum) and what it made of it."""

    total: np.ndarray  # the sum of the summed clients' vectors (with the quantisation's error)
    results: dict[int, ClientResult]  # every client whose vector is in the sum
    trained: list[int]
    weight_sum: float | None = None  # sum_k r_k (mean rounds)
    error_bound: float = 0.0  # per coordinate of the next global model, against the individual uploads


def server_results(spec: SecureSpec, payload_model: Mapping[str, torch.Tensor], total: np.ndarray,
                   summed: list[int], skipped: Collection[int], step: float, frozen: Collection[str] = (),
                   denominator: float | None = None, margin: float = 0.0) -> SecureSum:
    """The results the algorithm's (or DP-FedAvg's) aggregation gets from the unmasked sum ``total`` of
    the clients ``summed`` (those in ``skipped`` sat the round out): every client that trained carries the
    sum divided by how many trained, the others their empty result.

    The bound, per coordinate of the next global model against the aggregation of the individual uploads
    (each of the K summed vectors is off by less than one step 2c/T per coordinate, stochastic rounding):
    ``mean``: K step (1 + max |mean update|) / (sum_k r_k - K step); ``dp``: (K step + T_c margin) / m, m the
    DP denominator, T_c the clients that trained, margin the client clip's reduction (central-dp)."""
    from fedfew.interface.algorithm import ClientResult
    from fedfew.privacy.clipping import DELTA, WITHIN

    shapes = layout(payload_model, frozen)
    size, k = vector_size(spec, shapes), len(summed)
    if total.shape != (size,):
        raise ValueError(f"the unmasked sum has shape {total.shape}, the round's vector ({size},)")
    trained = [cid for cid in summed if cid not in skipped]
    results: dict[int, ClientResult] = {cid: ClientResult.sat_out(None) for cid in summed if cid in skipped}
    out = SecureSum(total, results, trained)
    if not trained:
        return out
    values = torch.from_numpy(total.copy())
    if spec["mode"] == "mean":
        weight_sum = float(total[-1])
        out.weight_sum = weight_sum
        if weight_sum <= k * step:
            raise SecureAggregationError(f"the round's weights sum to {weight_sum:.3g} (of max_weight), within the "
                                         f"quantisation error {k * step:.3g}: lower flower.secure_aggregation."
                                         "max_weight or raise quantization_range")
        mean = values[:-1] / weight_sum
        out.error_bound = k * step * (1 + float(mean.abs().max() if mean.numel() else 0.0)) / (weight_sum - k * step)
        updates = _split(mean, shapes)
        model: dict[str, torch.Tensor] = {}
        for name, tensor in payload_model.items():
            model[name] = (tensor.detach().to(torch.float64) + updates[name]).to(tensor.dtype) if name in updates \
                else tensor
        # weights 1: the algorithm's weighted mean of identical models is that model
        upload: Payload = {"model": model}
    else:
        share = values / len(trained)
        upload = {DELTA: _split(share, shapes)}
        if spec.get("within"):
            upload[WITHIN] = share[-1].clone()
        out.error_bound = (k * step + len(trained) * margin) / float(denominator or len(trained))
    for cid in trained:
        results[cid] = ClientResult(upload=upload, state=None, metrics={}, num_samples=1, num_episodes=1)
    out.results = {cid: results[cid] for cid in sorted(results)}
    return out


def _split(vector: torch.Tensor, shapes: list[tuple[str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
    """The tensors of :func:`layout` from the start of ``vector``, in its order."""
    out, offset = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        out[name] = vector[offset:offset + n].reshape(shape)
        offset += n
    return out


def dp_margin(size: int, step: float) -> float:
    """How much below the clip C a central-dp client clips under secure aggregation: sqrt(d) steps, so
    that its quantised update (each of its d coordinates off by less than a step) still has norm <= C."""
    return math.sqrt(size) * step
