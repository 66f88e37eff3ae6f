"""What a run's data was, written to ``RUN/data.json``: where it came from and how big it is, the
resolved class split (class names per split, whatever ``class_split`` said), and the partition's
per-client class counts. Enough to tell, from the run folder alone, which classes trained the
clients, which selected the model and which tested it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch

from fedfew.core.integrity import fingerprint
from fedfew.core.jsontypes import JSONObject
from fedfew.data.registry import BUNDLED, data_root

if TYPE_CHECKING:
    from fedfew.run.experiment import Experiment


class ClientCounts(TypedDict):
    """One client's row of ``data.json``'s ``clients``."""

    client: int
    samples: int
    classes: dict[str, int]  # class name -> samples, for the classes the client holds


class DataSource(TypedDict, total=False):
    """Where the data came from (spread into the data record)."""

    data_folder: str | None
    bundled: bool
    source: str | None
    source_bytes: int | None  # only when the source exists
    #: What identifies the source's content (fedfew.core.integrity.fingerprint): a resume or evaluate of the
    #: run refuses other data under the same name. Absent for bundled data and the whole data folder.
    fingerprint: JSONObject | None

#: A source folder larger than this many files is not walked to sum its size.
MAX_FILES = 100_000


def data_record(experiment: Experiment) -> dict[str, object]:
    """The data record of a built :class:`~fedfew.run.experiment.Experiment`."""
    config, dataset = experiment.config, experiment.dataset
    names = dataset.class_names
    record: dict[str, object] = {
        "dataset": config.dataset.name,
        "options": config.dataset.options,
        **source_of(config.dataset.name, config.dataset.root, config.dataset.options, dataset.extras),
        "samples": len(dataset),
        "classes": dataset.num_classes,
        "input_shape": list(dataset.input_shape),
    }
    if config.task == "fewshot":
        record["class_split"] = {split: [names[c] for c in classes] for split, classes in dataset.splits.items()}
        record["splits_used"] = config.splits.model_dump()
    record["test_samples"] = (len(experiment.test.dataset) if experiment.test.dataset is not None
                              else None)
    record["clients"] = [client_counts(c.client_id, c.train.labels, names) for c in experiment.clients]
    return record


def client_counts(client_id: int, labels: torch.Tensor, names: list[str]) -> ClientCounts:
    """{"client", "samples", "classes": {class name: count}} (classes the client holds, by id order)."""
    counts = torch.bincount(labels.cpu(), minlength=len(names))
    held = torch.nonzero(counts).flatten().tolist()
    return {"client": client_id, "samples": int(counts.sum()), "classes": {names[c]: int(counts[c]) for c in held}}


def source_of(name: str, root: str | None, options: Mapping[str, object], extras: Mapping[str, object]) -> DataSource:
    """The data folder, the most specific source path known (the loader's own file, a ``path``
    option under the data folder, or the folder named after the dataset) and its size in bytes."""
    folder, _ = data_root(root)
    given, path_option = extras.get("source"), options.get("path")
    source = given if isinstance(given, str) else None
    if source is None and isinstance(path_option, str):
        source = str(folder / path_option)
    if source is None and name not in BUNDLED:
        guess = folder / name
        source = str(guess) if guess.exists() else str(folder)
    out: DataSource = {"data_folder": None if name in BUNDLED else str(folder.resolve()),
                           "bundled": name in BUNDLED, "source": source}
    if source is not None and Path(source).exists():
        out["source_bytes"] = size_of(Path(source))
        # the whole data folder holds other datasets too: not fingerprinted (None: said so, not forgotten)
        out["fingerprint"] = fingerprint(Path(source)) if Path(source).resolve() != folder.resolve() else None
    return out


def size_of(path: Path) -> int | None:
    """Bytes of a file, or of every file under a folder (None above :data:`MAX_FILES` files)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for count, item in enumerate(path.rglob("*")):
        if count >= MAX_FILES:
            return None
        if item.is_file():
            total += item.stat().st_size
    return total
