"""The progress bar of a run (rounds done of ``federation.rounds``), wherever the run trains."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedfew.configschema import ExperimentSchema


def progress_bar(config: ExperimentSchema, label: str | None, done: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=config.federation.rounds, initial=done, desc=label or config.algorithm.name, unit="round",
                leave=True, dynamic_ncols=True)
