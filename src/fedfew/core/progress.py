"""The progress bar of a run (rounds done of ``federation.rounds``), wherever the run trains."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fedfew.core.config_schema import ExperimentSchema


class ProgressBar(Protocol):
    """What fedfew uses of a tqdm bar (tqdm itself ships no type information)."""

    n: float

    def update(self, n: float = 1) -> bool | None: ...
    def set_postfix(self, ordered_dict: Mapping[str, object] | None = None, refresh: bool = True) -> None: ...
    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...
    def close(self) -> None: ...


def progress_bar(config: ExperimentSchema, label: str | None, done: int) -> ProgressBar:
    """A tqdm bar of rounds done of ``federation.rounds``, starting at ``done`` (a resumed run)."""
    from tqdm.auto import tqdm

    return tqdm(total=config.federation.rounds, initial=done, desc=label or config.algorithm.name, unit="round",
                leave=True, dynamic_ncols=True)
