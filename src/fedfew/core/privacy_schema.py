"""The ``privacy`` section of an experiment config: client-level differential privacy and its adaptive
clip (docs/privacy.md); part of :class:`fedfew.core.config_schema.ExperimentSchema`, which re-exports
them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedfew.core.options import Section


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
    #: C: the L2 norm each client's update is clipped to (the initial clip with adaptive_clip). At most
    #: 1e6: a larger clip clips nothing, and its noise z x C overflows float32 models.
    clip: float | None = Field(default=None, gt=0, le=1e6)
    #: z: the noise's standard deviation is z x C (on the sum, central-dp; on each update, local-dp).
    noise_multiplier: float | None = Field(default=None, gt=0, le=1e6)  # above 1e6 the accountant overflows
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
    #: Where the noise (and, under DP with a sampling rate below 1, the clients of each round) comes from:
    #: "secure" (OS randomness, drawn where it is added: nobody can regenerate it) or "seeded" (research
    #: mode: from the run's seed, reproducible, so not private against anyone who holds the seed).
    noise: Literal["secure", "seeded"] = "secure"
    #: What epsilon assumes about who took part (docs/privacy.md): "poisson" (each client independently
    #: with probability q, from a secret generator), "without_replacement" (a secret fixed-size sample,
    #: replace-one adjacency) or "none" (no amplification: the most rounds any client took part in).
    #: None: poisson, except local-dp and noise: seeded, where the sample is no secret (none).
    accounting: Literal["poisson", "without_replacement", "none"] | None = None
    #: Save the clients' private (un-noised) states to RUN/model/clients/ in a DP run; by default they
    #: are not saved, since the guarantee does not cover them.
    keep_private_states: bool = False

    @model_validator(mode="after")
    def _complete(self) -> PrivacyConfig:
        if self.mechanism == "none":
            # A key given beside mechanism none would be silently ignored: refused when it differs from its
            # default, or at all when mechanism is not given (``privacy: {client_metrics: false}``); a
            # resolved config's full section (mechanism none, every key at its default) stays valid.
            explicit = "mechanism" in self.model_fields_set
            fields = type(self).model_fields
            given = [k for k in fields if k != "mechanism" and k in self.model_fields_set
                     and (not explicit or getattr(self, k) != fields[k].default)]
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
        if self.mechanism == "local-dp" and self.accounting not in (None, "none"):
            raise ValueError(f"privacy.accounting={self.accounting}: under local-dp the server sees which clients "
                             "upload, so no amplification by sampling holds against it: use privacy.accounting: none "
                             "(local-dp's default)")
        if self.accounting == "without_replacement" and self.accountant != "rdp":
            raise ValueError(f"privacy.accountant={self.accountant}: accounting without_replacement is dp-accounting's "
                             "RDP bound: use privacy.accountant: rdp")
        return self

    def accounting_mode(self, secure_aggregation: bool = False) -> str:
        """What epsilon assumes about participation: the given ``accounting``, else "none" where the
        sample is no secret (local-dp's server sees it; seeded mode derives it from the seed), else
        "without_replacement" under secure aggregation (SecAgg+ needs a fixed number of clients a
        round), else "poisson"."""
        if self.accounting is not None:
            return self.accounting
        if self.mechanism == "local-dp" or self.noise == "seeded":
            return "none"
        return "without_replacement" if secure_aggregation else "poisson"

    @property
    def enabled(self) -> bool:
        return self.mechanism != "none"
