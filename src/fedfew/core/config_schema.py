"""The schema of an experiment config: its sections, their fields and defaults, and the checks a
config's own values decide (bounds, faults, privacy settings, the old ``runtime.workers``).

Names a config gives (dataset, partition, model, algorithm, engine) and their options are checked
against the registries by :class:`fedfew.config.validation.ExperimentConfig`, which extends
:class:`ExperimentSchema` one layer up: this module imports nothing of fedfew above the foundations,
so that any layer may type against a config (docs/architecture.md). Validate configs through
:mod:`fedfew.config.validation`; its module re-exports every section named here.
"""

from __future__ import annotations

import difflib
import logging
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from fedfew.core.flower_schema import FlowerConfig, FlowerSimConfig, SecureAggregationConfig
from fedfew.core.options import Section
from fedfew.core.privacy_schema import AdaptiveClipConfig, PrivacyConfig

#: The longest run name (``name``): its folder adds a 16-character time stamp, within a file name's 255 bytes.
MAX_NAME = 200

__all__ = ["MAX_CLIENTS", "MAX_EPISODES", "MAX_ROUNDS", "AdaptiveClipConfig", "AlgorithmConfig", "ClassificationConfig",
           "DatasetConfig", "DivergenceConfig", "EpisodeConfig", "EvalConfig", "ExperimentSchema", "FederationConfig",
           "FlowerConfig", "FlowerSimConfig", "HeldOutTest", "MembershipInferenceConfig", "ModelConfig", "PartitionConfig",
           "PrivacyConfig", "RuntimeConfig", "SecureAggregationConfig", "Section", "SplitConfig", "allowed_keys", "format_errors"]

#: The deprecation note of ``runtime.workers`` keeps the logger of :mod:`fedfew.config.validation`, where the schema
#: lived before (``fedfew study`` quietens that logger by name).
logger = logging.getLogger("fedfew.config.validation")


#: Bounds on counts that size what a run holds in memory before its first round (the client schedule is
#: drawn for every round at the start; ~55 KB per client stay in the main process, docs/performance.md):
#: past them a run would grow silently for minutes instead of starting.
MAX_ROUNDS = 1_000_000
MAX_CLIENTS = 1_000_000
MAX_EPISODES = 1_000_000


class DatasetConfig(Section):
    name: str = "digits"
    root: str | None = None
    options: dict[str, object] = Field(default_factory=dict)


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
    def _held_out(cls, value: object) -> object:
        # a mapping is held-out samples: its errors name splits.test.<key>, not both forms of the union
        if not isinstance(value, dict):
            return value
        try:
            return HeldOutTest.model_validate(value)
        except ValidationError as err:
            raise ValueError(format_errors(err, "splits.test", HeldOutTest, header=False)) from None


class ClassificationConfig(Section):
    """Sample splits for classification tasks (FML, AdFL)."""

    test_fraction: float = Field(0.2, gt=0, lt=1)
    client_val_fraction: float = Field(0.0, ge=0, lt=1)


class PartitionConfig(Section):
    name: str = "dirichlet"
    num_clients: int = Field(10, ge=1, le=MAX_CLIENTS)
    options: dict[str, object] = Field(default_factory=dict)
    #: Entropy for ``numpy.random.default_rng`` in place of the generator derived from the seed: to
    #: reproduce another tool's partition draw for draw (benchmarks/peers.yaml: [seed, 0]).
    rng_entropy: list[int] | None = None


class ModelConfig(Section):
    name: str = "conv4"
    options: dict[str, object] = Field(default_factory=dict)
    channels_last: bool = True
    #: Build the server's initial model right after torch.manual_seed(init_seed) instead of a seed
    #: derived from the experiment's: to start from the very model another tool starts from.
    init_seed: int | None = None


class AlgorithmConfig(Section):
    name: str = "fl-maml"
    options: dict[str, object] = Field(default_factory=dict)


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
    #: The training episodes' way and queries per class where they differ from the evaluation's (None:
    #: n_way and q_query). Prototypical Networks train on 60-way episodes and test on 5- and 20-way ones
    #: (Snell et al. 2017, section 3.1): only an algorithm whose model has no n_way head takes them (fl-proto).
    train_way: int | None = Field(None, ge=2)
    train_query: int | None = Field(None, ge=1)
    val_episodes: int = Field(100, ge=1, le=MAX_EPISODES)
    test_episodes: int = Field(600, ge=1, le=MAX_EPISODES)
    #: A JSON file of fixed test tasks (dataset positions) used instead of drawing test_episodes:
    #: to score on exactly the tasks another tool or paper used. See fedfew.fewshot.episodes.load_tasks.
    test_tasks: str | None = None


class MembershipInferenceConfig(Section):
    """The loss-threshold membership-inference attack on the released model (``eval.membership_inference``;
    :mod:`fedfew.privacy.membership`, docs/privacy-study.md)."""

    #: Examples of the training classes held out from every client as the non-members, each attacked
    #: beside one member example of its class (at most a quarter of the training examples).
    examples: int = Field(500, ge=10, le=100_000)
    #: Bootstrap draws (over examples) for the advantage's 95% interval.
    bootstrap: int = Field(1000, ge=100, le=100_000)


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
    #: Attack the selected model with the loss-threshold membership-inference attack and add
    #: ``membership`` to the summary (few-shot methods scored on the server's model). Off by default
    #: (None); computed after the score, from generators of its own, so the scores stay as without it.
    membership_inference: MembershipInferenceConfig | None = None
    #: Round 0, the initial model scored before any training: "always" (the default; every run reports
    #: ``initial_score``, which study cells and their untrained controls read) or "auto" (scored only
    #: where something reads it: a selection on validation, or a run of 0 rounds). "auto" saves one
    #: evaluation pass of a run without validation; the summary then says ``initial_scored: false``.
    initial: Literal["always", "auto"] = "always"


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
    #: matrix products to bfloat16 (parameters stay float32); "auto": bf16 where the hardware computes
    #: it natively (a CPU with AVX-512 BF16 or AMX, a GPU torch says supports it), else fp32 (bf16
    #: emulated on a CPU is several times slower than fp32: fedfew.interface.precision). Not the default:
    #: a run's numbers would then depend on the machine.
    precision: Literal["fp32", "tf32", "bf16", "auto"] = "fp32"
    #: Where the clients run (``fedfew list engines``): "inprocess" (this process), "workers" (worker
    #: processes, one thread each), "flower" (Flower's deployment runtime: a SuperLink and one
    #: SuperNode per client as separate processes; docs/deployment.md) or "flower-sim" (Flower's
    #: Simulation Engine on Ray; flower.sim.*).
    engine: str = "inprocess"
    #: The engine's options, e.g. ``{workers: 4}`` for the workers engine (unknown keys are errors).
    engine_options: dict[str, object] = Field(default_factory=dict)
    #: Run the local updates of a round's clients as one batched computation in this process (one
    #: device; runtime.engine: inprocess): the episodic family (fl-maml, fl-proto, fedfsl-prox) on
    #: stackable models (Conv4). Equal to the sequential path up to floating-point summation order
    #: (tests/engine/test_batched.py).
    batch_clients: bool = False
    #: torch.compile of the batched clients' stacked forward and loss (runtime.batch_clients) and of the
    #: model's forward on the sequential path in this process: "off" (the default: eager), "default"
    #: (inductor) or "reduce-overhead" (inductor with CUDA graphs on a GPU: a round's static-shape
    #: episodes captured once and replayed). Equal to eager within float32 rounding
    #: (tests/run/test_experiment.py); compiling costs seconds to minutes at the first round.
    compile: Literal["off", "default", "reduce-overhead"] = "off"

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_off(cls, value: object) -> object:
        """YAML reads a bare ``off`` as false (and ``on`` as true): false is "off", true "default"."""
        if value is False:
            return "off"
        return "default" if value is True else value
    #: Experiment trackers writing into the run folder: "tensorboard", "mlflow" (fedfew.core.tracking).
    loggers: list[str] = Field(default_factory=list)
    #: When a finite but exploding run stops as diverged (:class:`DivergenceConfig`).
    divergence: DivergenceConfig = Field(default_factory=DivergenceConfig)

    @model_validator(mode="before")
    @classmethod
    def _workers_alias(cls, data: object) -> object:
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


class ExperimentSchema(Section):
    """A whole config as the schema alone checks it. :class:`fedfew.config.validation.ExperimentConfig` adds the
    checks against the registries; lower layers type against this class, which it extends."""

    #: The run's label; its folder is ``NAME-<date>-<time>``, so it may not start with a dot (a hidden
    #: folder, or ``.``/``..``) nor exceed :data:`MAX_NAME` characters (a file name holds 255 bytes).
    name: str = Field(default="experiment", min_length=1, max_length=MAX_NAME)
    seed: int = 0
    task: Literal["fewshot", "classification"] = "fewshot"

    @field_validator("name")
    @classmethod
    def _visible_name(cls, name: str) -> str:
        if name.strip().startswith("."):
            raise ValueError(f"name {name!r} starts with a dot: its run folder would be hidden (or be . or ..); "
                             "start it with a letter or digit")
        return name
    #: Python files imported before validation (fedfew.config.plugins); relative paths from the config's folder.
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


def allowed_keys(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> list[str]:
    """Field names allowed at ``loc`` (for 'did you mean' hints)."""
    current: object = model
    for part in loc[:-1]:
        if current is None or not hasattr(current, "model_fields") or part not in current.model_fields:
            return []
        current = current.model_fields[part].annotation
    return list(current.model_fields) if current is not None and hasattr(current, "model_fields") else []


def format_errors(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None, header: bool = True) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in ((prefix,) if prefix else ()) + loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = allowed_keys(model, loc)
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
