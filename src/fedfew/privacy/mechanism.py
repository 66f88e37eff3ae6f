"""The server side of differential privacy: DP-FedAvg's noised average, adaptive clipping, and the
accounting reported with the result.

**central-dp** (DP-FedAvg, McMahan et al. 2018, Algorithm 1 with the fixed-denominator estimator): each
selected client clips its update Delta_k to L2 norm C where it trains (:mod:`fedfew.privacy.clipping`);
the server adds Gaussian noise N(0, (z C)^2 I) to the sum and divides by the *expected* number of
clients per round m (not by the replies or their sample counts, which would make the sensitivity
depend on the data):

    w^{t+1} = w^t + (sum_k clip_C(Delta_k) + N(0, z^2 C^2 I)) / m

One round is one step of the Gaussian mechanism with L2 sensitivity C (adding or removing one client's
data moves the sum by at most C), subsampled at q = m / N. The accountant turns (q, z, rounds, delta)
into epsilon (:mod:`fedfew.privacy.accounting`).

**local-dp**: each client adds N(0, (z C)^2 I) to its own clipped update before it leaves, so the
server need not be trusted; the server averages what arrived. Against a server that sees every upload
and knows who took part, there is no amplification by sampling: each round is a Gaussian mechanism
with sensitivity 2C (replacing the client's data moves its clipped update by at most 2C), accounted as
noise multiplier z / 2 with sampling rate 1 for every round, a bound for a client that takes part in
all of them.

**Adaptive clipping** (central-dp; Andrew et al. 2021, Algorithm 1 and Theorem 1): each client also
reports b_k = 1 when ||Delta_k|| <= C; the server releases the noised share
b = (sum_k (b_k - 1/2) + N(0, sigma_b^2)) / m + 1/2 and moves the clip geometrically toward the target
quantile gamma: C <- C exp(-eta_C (b - gamma)). Centred, the count has sensitivity 1/2, and the two
releases together are a Gaussian mechanism of noise multiplier z when the updates get
z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2): so the updates carry z_Delta C of noise and the accountant is
given z. The clip lives in the server state (``server["dp"]["clip"]``), which checkpoints carry, so a
resumed run continues it.

**FRL** (``dp_upload = "frl-prototypes"``, our extension): an episode releases R + 1 times (R inner
rounds, each a new global model and global prototypes, and the meta-update's phi) to the same sampled
participants. Each participant clips, per release, its model update and its prototypes as one vector
to C; the server noises the sum of the updates as above and, for every preparation class, the sum of
the clipped prototypes with N(0, (z C)^2 I), divided by m: a fixed, data-independent divisor (class
counts would make the sensitivity depend on the data; a class few participants hold is shrunk toward
0, a class none holds is noise). The R + 1 releases of one subsampled set are one subsampled mechanism
per episode whose inner mechanism is R + 1 adaptively composed Gaussians of multiplier z, itself a
Gaussian of multiplier z / sqrt(R + 1): the accountant is given (z / sqrt(R + 1), q, episodes). Counting
(R + 1) x episodes steps of rate q would amplify by sampling R + 1 times for one draw of the clients and
understate epsilon (2-3x at q = 0.1-0.25).

**Noise** (``privacy.noise``): "secure" by default, from a generator seeded from OS randomness where
the noise is added (:func:`fedfew.privacy.sampling.secure_generator`): nobody holding the run's config
can regenerate it, and two runs with one seed draw different noise (a resumed run continues from the
noised models of its checkpoint, never re-drawing a finished round). "seeded" (research mode): from
generators keyed by (seed, "dp-noise" or "dp-count-noise", round key), drawn in the sorted order of
the model's tensor names: every engine and a resumed run draw the same numbers, and so can anyone who
holds the seed.

**Participation** (``privacy.accounting``, :mod:`fedfew.privacy.accounting`): with a sampling rate
below 1 and secure noise, the clients of each round are a secret sample (:meth:`PrivateAggregation.sampler`),
Poisson or of fixed size; the denominator stays the expected m = qN. With accounting "none" the server
state counts each client's rounds (``server["dp"]["participated"]``) and epsilon composes the largest
count.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import torch

from fedfew.core.jsontypes import JSONObject
from fedfew.core.seeding import torch_generator
from fedfew.interface.serialize import named_parts
from fedfew.privacy.accounting import ACCOUNTANTS, ACCOUNTING, accountant_name, accounted_epsilon, solve_for
from fedfew.privacy.clipping import DELTA, PROTOTYPES, REFERENCE, WITHIN, ClientSpec
from fedfew.privacy.coverage import NESTED, PrivacyConfigError, check_algorithm, covers, upload_key
from fedfew.privacy.sampling import ParticipantSampler, secure_generator

if TYPE_CHECKING:
    from fedfew.core.config_schema import PrivacyConfig
    from fedfew.interface.algorithm import Algorithm, ClientResult, Parts, Payload

__all__ = ["COUNT_NOISE_KEY", "MEANINGLESS_EPSILON", "NOISE_KEY", "STATE_KEY", "PrivateAggregation"]

logger = logging.getLogger(__name__)

#: The server state's key for what privacy keeps between rounds (the clip).
STATE_KEY: Final = "dp"
NOISE_KEY = "dp-noise"
COUNT_NOISE_KEY = "dp-count-noise"
_SAID: set[str] = set()
#: Above this epsilon the guarantee bounds nothing useful (e^50 ~ 5e21 times the odds): said loudly.
MEANINGLESS_EPSILON = 50.0


class PrivateAggregation:
    """One run's differential privacy on the server side: what each round's clients are told
    (:meth:`client_spec`), the noised average that replaces the algorithm's aggregation
    (:meth:`aggregate`) and the accounting (:meth:`epsilon`, :meth:`report`)."""

    def __init__(self, config: PrivacyConfig, algorithm: Algorithm, num_clients: int, per_round: int, rounds: int,
                 frozen: Collection[str] = (), secure_aggregation: bool = False) -> None:
        if not config.enabled or config.clip is None or config.delta is None:
            raise ValueError("PrivateAggregation needs a complete privacy section (mechanism, clip, delta)")
        self.kind = check_algorithm(algorithm)
        #: The algorithm plays its own rounds and runs each through this object (FRL), not the simulator.
        self.nested = self.kind in NESTED
        self.key = upload_key(self.kind)  # where the clipped model lives: "model" (F2L: "server")
        self.advance = algorithm.dp_advance  # the rest of the server state a round moves (FML: its round)
        self.mechanism = config.mechanism
        self.central = config.mechanism == "central-dp"
        self.clip, self.delta, self.accountant = config.clip, config.delta, config.accountant
        self.num_clients, self.per_round, self.rounds = num_clients, per_round, rounds
        self.sampling_rate = per_round / num_clients
        self.frozen = frozenset(frozen)
        self.metrics = config.client_metrics
        self.adaptive = config.adaptive_clip
        self.target_epsilon = config.target_epsilon
        #: "secure" (OS randomness) or "seeded" (research mode: reproducible from the run's seed).
        self.noise = config.noise
        self.seeded = config.noise == "seeded"
        #: What epsilon assumes about participation (fedfew.privacy.accounting.ACCOUNTING), and whether
        #: it was chosen for the run (not given).
        self.accounting = config.accounting_mode(secure_aggregation)
        self.accounting_given = config.accounting is not None
        self.keep_private_states = config.keep_private_states
        self.evaluates_clients = bool(algorithm.evaluates_clients)
        if self.accounting == "poisson" and secure_aggregation:
            raise PrivacyConfigError("privacy.accounting=poisson: a Poisson round may ask fewer than the 2 clients "
                                     "secure aggregation needs, and SecAgg+ tells each client its neighbours: use "
                                     "privacy.accounting: without_replacement or none")
        #: Releases per simulator round to the same sampled clients (FRL: R inner rounds + the meta-update).
        self.releases = int(getattr(algorithm, "dp_releases", 1)) if self.nested else 1
        #: The classes every prototype release covers, whoever holds them (FRL), else empty.
        self.prototype_classes: list[int] = []
        if self.kind in NESTED:
            if not self.central:
                raise PrivacyConfigError(f"privacy: algorithm {algorithm.name} runs with central-dp only: local-dp "
                                         "of its prototypes is not implemented")
            if self.adaptive is not None:
                raise PrivacyConfigError(f"privacy: algorithm {algorithm.name} runs with a fixed clip only: adaptive "
                                         "clipping of its R + 1 releases per episode is not implemented")
            self.prototype_classes = sorted(int(c) for c in algorithm.context.train_classes)
        # What the accountant is given: (noise multiplier, sampling rate) of one round's Gaussian mechanism.
        self.accounted_rate = self.sampling_rate if self.central and self.accounting != "none" else 1.0
        if config.noise_multiplier is not None:
            self.noise_multiplier: float | None = config.noise_multiplier
        elif rounds == 0:
            self.noise_multiplier = None  # the untrained control: nothing released, nothing to solve
        else:
            assert config.target_epsilon is not None
            # "none": every round counted for every client (the most it can take part in; the report
            # composes the actual largest count, at most this).
            solved = solve_for(self.accounting, self.accountant, config.target_epsilon, num_clients, per_round,
                               rounds, self.delta)
            solved *= math.sqrt(self.releases)  # the multiplier of each of a round's releases (module docstring)
            self.noise_multiplier = solved if self.central else 2 * solved
            releases = f" ({self.releases} releases each)" if self.releases > 1 else ""
            note = (f"privacy: target epsilon {config.target_epsilon:g} at delta {self.delta:g} over {rounds} rounds"
                    f"{releases}: "
                    f"noise multiplier {self.noise_multiplier:.4f} (solved by the {ACCOUNTANTS[self.accountant]} "
                    f"before the run, accounting {self.accounting})")
            if note not in _SAID:  # once per process (validation and the run both build this)
                _SAID.add(note)
                logger.info("%s", note)
        z = self.noise_multiplier or 0.0
        self.count_noise = 0.0
        self.update_noise = z  # z_Delta: the multiplier of the updates' noise
        if self.adaptive is not None:
            self.count_noise = self.adaptive.count_noise or per_round / 20
            if z > 0:
                if 2 * self.count_noise <= z:
                    raise PrivacyConfigError(adaptive_clip_refusal(self.count_noise, z, per_round,
                                                                   self.adaptive.count_noise is None))
                self.update_noise = (z ** -2 - (2 * self.count_noise) ** -2) ** -0.5
        self._check_computable(rounds)

    def _check_computable(self, rounds: int) -> None:
        """Epsilon for the whole run, computed once before it: a setting the accountant cannot compute
        (an overflow) is refused here, not after the run folder exists; one too large to mean
        anything is said."""
        try:
            reached = self.epsilon(rounds)
        except (OverflowError, FloatingPointError, ValueError) as err:
            raise PrivacyConfigError(f"privacy.noise_multiplier={self.noise_multiplier:g}: the accountant cannot "
                                     f"compute epsilon for it ({err}); give a multiplier below 1e6") from None
        if reached > MEANINGLESS_EPSILON:
            note = (f"privacy: epsilon {reached:.3g} after {rounds} rounds: an epsilon that large protects nothing "
                    "(e^epsilon bounds the odds); the run is private in name only")
            if note not in _SAID:
                _SAID.add(note)
                logger.warning("%s", note)

    # -- participation -------------------------------------------------------------------------
    @property
    def sample_secret(self) -> bool:
        """Whether the round's clients are a secret sample (secure mode, a sampling rate below 1)."""
        return not self.seeded and self.per_round < self.num_clients

    def sampler(self, seed: int) -> ParticipantSampler | None:
        """Who takes part in each round under DP: None where the simulator's seeded fixed-size
        schedule (the one every run without DP uses) is what runs: everyone each round, or research
        mode without Poisson accounting."""
        if self.per_round >= self.num_clients:
            return None
        poisson = self.accounting == "poisson"
        if self.seeded:
            return ParticipantSampler(self.num_clients, self.per_round, True, seed) if poisson else None
        return ParticipantSampler(self.num_clients, self.per_round, poisson)

    def count_participation(self, server: Parts, asked: Sequence[int]) -> Parts:
        """Accounting "none": the server state with each asked client's rounds counted (a released
        round counts whether or not the client trained in it)."""
        if self.accounting != "none":
            return server
        state = dict(server[STATE_KEY])
        counts = state.get("participated")
        counts = torch.zeros(self.num_clients, dtype=torch.int64) if counts is None else counts.clone()
        if asked:
            counts[torch.as_tensor(sorted(asked), dtype=torch.long)] += 1
        state["participated"] = counts
        return {**server, STATE_KEY: state}

    def most_participated(self, server: Parts | None, rounds: int) -> int:
        """The most rounds any client took part in (accounting "none"), at most ``rounds``."""
        counts = None if server is None else server.get(STATE_KEY, {}).get("participated")
        if counts is None:
            return rounds  # not counted (no server state given): every round, the bound for anyone
        return int(counts.max()) if counts.numel() else 0

    # -- accounting ----------------------------------------------------------------------------
    @property
    def accounted_noise(self) -> float:
        """The noise multiplier the accountant is given per round (z; z / 2 for local-dp's sensitivity 2C;
        z / sqrt(k) for k releases a round to the same clients)."""
        z = (self.noise_multiplier or 0.0) / math.sqrt(self.releases)
        return z if self.central else z / 2

    def epsilon(self, rounds: int, server: Parts | None = None) -> float:
        """Epsilon at :attr:`delta` after ``rounds`` rounds under :attr:`accounting` (the accountant's own
        call); "none" composes the most rounds a client took part in (``server``'s count)."""
        if rounds <= 0 or not self.noise_multiplier:
            return 0.0
        count = self.most_participated(server, rounds) if self.accounting == "none" else rounds
        return accounted_epsilon(self.accounting, self.accountant, self.accounted_noise, self.num_clients,
                                 self.per_round, count, self.delta)

    def epsilon_no_amplification(self, rounds: int, server: Parts | None = None) -> float:
        """Epsilon with no amplification by sampling: for the most rounds a client took part in where
        they are counted, else for every round (a client in all of them)."""
        if rounds <= 0 or not self.noise_multiplier:
            return 0.0
        count = self.most_participated(server, rounds) if self.accounting == "none" else rounds
        return accounted_epsilon("none", self.accountant, self.accounted_noise, self.num_clients, self.per_round,
                                 count, self.delta)

    def report(self, rounds: int, server: Parts | None = None) -> JSONObject:
        """The ``privacy`` section of a run's summary after ``rounds`` rounds (``server``: the last server
        state, for the final clip of an adaptive clip)."""
        reached = self.epsilon(rounds, server)
        replace_one = not self.central or self.accounting == "without_replacement"
        out: JSONObject = {
            "mechanism": self.mechanism, "clip": self.clip, "noise_multiplier": self.noise_multiplier,
            "delta": self.delta, "epsilon": reached,
            "epsilon_no_amplification": self.epsilon_no_amplification(rounds, server),
            "accountant": accountant_name(self.accountant, self.accounting),
            "sampling_rate": self.sampling_rate, "rounds": rounds,
            "adjacency": "replace one client's data" if replace_one else "add or remove one client's data",
            "accounting": self.accounting, "noise": self.noise,
            "participation": self.participation_note(),
            "covers": covers(self.mechanism, self.kind, self.accounting, self.noise, self.evaluates_clients,
                             self.metrics),
        }
        if self.accounting == "none":
            out["most_rounds_of_a_client"] = self.most_participated(server, rounds)
        if self.keep_private_states:
            out["keep_private_states"] = True
        if reached > MEANINGLESS_EPSILON:
            out["warning"] = f"epsilon {reached:.3g}: an epsilon that large protects nothing"
        if self.releases > 1:
            out["releases_per_round"] = self.releases
            out["releases"] = self.releases * rounds
            out["accounted_noise_multiplier"] = self.accounted_noise
        if self.target_epsilon is not None:
            out["target_epsilon"] = self.target_epsilon
        if self.adaptive is not None:
            out["adaptive_clip"] = {"target_quantile": self.adaptive.target_quantile, "lr": self.adaptive.lr,
                                    "count_noise": self.count_noise, "update_noise_multiplier": self.update_noise,
                                    "final_clip": self.current_clip(server) if server is not None else self.clip}
        return out

    def participation_note(self) -> str:
        """What the epsilon assumes about who took part, and whom that trusts (the summary's
        ``participation``)."""
        if self.per_round >= self.num_clients:
            return "every client takes part in every round: no amplification by sampling is claimed"
        how = ACCOUNTING[self.accounting]
        if self.accounting == "none":
            why = ""
            if not self.accounting_given:
                why = (" (chosen because the sample is no secret: " +
                       ("the server sees who uploads under local-dp)" if not self.central else
                        "noise: seeded derives the clients of each round from the run's seed)"))
            return f"{how}{why}"
        if self.seeded:
            return (f"{how}; the sample comes from the run's seed (noise: seeded), so the amplification holds only "
                    "against someone who does not hold the seed")
        return (f"{how}; drawn from OS randomness each round, and the server is trusted to keep the sample secret "
                "(the history records counts of clients, not which)")

    # -- the rounds ----------------------------------------------------------------------------
    def init_server(self, server: Parts) -> Parts:
        """The algorithm's initial server state with privacy's own: the clip of round 1."""
        return {**server, STATE_KEY: {"clip": float(self.clip)}}

    def current_clip(self, server: Parts) -> float:
        return float(server[STATE_KEY]["clip"])

    def client_spec(self, server: Parts) -> ClientSpec:
        """What this round's clients are told (it travels in the task)."""
        clip = self.current_clip(server)
        local = 0.0 if self.central else (self.noise_multiplier or 0.0) * clip
        return ClientSpec(self.kind, clip, local, self.adaptive is not None, self.metrics, self.seeded,
                          tuple(self.prototype_classes))

    def _generator(self, seed: int, key: str, round_key: str) -> torch.Generator:
        """The server's noise generator for a round: the seeded one in research mode, else one seeded
        from OS randomness (module docstring)."""
        return torch_generator(seed, key, round_key) if self.seeded else secure_generator()

    def aggregate(self, server: Parts, results: Mapping[int, ClientResult], seed: int,
                  round_key: str) -> tuple[Parts, dict[str, float]]:
        """(the next server state, this round's privacy record): the noised average of the clipped
        updates added to the global model, in place of the algorithm's aggregation, and the next clip."""
        clip = self.current_clip(server)
        sent = [results[c].upload for c in sorted(results) if DELTA in results[c].upload]
        model = server[self.key]
        generator = self._generator(seed, NOISE_KEY, round_key)
        denominator = self.per_round if self.central else max(len(sent), 1)
        std = self.update_noise * clip if self.central else 0.0
        new: dict[str, torch.Tensor] = {}
        for name in sorted(model):  # a fixed order: every engine draws the same noise
            tensor = model[name]
            if not torch.is_floating_point(tensor) or name in self.frozen:
                new[name] = tensor
                continue
            total = torch.zeros(tensor.shape, dtype=torch.float64, device=tensor.device)
            for upload in sent:
                total = total + upload[DELTA][name].to(device=tensor.device, dtype=torch.float64)
            if std > 0:
                noise = torch.randn(tensor.shape, generator=generator, device=generator.device, dtype=torch.float64)
                total = total + noise.to(tensor.device) * std
            new[name] = (tensor.to(torch.float64) + total / denominator).to(tensor.dtype)
        released: Parts = {}
        if self.prototype_classes and not server.get(REFERENCE):  # an FRL inner round: prototypes too
            prototypes = self.noised_prototypes(sent, std, generator, server.get("prototypes"))
            if prototypes is not None:
                released["prototypes"] = prototypes
        record: dict[str, float] = {"dp_clip": clip}
        next_clip = clip
        if self.adaptive is not None:
            within = sum(float(u[WITHIN]) - 0.5 for u in sent if WITHIN in u)
            count_generator = self._generator(seed, COUNT_NOISE_KEY, round_key)
            draw = float(torch.randn((), generator=count_generator, device=count_generator.device, dtype=torch.float64))
            share = (within + draw * self.count_noise) / self.per_round + 0.5
            next_clip = clip * math.exp(-self.adaptive.lr * (share - self.adaptive.target_quantile))
            record["dp_within_clip"] = share
        next_server = {**server, self.key: {name: new[name] for name in model}, **released,
                       STATE_KEY: {**server[STATE_KEY], "clip": next_clip}}
        return named_parts(self.advance(next_server), "the server state after a private round"), record

    def noised_prototypes(self, sent: Sequence[Payload], std: float, generator: torch.Generator,
                          previous: Payload | None = None) -> Payload | None:
        """FRL's global prototypes: for every preparation class, the sum of the clipped prototypes of the
        clients holding it plus N(0, std^2 I), divided by the clients per round (module docstring). When
        no participant sent any, the noise alone over the shape of the ``previous`` global prototypes
        (keeping them would tell that no one sent: an empty secret sample must look like any other);
        None when there are none yet to take the shape from."""
        classes = torch.as_tensor(self.prototype_classes, dtype=torch.long)
        rows = [u[PROTOTYPES] for u in sent if PROTOTYPES in u]
        if not rows:
            if previous is None or "prototypes" not in previous:
                return None
            rows_shape = previous["prototypes"]
            total = torch.zeros(len(classes), int(rows_shape.shape[1]), dtype=torch.float64)
            if std > 0:
                total = total + torch.randn(total.shape, generator=generator, device=generator.device,
                                            dtype=torch.float64).cpu() * std
            return {"classes": classes.to(rows_shape.device),
                    "prototypes": (total / self.per_round).to(device=rows_shape.device, dtype=rows_shape.dtype),
                    "counts": torch.full((len(classes),), float(self.per_round), dtype=rows_shape.dtype)}
        dim = int(rows[0]["prototypes"].shape[1])
        total = torch.zeros(len(classes), dim, dtype=torch.float64)
        for upload in rows:  # clients in sorted order: every engine sums the same way
            position = torch.searchsorted(classes, upload["classes"].to(torch.long).cpu())
            if bool((position >= len(classes)).any()) or not bool((classes[position.clamp(max=len(classes) - 1)]
                                                                    == upload["classes"].cpu()).all()):
                raise ValueError("a client's prototype class is not a preparation class")
            total.index_add_(0, position, upload["prototypes"].detach().cpu().to(torch.float64))
        if std > 0:
            noise = torch.randn(total.shape, generator=generator, device=generator.device, dtype=torch.float64)
            total = total + noise.cpu() * std
        dtype, device = rows[0]["prototypes"].dtype, rows[0]["prototypes"].device
        return {"classes": classes.to(device), "prototypes": (total / self.per_round).to(device=device, dtype=dtype),
                "counts": torch.full((len(classes),), float(self.per_round), dtype=dtype)}  # the fixed divisor


def adaptive_clip_refusal(count_noise: float, z: float, per_round: int, default: bool) -> str:
    """Why adaptive clipping cannot run at this noise: the count's noise must exceed z / 2 (Andrew et
    al. 2021, Theorem 1); at the default count_noise (clients per round / 20) that is at least 10 z
    clients a round."""
    if default:
        return (f"privacy.adaptive_clip: adaptive clipping needs more than 10 x noise_multiplier = {10 * z:g} clients "
                f"a round at its default count_noise (clients per round / 20); this run asks {per_round}: raise "
                "federation.clients_per_round, or set privacy.adaptive_clip.count_noise above noise_multiplier / 2 = "
                f"{z / 2:g} (it spends part of the budget: docs/privacy.md)")
    return (f"privacy.adaptive_clip.count_noise={count_noise:g} must exceed privacy.noise_multiplier / 2 = {z / 2:g}: "
            "the count's noise spends part of the budget (Andrew et al. 2021, Theorem 1)")
