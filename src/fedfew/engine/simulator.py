"""A run's loop of rounds, on any engine.

:class:`Simulator` plays :func:`~fedfew.engine.round.run_round` once per round over the clients of the
schedule drawn once from the seed (:mod:`fedfew.engine.schedule`), with communication accounting,
evaluation on validation classes with best-round selection, the divergence guard
(:mod:`fedfew.engine.guard`), and a final test. Everything a run needs to continue is
in :class:`RunState` plus the client states: a run stopped after any round and continued from them
gives the same numbers as one never stopped.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from fedfew.core.errors import RunFailedError
from fedfew.core.seeding import derive_seed, initial_model_seed, torch_generator
from fedfew.engine.base import Engine, Faults, InProcessEngine
from fedfew.engine.guard import DivergedError, LossGuard, non_finite
from fedfew.engine.round import CommLog, RoundOutcome, mean_metrics, run_round
from fedfew.engine.schedule import client_schedule
from fedfew.fewshot.evaluation import mean_ci95, per_class_accuracy, with_interval
from fedfew.interface.algorithm import Algorithm, ClientData, EvalData
from fedfew.interface.protocol import init_generator, initial_client_state, initial_server_state
from fedfew.interface.serialize import named_parts
from fedfew.interface.state_store import ClientStates, Entry

if TYPE_CHECKING:
    from fedfew.privacy.mechanism import PrivateAggregation


class _PlaysPrivately(Protocol):
    """An algorithm that plays its own rounds under DP (``privacy.nested``: FRL), handed the run's
    :class:`~fedfew.privacy.PrivateAggregation` to run each of its rounds through."""

    privacy: PrivateAggregation | None


class NothingTrainedError(RunFailedError):
    """No client trained in any round: the run has nothing to report."""


@dataclass
class Best:
    """The best round so far by validation accuracy, with its server and client states."""

    accuracy: float
    round: int
    server: object  # in the algorithm's own form
    states: dict[int, Entry]


@dataclass
class RunState:
    """Everything a run needs to continue after round ``round`` (besides the client states)."""

    round: int
    server: object  # in the algorithm's own form
    history: list[dict[str, Any]] = field(default_factory=list)
    comm: CommLog = field(default_factory=CommLog)
    best: Best | None = None
    last_test: dict[str, float] | None = None
    seconds: float = 0.0
    #: The initial model's score before any round ({"split": "val" | "test", "accuracy", ...}): round 0,
    #: a selection candidate and the untrained baseline every run is compared with.
    initial: dict[str, Any] | None = None
    #: With :attr:`Simulator.record_rows`: each dataset row a trained reply's episodes used, with the
    #: first round whose aggregate took it in (the membership check's members of a round's model).
    rows_first_used: dict[int, int] | None = None


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

        def init_state(cid: int) -> object:
            return initial_client_state(algorithm, by_id[cid], init_generator(seed, cid))

        self.states = states if states is not None else ClientStates([c.client_id for c in clients], init_state)
        self.engine = engine if engine is not None else InProcessEngine(algorithm, by_id, seed, self.states, faults)
        with self.engine.compute.device_scope(), initial_model_seed(init_seed):
            self.state = RunState(0, initial_server_state(algorithm, torch_generator(seed, "server-init")))
        if privacy is not None:  # the clip of round 1 joins the server state (checkpoints carry it)
            self.state.server = privacy.init_server(named_parts(self.state.server, "a private run's server state"))
            if privacy.nested:  # it plays its own rounds (FRL's episodes): it runs each through DP itself
                cast("_PlaysPrivately", algorithm).privacy = privacy
        #: Record the dataset rows the clients' episodes use, round by round (``eval.membership_inference``:
        #: its members are the rows the selected model trained on; :meth:`rows_used_until`).
        self.record_rows = False
        #: Called with a short note before a long evaluation outside the rounds (round 0, the final
        #: test), so a progress display is not silent while it runs.
        self.on_phase: Callable[[str], None] | None = None

    # -- compatibility views ------------------------------------------------------------------
    @property
    def server(self) -> object:
        return self.state.server

    @server.setter
    def server(self, value: object) -> None:
        self.state.server = value

    @property
    def comm(self) -> CommLog:
        return self.state.comm

    @property
    def client_states(self) -> Mapping[int, object]:
        return self.states

    def evaluate(self, data: EvalData, server: object = None, client_states: Mapping[int, object] | None = None) -> dict[str, float]:
        """The algorithm's scores on ``data``, with a 95% interval on the accuracy and how it was computed."""
        episodes = len(data.episodes) if data.episodes is not None else None
        samples = len(data.dataset) if data.dataset is not None else None
        return with_interval(self._evaluate(data, server, client_states), episodes, samples)  # type: ignore[return-value]

    def _evaluate(self, data: EvalData, server: object = None, client_states: Mapping[int, object] | None = None) -> dict[str, float]:
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
            played = self.algorithm.play_round(self.state.server, self.engine, selected, round_index)
            if played is None:  # the standard round (every algorithm but those that nest rounds)
                return run_round(self.engine, self.algorithm, self.state.server, selected, round_index,
                                 round_index, privacy=self.privacy, record_rows=self.record_rows)
        if not isinstance(played, RoundOutcome):
            raise TypeError(f"{self.algorithm.name}: play_round returned a {type(played).__name__}, not a "
                            "RoundOutcome (or None for the standard round)")
        return played

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
            record.update(mean_metrics(outcome.results))
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
            if self.record_rows:  # the replies aggregated this round (late ones never reached the model)
                first = st.rows_first_used if st.rows_first_used is not None else {}
                for row in sorted({row for res in outcome.results.values() if not res.skipped
                                   for row in res.rows_used or ()}):
                    first.setdefault(row, r + 1)
                st.rows_first_used = first
            st.server, st.best, st.last_test, st.seconds, st.round = server, best, last_test, seconds, r + 1
            if on_round is not None:
                on_round(r + 1, record, self)
        return self.finish()

    def rows_used_until(self, round_number: int) -> list[int] | None:
        """The dataset rows the model of ``round_number`` trained on (their episodes' support and query
        rows, in the rounds up to it), or None where the rows were not recorded (``record_rows`` off)."""
        first = self.state.rows_first_used
        if first is None:
            return None
        return sorted(row for row, r in first.items() if r <= round_number)

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

    def per_class_accuracy(self, data: EvalData, server: object) -> dict[str, float]:
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
        states: Mapping[int, object]
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
        privacy = ({"privacy": self.privacy.report(st.round, named_parts(st.server, "a private run's server state"))}
                   if self.privacy is not None else {})
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


