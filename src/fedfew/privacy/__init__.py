"""Client-level differential privacy on every engine (config ``privacy``; docs/privacy.md).

* :mod:`fedfew.privacy.clipping`: the client side, run where the client trains: its update clipped to
  L2 norm C (and, ``local-dp``, noised) before it leaves;
* :mod:`fedfew.privacy.mechanism`: the server side: DP-FedAvg's noised average with a fixed
  denominator, adaptive clipping (Andrew et al. 2021), and the report;
* :mod:`fedfew.privacy.accounting`: Opacus's RDP or PRV accountant, epsilon from (sampling rate, noise
  multiplier, rounds, delta) and a noise multiplier from a target epsilon;
* :mod:`fedfew.privacy.coverage`: which algorithms' uploads are covered, and why the others refuse.
"""

from fedfew.privacy.accounting import ACCOUNTANTS, PrivacyBudgetError, epsilon, solve_noise_multiplier
from fedfew.privacy.clipping import ClientSpec, clip_to, l2_norm, model_delta, privatize
from fedfew.privacy.coverage import COVERED_UPLOADS, PrivacyConfigError, check_algorithm, refused_because
from fedfew.privacy.mechanism import PrivateAggregation

__all__ = [
    "ACCOUNTANTS", "COVERED_UPLOADS", "ClientSpec", "PrivacyBudgetError", "PrivacyConfigError",
    "PrivateAggregation", "check_algorithm", "clip_to", "epsilon", "l2_norm", "model_delta", "privatize",
    "refused_because",
    "solve_noise_multiplier",
]
