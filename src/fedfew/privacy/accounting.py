"""Privacy accounting: (noise multiplier, participation, rounds, delta) -> epsilon, and back.

What epsilon assumes about who took part in a round is ``privacy.accounting`` (:data:`ACCOUNTING`):

* ``poisson``: each client takes part independently with probability q, and nobody but the server
  knows who did (McMahan et al. 2018's DP-FedAvg). Opacus's accountants (``privacy.accountant``): the
  RDP accountant (Renyi DP of the Poisson-subsampled Gaussian, Mironov et al. 2019) or the PRV
  accountant (Gopi et al. 2021). Add/remove-one adjacency, sensitivity C.
* ``without_replacement``: a fixed number m of the N clients, drawn without replacement and kept
  secret. Google's dp-accounting (``SampledWithoutReplacementDpEvent``, RDP of Wang, Balle and
  Kasiviswanathan 2019), which holds at replace-one adjacency: replacing one client's data moves the
  sum of m clipped updates by up to 2C, so the Gaussian it is given has multiplier z / 2.
* ``none``: no amplification: every release the client took part in is an un-subsampled Gaussian
  (the accountant of ``privacy.accountant`` at sampling rate 1, which is dp-accounting's
  ``GaussianDpEvent`` too), composed over the most rounds any one client took part in.
  What holds against anyone who knows the sample (a reader of a seeded run's schedule, the server
  under local-dp).

Opacus and dp-accounting are imported only when a private run needs them.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any

from fedfew.core.errors import UsageError

__all__ = ["ACCOUNTANTS", "ACCOUNTING", "PrivacyBudgetError", "accountant_name", "accounted_epsilon", "epsilon",
           "epsilon_without_replacement", "solve_for"]

logger = logging.getLogger(__name__)

#: The accountants ``privacy.accountant`` may name, with what they are.
ACCOUNTANTS = {
    "rdp": "Opacus RDP accountant of the Poisson-subsampled Gaussian",
    "prv": "Opacus PRV accountant of the Poisson-subsampled Gaussian",
}
#: The participation ``privacy.accounting`` may assume, with what epsilon then means.
ACCOUNTING = {
    "poisson": "each client takes part with probability q, the sample kept secret by the server",
    "without_replacement": "a fixed number of clients a round without replacement, the sample kept secret by the "
                           "server (replace-one adjacency)",
    "none": "no amplification by sampling: the most rounds any client took part in, each a full Gaussian release",
}
#: How close to the target a solved noise multiplier's epsilon is (Opacus's search tolerance).
EPSILON_TOLERANCE = 0.01


class PrivacyBudgetError(UsageError):
    """A target epsilon no noise multiplier reaches (exit 2)."""


def accountant_name(name: str, accounting: str = "poisson") -> str:
    """What a report calls accountant ``name``: "rdp (Opacus 1.6.0: ...)", "at sampling rate 1" for
    accounting none; dp-accounting's for without_replacement."""
    from importlib.metadata import PackageNotFoundError, version

    if accounting == "without_replacement":
        try:
            own = f"dp-accounting {version('dp-accounting')}"
        except PackageNotFoundError:
            own = "dp-accounting"
        return f"rdp ({own}: RDP accountant of the sampled-without-replacement Gaussian, replace-one adjacency)"
    try:
        opacus = f"Opacus {version('opacus')}"
    except PackageNotFoundError:
        opacus = "Opacus"
    at_one = " at sampling rate 1 (no amplification)" if accounting == "none" else ""
    return f"{name} ({ACCOUNTANTS[name].replace('Opacus', opacus, 1)}{at_one})"


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


def _dp_accounting_epsilon(event: Any, count: int, delta: float, replace_one: bool) -> float:
    """dp-accounting's RDP accountant's epsilon for ``count`` compositions of ``event``."""
    from dp_accounting import privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    relation = privacy_accountant.NeighboringRelation
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=relation.REPLACE_ONE if replace_one else relation.ADD_OR_REMOVE_ONE)
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # "failed to converge ... excluding this order": the bound still holds
    try:
        accountant.compose(event, count)
        return float(accountant.get_epsilon(delta))
    finally:
        absl.setLevel(level)


def epsilon_without_replacement(noise_multiplier: float, population: int, sample: int, rounds: int,
                                delta: float) -> float:
    """Epsilon after ``rounds`` releases of a sum over ``sample`` of ``population`` clients drawn without
    replacement, each a Gaussian of ``noise_multiplier`` relative to the replace-one sensitivity (the
    caller halves z, whose sensitivity is C)."""
    if rounds <= 0:
        return 0.0
    from dp_accounting import dp_event

    event = dp_event.SampledWithoutReplacementDpEvent(population, sample, dp_event.GaussianDpEvent(noise_multiplier))
    return _dp_accounting_epsilon(event, rounds, delta, replace_one=True)


def accounted_epsilon(accounting: str, accountant: str, noise_multiplier: float, population: int, sample: int,
                      rounds: int, delta: float) -> float:
    """Epsilon under ``accounting`` (:data:`ACCOUNTING`): ``noise_multiplier`` is relative to the
    add/remove sensitivity C (halved here for the replace-one bound of without_replacement);
    ``rounds`` is the rounds run (poisson, without_replacement) or the most any client took part in
    (none)."""
    if accounting == "poisson":
        return epsilon(accountant, noise_multiplier, sample / population, rounds, delta)
    if accounting == "without_replacement":
        return epsilon_without_replacement(noise_multiplier / 2, population, sample, rounds, delta)
    if accounting == "none":  # every release a full Gaussian: the accountant at sampling rate 1
        return epsilon(accountant, noise_multiplier, 1.0, rounds, delta)
    raise ValueError(f"unknown accounting {accounting!r}")


@functools.lru_cache(maxsize=64)
def solve_for(accounting: str, accountant: str, target_epsilon: float, population: int, sample: int, rounds: int,
              delta: float) -> float:
    """The smallest noise multiplier (relative to C) whose :func:`accounted_epsilon` after ``rounds`` is
    at most ``target_epsilon``: Opacus's own solver for poisson and none (rate 1), a bisection on
    dp-accounting's epsilon to the same tolerance for without_replacement."""
    if accounting == "poisson":
        return solve_noise_multiplier(accountant, target_epsilon, sample / population, rounds, delta)
    if accounting == "none":  # Opacus's own accountant at sampling rate 1: its own solver
        return solve_noise_multiplier(accountant, target_epsilon, 1.0, rounds, delta)

    def eps(z: float) -> float:
        return accounted_epsilon(accounting, accountant, z, population, sample, rounds, delta)

    low, high = 0.0, 1.0
    while eps(high) > target_epsilon:
        low, high = high, 2 * high
        if high > 1e6:
            raise PrivacyBudgetError(f"privacy.target_epsilon={target_epsilon:g} at delta={delta:g} cannot be reached "
                                     f"in {rounds} rounds with accounting {accounting} (a noise multiplier above 1e6 "
                                     "would be needed); raise it")
    while eps(high) < target_epsilon - EPSILON_TOLERANCE:  # Opacus's criterion: within the tolerance below
        middle = (low + high) / 2
        if eps(middle) > target_epsilon:
            low = middle
        else:
            high = middle
        if high - low < 1e-9:
            break
    return high
