"""The algorithm interface every method implements, and the registry that names them.

A client update is a pure function of (payload from the server, the client's own persistent state,
the client's own data, a seeded generator): nothing is read from globals, so the same update can run
in this process, in a worker process or on a real federated runtime. The algorithm object holds only
its options, the experiment context and a reusable workspace model (a speed cache whose contents are
overwritten at the start of every use).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch
from pydantic import ConfigDict

from fedfew.data.dataset import LabelledDataset
from fedfew.episodes import FixedEpisodes
from fedfew.models.base import FewShotModel
from fedfew.registry import Registry
from fedfew.schema import NoBoolNumbers


class Options(NoBoolNumbers):
    """Base for an algorithm's options: unknown keys are errors, and so are booleans for numbers."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


#: The base of every algorithm's options (``Algorithm.Options`` names a subclass).
BaseOptions = Options


@dataclass
class EpisodeShape:
    n_way: int = 5
    k_shot: int = 1
    q_query: int = 15


@dataclass
class Context:
    """What an algorithm knows about the experiment (never a client's data).

    ``make_model(num_classes)`` builds a fresh model of the configured architecture (``None`` for a
    head-less encoder, an int for a linear head); ``make_model_named(name, num_classes)`` builds
    another zoo model, for heterogeneous private models.
    """

    seed: int
    make_model: Callable[[int | None], FewShotModel]
    make_model_named: Callable[[str, int | None], FewShotModel]
    input_shape: tuple[int, ...]
    num_classes: int
    train_classes: list[int]
    episode: EpisodeShape = field(default_factory=EpisodeShape)
    task: str = "fewshot"  # "fewshot" (meta-test on novel-class episodes) or "classification"
    extras: dict[str, Any] = field(default_factory=dict)
    num_clients: int = 0  # how many clients the federation has (0: not known)
    #: The run's number of training rounds (``federation.rounds``; None: not known), for a phase that
    #: happens once the last round is done (FML's newcomers joining the final global model).
    num_rounds: int | None = None
    #: An engine of the configured kind (``runtime.engine``) for a federation of new clients that
    #: the algorithm makes itself (FRL's deployment groups): ``new_federation(algorithm, clients)``,
    #: an :class:`~fedfew.engine.engines.Engine` to close after use. None: in this process.
    new_federation: Callable[[Algorithm, list[ClientData]], Any] | None = None
    #: The rows of the loaded dataset that some client trains on: simulation bookkeeping (never the
    #: data), so that FRL's seen-class deployment groups use only samples no participant holds.
    participant_positions: torch.Tensor | None = None
    #: The clients whose data ``partition.options.corrupt`` spoiled (sorted ids): simulation
    #: bookkeeping for reports on a server's selection (where the bad clients rank), never for training.
    corrupt_clients: list[int] = field(default_factory=list)


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
    private ``state`` (never sent), ``metrics``, and the counts the server may weight by."""

    upload: dict[str, Any]
    state: Any = None
    metrics: dict[str, float] = field(default_factory=dict)
    num_samples: int = 0
    num_episodes: int = 0
    #: True when the client could not train this round (too little data for a task) and sat it out.
    skipped: bool = False

    def summary(self) -> dict[str, Any]:
        """Every field but the tensors (``upload``, ``state``), JSON-able: the result's wire form
        beside the tensors (:mod:`fedfew.engine.protocol`)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _TENSOR_FIELDS}

    @classmethod
    def from_summary(cls, *, upload: dict[str, Any], state: Any, summary: Mapping[str, Any]) -> ClientResult:
        """The result back from its tensors and :meth:`summary` (keys it does not know, such as a
        transport's timing, are ignored)."""
        known = {f.name for f in fields(cls)} - _TENSOR_FIELDS
        return cls(upload=upload, state=state, **{k: v for k, v in summary.items() if k in known})

    @classmethod
    def sat_out(cls, state: Any, num_samples: int = 0) -> ClientResult:
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


class Algorithm:
    """Base class. Subclasses set ``name`` (via :func:`register`) and usually ``Options``, and
    override ``init_server``, ``client_update``, ``aggregate`` and ``evaluate``."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[BaseOptions]] = BaseOptions
    options: BaseOptions
    # Capabilities: each is a class attribute (a property where it depends on the options).
    #: False for a method whose rounds train nothing by design (FRL's from-scratch baseline learns at
    #: deployment only); otherwise a run in which no client ever trained is an error, not a result.
    trains: bool = True
    #: True when evaluation is the mean over independent episodes of :meth:`episode_scores`, so an
    #: engine may score the episodes in parallel.
    splits_evaluation: bool = False
    #: True when evaluation involves the clients' own models: then the score of one client is
    #: :meth:`evaluate_client`, computed where the client is (its own process or Flower node), and
    #: :meth:`combine_evaluations` turns all of them into the metrics. Otherwise :meth:`evaluate`
    #: runs on the server alone.
    evaluates_clients: bool = False

    def __init__(self, options: BaseOptions, context: Context) -> None:
        self.options = options
        self.context = context

    # -- server side -------------------------------------------------------------------------
    def init_server(self, generator: torch.Generator) -> Any:
        raise NotImplementedError

    def broadcast(self, server: Any, client_id: int) -> dict[str, Any]:
        """The payload sent to ``client_id`` (counted as bytes sent down)."""
        return {"model": server["model"]}

    def aggregate(self, server: Any, results: dict[int, ClientResult], generator: torch.Generator) -> Any:
        raise NotImplementedError

    # -- client side -------------------------------------------------------------------------
    def init_client_state(self, client: ClientData, generator: torch.Generator) -> Any:
        return None

    def client_update(
        self, payload: dict[str, Any], state: Any, data: ClientData, generator: torch.Generator
    ) -> ClientResult:
        raise NotImplementedError

    # -- many clients as one computation (runtime.batch_clients) ------------------------------
    def batching_unsupported(self) -> str | None:
        """None when :meth:`client_update_batch` can run this algorithm's client updates together;
        otherwise why not, in words for the user."""
        return f"{self.name} has no batched client update"

    def client_update_batch(self, payloads: Sequence[dict[str, Any]], states: Sequence[Any],
                            data: Sequence[ClientData], generators: Sequence[torch.Generator]) -> list[ClientResult]:
        """:meth:`client_update` of several clients as one computation on one device: the i-th result
        is client ``data[i]``'s update from ``payloads[i]``, ``states[i]`` and its own generator
        ``generators[i]``, equal to :meth:`client_update`'s up to floating-point summation order."""
        raise NotImplementedError(f"{self.name} has no batched client update")

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, server: Any, data: EvalData, generator: torch.Generator) -> dict[str, float]:
        """The metrics of the server's model(s) on ``data`` (an evaluation split: fixed episodes or a
        labelled set), from what a server has: its state and the evaluation data, never a client's
        data or private state (those take part through :meth:`evaluate_client`)."""
        raise NotImplementedError(f"{self.name} does not evaluate on the server")

    def episode_scores(self, server: Any, data: EvalData, indices: Sequence[int]) -> list[float]:
        """The score of each evaluation episode in ``indices`` (algorithms with ``splits_evaluation``)."""
        raise NotImplementedError(f"{self.name} does not score episodes one by one")

    def episode_predictions(self, server: Any, data: EvalData, indices: Sequence[int]) -> list[torch.Tensor]:
        """The predicted query labels (0..N-1) of each evaluation episode in ``indices``, from the same
        model and adaptation as :meth:`episode_scores` (``eval.per_class`` pools them by true class)."""
        raise NotImplementedError(f"{self.name} does not report its episodes' predictions")

    @property
    def predicts_episodes(self) -> bool:
        """Whether :meth:`episode_predictions` gives the predictions behind this algorithm's score: its
        score is the mean of :meth:`episode_scores` of the server's model (not the clients' own models)."""
        overridden = type(self).episode_predictions is not Algorithm.episode_predictions
        return overridden and self.splits_evaluation and not self.evaluates_clients

    # -- evaluation with the clients' own models (``evaluates_clients``) ----------------------
    def evaluate_client(self, payload: dict[str, Any], state: Any, client: ClientData, data: EvalData,
                        generator: torch.Generator) -> dict[str, Any]:
        """One client's scores of its own model (per-episode lists or numbers), from the payload the
        server broadcasts to it, its private state and its own data."""
        raise NotImplementedError(f"{self.name} evaluates on the server")

    def combine_evaluations(self, server: Any, scores: dict[int, dict[str, Any]], data: EvalData,
                            generator: torch.Generator) -> dict[str, float]:
        """The metrics from every client's :meth:`evaluate_client` (keyed by client id)."""
        raise NotImplementedError(f"{self.name} evaluates on the server")

    # -- a round made of nested rounds ---------------------------------------------------------
    def play_round(self, server: Any, engine: Any, selected: Sequence[int], round_index: int) -> Any:
        """One simulator round done otherwise than one broadcast / update / aggregate: return a
        :class:`fedfew.engine.simulator.RoundOutcome` whose byte counts cover every exchange inside it
        (FRL: R nested rounds of FL and a meta-update, each a :func:`~fedfew.engine.simulator.run_round`
        on ``engine``), or ``None``, the default, for the standard round."""
        return None

    def client_part(self, name: str, **args: Any) -> Algorithm:
        """The algorithm object that runs client tasks of part ``name`` (see
        :class:`fedfew.engine.tasks.ClientTask`): FRL's inner FL, for example. Only algorithms that
        nest rounds have parts; the client side rebuilds a part from its name and JSON arguments."""
        raise KeyError(f"{self.name} has no client part {name!r}")


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")


def register(name: str, help: str = "") -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator: register an algorithm under ``name`` and set its ``name`` attribute."""

    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        cls.name = name
        return ALGORITHMS.register(name, help=help or (cls.__doc__ or "").strip().split("\n")[0])(cls)

    return decorate
