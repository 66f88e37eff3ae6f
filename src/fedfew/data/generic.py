"""What the generic loaders (image-folder, arrays, text-jsonl, text-csv, hf-disk) share: where their
``path`` option points, and how labels and groups of any type become integer ids."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset
from fedfew.data.splits import default_split

PATH_HOW = "Set dataset.options.path to it (relative to the data folder, or absolute)."


def resolve_path(root: Path, path: str | Path | None, dataset: str, what: str, folder: bool = False) -> Path:
    """``path`` relative to the data folder ``root`` (absolute paths and ``~`` as they are; no
    ``path`` means the data folder itself). A missing file or folder is a DataNotFoundError."""
    target = Path(root) if path is None else Path(root) / Path(path).expanduser()
    exists = target.is_dir() if folder else target.is_file()
    if not exists:
        if target.exists():
            kind = "a folder" if folder else "a file"
            raise DataError(f"{dataset}: {target} is not {kind}; expected {what}")
        raise DataNotFoundError(target, dataset, f"Expected {what}. {PATH_HOW}")
    return target


def _sort_key(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int) else (1, value)


def encode_labels(values: Sequence[Any], where: str, numeric_strings: bool = False) -> tuple[list[int], list[str]]:
    """Labels of one type -> (class ids, class names). Integer labels keep numeric order and are
    named by their value ("0", "7", ...); string labels are sorted by name. With ``numeric_strings``
    (CSV cells) strings that all read as integers are ordered as numbers, named as written."""
    if not values:
        raise DataError(f"{where} holds no samples")
    kinds = {type(v) for v in values}
    if kinds <= {int}:
        keys = list(values)
        names_of = {v: str(v) for v in values}
    elif kinds <= {str}:
        if numeric_strings and all(_is_int(v) for v in values):
            keys = [int(v) for v in values]
            names_of = {}
            for v, k in zip(values, keys):
                if names_of.setdefault(k, v) != v:
                    raise DataError(f"{where}: labels {names_of[k]!r} and {v!r} are the same number")
        else:
            keys = list(values)
            names_of = {v: v for v in values}
    else:
        raise DataError(
            f"{where}: labels must be all integers or all strings, found {', '.join(sorted(k.__name__ for k in kinds))}"
        )
    order = sorted(set(keys), key=_sort_key)
    ids = {k: i for i, k in enumerate(order)}
    return [ids[k] for k in keys], [names_of[k] for k in order]


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def encode_groups(values: Sequence[Any] | None, where: str, extras: dict[str, Any]) -> torch.Tensor | None:
    """Group (writer, user, site) values -> group ids 0..G-1, encoded like labels; their names go to
    ``extras["group_names"]``. None (no groups given) stays None."""
    if values is None:
        return None
    ids, extras["group_names"] = encode_labels(values, f"{where} groups", numeric_strings=True)
    return torch.tensor(ids, dtype=torch.long)


def generic_dataset(inputs: torch.Tensor, labels: Sequence[int], class_names: list[str], name: str,
                    groups: torch.Tensor | None, extras: dict[str, Any]) -> LabelledDataset:
    """A generic loader's dataset, with the default seeded class split (~60/20/20)."""
    return LabelledDataset(inputs=inputs, labels=torch.tensor(labels, dtype=torch.long), class_names=class_names,
                           name=name, groups=groups, splits=default_split(len(class_names)), extras=extras)


def check_label_value(value: object, where: str, field: str) -> int | str:
    """A label or group read from a file: an integer or a non-empty string (bools and floats are errors)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise DataError(f"{where}: field {field!r} must be an integer or a string, not {value!r}")
    if isinstance(value, str) and not value.strip():
        raise DataError(f"{where}: field {field!r} is empty")
    return value
