"""Naming algorithms: the registry a config's ``algorithm.name`` looks up, the decorator that fills it, and
the rules that say which hooks a class must write before it may be registered.

Apart from :mod:`fedfew.interface.algorithm` so that the contract (what a class implements) and the
naming (how a config finds it, and what is checked before it may) are each one job.
"""

from __future__ import annotations

from collections.abc import Callable

from fedfew.core.registry import Registry
from fedfew.interface.algorithm import Algorithm, AlgorithmDefinitionError

__all__ = ["ALGORITHMS", "missing_hooks", "register"]

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")


def register(name: str, help: str = "") -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator: register an :class:`Algorithm` subclass under ``name``, the name a config's
    ``algorithm.name`` gives, and set the class's ``name`` attribute to it. ``help`` is the line
    ``fedfew list algorithms`` shows (default: the first line of the class docstring); the options'
    ``Field(description=...)`` are what ``fedfew list algorithms NAME`` adds. A name registered
    twice is an error.

    Example (the complete class is in :class:`Algorithm`'s docstring)::

        from fedfew import ALGORITHMS, Algorithm, register

        @register("my-fedavg", help="FedAvg: one epoch of minibatch SGD, sample-weighted averaging")
        class MyFedAvg(Algorithm):
            ...

        assert MyFedAvg.name == "my-fedavg" and ALGORITHMS.get("my-fedavg") is MyFedAvg

    In a package module under ``fedfew/algorithms/`` it registers on import; in a file of your own
    it does when the file is loaded as a plugin (``fedfew run my.yaml --plugin my_fedavg.py``, or
    ``plugins: [my_fedavg.py]`` in the config), and only then may a config name it.
    """

    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        missing = missing_hooks(cls)
        if missing:
            raise AlgorithmDefinitionError(f"algorithm {name!r} ({cls.__name__}) does not implement "
                                           f"{', '.join(missing)}: override {'it' if len(missing) == 1 else 'them'} "
                                           "(the hooks and when each is required: fedfew.Algorithm's docstring)")
        cls.name = name
        return ALGORITHMS.register(name, help=help or (cls.__doc__ or "").strip().split("\n")[0])(cls)

    return decorate


def _overrides(cls: type[Algorithm], hook: str) -> bool:
    return getattr(cls, hook) is not getattr(Algorithm, hook)


def _declared(cls: type[Algorithm], flag: str) -> bool | None:
    """A capability flag as the class sets it: True or False, or None where it is a property (it depends
    on the options, so only a built algorithm can say)."""
    value = getattr(cls, flag)
    return None if isinstance(value, property) else bool(value)


def missing_hooks(cls: type[Algorithm]) -> list[str]:
    """The hooks a class must write and does not, as the rules of :class:`Algorithm`'s docstring say:
    ``init_server`` always; ``client_update`` and ``aggregate`` unless it trains nothing (``trains``
    False) or plays its own rounds (``play_round``); an evaluation path: ``evaluate``, or
    ``episode_scores`` for ``splits_evaluation``, or ``evaluate_client`` and ``combine_evaluations`` for
    ``evaluates_clients``. A flag that is a property (set by the options) is taken as possibly on, so
    only what every option would need is asked of the class; the rest fails where it is called."""
    needed = ["init_server"]
    if _declared(cls, "trains") is not False and not _overrides(cls, "play_round"):
        needed += ["client_update", "aggregate"]
    splits, on_clients = _declared(cls, "splits_evaluation"), _declared(cls, "evaluates_clients")
    if splits:
        needed.append("episode_scores")
    if on_clients:
        needed += ["evaluate_client", "combine_evaluations"]
    if splits is False and on_clients is False:
        needed.append("evaluate")
    return [hook for hook in needed if not _overrides(cls, hook)]
