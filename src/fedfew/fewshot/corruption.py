"""Bad clients on purpose: ``partition.options.corrupt`` spoils some clients' local data.

AdFL's bad-client experiment (docs/adfl.md) asks whether a server's selection keeps out clients that
trained on wrong data. Any partition takes::

    partition:
      options: {corrupt: {clients: [0, 1, 2, 3, 4], kind: flip}}

after the partition (and each client's own validation split, if any) is made, the listed clients'
data are replaced by the ``kind``'s corruption (:data:`CORRUPTIONS`); every other client's data,
and every other random draw of the run, are exactly what they are without ``corrupt``: a corruption
draws only from its own generator, ``torch_generator(seed, "corrupt", client_id, part)``. The algorithm
learns which clients were corrupted through ``Context.corrupt_clients`` (simulation bookkeeping for
its report, never used to train or select).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedfew.core.errors import ConfigError
from fedfew.core.registry import Registry, RegistryError
from fedfew.core.seeding import torch_generator
from fedfew.data.dataset import LabelledDataset

#: The partition option that names the corrupted clients; every partitioner accepts it.
KEY = "corrupt"

#: A corruption: (a client's data, the classes clients train on, sorted; its own generator) -> the
#: spoiled data, the same samples in the same order.
Corruptor = Callable[[LabelledDataset, list[int], torch.Generator], LabelledDataset]
CORRUPTIONS: Registry[Corruptor] = Registry("corruption")


@CORRUPTIONS.register("flip", help="labels mirrored: the i-th of the K training classes becomes the (K-1-i)-th "
                                   "(MNIST: y -> 9 - y); inputs kept")
def flip(data: LabelledDataset, classes: list[int], generator: torch.Generator) -> LabelledDataset:
    """Each label y, the i-th of the sorted training classes, becomes the (K-1-i)-th: a fixed
    permutation every honest client disagrees with (the retired experiments/adfl.py's "flipped", y -> 9 - y on
    MNIST). Draws nothing."""
    table = torch.full((max(classes) + 1,), -1, dtype=torch.long)
    table[torch.tensor(classes)] = torch.tensor(classes[::-1])
    mapped = table[data.labels.cpu()]
    if bool((mapped < 0).any()):  # a client holding a class outside the training classes cannot happen
        raise ConfigError(f"partition.options.{KEY}: a client holds labels outside the training classes")
    return replace(data, labels=mapped.to(data.labels.device))


@CORRUPTIONS.register("noise", help="inputs replaced by uniform noise on [0, 1] of the same shape; labels kept")
def noise(data: LabelledDataset, classes: list[int], generator: torch.Generator) -> LabelledDataset:
    """Every input replaced by uniform noise on [0, 1] (the scale of fedfew's image loaders), its
    label kept: a client that learns nothing about the real inputs (the retired experiments/adfl.py's "noise").
    Drawn on the CPU, so the numbers are the same on every device."""
    if data.is_text:
        raise ConfigError(f"partition.options.{KEY}.kind: noise replaces images or features; "
                          f"dataset {data.name!r} holds token ids")
    values = torch.rand(tuple(data.inputs.shape), generator=generator, dtype=torch.float32, device=generator.device)
    return replace(data, inputs=values.to(device=data.inputs.device, dtype=data.inputs.dtype))


class CorruptOptions(BaseModel):
    """``partition.options.corrupt``: which clients, and how their data are spoiled."""

    model_config = ConfigDict(extra="forbid")

    #: Client ids (0 .. num_clients - 1) whose data are corrupted.
    clients: list[int] = Field(min_length=1)
    #: A name in :data:`CORRUPTIONS` (``flip``, ``noise``).
    kind: str

    @field_validator("clients")
    @classmethod
    def _distinct(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"client ids must be distinct, got {value}")
        if any(c < 0 for c in value):
            raise ValueError(f"client ids must be 0 or more, got {value}")
        return value

    @field_validator("kind")
    @classmethod
    def _known(cls, value: str) -> str:
        try:
            CORRUPTIONS.get(value)
        except RegistryError as err:
            raise ValueError(str(err)) from None
        return value


def split_options(options: Mapping[str, object]) -> tuple[dict[str, object], object]:
    """(the partitioner's own options, the raw ``corrupt`` value or None)."""
    own = {k: v for k, v in options.items() if k != KEY}
    return own, options.get(KEY)


def parse(raw: object, num_clients: int) -> CorruptOptions | None:
    """The validated ``corrupt`` option (None when absent); a bad one is a one-line
    :class:`ConfigError` naming the key."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"partition.options.{KEY}: must be a mapping {{clients: [...], kind: flip|noise}}, "
                          f"got {raw!r}")
    try:
        parsed = CorruptOptions.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = ("unknown key" if first["type"] == "extra_forbidden" else
                   "required key missing" if first["type"] == "missing" else
                   first["msg"].removeprefix("Value error, "))
        raise ConfigError(f"partition.options.{KEY}.{where}: {message}") from None
    outside = [c for c in parsed.clients if c >= num_clients]
    if outside:
        raise ConfigError(f"partition.options.{KEY}.clients: {outside} name no client "
                          f"(partition.num_clients={num_clients}: ids 0..{num_clients - 1})")
    return parsed


def corrupted_ids(partition_options: Mapping[str, object]) -> list[int]:
    """The corrupted clients a (validated) config's partition options name, sorted ([] for none)."""
    raw = partition_options.get(KEY)
    return sorted(raw["clients"]) if isinstance(raw, dict) and isinstance(raw.get("clients"), list) else []


def corrupt_data(data: LabelledDataset, kind: str, classes: list[int], seed: int, client_id: int,
                 part: str = "train") -> LabelledDataset:
    """Client ``client_id``'s ``data`` (its ``part``: train, or its own validation split) spoiled by
    ``kind``, drawing from a generator of its own."""
    return CORRUPTIONS.get(kind)(data, sorted(classes), torch_generator(seed, KEY, client_id, part))
