"""The algorithm interface every method implements, and the registry that names them.

A client update is a pure function of (payload from the server, the client's own persistent state,
the client's own data, a seeded generator): nothing is read from globals, so the same update can run
in this process, in a worker process or on a real federated runtime. The algorithm object holds only
its options, the experiment context and a reusable workspace model (a speed cache whose contents are
overwritten at the start of every use).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, get_args, get_origin

import torch

from fedfew.core.errors import UsageError
from fedfew.interface.records import (
    BaseOptions,
    ClientData,
    ClientResult,
    ClientScores,
    EpisodeShape,
    EvalData,
    Options,
    Parts,
    Payload,
    State,
)

#: The contract's records (:mod:`fedfew.interface.records`) are part of this module's names: an algorithm
#: imports the base class and what its hooks receive from one place.
__all__ = ["Algorithm", "AlgorithmDefinitionError", "BaseOptions", "ClientData", "ClientResult", "ClientScores",
           "Context", "EpisodeShape", "EvalData", "Options", "OptionsT", "Parts", "Payload", "State"]

#: The options class an :class:`Algorithm` is generic in: ``class FedAvg(Algorithm[FedAvgOptions])``.
OptionsT = TypeVar("OptionsT", bound=BaseOptions)

if TYPE_CHECKING:  # annotations only: the contract runs nothing of the model package
    from fedfew.models.base import FewShotModel

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
    #: an :class:`~fedfew.engine.base.Engine` to close after use. None: in this process.
    new_federation: Callable[[Algorithm, list[ClientData]], Any] | None = None
    #: The rows of the loaded dataset that some client trains on: simulation bookkeeping (never the
    #: data), so that FRL's seen-class deployment groups use only samples no participant holds.
    participant_positions: torch.Tensor | None = None
    #: The clients whose data ``partition.options.corrupt`` spoiled (sorted ids): simulation
    #: bookkeeping for reports on a server's selection (where the bad clients rank), never for training.
    corrupt_clients: list[int] = field(default_factory=list)


class Algorithm(Generic[OptionsT]):
    """Base class of every federated algorithm: subclass it with its options class,
    ``class MyFedAvg(Algorithm[MyOptions])``, decorate the subclass with :func:`register`, and fill in
    the hooks. A standard round is::

        payload_k = broadcast(server, k)                      for each selected client k (server side)
        result_k  = client_update(payload_k, state_k, data_k, generator_k)   (where client k is)
        server    = aggregate(server, {k: result_k, ...}, generator)        (server side)

    and :meth:`evaluate` scores the server's state on an evaluation split. The hooks a
    subclass must write are :meth:`init_server`, :meth:`client_update`, :meth:`aggregate` and
    :meth:`evaluate`; :meth:`broadcast` (the server's ``"model"``) and :meth:`init_client_state`
    (None) have defaults. The others are capabilities an algorithm opts into, and they change what is
    required (:func:`missing_hooks`): a class that trains nothing (``trains = False``) or plays its own
    rounds (:meth:`play_round`) needs no :meth:`client_update` or :meth:`aggregate`; one that
    ``splits_evaluation`` scores episodes with :meth:`episode_scores`, and one that
    ``evaluates_clients`` scores the clients' own models with :meth:`evaluate_client` and
    :meth:`combine_evaluations`, instead of :meth:`evaluate`. :func:`register` refuses a class that
    lacks a hook it needs, naming it (:class:`AlgorithmDefinitionError`, exit 2), so the error comes
    when the class is registered, not rounds into a run.

    The contract every hook keeps, so that one algorithm runs unchanged in this process, in worker
    processes and on Flower nodes, and a run stopped after any round resumes to the same numbers:

    * **States are data.** Server states, client states, payloads and uploads are nestings of dicts,
      lists and tuples of tensors, numbers, strings and None (a :data:`State`: what
      :mod:`fedfew.interface.serialize` stores and sends), never modules or optimisers: :func:`get_state`
      turns a model into one. The framework hands each hook the states its own hooks made, without
      looking inside, so the hooks here type them ``Any`` and a subclass annotates them in its own form
      (a ``TypedDict`` of its own, or :data:`Parts`).
    * **Nothing received is mutated.** A hook returns new states; it never writes into the server
      state, payload, client state or results it was given (they may be the very tensors the server,
      a best-round snapshot or another client holds). Copy into a workspace model with
      :func:`load_state_` and train that.
    * **A client update reads only its arguments**: the payload, its own state, its own data and its
      generator (plus ``self.options``, ``self.context`` and workspace objects, which carry nothing
      from one call to the next).
    * **Randomness only from the generator passed in.** Each hook gets a ``torch.Generator`` seeded
      from (run seed, what the hook is, round, client id), so results do not depend on the order or
      place clients run in. torch's global RNG is also seeded from the same key before each client
      update, aggregation and evaluation (dropout reads it), and from the generator of
      :meth:`init_server` just before it is called (:attr:`seeds_init_server`; ``torch.nn`` initialisers
      read only the global RNG), so the initial model follows from the seed; :func:`seed_torch_init`
      seeds it from a generator where a hook builds another model.
      Name the generator's device in a draw (``torch.randperm(n, generator=g, device=g.device)``):
      on a GPU run a draw without it is made on the GPU, where a CPU generator is an error.

    ``self.options`` is the validated :attr:`Options` (``algorithm.options`` of the config; typed as the
    class's options class) and ``self.context`` the :class:`Context` (model factory, episode shape,
    classes; never a client's data). Workspace models built in ``__init__`` are a cache whose contents
    are overwritten at the start of every use.

    A complete algorithm, FedAvg with one epoch of SGD per round on a classification task::

        import torch
        import torch.nn.functional as F
        from pydantic import Field

        from fedfew import (Algorithm, ClientResult, Options, evaluate_model, get_state, load_state_,
                            register, weighted_average)


        class SGDOptions(Options):
            lr: float = Field(0.05, gt=0, description="the clients' SGD learning rate")
            batch_size: int = Field(32, ge=1, description="samples per SGD step")


        @register("my-fedavg", help="FedAvg: one epoch of minibatch SGD, sample-weighted averaging")
        class MyFedAvg(Algorithm[SGDOptions]):
            def __init__(self, options, context):
                super().__init__(options, context)
                self.model = context.make_model(context.num_classes)  # workspace, reused every call

            def init_server(self, generator):
                # fedfew has seeded torch's RNG from the run's seed: the initial weights follow from it
                return {"model": get_state(self.context.make_model(self.context.num_classes))}

            def client_update(self, payload, state, data, generator):
                model = load_state_(self.model, payload["model"])  # a copy: the payload stays intact
                model.train()
                optimizer = torch.optim.SGD(model.parameters(), lr=self.options.lr)
                order = torch.randperm(data.num_samples, generator=generator, device=generator.device)
                for batch in order.split(self.options.batch_size):
                    loss = F.cross_entropy(model(data.train.inputs[batch]), data.train.labels[batch])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                return ClientResult(upload={"model": get_state(model)}, state=state,
                                    metrics={"loss": float(loss.detach())}, num_samples=data.num_samples)

            def aggregate(self, server, results, generator):
                sent = [r for r in results.values() if not r.skipped]
                average = weighted_average([r.upload["model"] for r in sent], [r.num_samples for r in sent])
                return {**server, "model": average}

            def evaluate(self, server, data, generator):
                return evaluate_model(load_state_(self.model, server["model"]), data)

    Saved in a file, it is a plugin: ``fedfew run my.yaml --plugin my_fedavg.py`` with
    ``algorithm: {name: my-fedavg}`` in the config (``task: classification``).
    docs/writing-an-algorithm.md writes a few-shot algorithm (Reptile) hook by hook.
    """

    name: ClassVar[str] = ""
    #: The class of the algorithm's options (``algorithm.options`` of a config is validated by it, and
    #: ``fedfew list algorithms NAME`` prints its fields): the ``X`` of ``class A(Algorithm[X])``, set on the
    #: class by :meth:`__init_subclass__`; a subclass that names none inherits its parent's. A class
    #: may also assign it (``Options = X``, the form before ``Algorithm`` was generic).
    Options: ClassVar[type[BaseOptions]] = BaseOptions
    options: OptionsT
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
    #: What differential privacy (config ``privacy``, :mod:`fedfew.privacy`) clips of this algorithm's
    #: upload: "model-delta" when ``upload["model"]`` is a model the server averages into
    #: ``server["model"]`` and nothing else of the round leaves the clients (DP-FedAvg clips the change
    #: and replaces the average by its noised one); "server-model-delta" (F2L's shared server-model,
    #: ``upload["server"]``) and "meme-model-delta" (FML's meme) for the shared model of an algorithm
    #: that keeps private models, and "shared-model-delta" for any other such algorithm whose shared
    #: model is ``upload["model"]`` (a plugin's: FedProto in docs/writing-an-algorithm.md)
    #: (:mod:`fedfew.privacy.coverage`); None (default): private runs are refused.
    dp_upload: str | None = None
    #: Why differential privacy refuses this algorithm, or the options it refuses when ``dp_upload`` is a
    #: property covered with some options only (``fedfew list privacy`` shows it; each class says its
    #: own, :func:`fedfew.privacy.coverage.refused_because`).
    dp_refused: ClassVar[str] = ""
    #: Secure summation (``flower.secure_aggregation``, Flower's SecAgg+; docs/privacy.md): whether the
    #: round's aggregate is the weighted mean of ``upload["model"]`` by the ``aggregation`` option, with
    #: nothing else of the round leaving the clients, so that the server needs only the sum of the
    #: uploads. ``None`` (the default): refused, why in :attr:`secure_sum_refused`; ``""``: covered;
    #: ``"with ..."``: covered with those options only (:attr:`secure_sum_requires` names them). Each
    #: class declares it for itself: a subclass, which may change what is aggregated, does not inherit
    #: its parent's cover, and a plugin opts in by declaring it.
    secure_sum: ClassVar[str | None] = None
    #: Why secure summation refuses this algorithm (or, with :attr:`secure_sum` ``"with ..."``, the
    #: options that :attr:`secure_sum_requires` refuses).
    secure_sum_refused: ClassVar[str] = ("fedfew does not know that its aggregate is a weighted mean of its uploads "
                                         "(only the algorithms of `fedfew list secure-aggregation` are covered)")
    #: The option values secure summation needs, ``{option: value}`` (with :attr:`secure_sum` ``"with ..."``):
    #: options with another value are refused, in the words of :attr:`secure_sum_refused`. A class declares
    #: the ones it adds; a subclass keeps its parents' (its own value wins for the same option), since the
    #: options that break the sum stay in what it inherits, even where it does not declare the cover itself.
    secure_sum_requires: ClassVar[Mapping[str, object]] = {}

    @classmethod
    def secure_sum_refusal(cls, options: object) -> str | None:
        """None when secure summation can carry this algorithm's rounds with ``options`` (its validated
        :attr:`Options`); otherwise why not, in words for the user: :attr:`secure_sum_refused` where an option
        differs from what :attr:`secure_sum_requires` asks (an option ``options`` lacks counts as asked), else
        the class's own :attr:`secure_sum` (None: refused)."""
        required: dict[str, object] = {}
        for klass in reversed(cls.__mro__):
            required.update(vars(klass).get("secure_sum_requires", {}))
        if any(getattr(options, name, value) != value for name, value in required.items()):
            return cls.secure_sum_refused
        if vars(cls).get("secure_sum", None) is None:
            return vars(cls).get("secure_sum_refused", Algorithm.secure_sum_refused)
        return None

    @property
    def seeds_init_server(self) -> bool:
        """Whether the framework seeds torch's global RNG from :meth:`init_server`'s generator just before
        it calls the hook (:func:`seed_torch_init`), so that the models it builds follow from the run's
        seed (and ``model.init_seed`` can replace them): True, the default. A class sets it False
        (``seeds_init_server = False``) for an initial server state that builds no model, or a hook that
        draws from its generator before building one (and calls :func:`seed_torch_init` itself)."""
        return True

    @property
    def seeds_init_client_state(self) -> bool:
        """The same before :meth:`init_client_state` (its generator seeded by the run's seed and the
        client's id): False, the default; a class whose clients build their own initial models sets it
        True (a property where the options decide)."""
        return False

    def dp_advance(self, server: Any) -> object:
        """The server state after a private round, from the one DP's noised average made (which
        replaced :meth:`aggregate` and set only the model): what else a round moves in the state
        (FML: its round counter). Default: nothing else moves."""
        return server

    def __init_subclass__(cls, **kwargs: object) -> None:
        """Set ``cls.Options`` from the class's generic base: ``X`` for ``class A(Algorithm[X])`` or
        ``class B(A[X])`` (a class generic in a type variable of its own, ``class A(Algorithm[T])``, takes
        the variable's bound). A class that names no options inherits its parent's; one that assigns
        ``Options = X`` itself keeps it (it must agree with a generic base that names one)."""
        super().__init_subclass__(**kwargs)
        derived = _options_of_bases(cls)
        if derived is None:
            return
        declared = vars(cls).get("Options")
        if declared is not None and declared is not derived:
            raise AlgorithmDefinitionError(f"{cls.__name__} assigns Options = {declared.__name__} but its base "
                                           f"names {derived.__name__}: give the options class once")
        cls.Options = derived

    def __init__(self, options: OptionsT, context: Context) -> None:
        """Called once per process that runs the algorithm (the server, each worker, each Flower
        node), so it builds only what follows from the options and context: workspace models, the
        learner. Anything that must be the same everywhere belongs in a state."""
        self.options = options
        self.context = context

    def _missing(self, hook: str, what: str) -> NotImplementedError:
        """The error of a required hook that a subclass did not write."""
        registered = f" (algorithm {self.name!r})" if self.name else ""
        return NotImplementedError(f"{type(self).__name__}{registered} does not implement {hook}: override it "
                                   f"to {what} (see fedfew.Algorithm's docstring)")

    # -- server side -------------------------------------------------------------------------
    def init_server(self, generator: torch.Generator) -> object:
        """The server's state before round 1, e.g. ``{"model": get_state(model)}``.

        ``generator`` is seeded by the run's seed alone, and torch's global RNG from it just before the
        call (:attr:`seeds_init_server`): build the model right away, and its initial weights follow
        from the seed (and ``model.init_seed`` can replace them). Called on the server when the run
        starts (a resumed run then replaces the result with its checkpoint). The state is what :meth:`broadcast`, :meth:`aggregate` and
        :meth:`evaluate` receive; it is checkpointed after every round."""
        raise self._missing("init_server(generator)", "return the server's initial state")

    def broadcast(self, server: Any, client_id: int) -> Payload:
        """The payload sent to ``client_id`` this round (its tensors count as bytes sent down).

        A pure function of the server state: no generator, nothing mutated. The default sends
        ``server["model"]``; override it to send less, more, or something per client. The payload
        may share tensors with ``server`` (it is not copied in this process), so a client update
        must treat it as read-only."""
        return {"model": server["model"]}

    def aggregate(self, server: Any, results: dict[int, ClientResult], generator: torch.Generator) -> object:
        """The server's next state from this round's client results.

        ``results`` maps client id to :class:`ClientResult`, in ascending id order, for the clients
        whose reply arrived in time; clients that failed or were late are absent, so weight by what
        is there (:func:`weighted_average`, :func:`weights_for`). It is never empty (with no reply
        the server state stays as it was, without a call). A result with ``skipped`` set sat the
        round out: its ``upload`` is empty and most algorithms leave it out. Return a new state
        (``{**server, "model": ...}``); never write into ``server``, which a best-round snapshot or
        a failed round's rollback may still hold. ``generator`` is seeded by (seed, round), for a
        server-side draw (a random tie-break, server noise)."""
        raise self._missing("aggregate(server, results, generator)", "return the next server state "
                            "from the clients' results")

    # -- client side -------------------------------------------------------------------------
    def init_client_state(self, client: ClientData, generator: torch.Generator) -> object:
        """A client's private state before its first update (default None: a stateless client).

        Made when the client's state is first needed, where its states are kept, from a generator
        seeded by (seed, client id) (and torch's global RNG from it first, where
        :attr:`seeds_init_client_state` says the clients build their models here); the state never
        leaves the client (it is not counted as bytes) and comes back to it as ``state`` in
        :meth:`client_update` and :meth:`evaluate_client`: a private model, optimiser moments."""
        return None


    def client_update(
        self, payload: Payload, state: Any, data: ClientData, generator: torch.Generator
    ) -> ClientResult:
        """One client's local work this round: a :class:`ClientResult` whose ``upload`` goes to the
        server (its tensors count as bytes sent up) and whose ``state`` is the client's next private
        state (return ``state`` itself when it does not change).

        ``payload`` is what :meth:`broadcast` made for this client, ``state`` its private state (see
        :meth:`init_client_state`), ``data`` its own :class:`ClientData` (``data.train`` keeps global
        class ids), ``generator`` seeded by (seed, round, client id). It must be a pure function of
        these: it reads nothing else, and mutates neither ``payload`` nor ``state`` (copy them into a
        workspace model with :func:`load_state_`). Set ``num_samples`` and ``num_episodes`` for the
        server's weighting and ``metrics`` (numbers, averaged over clients into the round's
        ``train_*`` history). A client whose data cannot make the round's task returns
        :meth:`ClientResult.sat_out`. It runs wherever the engine puts the client: this process, a
        worker process or a Flower node."""
        raise self._missing("client_update(payload, state, data, generator)", "train on the client's "
                            "data and return a ClientResult")

    # -- many clients as one computation (runtime.batch_clients) ------------------------------
    def batching_unsupported(self) -> str | None:
        """None when :meth:`client_update_batch` can run this algorithm's client updates together;
        otherwise why not, in words for the user."""
        return f"{self.name} has no batched client update"

    def client_update_batch(self, payloads: Sequence[Payload], states: Sequence[Any],
                            data: Sequence[ClientData], generators: Sequence[torch.Generator]) -> list[ClientResult]:
        """:meth:`client_update` of several clients as one computation on one device: the i-th result
        is client ``data[i]``'s update from ``payloads[i]``, ``states[i]`` and its own generator
        ``generators[i]``, equal to :meth:`client_update`'s up to floating-point summation order."""
        raise NotImplementedError(f"{self.name} has no batched client update")

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, server: Any, data: EvalData, generator: torch.Generator) -> dict[str, float]:
        """The metrics of the server's model(s) on ``data``: at least ``"accuracy"`` (a fraction in
        [0, 1]; the run selects and reports rounds by it), optionally ``"ci95"`` and any other numbers.

        ``data`` is one evaluation split: fixed episodes (``data.episodes``, few-shot tasks: adapt on
        each episode's support set, score its query set) or a labelled set (``data.dataset``,
        classification tasks); :func:`evaluate_model` handles both for a model with a prototype or
        linear classifier. Only what a server has is used: its state and the evaluation data, never a
        client's data or private state (those take part through :meth:`evaluate_client`). Must not
        change ``server``; ``generator`` is seeded by (seed, split), for an evaluation that draws."""
        raise self._missing("evaluate(server, data, generator)", "score the server's state on the "
                            "evaluation split")

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
    def evaluate_client(self, payload: Payload, state: Any, client: ClientData, data: EvalData,
                        generator: torch.Generator) -> ClientScores:
        """One client's scores of its own model (per-episode lists or numbers), from the payload the
        server broadcasts to it, its private state and its own data."""
        raise NotImplementedError(f"{self.name} evaluates on the server")

    def combine_evaluations(self, server: Any, scores: dict[int, ClientScores], data: EvalData,
                            generator: torch.Generator) -> dict[str, float]:
        """The metrics from every client's :meth:`evaluate_client` (keyed by client id)."""
        raise NotImplementedError(f"{self.name} evaluates on the server")

    # -- a round made of nested rounds ---------------------------------------------------------
    def play_round(self, server: Any, engine: Any, selected: Sequence[int], round_index: int) -> object:
        """One simulator round done otherwise than one broadcast / update / aggregate: return a
        :class:`fedfew.engine.round.RoundOutcome` whose byte counts cover every exchange inside it
        (FRL: R nested rounds of FL and a meta-update, each a :func:`~fedfew.engine.round.run_round`
        on ``engine``), or ``None``, the default, for the standard round."""
        return None

    def client_part(self, name: str, **args: Any) -> Algorithm:
        """The algorithm object that runs client tasks of part ``name`` (see
        :class:`fedfew.engine.tasks.ClientTask`): FRL's inner FL, for example. Only algorithms that
        nest rounds have parts; the client side rebuilds a part from its name and JSON arguments."""
        raise KeyError(f"{self.name} has no client part {name!r}")


class AlgorithmDefinitionError(UsageError):
    """An algorithm class registered without a hook it needs (exit 2, one line naming the hook)."""


def _options_of_bases(cls: type) -> type[BaseOptions] | None:
    """The options class that ``cls``'s own generic bases name (``Algorithm[X]``, ``A[X]``), or None."""
    for base in vars(cls).get("__orig_bases__", ()):
        origin = get_origin(base)
        if not (isinstance(origin, type) and issubclass(origin, Algorithm)):
            continue
        for arg in get_args(base):
            if isinstance(arg, TypeVar):  # class A(Algorithm[T]): generic itself, its own options are T's bound
                arg = arg.__bound__
                if not isinstance(arg, type):  # a bound named as a string (a forward reference): none named here
                    return None
            if isinstance(arg, type) and issubclass(arg, BaseOptions):
                return arg
            raise AlgorithmDefinitionError(f"{cls.__name__}'s base {base} names {arg!r}, which is not an options "
                                           "class (a subclass of fedfew.Options)")
    return None
