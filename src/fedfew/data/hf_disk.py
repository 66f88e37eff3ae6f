"""``hf-disk``: a Hugging Face ``datasets`` dataset saved with ``save_to_disk``, read offline by
column names (``pip install 'fedfew[hf]'``).

    from datasets import load_dataset
    load_dataset("ag_news").save_to_disk("data/ag_news")       # once, where there is a network

Texts (``text_field``) go through the tools of :mod:`fedfew.data.text` as in ``text-csv``; images
(``image_field``: the ``Image`` feature, or uint8 arrays) as in ``image-folder``. A ``ClassLabel``
label column gives the class names; plain integer or string labels are ordered as in ``text-csv``.
A ``DatasetDict`` is read split by split (``splits``, default all, in name order); samples of a
split named "test" are marked in ``extras["is_test"]`` (the test set of classification runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedfew.data.dataset import DataError, LabelledDataset
from fedfew.data.generic import check_label_value, encode_groups, encode_labels, generic_dataset, resolve_path
from fedfew.data.image_folder import image_array, image_size_pair, stack_images
from fedfew.data.offline import offline_environment
from fedfew.data.registry import DATASETS
from fedfew.data.splits import default_split

if TYPE_CHECKING:  # an optional dependency (fedfew[hf]), imported where a dataset is read
    from datasets import Dataset
from fedfew.data.text import check_sentence_encoder, text_dataset
from fedfew.data.text_options import TextOptions, text_options

NAME = "hf-disk"
HOW = "`pip install 'fedfew[hf]'` (or `pip install datasets`)"


def _open(folder: Path, splits: Sequence[str] | str | None) -> list[tuple[str, Dataset]]:
    """[(split name, Dataset)] of the saved dataset in ``folder``."""
    try:
        with offline_environment(HF_DATASETS_OFFLINE="1"):  # never reach for the network
            import datasets

            loaded = datasets.load_from_disk(str(folder))
    except ImportError:
        raise DataError(f"{NAME}: reading a saved Hugging Face dataset needs {HOW}") from None
    except (FileNotFoundError, ValueError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"{NAME}: {folder} is not a dataset saved with save_to_disk ({first})") from None
    if isinstance(loaded, datasets.Dataset):
        if splits is not None:
            raise DataError(f"{NAME}: {folder} holds a single Dataset, so the splits option does not apply")
        return [("", loaded)]
    wanted = [splits] if isinstance(splits, str) else list(splits) if splits is not None else sorted(loaded)
    unknown = [s for s in wanted if s not in loaded]
    if unknown:
        raise DataError(f"{NAME}: {folder} has no split(s) {unknown} (found: {', '.join(sorted(loaded))})")
    return [(s, loaded[s]) for s in wanted]


def _column(part: Dataset, field: str | None, folder: Path, split: str) -> list[Any]:
    if field not in part.column_names:
        where = f"{folder} split {split!r}" if split else str(folder)
        raise DataError(
            f"{NAME}: {where} has no column {field!r} (columns: {', '.join(part.column_names)}); "
            "set the column name in dataset.options"
        )
    return list(part[field])


def _class_label_names(parts: list[tuple[str, Dataset]], field: str) -> list[str] | None:
    """The names of a ClassLabel label column (the same in every split), else None."""
    from datasets import ClassLabel

    features = [part.features.get(field) for _, part in parts]
    if all(isinstance(f, ClassLabel) for f in features):
        names = features[0].names
        if any(f.names != names for f in features):
            raise DataError(f"{NAME}: the splits' {field!r} ClassLabel names differ")
        return list(names)
    return None


def _images(values: list[object], folder: Path, field: str, size: tuple[int, int] | None, channels: int | None) -> torch.Tensor:
    from PIL import Image

    arrays = []
    for i, value in enumerate(values):
        try:
            if not isinstance(value, Image.Image):
                array = np.asarray(value)
                if array.dtype != np.uint8 or array.ndim not in (2, 3):
                    raise DataError(
                        f"{NAME}: {folder} row {i} {field!r} is {array.dtype} {array.shape}; expected an image "
                        "or a uint8 array [H, W] or [H, W, C] (use the arrays loader for other inputs)"
                    )
                value = Image.fromarray(array)
            arrays.append(image_array(value, size, channels))
        except (OSError, ValueError, TypeError) as err:
            if isinstance(err, DataError):
                raise
            raise DataError(f"{NAME}: {folder} row {i}: cannot read {field!r} as an image ({err})") from err
    stacked = stack_images(arrays, [f"{folder} row {i}" for i in range(len(arrays))], NAME)
    return torch.from_numpy(stacked).to(torch.float32).div_(255.0)


@DATASETS.register(NAME, help="a Hugging Face dataset saved with save_to_disk (offline); text_field or image_field")
@text_options()
def load_hf_disk(
    root: Path,
    path: str | None = None,
    label_field: str = "label",
    text_field: str | None = None,
    image_field: str | None = None,
    group_field: str | None = None,
    splits: str | list[str] | None = None,
    image_size: int | list[int] | None = None,
    channels: int | None = None,
    *,
    text_options: TextOptions,
) -> LabelledDataset:
    """``path``: the folder ``save_to_disk`` wrote, relative to the data folder ``root``. Exactly one
    of ``text_field`` and ``image_field``; ``label_field`` (default "label"), optional
    ``group_field``. Text options as for ``text-csv``, image options as for ``image-folder``.
    Default class split: a seeded ~60/20/20."""
    if (text_field is None) == (image_field is None):
        raise DataError(f"{NAME}: set exactly one of text_field (texts) and image_field (images)")
    if channels not in (None, 1, 3):
        raise DataError(f"{NAME}: channels must be 1, 3 or unset, not {channels!r}")
    check_sentence_encoder(NAME, text_options["sentence_encoder"], text_options["glove"])
    folder = resolve_path(root, path, NAME, "a folder written by a Hugging Face dataset's save_to_disk", folder=True)
    parts = _open(folder, splits)
    raw_labels, raw_groups, inputs, is_test = [], [], [], []
    for split, part in parts:
        where = f"{NAME}: {folder}" + (f" split {split!r}" if split else "")
        raw_labels += [check_label_value(v, where, label_field) for v in _column(part, label_field, folder, split)]
        if group_field is not None:
            raw_groups += [check_label_value(v, where, group_field) for v in _column(part, group_field, folder, split)]
        inputs += _column(part, text_field or image_field, folder, split)
        is_test += [split == "test"] * part.num_rows
    if not raw_labels:
        raise DataError(f"{NAME}: {folder} holds no rows")
    names = _class_label_names(parts, label_field)
    if names is not None:
        labels, class_names = [int(v) for v in raw_labels], names
    else:
        labels, class_names = encode_labels(raw_labels, f"{NAME}: {folder}", numeric_strings=False)
    extras: dict[str, object] = {"path": str(folder), "parts": [s for s, _ in parts]}
    if any(is_test) and not all(is_test):
        extras["is_test"] = torch.tensor(is_test, dtype=torch.bool)
    groups = encode_groups(raw_groups if group_field is not None else None, f"{NAME}: {folder}", extras)
    class_split = default_split(len(class_names))
    if text_field is not None:
        bad = next((i for i, t in enumerate(inputs) if not isinstance(t, str)), None)
        if bad is not None:
            raise DataError(f"{NAME}: {folder} row {bad} {text_field!r} is {type(inputs[bad]).__name__}, not a string")
        return text_dataset(
            inputs, labels, class_names, NAME, class_split, groups=groups, extras=extras, vocab_split="base",
            **text_options,
        )
    images = _images(inputs, folder, str(image_field), image_size_pair(image_size, NAME), channels)
    return generic_dataset(images, labels, class_names, NAME, groups, extras)
