"""What the sections of a config ask of one another, beyond what each section's own values decide (the
schema, :mod:`fedfew.core.config_schema`): what the named engine allows (compiled steps, batched clients,
a device), the round's size and that some client replies in every round, what privacy contradicts in the
rest of the config, and what secure aggregation needs of the engine, the algorithm, the rounds and
privacy. :class:`fedfew.config.validation.ExperimentConfig` runs them in that order, after the names and
options are checked against the registries; each raises ``ValueError`` (pydantic makes it the config's
error) with the keys to change."""

from __future__ import annotations

from fedfew.core.config_schema import ExperimentSchema


def check_engine(config: ExperimentSchema) -> None:
    """What the named engine asks of the rest of the config: its own
    :meth:`~fedfew.engine.base.Engine.check_config`, through the registry (compiled steps, batched clients
    and a device run only in this process; the deployment engine's parties hold the config)."""
    from fedfew.config.engines import ENGINES

    ENGINES.get(config.runtime.engine).check_config(config)


def check_rounds(config: ExperimentSchema) -> None:
    """A round asks at most every client (``federation.clients_per_round``), and some client replies in
    it (:func:`check_replies`)."""
    fpr = config.federation.clients_per_round
    if isinstance(fpr, int) and fpr > config.partition.num_clients:
        raise ValueError(
            f"federation.clients_per_round={fpr} exceeds partition.num_clients={config.partition.num_clients}"
        )
    if isinstance(fpr, float) and fpr > 1.0:
        raise ValueError("federation.clients_per_round as a fraction must be in (0, 1]")
    check_replies(config)


def check_replies(config: ExperimentSchema) -> None:
    """Some client must reply in every round: the fault counts are rounded exactly as the fault
    draw rounds them (engine.Faults.counts) for the round size the schedule uses."""
    from fedfew.engine.base import Faults
    from fedfew.engine.schedule import round_size

    f = config.federation
    if f.dropout == 0 and f.stragglers == 0:
        return
    asked = round_size(config.partition.num_clients, f.clients_per_round)
    failed, late = Faults(f.dropout, f.stragglers).counts(asked)
    if asked - failed - late <= 0:
        raise ValueError(
            f"federation.dropout={f.dropout} and federation.stragglers={f.stragglers} leave no client to reply "
            f"in a round of {asked} (federation.clients_per_round={f.clients_per_round}, partition.num_clients="
            f"{config.partition.num_clients}): {failed} fail and {late} are late; lower them or ask more clients")


def check_privacy(config: ExperimentSchema) -> None:
    """What privacy settings contradict in the rest of the config (the algorithm's upload is
    checked when it is built: fedfew.privacy.check_algorithm)."""
    p = config.privacy
    if not p.enabled:
        return
    from fedfew.config.engines import ENGINES
    from fedfew.engine.schedule import round_size

    clients = config.partition.num_clients
    if p.delta is not None and p.delta >= 1 / clients:
        raise ValueError(f"privacy.delta={p.delta:g} must be below 1 / partition.num_clients = {1 / clients:g}: "
                         "a delta that large allows leaking one client's data outright")
    engine = ENGINES.get(config.runtime.engine)
    if not getattr(engine, "honours_privacy", False):
        raise ValueError(f"privacy: runtime.engine={config.runtime.engine} does not run client updates through "
                         "fedfew's client task (fedfew.engine.tasks.run_client_task), where updates are clipped: "
                         "use inprocess, workers, flower or flower-sim")
    if p.adaptive_clip is not None and config.algorithm.name == "frl":  # before the count's noise: it never runs
        raise ValueError("privacy.adaptive_clip: algorithm frl runs with a fixed clip only: adaptive clipping of "
                         "its R + 1 releases per episode is not implemented (remove privacy.adaptive_clip)")
    if p.adaptive_clip is not None and p.noise_multiplier is not None:
        from fedfew.privacy.mechanism import adaptive_clip_refusal

        m = round_size(clients, config.federation.clients_per_round)
        count_noise = p.adaptive_clip.count_noise or m / 20
        if 2 * count_noise <= p.noise_multiplier:
            raise ValueError(adaptive_clip_refusal(count_noise, p.noise_multiplier, m,
                                                   p.adaptive_clip.count_noise is None))
    if p.accounting == "poisson" and config.flower.secure_aggregation.enabled:
        raise ValueError("privacy.accounting=poisson: a Poisson round may ask fewer than the 2 clients secure "
                         "aggregation needs, and SecAgg+ tells each client its neighbours: use "
                         "privacy.accounting: without_replacement or none")


def check_secure_aggregation(config: ExperimentSchema) -> None:
    """What ``flower.secure_aggregation`` needs of the engine, the algorithm, the rounds and privacy
    (the protocol's own values are checked by :class:`fedfew.core.config_schema.SecureAggregationConfig`)."""
    s = config.flower.secure_aggregation
    if not s.enabled:
        return
    from fedfew.config.engines import ENGINES
    from fedfew.engine.base import Faults
    from fedfew.engine.schedule import round_size
    from fedfew.interface.registration import ALGORITHMS
    from fedfew.privacy.secure_sum import protocol_sizes, refusal

    key = "flower.secure_aggregation"
    if not getattr(ENGINES.get(config.runtime.engine), "honours_secure_aggregation", False):
        raise ValueError(f"{key}: runtime.engine={config.runtime.engine} cannot honour it (its server would see each "
                         "client's upload): use runtime.engine: flower or flower-sim")
    algorithm = ALGORITHMS.get(config.algorithm.name)
    reason = refusal(algorithm, algorithm.Options.model_validate(config.algorithm.options))
    if reason is not None:
        raise ValueError(f"{key}: algorithm {config.algorithm.name} cannot run with secure aggregation: {reason}")
    f = config.federation
    if f.stragglers > 0:
        raise ValueError(f"{key}: federation.stragglers={f.stragglers} drops replies after they arrive, but a masked "
                         "sum cannot drop one client's part: set federation.stragglers: 0")
    asked = round_size(config.partition.num_clients, f.clients_per_round)
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
    p = config.privacy
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
