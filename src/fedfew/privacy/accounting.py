"""Privacy accounting: (sampling rate, noise multiplier, rounds, delta) -> epsilon, and back.

Opacus's accountants (``opacus.accountants``, Meta's PyTorch DP library): the RDP accountant (Renyi DP
of the Poisson-subsampled Gaussian mechanism, Mironov et al. 2019, converted to (epsilon, delta)) or the
PRV accountant (Gopi et al. 2021, numerically composed privacy random variables). One round of
DP-FedAvg is one step of the subsampled Gaussian mechanism with sampling rate q = clients per round /
clients, as in McMahan et al. 2018. fedfew samples a fixed number of clients without replacement each
round; accounting it as Poisson sampling with the same rate is the standard approximation the
DP-FedAvg papers use (McMahan et al. 2018, Andrew et al. 2021), and it is what is reported here.

Opacus is imported only when a private run needs it.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any

from fedfew.errors import UsageError

__all__ = ["ACCOUNTANTS", "PrivacyBudgetError", "accountant_name", "epsilon", "solve_noise_multiplier"]

logger = logging.getLogger(__name__)

#: The accountants ``privacy.accountant`` may name, with what they are.
ACCOUNTANTS = {
    "rdp": "Opacus RDP accountant of the Poisson-subsampled Gaussian",
    "prv": "Opacus PRV accountant of the Poisson-subsampled Gaussian",
}
#: How close to the target a solved noise multiplier's epsilon is (Opacus's search tolerance).
EPSILON_TOLERANCE = 0.01


class PrivacyBudgetError(UsageError):
    """A target epsilon no noise multiplier reaches (exit 2)."""


def accountant_name(name: str) -> str:
    """What a report calls accountant ``name``: "rdp (Opacus 1.6.0: ...)"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        opacus = f"Opacus {version('opacus')}"
    except PackageNotFoundError:
        opacus = "Opacus"
    return f"{name} ({ACCOUNTANTS[name].replace('Opacus', opacus, 1)})"


def _accountant(name: str) -> Any:
    from opacus.accountants import create_accountant

    return create_accountant(mechanism=name)


def epsilon(accountant: str, noise_multiplier: float, sampling_rate: float, rounds: int, delta: float) -> float:
    """Epsilon at ``delta`` after ``rounds`` steps of the Gaussian mechanism with ``noise_multiplier``
    (noise standard deviation / L2 sensitivity), Poisson-subsampled at ``sampling_rate``: the accountant's
    own call, ``accountant.history = [(z, q, T)]; accountant.get_epsilon(delta)``. 0 for no round."""
    if rounds <= 0:
        return 0.0
    acc = _accountant(accountant)
    acc.history = [(noise_multiplier, sampling_rate, rounds)]
    with warnings.catch_warnings():
        # "Optimal order is the largest alpha": the bound holds, it is only looser than it could be.
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(delta=delta))


@functools.lru_cache(maxsize=64)
def solve_noise_multiplier(accountant: str, target_epsilon: float, sampling_rate: float, rounds: int,
                           delta: float) -> float:
    """The smallest noise multiplier (to Opacus's search tolerance) whose epsilon after ``rounds`` is at
    most ``target_epsilon``: ``opacus.accountants.utils.get_noise_multiplier``. Its epsilon is within
    :data:`EPSILON_TOLERANCE` below the target."""
    from opacus.accountants.utils import get_noise_multiplier

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            z = get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=sampling_rate,
                                     steps=rounds, accountant=accountant, epsilon_tolerance=EPSILON_TOLERANCE)
    except ValueError as err:
        raise PrivacyBudgetError(f"privacy.target_epsilon={target_epsilon:g} at delta={delta:g} cannot be reached in "
                                 f"{rounds} rounds at sampling rate {sampling_rate:g} ({err}); raise it") from None
    return float(z)
