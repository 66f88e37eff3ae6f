"""The client side of differential privacy: a client's upload clipped (and, with ``local-dp``, noised)
where the client trained, before anything leaves it.

:func:`privatize` is called by :func:`fedfew.engine.tasks.run_client_task`, the one function every
engine runs a client update with, so the clip happens in the client's own process (a worker, a Flower
node) whichever engine runs the round. Its instructions come with the task (``ClientTask.privacy``, a
JSON-able :class:`ClientSpec` made by the server from its state each round: the clip of an adaptive
clip changes). The server side (noise, averaging, accounting) is :mod:`fedfew.privacy.mechanism`.

For an algorithm whose upload is a model the server averages (``dp_upload = "model-delta"``), the
vector clipped is the update Delta = upload["model"] - payload["model"] (F2L: ``"server"``, the
shared server-model; :data:`fedfew.privacy.coverage.UPLOAD_KEYS`) over the model's floating-point
tensors (parameters and floating buffers), frozen parameters left out (they never change and never
cross; :mod:`fedfew.interface.static`). Integer buffers (BatchNorm's batch counter) stay at the server's.

FRL (``dp_upload = "frl-prototypes"``, our extension): the vector clipped is the model update and, in
an inner round, the client's prototypes together (one joint clip to C); the meta-update's update is
measured from phi^t, which the payload carries under :data:`REFERENCE`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final

import torch

from fedfew.core.seeding import torch_generator
from fedfew.privacy.coverage import UPLOAD_KEYS
from fedfew.privacy.sampling import secure_generator

if TYPE_CHECKING:  # fedfew.privacy sits below the engine, which calls it (fedfew.engine.tasks)
    from fedfew.interface.algorithm import ClientResult, Payload

__all__ = ["DELTA", "LOCAL_NOISE_KEY", "PROTOTYPES", "REFERENCE", "WITHIN", "ClientSpec", "clip_to", "l2_norm",
           "model_delta", "privatize"]

#: The upload keys of a private client: its clipped (noised) update, and (adaptive clipping) whether
#: its update's norm was within the clip, as 1.0 or 0.0.
DELTA = "dp_delta"
WITHIN = "dp_within"
#: FRL (``dp_upload = "frl-prototypes"``): the upload key of a client's clipped prototypes
#: ({"classes", "prototypes"}, no class counts), and the payload key of the model its update is
#: measured from when that is not the model it downloaded (the meta-update: phi^t, not theta^R).
PROTOTYPES = "dp_prototypes"
REFERENCE: Final = "dp_reference"
#: The name the prototypes take in the one vector clipped with the model delta (no tensor's name).
_PROTOTYPE_ROWS = "\0prototypes"
#: The key of a client's local-dp noise generator, with the seed, round key and client id (research
#: mode, ``privacy.noise: seeded``, only: by default the client seeds it from its own OS randomness).
LOCAL_NOISE_KEY = "dp-local-noise"
#: Updates are clipped to this fraction of C in float64, so that rounding them back to float32 (a
#: relative error of at most 2^-24 per coordinate) cannot take the norm above C.
_MARGIN = 1.0 - 2.0**-20


@dataclass(frozen=True)
class ClientSpec:
    """What the server tells each client about this round's privacy (``ClientTask.privacy``)."""

    upload: str  # what is clipped: a kind of fedfew.privacy.coverage.UPLOAD_KEYS ("model-delta")
    clip: float  # C this round
    local_noise: float = 0.0  # the standard deviation each client adds itself (local-dp), else 0
    adaptive: bool = False  # report whether the update was within the clip (adaptive clipping)
    metrics: bool = False  # send the training metrics (not covered by the guarantee)
    seeded_noise: bool = False  # research mode: local noise from the run's seed (else the client's OS randomness)
    #: FRL: every preparation class, sorted: a client's prototype rows are padded to all of them (zero
    #: rows), so neither its upload's class list nor its size says which classes it holds.
    classes: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "classes": list(self.classes)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClientSpec:
        fields = dict(data)
        fields["classes"] = tuple(int(c) for c in fields.get("classes", ()))  # a JSON list on the wire
        return cls(**fields)


def model_delta(upload: Mapping[str, torch.Tensor], sent: Mapping[str, torch.Tensor],
                frozen: Collection[str] = ()) -> dict[str, torch.Tensor]:
    """upload - sent in float64, by name in sorted order, for the floating-point tensors that are not
    frozen parameters."""
    delta = {}
    for name in sorted(upload):
        tensor = upload[name]
        if not torch.is_floating_point(tensor) or name in frozen:
            continue
        if name not in sent:
            raise KeyError(f"the upload's tensor {name!r} is not in the model the client received")
        delta[name] = tensor.detach().to(torch.float64) - sent[name].detach().to(torch.float64)
    return delta


def l2_norm(tensors: Mapping[str, torch.Tensor]) -> float:
    """The L2 norm of all of ``tensors`` as one vector (float64)."""
    total = sum((float(t.to(torch.float64).pow(2).sum()) for t in tensors.values()), 0.0)
    return math.sqrt(total)


def clip_to(tensors: Mapping[str, torch.Tensor], clip: float) -> tuple[dict[str, torch.Tensor], float]:
    """(``tensors`` scaled to L2 norm at most ``clip``, their norm before): min(1, C / ||v||) v, with
    the float32 margin of :data:`_MARGIN`."""
    norm = l2_norm(tensors)
    bound = clip * _MARGIN
    scale = 1.0 if norm <= bound else bound / norm
    return {name: t * scale for name, t in tensors.items()}, norm


def privatize(result: ClientResult, payload: Mapping[str, Any], spec: ClientSpec, seed: int, round_key: str,
              client_id: int, frozen: Collection[str] = ()) -> ClientResult:
    """What a private client sends instead of ``result``: its clipped update (plus its own noise,
    local-dp), nothing else of the upload, no training metrics unless ``spec.metrics``, and no sample
    or episode counts (the server divides by the expected clients per round, never by the clients'
    sizes). Its private state stays as the update left it. A client that sat the round out sends
    nothing (whether a client took part is not covered: docs/privacy.md)."""
    if spec.upload not in UPLOAD_KEYS:
        raise ValueError(f"unknown private upload {spec.upload!r}")
    key = UPLOAD_KEYS[spec.upload]  # "model"; F2L's shared server-model is "server"
    metrics = dict(result.metrics) if spec.metrics else {}
    if result.skipped or key not in result.upload:
        return dataclasses.replace(result, upload={}, metrics=metrics, num_samples=0, num_episodes=0)
    model = result.upload[key]
    delta = model_delta(model, payload.get(REFERENCE, payload[key]), frozen)
    prototypes = result.upload.get("prototypes") if spec.upload == "frl-prototypes" else None
    if prototypes is not None:  # one joint clip: delta and prototype rows together have norm <= C
        delta[_PROTOTYPE_ROWS] = prototypes["prototypes"].detach().to(torch.float64)
    delta, norm = clip_to(delta, spec.clip)
    rows = delta.pop(_PROTOTYPE_ROWS, None)
    if spec.local_noise > 0:
        # Drawn here, on the client: by default from its own OS randomness, which the server never holds.
        generator = (torch_generator(seed, LOCAL_NOISE_KEY, round_key, client_id) if spec.seeded_noise
                     else secure_generator())
        for name in sorted(delta):  # a fixed order: every engine draws the same noise
            noise = torch.randn(delta[name].shape, generator=generator, device=generator.device, dtype=torch.float64)
            delta[name] = delta[name] + noise.to(delta[name].device) * spec.local_noise
    upload: Payload = {DELTA: {name: delta[name].to(model[name].dtype) for name in sorted(delta)}}
    if prototypes is not None and rows is not None:  # the classes, not their counts (the divisor is fixed)
        classes, rows = pad_to_classes(prototypes["classes"], rows, spec.classes)
        upload[PROTOTYPES] = {"classes": classes, "prototypes": rows.to(prototypes["prototypes"].dtype)}
    if spec.adaptive:
        upload[WITHIN] = torch.tensor(1.0 if norm <= spec.clip else 0.0, dtype=torch.float64)
    return dataclasses.replace(result, upload=upload, metrics=metrics, num_samples=0, num_episodes=0)


def pad_to_classes(classes: torch.Tensor, rows: torch.Tensor,
                   every: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(every class, its row: the client's clipped row where it holds the class, zeros elsewhere):
    zero rows add nothing to the norm or to the server's per-class sums, so the guarantee and the
    numbers are those of the unpadded upload, and the upload no longer says which classes the client
    holds. ``every`` empty: the client's own classes and rows, as they are."""
    if not every:
        return classes, rows
    full = torch.as_tensor(every, dtype=torch.long, device=classes.device)
    position = torch.searchsorted(full, classes.to(torch.long))
    if bool((position >= len(full)).any()) or not bool(torch.equal(full[position.clamp(max=len(full) - 1)],
                                                                      classes.to(torch.long))):
        raise ValueError("a client's prototype class is not a preparation class")
    padded = torch.zeros((len(full), rows.shape[1]), dtype=rows.dtype, device=rows.device)
    padded[position.to(rows.device)] = rows
    return full.to(classes.dtype), padded
