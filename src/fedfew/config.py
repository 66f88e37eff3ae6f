"""Experiment configuration: a YAML file validated by a schema.

Unknown keys, wrong types and impossible combinations are :class:`ConfigError` naming the key and
what is allowed. Any value can be overridden with ``key=value`` (``--set`` on the command line);
a key is a dotted path (``federation.rounds=50``) or, where unambiguous, a bare field name
(``rounds=50``).
"""

from __future__ import annotations

import copy
import difflib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedfew.errors import ConfigError
from fedfew.schema import NoBoolNumbers

__all__ = ["ConfigError", "ExperimentConfig", "apply_override", "dump_config", "load_config"]

if TYPE_CHECKING:
    from fedfew.engine.algorithm import BaseOptions

logger = logging.getLogger(__name__)


#: Bounds on counts that size what a run holds in memory before its first round (the client schedule is
#: drawn for every round at the start; ~55 KB per client stay in the main process, docs/performance.md):
#: past them a run would grow silently for minutes instead of starting.
MAX_ROUNDS = 1_000_000
MAX_CLIENTS = 1_000_000
MAX_EPISODES = 1_000_000


class Section(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DatasetConfig(Section):
    name: str = "digits"
    root: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class HeldOutTest(Section):
    """Test episodes drawn from held-out *samples* of chosen classes rather than from a class split: a
    seeded ``holdout`` share of each listed class's samples leaves the training data and is tested on,
    so test classes may be classes the clients train on (a centralised ceiling, FedFSL section 5.3)."""

    #: Class names or ids.
    classes: list[int | str] = Field(min_length=2)
    #: The share of each listed class's samples held out for the test episodes.
    holdout: float = Field(gt=0, lt=1)


class SplitConfig(Section):
    """Which class splits train the clients, select the model and test it (few-shot tasks)."""

    train: str = "base"
    val: str | None = "val"
    #: A class split's name, or held-out samples of chosen classes (:class:`HeldOutTest`).
    test: str | HeldOutTest = "novel"

    @field_validator("test", mode="before")
    @classmethod
    def _held_out(cls, value: Any) -> Any:
        # a mapping is held-out samples: its errors name splits.test.<key>, not both forms of the union
        if not isinstance(value, dict):
            return value
        try:
            return HeldOutTest.model_validate(value)
        except ValidationError as err:
            raise ValueError(_format(err, "splits.test", HeldOutTest, header=False)) from None


class ClassificationConfig(Section):
    """Sample splits for classification tasks (FML, AdFL)."""

    test_fraction: float = Field(0.2, gt=0, lt=1)
    client_val_fraction: float = Field(0.0, ge=0, lt=1)


class PartitionConfig(Section):
    name: str = "dirichlet"
    num_clients: int = Field(10, ge=1, le=MAX_CLIENTS)
    options: dict[str, Any] = Field(default_factory=dict)
    #: Entropy for ``numpy.random.default_rng`` in place of the generator derived from the seed: to
    #: reproduce another tool's partition draw for draw (benchmarks/peers.yaml: [seed, 0]).
    rng_entropy: list[int] | None = None


class ModelConfig(Section):
    name: str = "conv4"
    options: dict[str, Any] = Field(default_factory=dict)
    channels_last: bool = True
    #: Build the server's initial model right after torch.manual_seed(init_seed) instead of a seed
    #: derived from the experiment's: to start from the very model another tool starts from.
    init_seed: int | None = None


class AlgorithmConfig(Section):
    name: str = "fl-maml"
    options: dict[str, Any] = Field(default_factory=dict)


class FederationConfig(Section):
    #: 0 is the untrained control: the initial model, scored exactly as a trained one would be.
    rounds: int = Field(50, ge=0, le=MAX_ROUNDS)
    clients_per_round: int | float = Field(1.0, gt=0)
    #: Fraction of the clients asked each round that fail (no reply; their state is unchanged).
    dropout: float = Field(0.0, ge=0, lt=1)
    #: Fraction that reply after the deadline: they trained, but the round goes on without them.
    stragglers: float = Field(0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _faults(self) -> FederationConfig:
        if self.dropout + self.stragglers >= 1:
            raise ValueError(f"federation.dropout + federation.stragglers must be below 1 (got "
                             f"{self.dropout} + {self.stragglers}): some client must reply")
        return self


class EpisodeConfig(Section):
    n_way: int = Field(5, ge=2)
    k_shot: int = Field(1, ge=1)
    q_query: int = Field(15, ge=1)
    val_episodes: int = Field(100, ge=1, le=MAX_EPISODES)
    test_episodes: int = Field(600, ge=1, le=MAX_EPISODES)
    #: A JSON file of fixed test tasks (dataset positions) used instead of drawing test_episodes:
    #: to score on exactly the tasks another tool or paper used. See fedfew.episodes.load_tasks.
    test_tasks: str | None = None


class EvalConfig(Section):
    every: int = Field(5, ge=1)
    track_test: bool = False
    #: Which round's model is tested: "best" (the best validation accuracy among the evaluated
    #: rounds; the last round without validation data) or "last" (the last round, whatever the
    #: validation says: a rule that no noise in a few validation tasks can move).
    selection: Literal["best", "last"] = "best"
    #: Add ``per_class`` to the final test metrics: per true class of the test episodes' queries, the
    #: share classified correctly, pooled over the episodes (few-shot methods scored on the server's
    #: model). Off by default; computed after the score, drawing nothing the score draws.
    per_class: bool = False


class DivergenceConfig(Section):
    """When a run counts as diverged although every number is still finite (a NaN or inf always does).
    Our rule, not a paper's: a client's training loss (any metric named ``*loss``) above ``max_loss``,
    or a round's mean training loss above ``loss_factor`` times its first round's (and above 1.0) for
    ``patience`` rounds in a row. The committed runs stay below 9 and within 5x their first round."""

    #: A client's training loss above this is divergence (a cross-entropy near it means logits of ~1e6).
    max_loss: float = Field(1e6, gt=0)
    #: The mean training loss above this multiple of the first round's (0: no relative rule).
    loss_factor: float = Field(100.0, ge=0)
    #: Rounds in a row above ``loss_factor`` before the run stops.
    patience: int = Field(3, ge=1)


class RuntimeConfig(Section):
    #: PyTorch threads of this process. 1 by default: fedfew's models are small, a second thread buys
    #: little and, on a machine whose cores are busy, costs much (measured on the demo; README, Tests).
    #: Worker processes (runtime.workers) use one thread each whatever this says.
    threads: int = Field(1, ge=1)
    output_dir: str = "runs"
    progress: bool = True
    #: Rounds between checkpoints (0: none); a checkpoint holds everything ``fedfew resume`` needs.
    checkpoint_every: int = Field(1, ge=0)
    #: Where clients' private states live: "memory", "disk" (files in the run folder; memory stays
    #: bounded with many clients), or "auto" (disk above 100 clients).
    client_states: Literal["auto", "memory", "disk"] = "auto"
    #: "cpu", "cuda" or "auto" (cuda when a GPU is visible).
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    #: "fp32": float32 throughout, also on a GPU (cuDNN's and cuBLAS's TF32 shortcuts off, so a CUDA run
    #: matches the CPU's to float32 rounding); "tf32" (CUDA only): convolutions and matrix products in
    #: TensorFloat-32, PyTorch's own default for cuDNN convolutions; "bf16" autocasts convolutions and
    #: matrix products to bfloat16 (parameters stay float32).
    precision: Literal["fp32", "tf32", "bf16"] = "fp32"
    #: Where the clients run (``fedfew list engines``): "inprocess" (this process), "workers" (worker
    #: processes, one thread each), "flower" (Flower's deployment runtime: a SuperLink and one
    #: SuperNode per client as separate processes; docs/deployment.md) or "flower-sim" (Flower's
    #: Simulation Engine on Ray; flower.sim.*).
    engine: str = "inprocess"
    #: The engine's options, e.g. ``{workers: 4}`` for the workers engine (unknown keys are errors).
    engine_options: dict[str, Any] = Field(default_factory=dict)
    #: Run the local updates of a round's clients as one batched computation in this process (one
    #: device; runtime.engine: inprocess): the episodic family (fl-maml, fl-proto, fedfsl-prox) on
    #: stackable models (Conv4). Equal to the sequential path up to floating-point summation order
    #: (tests/test_batched.py).
    batch_clients: bool = False
    #: Experiment trackers writing into the run folder: "tensorboard", "mlflow" (fedfew.tracking).
    loggers: list[str] = Field(default_factory=list)
    #: When a finite but exploding run stops as diverged (:class:`DivergenceConfig`).
    divergence: DivergenceConfig = Field(default_factory=DivergenceConfig)

    @model_validator(mode="before")
    @classmethod
    def _workers_alias(cls, data: Any) -> Any:
        """The old ``runtime.workers: N`` (N > 0: the workers engine with N workers; 0: in process)."""
        if not isinstance(data, dict) or "workers" not in data:
            return data
        data = dict(data)
        workers = data.pop("workers")
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise ValueError(f"runtime.workers: must be a whole number >= 0 (got {workers!r})")
        engine = data.get("engine", "inprocess")
        logger.warning("runtime.workers is deprecated: write runtime.engine: %s%s instead",
                       "workers" if workers else "inprocess",
                       f" and runtime.engine_options: {{workers: {workers}}}" if workers else "")
        if workers and engine not in ("inprocess", "workers"):
            raise ValueError(f"runtime.workers runs clients in worker processes (runtime.engine: workers); with "
                             f"runtime.engine: {engine} it cannot apply (set runtime.workers: 0)")
        if workers:
            data["engine"] = "workers"
            data["engine_options"] = {**(data.get("engine_options") or {}), "workers": workers}
        elif engine == "workers":
            data["engine"], data["engine_options"] = "inprocess", {}
        return data


class FlowerSimConfig(Section):
    """Flower's Simulation Engine on Ray (runtime.engine: flower-sim)."""

    #: CPUs (and GPU fraction) Ray reserves per ClientApp actor: how many clients run at once.
    num_cpus: float = Field(1.0, gt=0)
    num_gpus: float = Field(0.0, ge=0)
    #: A Ray cluster to join ("HOST:PORT" of `ray start --head`); None: a private Ray instance.
    address: str | None = None
    #: More ray.init arguments (e.g. num_cpus for the private instance, _temp_dir).
    init_args: dict[str, Any] = Field(default_factory=dict)


class SecureAggregationConfig(Section):
    """Secure aggregation on the Flower engines (runtime.engine: flower or flower-sim): Flower's SecAgg+
    (Bell et al. 2020), so that the server learns only the sum of a round's client updates, never one
    client's (docs/privacy.md, "Secure aggregation"). Off by default. The other keys are the protocol's
    (Flower's ``SecAggPlusWorkflow`` names) and the quantisation's: each coordinate is clipped to
    [-clipping_range, clipping_range] (a coordinate beyond it stops the run) and rounded to one of
    ``quantization_range`` levels, so the sum is exact to 2 clipping_range / quantization_range per client
    and coordinate."""

    enabled: bool = False
    #: With how many of the round's clients each client shares its secrets: a fraction of them (a float in
    #: (0, 1]; 1.0: every client, classic SecAgg) or a count (an integer > 2).
    num_shares: int | float = Field(default=1.0, gt=0)
    #: How many of a client's shares unmask it: a fraction of num_shares (a float in (0, 1]) or a count
    #: (an integer below num_shares). The round completes while every client keeps at least this many
    #: live neighbours; higher resists more colluding clients, lower more dropouts.
    reconstruction_threshold: int | float = Field(default=0.67, gt=0)
    #: The largest aggregation weight a client may have (by the algorithm's aggregation: 1, its episodes
    #: per round or its samples): each update is scaled by weight / max_weight before it is quantised, so
    #: a bound close to the real largest weight keeps the precision. None: the largest this run's clients
    #: can have (1; local_steps x meta_batch; the largest client's samples in the run's partition).
    max_weight: float | None = Field(default=None, gt=0)
    #: c: every coordinate of a client's (weighted) update must lie in [-c, c].
    clipping_range: float = Field(default=8.0, gt=0)
    #: T: the number of quantisation levels of [-c, c] (at most 2^30).
    quantization_range: int = Field(default=2**22, ge=2, le=2**30)
    #: M: masks are drawn modulo M, a power of 2 above clients per round x T (at most 2^32).
    modulus_range: int = Field(default=2**32, ge=4, le=2**32)

    @model_validator(mode="after")
    def _protocol(self) -> SecureAggregationConfig:
        key = "flower.secure_aggregation"
        if not self.enabled:
            changed = [k for k, f in type(self).model_fields.items() if k != "enabled" and getattr(self, k) != f.default]
            if changed:
                raise ValueError(f"{key}.{changed[0]} is set but {key}.enabled is false: set enabled: true, or remove it")
            return self
        for name, least in (("num_shares", 3), ("reconstruction_threshold", 2)):
            value = getattr(self, name)
            if isinstance(value, float) and value > 1:
                raise ValueError(f"{key}.{name}={value:g}: a fraction must be in (0, 1]; give a count as an integer")
            if isinstance(value, int) and value < least:
                raise ValueError(f"{key}.{name}={value}: a count must be at least {least} (a fraction such as 1.0 "
                                 "means all of them)")
        m = self.modulus_range
        if m & (m - 1) or m <= self.quantization_range:
            raise ValueError(f"{key}.modulus_range={m} must be a power of 2 above quantization_range="
                             f"{self.quantization_range}")
        return self


class FlowerConfig(Section):
    """Flower's deployment runtime (runtime.engine: flower) and Simulation Engine (flower.sim)."""

    #: Seconds the server waits for a round's replies; a node that has not replied by then failed.
    round_timeout: float = Field(600.0, gt=0)
    #: Seconds to wait for every SuperNode to connect and load its data.
    startup_timeout: float = Field(300.0, gt=0)
    #: The SuperLink's port on 127.0.0.1 (0: a free one).
    port: int = Field(0, ge=0, le=65535)
    #: TLS between SuperNodes and the SuperLink (certificates made for the run).
    tls: bool = True
    #: SuperNode authentication: only SuperNodes whose key was registered may join.
    node_auth: bool = True
    sim: FlowerSimConfig = Field(default_factory=FlowerSimConfig)
    #: Flower's SecAgg+: the server sees only the masked sum of a round's updates (off by default).
    secure_aggregation: SecureAggregationConfig = Field(default_factory=SecureAggregationConfig)


class AdaptiveClipConfig(Section):
    """Adaptive clipping (Andrew et al. 2021, "Differentially Private Learning with Adaptive Clipping"):
    after each round the clip moves geometrically toward the ``target_quantile`` of the clients' update
    norms, C <- C exp(-lr (b - target_quantile)), where b is the noised share of this round's clients
    whose update was within the clip. That count is released too: it has noise of its own
    (``count_noise``), and the updates get more noise so that both together spend the budget of
    ``privacy.noise_multiplier`` (the paper's Theorem 1; docs/privacy.md)."""

    #: The quantile of the clients' update norms the clip tracks (the paper's gamma; 0.5: the median).
    target_quantile: float = Field(0.5, gt=0, lt=1)
    #: The clip's learning rate (the paper's eta_C) in the geometric update.
    lr: float = Field(0.2, gt=0)
    #: Standard deviation sigma_b of the noise on the count of clients within the clip; None: the expected
    #: clients per round / 20, the paper's choice. Must exceed privacy.noise_multiplier / 2.
    count_noise: float | None = Field(default=None, gt=0)


class PrivacyConfig(Section):
    """Client-level differential privacy (fedfew.privacy; docs/privacy.md). Off by default.

    ``central-dp`` is DP-FedAvg (McMahan et al. 2018): each client clips its update to L2 norm ``clip``
    where it trains, and the server adds Gaussian noise of standard deviation noise_multiplier x clip to
    the sum before dividing by the expected clients per round. ``local-dp``: each client adds that noise
    to its own clipped update before it leaves, so the server need not be trusted. Give
    ``noise_multiplier`` or ``target_epsilon`` (the multiplier is then solved before the run)."""

    #: "none" (off), "central-dp" (the server adds the noise) or "local-dp" (each client adds its own).
    mechanism: Literal["none", "central-dp", "local-dp"] = "none"
    #: C: the L2 norm each client's update is clipped to (the initial clip with adaptive_clip).
    clip: float | None = Field(default=None, gt=0)
    #: z: the noise's standard deviation is z x C (on the sum, central-dp; on each update, local-dp).
    noise_multiplier: float | None = Field(default=None, gt=0)
    #: Solve for the noise multiplier that gives this epsilon after federation.rounds (instead of
    #: noise_multiplier).
    target_epsilon: float | None = Field(default=None, gt=0)
    #: delta of the (epsilon, delta) guarantee; must be below 1 / partition.num_clients.
    delta: float | None = Field(default=None, gt=0, lt=1)
    #: The accountant turning (sampling rate, noise multiplier, rounds, delta) into epsilon: Opacus's
    #: "rdp" (Renyi DP of the Poisson-subsampled Gaussian) or "prv" (privacy random variables).
    accountant: Literal["rdp", "prv"] = "rdp"
    #: Let the clip track a quantile of the update norms (central-dp only); None: a fixed clip.
    adaptive_clip: AdaptiveClipConfig | None = None
    #: Send the clients' training metrics (loss and accuracy on their own data) to the server for the
    #: round history. They are not covered by the guarantee, so by default they stay on the clients.
    client_metrics: bool = False

    @model_validator(mode="after")
    def _complete(self) -> PrivacyConfig:
        if self.mechanism == "none":
            given = [k for k in ("clip", "noise_multiplier", "target_epsilon", "delta", "adaptive_clip")
                     if getattr(self, k) is not None]
            if given:
                raise ValueError(f"privacy.{given[0]} is set but privacy.mechanism is none: set privacy.mechanism: "
                                 "central-dp or local-dp, or remove it")
            return self
        for key in ("clip", "delta"):
            if getattr(self, key) is None:
                raise ValueError(f"privacy.mechanism: {self.mechanism} needs privacy.{key}")
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError(f"privacy.mechanism: {self.mechanism} needs exactly one of privacy.noise_multiplier "
                             "and privacy.target_epsilon" + (" (both are set)" if self.noise_multiplier else ""))
        if self.adaptive_clip is not None and self.mechanism == "local-dp":
            raise ValueError("privacy.adaptive_clip needs the server's noised count of clients within the clip "
                             "(mechanism: central-dp); local-dp uses a fixed clip")
        return self

    @property
    def enabled(self) -> bool:
        return self.mechanism != "none"


class ExperimentConfig(Section):
    name: str = "experiment"
    seed: int = 0
    task: Literal["fewshot", "classification"] = "fewshot"
    #: Python files imported before validation (fedfew.plugins); relative paths from the config's folder.
    plugins: list[str] = Field(default_factory=list)
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    splits: SplitConfig = Field(default_factory=SplitConfig)
    classification: ClassificationConfig = Field(default_factory=ClassificationConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    federation: FederationConfig = Field(default_factory=FederationConfig)
    episodes: EpisodeConfig = Field(default_factory=EpisodeConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    flower: FlowerConfig = Field(default_factory=FlowerConfig)
    #: Client-level differential privacy (off by default; docs/privacy.md).
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)

    @model_validator(mode="after")
    def _check_names(self) -> ExperimentConfig:
        import fedfew.algorithms  # noqa: F401  (registers algorithms)
        from fedfew.data import DATASETS
        from fedfew.engine import ALGORITHMS
        from fedfew.engines import ENGINES
        from fedfew.models import MODELS
        from fedfew.partition import PARTITIONS
        from fedfew.registry import RegistryError
        from fedfew.signature_options import options_schema

        for key, registry, name in (
            ("dataset.name", DATASETS, self.dataset.name),
            ("partition.name", PARTITIONS, self.partition.name),
            ("model.name", MODELS, self.model.name),
            ("algorithm.name", ALGORITHMS, self.algorithm.name),
            ("runtime.engine", ENGINES, self.runtime.engine),
        ):
            try:
                registry.get(name)
            except RegistryError as err:
                raise ValueError(f"{key}: {err}") from None
        options_model = ALGORITHMS.get(self.algorithm.name).Options
        try:
            options_model.model_validate(self.algorithm.options)
        except ValidationError as err:
            raise ValueError(_format(err, prefix="algorithm.options", model=options_model, header=False)) from None
        from fedfew.corruption import parse as parse_corruption
        from fedfew.corruption import split_options

        # ``corrupt`` (fedfew.corruption) is taken by every partitioner: checked here, not by their schemas.
        partition_options, corrupt = split_options(self.partition.options)
        parse_corruption(corrupt, self.partition.num_clients)
        for key, registry, name, options, skip in (
            ("partition.options", PARTITIONS, self.partition.name, partition_options,
             ("labels", "num_clients", "rng", "groups")),
            ("model.options", MODELS, self.model.name, self.model.options, ("input_shape", "num_classes")),
        ):
            schema = options_schema(registry.get(name), skip)
            try:
                schema.model_validate(options)
            except ValidationError as err:
                raise ValueError(_format(err, prefix=key, model=schema, header=False)) from None
        from fedfew.tracking import check_loggers

        check_loggers(self.runtime.loggers)
        engine_options = ENGINES.get(self.runtime.engine).Options
        try:
            engine_options.model_validate(self.runtime.engine_options)
        except ValidationError as err:
            raise ValueError(_format(err, prefix="runtime.engine_options", model=engine_options, header=False)) from None
        if self.runtime.batch_clients and self.runtime.engine != "inprocess":
            raise ValueError("runtime.batch_clients runs a round's clients together in this process: set "
                             "runtime.engine: inprocess")
        if self.runtime.device != "cpu" and self.runtime.engine != "inprocess":
            raise ValueError("runtime.device=cuda/auto runs the clients in this process (one GPU): set "
                             "runtime.engine: inprocess")
        fpr = self.federation.clients_per_round
        if isinstance(fpr, int) and fpr > self.partition.num_clients:
            raise ValueError(
                f"federation.clients_per_round={fpr} exceeds partition.num_clients={self.partition.num_clients}"
            )
        if isinstance(fpr, float) and fpr > 1.0:
            raise ValueError("federation.clients_per_round as a fraction must be in (0, 1]")
        self._check_replies()
        self._check_privacy()
        self._check_secure_aggregation()
        return self

    def engine_options(self) -> BaseModel:
        from fedfew.engines import ENGINES

        return ENGINES.get(self.runtime.engine).Options.model_validate(self.runtime.engine_options)

    def _check_replies(self) -> None:
        """Some client must reply in every round: the fault counts are rounded exactly as the fault
        draw rounds them (engine.Faults.counts) for the round size the schedule uses."""
        from fedfew.engine.engines import Faults
        from fedfew.engine.simulator import round_size

        f = self.federation
        if f.dropout == 0 and f.stragglers == 0:
            return
        asked = round_size(self.partition.num_clients, f.clients_per_round)
        failed, late = Faults(f.dropout, f.stragglers).counts(asked)
        if asked - failed - late <= 0:
            raise ValueError(
                f"federation.dropout={f.dropout} and federation.stragglers={f.stragglers} leave no client to reply "
                f"in a round of {asked} (federation.clients_per_round={f.clients_per_round}, partition.num_clients="
                f"{self.partition.num_clients}): {failed} fail and {late} are late; lower them or ask more clients")

    def _check_privacy(self) -> None:
        """What privacy settings contradict in the rest of the config (the algorithm's upload is
        checked when it is built: fedfew.privacy.check_algorithm)."""
        p = self.privacy
        if not p.enabled:
            return
        from fedfew.engine.simulator import round_size
        from fedfew.engines import ENGINES

        clients = self.partition.num_clients
        if p.delta is not None and p.delta >= 1 / clients:
            raise ValueError(f"privacy.delta={p.delta:g} must be below 1 / partition.num_clients = {1 / clients:g}: "
                             "a delta that large allows leaking one client's data outright")
        engine = ENGINES.get(self.runtime.engine)
        if not getattr(engine, "honours_privacy", False):
            raise ValueError(f"privacy: runtime.engine={self.runtime.engine} does not run client updates through "
                             "fedfew's client task (fedfew.engine.tasks.run_client_task), where updates are clipped: "
                             "use inprocess, workers, flower or flower-sim")
        if p.adaptive_clip is not None and p.noise_multiplier is not None:
            m = round_size(clients, self.federation.clients_per_round)
            count_noise = p.adaptive_clip.count_noise or m / 20
            if 2 * count_noise <= p.noise_multiplier:
                raise ValueError(f"privacy.adaptive_clip.count_noise={count_noise:g} must exceed privacy.noise_multiplier"
                                 f" / 2 = {p.noise_multiplier / 2:g}: the count's noise spends part of the budget "
                                 "(Andrew et al. 2021, Theorem 1); raise it or the clients per round")

    def _check_secure_aggregation(self) -> None:
        """What ``flower.secure_aggregation`` needs of the engine, the algorithm, the rounds and privacy
        (the protocol's own values are checked by :class:`SecureAggregationConfig`)."""
        s = self.flower.secure_aggregation
        if not s.enabled:
            return
        from fedfew.engine.engines import Faults
        from fedfew.engine.simulator import round_size
        from fedfew.engines import ENGINES
        from fedfew.flower.secure_aggregation import protocol_sizes, refusal

        key = "flower.secure_aggregation"
        if not getattr(ENGINES.get(self.runtime.engine), "honours_secure_aggregation", False):
            raise ValueError(f"{key}: runtime.engine={self.runtime.engine} cannot honour it (its server would see each "
                             "client's upload): use runtime.engine: flower or flower-sim")
        reason = refusal(self.algorithm.name, self.algorithm_options())
        if reason is not None:
            raise ValueError(f"{key}: algorithm {self.algorithm.name} cannot run with secure aggregation: {reason}")
        f = self.federation
        if f.stragglers > 0:
            raise ValueError(f"{key}: federation.stragglers={f.stragglers} drops replies after they arrive, but a masked "
                             "sum cannot drop one client's part: set federation.stragglers: 0")
        asked = round_size(self.partition.num_clients, f.clients_per_round)
        summed = asked - Faults(f.dropout, f.stragglers).counts(asked)[0]
        if summed < 2:
            raise ValueError(f"{key}: a round sums {summed} client(s) (federation.clients_per_round, federation.dropout); "
                             "secure aggregation needs at least 2")
        if isinstance(s.num_shares, int) and s.num_shares > asked:
            raise ValueError(f"{key}.num_shares={s.num_shares} exceeds the {asked} clients of a round")
        shares, threshold = protocol_sizes(summed, s.num_shares, s.reconstruction_threshold)
        if threshold > shares:
            raise ValueError(f"{key}.reconstruction_threshold={s.reconstruction_threshold} asks {threshold} shares of "
                             f"the {shares} each client makes in a round of {summed}: lower it")
        if asked * s.quantization_range >= s.modulus_range:
            raise ValueError(f"{key}.quantization_range={s.quantization_range}: the sum of {asked} clients' quantised "
                             f"values would wrap around modulus_range={s.modulus_range}: lower it or raise modulus_range")
        p = self.privacy
        if p.enabled and p.client_metrics:
            raise ValueError(f"{key}: privacy.client_metrics sends each client's training metrics beside the masked "
                             "sum: set it to false")
        if p.enabled and p.clip is not None and p.clip > s.clipping_range:
            raise ValueError(f"{key}.clipping_range={s.clipping_range:g} is below privacy.clip={p.clip:g}: a clipped "
                             "update's coordinates reach the clip; raise it")
        if p.adaptive_clip is not None and not float(s.quantization_range / (2 * s.clipping_range)).is_integer():
            raise ValueError(f"{key}: with privacy.adaptive_clip, quantization_range / (2 clipping_range) must be an "
                             "integer, so that each client's within-the-clip bit is summed exactly (e.g. the defaults "
                             "2^22 and 8)")

    def algorithm_options(self) -> BaseOptions:
        from fedfew.engine import ALGORITHMS

        return ALGORITHMS.get(self.algorithm.name).Options.model_validate(self.algorithm.options)


def _allowed(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    """Field names allowed at ``loc`` (for 'did you mean' hints)."""
    current: Any = model
    for part in loc[:-1]:
        if current is None or not hasattr(current, "model_fields") or part not in current.model_fields:
            return []
        current = current.model_fields[part].annotation
    return list(current.model_fields) if current is not None and hasattr(current, "model_fields") else []


def _format(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None, header: bool = True) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in ((prefix,) if prefix else ()) + loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = _allowed(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(f"{key}: unknown key{hint}; allowed here: {', '.join(allowed)}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] == "value_error":
                lines.append(msg)
            else:
                lines.append(f"{key}: {msg} (got {e.get('input')!r})")
    body = "; ".join(lines)
    return f"invalid configuration: {body}" if header else body


class DuplicateKeyError(yaml.YAMLError):
    """A mapping in YAML text names the same key twice (plain YAML keeps the last one silently)."""

    def __init__(self, key: Any, line: int) -> None:
        super().__init__(f"key {key!r} appears twice in one mapping (line {line})")
        self.key, self.line = key, line


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in the same mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may repeat what it merges
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise DuplicateKeyError(key, key_node.start_mark.line + 1)
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader reports it
                pass
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` that refuses duplicate keys (:class:`DuplicateKeyError`)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_config_text(path: Path) -> str:
    """The text of the config file ``path``, or a :class:`ConfigError` saying what is wrong with it."""
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder, not a YAML file")
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte 0x{data[err.start]:02x} at position "
                          f"{err.start}); save it as UTF-8") from None


def _leaf_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths += _leaf_paths(annotation, f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{name}")
    return paths


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``key=value`` override in place; the value is parsed as YAML."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like key=value (e.g. federation.rounds=50)")
    key, raw = assignment.split("=", 1)
    key = key.strip()
    try:
        value = load_yaml(raw) if raw.strip() else None
    except DuplicateKeyError as err:
        raise ConfigError(f"--set {key.strip()}: value {raw!r}: {err}") from None
    except yaml.YAMLError as err:
        problem = str(getattr(err, "problem", None) or err).splitlines()[0]
        raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({problem}); quote strings, "
                          "e.g. key='[1, 2]' for a list") from None
    if "." not in key and key not in ExperimentConfig.model_fields:
        matches = [p for p in _leaf_paths(ExperimentConfig) if p.split(".")[-1] == key]
        if len(matches) == 1:
            key = matches[0]
        elif len(matches) > 1:
            raise ConfigError(f"override key {key!r} is ambiguous: use one of {', '.join(matches)}")
        else:
            raise ConfigError(f"override key {key!r} is unknown; use a dotted path such as federation.rounds")
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part, {}), dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def load_config(source: str | Path | dict[str, Any] | None = None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read and validate a config from a YAML path or a dict, applying ``key=value`` overrides."""
    if source is None:
        data: dict[str, Any] = {}
    elif isinstance(source, dict):
        data = yaml.safe_load(yaml.safe_dump(source))  # a deep copy
    else:
        path = Path(source)
        text = read_config_text(path)
        try:
            data = load_yaml(text)
        except DuplicateKeyError as err:
            raise ConfigError(f"config file {path}: {err}; remove one of them") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
        if data is None:
            raise ConfigError(f"config file {path} is empty: a config sets at least {', '.join(REQUIRED_KEYS)} "
                              "(see src/fedfew/configs/demo.yaml)")
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        tasks = (data.get("episodes") or {}).get("test_tasks") if isinstance(data.get("episodes"), dict) else None
        if isinstance(tasks, str) and not Path(tasks).is_absolute():  # relative to the config file
            data["episodes"]["test_tasks"] = str((path.parent / tasks).resolve())
    before = {section: _name_and_options(data, section) for section in _CHOICES}
    for assignment in overrides or []:
        apply_override(data, assignment)
    from fedfew.plugins import config_plugins

    # Before validation: a plugin registers the names the config may use.
    data["plugins"] = config_plugins(data.get("plugins"), Path(source).parent if isinstance(source, (str, Path)) else None)
    if isinstance(source, (str, Path)):
        _check_required(data, Path(source))
    for section, (name, options) in before.items():
        _drop_stale_options(data, section, name, options)
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        where = f"config file {source}: " if isinstance(source, (str, Path)) else ""  # which one of a batch
        raise ConfigError(where + _format(err, model=ExperimentConfig)) from None


_NOTED: set[str] = set()

#: What a config file (with its --set overrides) must say itself: a run on the defaults of these would
#: be a run nobody asked for (an empty file used to train fl-maml on digits for 50 rounds).
REQUIRED_KEYS = ("task", "dataset.name", "algorithm.name")


def _check_required(data: dict[str, Any], path: Path) -> None:
    missing = []
    for key in REQUIRED_KEYS:
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            missing.append(key)
    if missing:
        raise ConfigError(f"config file {path} does not set {', '.join(missing)}: a config names its task "
                          "(fewshot or classification), dataset and algorithm itself (defaults would run an "
                          "experiment nobody asked for)")

#: Sections whose options belong to the registered choice they sit beside: section -> (the key naming
#: the choice, the key of its options).
_CHOICES = {"partition": ("name", "options"), "model": ("name", "options"), "algorithm": ("name", "options"),
            "runtime": ("engine", "engine_options")}


def _name_and_options(data: dict[str, Any], section: str) -> tuple[Any, Any]:
    node = data.get(section)
    if not isinstance(node, dict):
        return None, None
    name_key, options_key = _CHOICES[section]
    options = node.get(options_key)
    return node.get(name_key, "inprocess" if section == "runtime" else None), copy.deepcopy(options)


def _accepted_options(section: str, name: str) -> set[str] | None:
    """The option names ``name`` accepts in ``section`` (None: unknown name, left to validation)."""
    import fedfew.algorithms  # noqa: F401  (registers algorithms)
    from fedfew.engine import ALGORITHMS
    from fedfew.engines import ENGINES
    from fedfew.models import MODELS
    from fedfew.partition import PARTITIONS
    from fedfew.registry import RegistryError
    from fedfew.signature_options import options_schema

    try:
        if section == "algorithm":
            return set(ALGORITHMS.get(name).Options.model_fields)
        if section == "runtime":
            return set(ENGINES.get(name).Options.model_fields)
        if section == "partition":  # ``corrupt`` belongs to no partitioner and suits them all
            from fedfew.corruption import KEY

            return {KEY, *options_schema(PARTITIONS.get(name), ("labels", "num_clients", "rng", "groups")).model_fields}
        return set(options_schema(MODELS.get(name), ("input_shape", "num_classes")).model_fields)
    except RegistryError:
        return None


def _drop_stale_options(data: dict[str, Any], section: str, old_name: Any, old_options: Any) -> None:
    """The rule for changing a choice from the command line (``--set partition.name=iid``): when an
    override changed ``SECTION.name``, the options the file gave the old choice that the new one does not
    take are dropped, with a logged note. An option set by an override is kept and validated as usual,
    so a mistyped one is still an error, and so is one in a file whose choice was not changed. The same
    holds for ``runtime.engine`` and its ``runtime.engine_options``."""
    name, options = _name_and_options(data, section)
    if name == old_name or not isinstance(name, str) or not isinstance(options, dict):
        return
    accepted = _accepted_options(section, name)
    if accepted is None:
        return
    from_file = old_options if isinstance(old_options, dict) else {}
    dropped = sorted(k for k in options if k not in accepted and k in from_file and from_file[k] == options[k])
    if dropped:
        name_key, options_key = _CHOICES[section]
        data[section][options_key] = {k: v for k, v in options.items() if k not in dropped}
        note = (f"{section}.{name_key} changed from {old_name} to {name}: dropped the options it does not take "
                f"({', '.join(f'{section}.{options_key}.{k}' for k in dropped)})")
        if note not in _NOTED:  # once per process: a study resolves the same change for many cells
            _NOTED.add(note)
            logging.getLogger(__name__).warning(note)


def dump_config(config: ExperimentConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
