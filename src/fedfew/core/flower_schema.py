"""The ``flower`` section of an experiment config: Flower's Simulation Engine (``flower.sim``) and secure
aggregation (``flower.secure_aggregation``, Flower's SecAgg+); part of :class:`fedfew.core.config_schema.
ExperimentSchema`, which re-exports them."""

from __future__ import annotations

from pydantic import Field, model_validator

from fedfew.core.options import Section


class FlowerSimConfig(Section):
    """Flower's Simulation Engine on Ray (runtime.engine: flower-sim)."""

    #: CPUs (and GPU fraction) Ray reserves per ClientApp actor: how many clients run at once.
    num_cpus: float = Field(1.0, gt=0)
    num_gpus: float = Field(0.0, ge=0)
    #: A Ray cluster to join ("HOST:PORT" of `ray start --head`); None: a private Ray instance.
    address: str | None = None
    #: More ray.init arguments (e.g. num_cpus for the private instance, _temp_dir).
    init_args: dict[str, object] = Field(default_factory=dict)


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
    #: Seconds to wait for every SuperNode to connect and load its data (flower-sim: also for the CPUs and
    #: GPUs its actors need on a Ray cluster where another job holds them).
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
