"""Rounds of broadcast, client updates and aggregation, on any engine.

:func:`run_round` is the building block (FRL nests R of them inside each meta-training episode);
:class:`Simulator` adds seeded client sampling drawn once, communication accounting, evaluation on
validation classes with best-round selection, and a final test. Everything a run needs to continue is
in :class:`RunState` plus the client states: a run stopped after any round and continued from them
gives the same numbers as one never stopped.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch

from fedfew.engine.algorithm import Algorithm, ClientData, ClientResult, EvalData
from fedfew.engine.engines import Engine, Faults, InProcessEngine, Replies
from fedfew.engine.protocol import init_generator
from fedfew.engine.state import payload_bytes
from fedfew.engine.static import crossing_bytes, static_tensors
from fedfew.engine.store import ClientStates, Entry
from fedfew.engine.tasks import MAIN, ClientTask, resolve_part
from fedfew.errors import RunFailedError
from fedfew.evaluation import mean_ci95, per_class_accuracy, with_interval
from fedfew.seeding import derive_seed, initial_model_seed, numpy_generator, torch_generator

if TYPE_CHECKING:
    from fedfew.privacy.mechanism import PrivateAggregation


class _PlaysPrivately(Protocol):
    """An algorithm that plays its own rounds under DP (``privacy.nested``: FRL), handed the run's
    :class:`~fedfew.privacy.PrivateAggregation` to run each of its rounds through."""

    privacy: PrivateAggregation | None


class NothingTrainedError(RunFailedError):
    """No client trained in any round: the run has nothing to report."""


class DivergedError(RunFailedError):
    """A round produced a non-finite loss or parameter: the model diverged, so the run stops (status
    failed) rather than report the accuracy of a broken model. ``record`` is that round's metrics."""

    def __init__(self, message: str, record: dict[str, Any]) -> None:
        super().__init__(message)
        self.record = record


@dataclass
class CommLog:
    """Bytes sent down (server to clients) and up (clients to server), per round."""

    down: list[int] = field(default_factory=list)
    up: list[int] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.down) + sum(self.up)


@dataclass
class RoundOutcome:
    server: Any
    results: dict[int, ClientResult]
    bytes_down: int
    bytes_up: int
    asked: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)
    #: A private round's record (the clip used, the noised share within it), else None.
    privacy: dict[str, float] | None = None

    @property
    def replied(self) -> list[int]:
        return sorted(self.results)

    @property
    def trained(self) -> list[int]:
        return sorted(c for c, r in self.results.items() if not r.skipped)


def run_round(
    engine: Engine,
    algorithm: Algorithm,
    server: Any,
    selected: Sequence[int],
    round_index: int,
    round_key: int | str,
    *,
    part: str = "",
    part_args: dict[str, Any] | None = None,
    view: str = "",
    view_args: dict[str, Any] | None = None,
    namespace: str = MAIN,
    privacy: PrivateAggregation | None = None,
) -> RoundOutcome:
    """One round: each selected client gets its payload and updates with its own generator (derived
    from seed, round key and client id, so order does not matter) on ``engine``; the server
    aggregates the replies that arrived (none: the server state stays). ``part`` and ``view`` name
    the part of ``algorithm`` and the view of the clients' data the round runs (FRL's inner rounds).
    With ``privacy`` the clients clip their updates where they run and the server's noised average
    (:meth:`fedfew.privacy.PrivateAggregation.aggregate`) replaces the algorithm's aggregation."""
    spec = privacy.client_spec(server).to_json() if privacy is not None else None
    task = ClientTask(round_index, str(round_key), part, dict(part_args or {}), view, dict(view_args or {}),
                      namespace, spec)
    actor = resolve_part(algorithm, task)
    payloads = {cid: actor.broadcast(server, cid) for cid in sorted(selected)}
    # A private Poisson round may ask no client; it still releases (the noise alone), below.
    replies = engine.execute(task, payloads) if payloads else Replies({})
    static = static_tensors(algorithm)  # frozen parameters: both sides hold them, they do not cross
    count = (lambda obj: crossing_bytes(obj, static)) if static else payload_bytes
    down = replies.bytes_down
    if down is None:
        down = sum(count(p) for cid, p in payloads.items() if cid not in replies.failed)
    up = replies.bytes_up
    if up is None:
        up = sum(count(r.upload) for r in replies.results.values())
    record = None
    if privacy is not None:
        # Every private round releases a noised model, whoever replied: skipping the noise when no one
        # did would tell an observer that the sample (or every reply) was empty.
        server, record = privacy.aggregate(server, replies.results, engine.seed, task.round_key)
    elif replies.results:
        torch.manual_seed(derive_seed(engine.seed, "aggregate-global", task.round_key))
        server = actor.aggregate(server, replies.results, torch_generator(engine.seed, "aggregate", task.round_key))
    return RoundOutcome(server, replies.results, down, up, sorted(payloads), replies.failed, replies.late, record)


def simulate_round(algorithm: Algorithm, server: Any, clients: Sequence[ClientData] | Mapping[int, ClientData],
                   client_states: dict[int, Any], selected: Sequence[int], seed: int,
                   round_key: int | str) -> RoundOutcome:
    """One round in this process on plain data (a library and test convenience): ``clients`` indexed
    by client id, ``client_states`` a dict updated in place with the selected clients' new states."""
    engine = InProcessEngine(algorithm, clients, seed)
    engine.state_of = lambda namespace, cid: client_states.get(cid)  # type: ignore[method-assign]
    outcome = run_round(engine, algorithm, server, selected, 0, round_key)
    client_states.update(engine._staged)
    engine.discard_round()
    return outcome


def client_schedule(num_clients: int, per_round: int | float, rounds: int, seed: int) -> list[list[int]]:
    """Which clients take part in each round, drawn once from the seed so that every algorithm run
    with the same seed sees the same clients. ``per_round`` is a count or a fraction in (0, 1]."""
    count = round_size(num_clients, per_round)
    if not 1 <= count <= num_clients:
        raise ValueError(f"clients per round must be in 1..{num_clients}, got {per_round}")
    rng = numpy_generator(seed, "schedule")
    return [sorted(rng.choice(num_clients, count, replace=False).tolist()) for _ in range(rounds)]


def round_size(num_clients: int, per_round: int | float) -> int:
    """How many clients each round asks: ``per_round`` itself, or a fraction in (0, 1] of the clients."""
    if isinstance(per_round, float) and per_round <= 1.0:
        return max(1, round(per_round * num_clients))
    return int(per_round)


@dataclass
class Best:
    """The best round so far by validation accuracy, with its server and client states."""

    accuracy: float
    round: int
    server: Any
    states: dict[int, Entry]


@dataclass
class RunState:
    """Everything a run needs to continue after round ``round`` (besides the client states)."""

    round: int
    server: Any
    history: list[dict[str, Any]] = field(default_factory=list)
    comm: CommLog = field(default_factory=CommLog)
    best: Best | None = None
    last_test: dict[str, float] | None = None
    seconds: float = 0.0
    #: The initial model's score before any round ({"split": "val" | "test", "accuracy", ...}): round 0,
    #: a selection candidate and the untrained baseline every run is compared with.
    initial: dict[str, Any] | None = None


RoundHook = Callable[[int, dict[str, Any], "Simulator"], None]


class Simulator:
    """Runs ``algorithm`` over ``clients`` for a number of rounds on ``engine`` (default: in this
    process)."""

    def __init__(
        self,
        algorithm: Algorithm,
        clients: list[ClientData],
        seed: int,
        val: EvalData | None = None,
        test: EvalData | None = None,
        faults: Faults | None = None,
        states: ClientStates | None = None,
        engine: Engine | None = None,
        init_seed: int | None = None,
        per_class: bool = False,
        privacy: PrivateAggregation | None = None,
    ) -> None:
        self.algorithm, self.clients, self.seed = algorithm, clients, seed
        #: Client-level differential privacy (config ``privacy``), or None.
        self.privacy = privacy
        self.val, self.test = val, test
        #: Add the per-class accuracy of the test episodes' queries to the final test metrics
        #: (``eval.per_class``; the algorithm must have :attr:`Algorithm.predicts_episodes`).
        self.per_class = per_class
        by_id = {c.client_id: c for c in clients}

        def init_state(cid: int) -> Any:
            return algorithm.init_client_state(by_id[cid], init_generator(seed, cid))

        self.states = states if states is not None else ClientStates([c.client_id for c in clients], init_state)
        self.engine = engine if engine is not None else InProcessEngine(algorithm, by_id, seed, self.states, faults)
        with self.engine.compute.device_scope(), initial_model_seed(init_seed):
            self.state = RunState(0, algorithm.init_server(torch_generator(seed, "server-init")))
        if privacy is not None:  # the clip of round 1 joins the server state (checkpoints carry it)
            self.state.server = privacy.init_server(self.state.server)
            if privacy.nested:  # it plays its own rounds (FRL's episodes): it runs each through DP itself
                cast("_PlaysPrivately", algorithm).privacy = privacy
        #: Called with a short note before a long evaluation outside the rounds (round 0, the final
        #: test), so a progress display is not silent while it runs.
        self.on_phase: Callable[[str], None] | None = None

    # -- compatibility views ------------------------------------------------------------------
    @property
    def server(self) -> Any:
        return self.state.server

    @server.setter
    def server(self, value: Any) -> None:
        self.state.server = value

    @property
    def comm(self) -> CommLog:
        return self.state.comm

    @property
    def client_states(self) -> Mapping[int, Any]:
        return self.states

    def evaluate(self, data: EvalData, server: Any = None, client_states: Mapping[int, Any] | None = None) -> dict[str, float]:
        """The algorithm's scores on ``data``, with a 95% interval on the accuracy and how it was computed."""
        episodes = len(data.episodes) if data.episodes is not None else None
        samples = len(data.dataset) if data.dataset is not None else None
        return with_interval(self._evaluate(data, server, client_states), episodes, samples)  # type: ignore[return-value]

    def _evaluate(self, data: EvalData, server: Any = None, client_states: Mapping[int, Any] | None = None) -> dict[str, float]:
        torch.manual_seed(derive_seed(self.seed, "evaluate-global", data.split))
        server = self.state.server if server is None else server
        states = self.states if client_states is None else client_states
        generator = torch_generator(self.seed, "evaluate", data.split)
        if self.algorithm.evaluates_clients:  # each client scores its own model where it is
            scores = self.engine.evaluate_clients(server, states, self.clients, data)
            with self.engine.compute.scope():
                return self.algorithm.combine_evaluations(server, scores, data, generator)
        if self.algorithm.splits_evaluation and data.episodes is not None:  # episodes in parallel where possible
            summary = mean_ci95(self.engine.episode_scores(server, data))
            return {"accuracy": summary.mean, "ci95": summary.ci95}
        with self.engine.compute.scope():
            return self.algorithm.evaluate(server, data, generator)

    def play(self, selected: Sequence[int], round_index: int) -> RoundOutcome:
        with self.engine.compute.device_scope():
            outcome = self.algorithm.play_round(self.state.server, self.engine, selected, round_index)
            if outcome is None:  # the standard round (every algorithm but those that nest rounds)
                outcome = run_round(self.engine, self.algorithm, self.state.server, selected, round_index,
                                    round_index, privacy=self.privacy)
        return outcome

    def run(
        self,
        rounds: int,
        clients_per_round: int | float,
        eval_every: int = 1,
        track_test: bool = False,
        on_round: RoundHook | None = None,
        selection: str = "best",
        guard: LossGuard | None = None,
        initial: bool = True,
    ) -> dict[str, Any]:
        """Train until ``rounds`` rounds are done (continuing from ``self.state``); returns the
        per-round history, the selected round and final test metrics. With validation data and
        ``selection`` "best" the best round by validation accuracy is kept (never chosen on test);
        without validation data, or with ``selection`` "last", the last round is.
        An exception inside a round (an interrupt) leaves ``self.state`` and the client states as
        they were after the last finished round. ``guard`` stops a run whose losses explode while
        staying finite (:class:`LossGuard`); a non-finite round always stops it. ``initial`` False
        leaves round 0 unscored (``eval.initial: auto`` where no selection reads it)."""
        schedule = client_schedule(len(self.clients), clients_per_round, rounds, self.seed)
        if self.privacy is not None and self.algorithm.evaluates_clients:
            # Its validation scores come from the clients' private, un-noised models, outside the
            # guarantee: choosing the round on them would leak through the choice. The last round stands.
            selection = "last"
        # Under DP the clients of a round may be a secret sample (fedfew.privacy.sampling), drawn when
        # the round starts; without DP (and in research mode) the seeded schedule above, as always.
        sampler = self.privacy.sampler(self.seed) if self.privacy is not None else None
        secret = sampler is not None and sampler.secret
        st = self.state
        if initial and st.round == 0 and st.initial is None:
            self.score_initial(rounds, selection)
        for r in range(st.round, rounds):
            started = time.perf_counter()
            try:
                selected = sampler.draw(r) if sampler is not None else schedule[r]
                outcome = self.play(selected, r)
                if self.privacy is not None:
                    outcome.server = self.privacy.count_participation(outcome.server, selected)
                diverged = non_finite(outcome)
                if diverged is None and guard is not None:
                    diverged = guard.exploded(outcome, st.history)
                if diverged is None:
                    self.engine.end_round(r)
                else:
                    self.engine.discard_round()  # the last finite round stands
            except BaseException:
                self.engine.discard_round()
                raise
            record: dict[str, Any] = {"round": r + 1, "bytes_down": outcome.bytes_down, "bytes_up": outcome.bytes_up}
            record.update(_mean_metrics(outcome.results))
            clients = {"asked": outcome.asked, "replied": outcome.replied, "trained": outcome.trained,
                       "failed": outcome.failed, "late": outcome.late}
            # A secret sample is released as counts only: the history is handed to readers of the results.
            record["clients"] = {k: len(v) for k, v in clients.items()} if secret else clients
            if outcome.privacy is not None and self.privacy is not None:
                record.update(outcome.privacy)
                record["dp_epsilon"] = self.privacy.epsilon(r + 1, outcome.server)
            if not outcome.trained:
                record["no_training"] = True
            if diverged is not None:
                record["diverged"] = diverged
                raise DivergedError(f"round {r + 1}: {diverged}: the model diverged (try a lower learning rate); "
                                    "no accuracy is reported" + (f"; rounds 1-{r} stand, resumable" if r else ""), record)
            server = outcome.server
            best, last_test = st.best, st.last_test
            last = r + 1 == rounds
            if (r + 1) % eval_every == 0 or last:
                if self.val is not None:
                    self._announce(f"round {r + 1}: scoring on {_size(self.val)} (val)")
                    val = self.evaluate(self.val, server)
                    record.update({f"val_{k}": v for k, v in val.items() if not isinstance(v, str)})
                    if selection == "best" and (best is None or val["accuracy"] > best.accuracy):
                        best = Best(val["accuracy"], r + 1, copy.deepcopy(server), self.states.snapshot())
                if self.test is not None and (track_test or self.val is None):
                    self._announce(f"round {r + 1}: scoring on {_size(self.test)} (test)")
                    test = self.evaluate(self.test, server)
                    record.update({f"test_{k}": v for k, v in test.items() if not isinstance(v, str)})
                    last_test = test if last else None
            seconds = st.seconds + time.perf_counter() - started
            record["seconds"] = seconds
            st.comm.down.append(outcome.bytes_down)
            st.comm.up.append(outcome.bytes_up)
            st.history.append(record)
            st.server, st.best, st.last_test, st.seconds, st.round = server, best, last_test, seconds, r + 1
            if on_round is not None:
                on_round(r + 1, record, self)
        return self.finish()

    def score_initial(self, rounds: int, selection: str = "best") -> None:
        """Round 0: the initial model scored by the same evaluation as every round (validation when
        there is a validation split, else test). With validation it is the first selection candidate,
        so a run whose training never beats it reports the initial model (selected round 0)."""
        st = self.state
        data = self.val if self.val is not None else self.test
        if data is None:
            return
        self._announce(f"round 0: scoring the initial model on {_size(data)} ({data.split})")
        scores = self.evaluate(data, st.server)
        st.initial = {"split": data.split, **scores}
        if self.val is not None and selection == "best":
            st.best = Best(scores["accuracy"], 0, copy.deepcopy(st.server), self.states.snapshot())
        elif rounds == 0:
            st.last_test = scores  # the control's test score: no second pass over the test tasks

    def per_class_accuracy(self, data: EvalData, server: Any) -> dict[str, float]:
        """{class name: accuracy over the queries of that true class} of ``server``'s model on ``data``'s
        episodes: a second pass over the episodes after the score is computed, with the global random
        state restored afterwards, so the scores and everything drawn after them stay as without it."""
        if data.episodes is None or not self.algorithm.predicts_episodes:
            raise ValueError(f"{self.algorithm.name}: eval.per_class needs few-shot episodes scored on the "
                             "server's model")
        self._announce(f"per-class accuracy on {_size(data)} ({data.split})")
        with torch.random.fork_rng(devices=[]), self.engine.compute.scope():
            torch.manual_seed(derive_seed(self.seed, "evaluate-per-class", data.split))
            predictions = self.algorithm.episode_predictions(server, data, range(len(data.episodes)))
        return per_class_accuracy(data.episodes, predictions, data.episodes.sampler.dataset.class_names)

    def _announce(self, note: str) -> None:
        if self.on_phase is not None:
            self.on_phase(note)

    def finish(self) -> dict[str, Any]:
        """The selected round and its test metrics, once every round is done."""
        st = self.state
        if self.algorithm.trains and st.history and not any(r["clients"]["trained"] for r in st.history):
            raise NothingTrainedError(
                f"no client trained in any of the {len(st.history)} rounds (every client sat out: too few "
                "samples per class for the episodes, or every client failed); nothing was learned, so no "
                "accuracy is reported. Check the partition and episodes settings"
            )
        selected_round = st.round
        states: Mapping[int, Any]
        server, states = st.server, self.states
        if st.best is not None:
            selected_round, server, states = st.best.round, st.best.server, self.states.view(st.best.states)
        if st.best is None and st.last_test is not None:
            final = st.last_test  # the last round, already scored: no second pass over the test tasks
        else:
            if self.test is not None:
                self._announce(f"testing round {selected_round} on {_size(self.test)}")
            final = self.evaluate(self.test, server, states) if self.test is not None else {}
        test: dict[str, Any] = dict(final)
        if self.per_class and self.test is not None:
            test["per_class"] = self.per_class_accuracy(self.test, server)
        self.best_server, self.best_client_states = server, states
        privacy = {"privacy": self.privacy.report(st.round, st.server)} if self.privacy is not None else {}
        return {"history": st.history, "selected_round": selected_round, "test": test, "comm": st.comm,
                "initial": st.initial, **privacy, **self._scores_against_initial(final)}

    def _scores_against_initial(self, final_test: dict[str, float]) -> dict[str, float]:
        """The selected and the final (last round's) model on the split the initial model was scored on."""
        st = self.state
        if st.initial is None or not st.history:
            return {}
        if st.initial["split"] == "test":
            return {"selected_score": final_test["accuracy"], "final_score": final_test["accuracy"]}
        last = next((h["val_accuracy"] for h in reversed(st.history) if "val_accuracy" in h), None)
        scores = {"selected_score": st.best.accuracy} if st.best is not None else {}
        return {**scores, **({"final_score": last} if last is not None else {})}


def _size(data: EvalData) -> str:
    if data.episodes is not None:
        return f"{len(data.episodes)} episodes"
    return f"{len(data.dataset) if data.dataset is not None else 0} samples"


@dataclass(frozen=True)
class LossGuard:
    """Divergence that stays finite (config ``runtime.divergence``): a client's training loss above
    ``max_loss``, or the round's mean training loss above ``loss_factor`` times the first round's (and
    above 1.0, so that a near-zero first loss is no yardstick) in ``patience`` rounds in a row. Only
    metrics named ``*loss`` count: accuracies and other metrics may grow freely."""

    max_loss: float = 1e6
    loss_factor: float = 100.0
    patience: int = 3

    def exploded(self, outcome: RoundOutcome, history: Sequence[dict[str, Any]]) -> str | None:
        """Why this round (after the rounds of ``history``) counts as diverged; None when it does not."""
        for cid, result in sorted(outcome.results.items()):
            for key, value in sorted(result.metrics.items()):
                if key.endswith("loss") and isinstance(value, (int, float)) and value > self.max_loss:
                    return (f"client {cid}'s training {key} is {value:.3g}, above runtime.divergence.max_loss="
                            f"{self.max_loss:g}")
        if not self.loss_factor or not history:
            return None
        means = _mean_metrics(outcome.results)
        first = history[0]
        for key, value in sorted(means.items()):
            if not key.endswith("loss") or not isinstance(first.get(key), (int, float)):
                continue
            limit = self.loss_factor * max(float(first[key]), 1.0)
            recent = [h.get(key) for h in history[len(history) - self.patience + 1:]] if self.patience > 1 else []
            if value > limit and len(recent) == self.patience - 1 and \
                    all(isinstance(v, (int, float)) and v > limit for v in recent):
                worst = max(outcome.results, key=lambda c: outcome.results[c].metrics.get(key[len("train_"):], 0.0))
                return (f"the mean training {key[len('train_'):]} ({value:.3g}; client {worst} the largest) has been "
                        f"above {self.loss_factor:g}x round {first.get('round', 1)}'s ({first[key]:.3g}) for "
                        f"{self.patience} rounds (runtime.divergence.loss_factor, patience)")
        return None


def non_finite(outcome: RoundOutcome) -> str | None:
    """What in a round is not a finite number, first by client (its training metrics, its upload, its
    new private state, in client order), then the aggregated server state; None when all is finite."""
    for cid, result in sorted(outcome.results.items()):
        for key, value in sorted(result.metrics.items()):
            if isinstance(value, (int, float)) and not math.isfinite(value):
                return f"client {cid}'s training {key} is {value}"
        for what, obj in (("upload", result.upload), ("model (private state)", result.state)):
            where = _first_non_finite(obj)
            if where is not None:
                return f"client {cid}'s {what} holds non-finite values ({where})"
    where = _first_non_finite(outcome.server)
    if where is not None:
        return f"the aggregated server model holds non-finite values ({where})"
    return None


def _first_non_finite(obj: object, path: str = "") -> str | None:
    """The path of the first floating-point tensor or number in ``obj`` (nested dicts, lists,
    tuples) that is not finite."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            return None if bool(torch.isfinite(obj).all()) else (path or "tensor")
        return None
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (path or "value")
    if isinstance(obj, Mapping):
        items: Iterable[tuple[object, object]] = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for key, value in items:
        found = _first_non_finite(value, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def _mean_metrics(results: dict[int, ClientResult]) -> dict[str, float]:
    keys = {k for r in results.values() for k in r.metrics}
    return {f"train_{k}": float(np.mean([r.metrics[k] for r in results.values() if k in r.metrics])) for k in sorted(keys)}
