"""The records of the algorithm contract: the state aliases, the options' base, a client's own data (:class:`ClientData`), what a client
update returns (:class:`ClientResult`) and an evaluation split (:class:`EvalData`). The hooks that
receive and return them (and the :class:`~fedfew.interface.algorithm.Context` they are built with) are :class:`fedfew.interface.algorithm.Algorithm`'s, which re-exports them."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeAlias

from pydantic import ConfigDict

from fedfew.core.options import NoBoolNumbers

if TYPE_CHECKING:  # annotations only: the contract runs nothing of the data, few-shot or model packages
    import torch

    from fedfew.data.dataset import LabelledDataset
    from fedfew.fewshot.episodes import FixedEpisodes


#: What a server state, a client's private state, a payload or an upload is made of (see "States are
#: data" in :class:`Algorithm`), exactly what :mod:`fedfew.interface.serialize` stores, sends and gives
#: back: tensors, numbers, strings, booleans and None, nested in lists, tuples and mappings whose keys
#: are strings, integers (an optimiser's ``state_dict``) or other hashable values of a state (tuples).
#: (Numpy scalars and arrays are taken too, and come back as numbers and tensors.) Each algorithm's hooks
#: read their own states in their own form (a ``TypedDict`` of theirs, :data:`Parts`), which the interface
#: passes back without looking inside: so :class:`Algorithm`'s hooks type them ``Any``, and the framework
#: holds them as ``object``.
State: TypeAlias = ("torch.Tensor | int | float | str | None | list[State] | tuple[State, ...] | Mapping[str, State] "
                    "| Mapping[int, State] | Mapping[Hashable, State]")
#: A state made of named parts, ``{"model": state dict, ...}``, each part a :data:`State` (most
#: algorithms' server states).
Parts: TypeAlias = dict[str, Any]
#: Named parts sent to a client (:meth:`Algorithm.broadcast`) or up from it (``ClientResult.upload``).
Payload: TypeAlias = Parts
#: One client's evaluation of its own model (:meth:`Algorithm.evaluate_client`): per-episode lists or
#: numbers by name.
ClientScores: TypeAlias = dict[str, Any]


class Options(NoBoolNumbers):
    """Base for an algorithm's options (``algorithm.options`` of a config): unknown keys are errors,
    and so are booleans for numbers. Declare each option with its default, bounds and meaning,
    ``lr: float = Field(0.01, gt=0, description="the clients' SGD learning rate")``: the
    description is what ``fedfew list algorithms NAME`` prints."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


#: The base of every algorithm's options (``Algorithm.Options`` names a subclass).
BaseOptions = Options


@dataclass
class EpisodeShape:
    n_way: int = 5
    k_shot: int = 1
    q_query: int = 15


@dataclass
class ClientData:
    """A client's own data, built once per run. ``train`` keeps global class ids."""

    client_id: int
    train: LabelledDataset
    val: LabelledDataset | None = None

    @property
    def num_samples(self) -> int:
        return len(self.train)


@dataclass
class ClientResult:
    """What a client update returns: ``upload`` (tensors, counted as bytes sent up), the client's new
    private ``state`` (never sent; in the algorithm's own form, a :data:`State`, which only its own
    hooks read), ``metrics``, and the counts the server may weight by."""

    upload: Payload
    state: object = None
    metrics: dict[str, float] = field(default_factory=dict)
    num_samples: int = 0
    num_episodes: int = 0
    #: True when the client could not train this round (too little data for a task) and sat it out.
    skipped: bool = False
    #: The dataset rows this update's episodes used, when the task asked (``ClientTask.record_rows``: the
    #: membership check's members); None otherwise, and then not part of the wire form.
    rows_used: list[int] | None = None

    def summary(self) -> dict[str, Any]:
        """Every field but the tensors (``upload``, ``state``), JSON-able: the result's wire form
        beside the tensors (:mod:`fedfew.interface.protocol`); ``rows_used`` only when recorded."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in _TENSOR_FIELDS and not (f.name == "rows_used" and self.rows_used is None)}

    @classmethod
    def from_summary(cls, *, upload: Payload, state: object, summary: Mapping[str, Any]) -> ClientResult:
        """The result back from its tensors and :meth:`summary` (keys it does not know, such as a
        transport's timing, are ignored)."""
        known = {f.name for f in fields(cls)} - _TENSOR_FIELDS
        return cls(upload=upload, state=state, **{k: v for k, v in summary.items() if k in known})

    @classmethod
    def sat_out(cls, state: object, num_samples: int = 0) -> ClientResult:
        """A client that had nothing to train on this round: no upload, its state unchanged."""
        return cls(upload={}, state=state, metrics={}, num_samples=num_samples, skipped=True)


_TENSOR_FIELDS = frozenset({"upload", "state"})


@dataclass
class EvalData:
    """Evaluation material for one split ("val" or "test"): fixed episodes for few-shot tasks, a
    labelled set for classification tasks; either may be missing."""

    split: str
    episodes: FixedEpisodes | None = None
    dataset: LabelledDataset | None = None
