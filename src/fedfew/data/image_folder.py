"""``image-folder``: your own images, one folder per class (read with Pillow).

    <path>/<class name>/<image files>                 layout: class (default)
    <path>/<class name>/<group>/<image files>         layout: class/group
    <path>/<group>/<class name>/<image files>         layout: group/class

A group is a writer, user or site: the ``natural`` partition gives each client one group. Groups
can instead come from a CSV file (``groups_csv``) with a header ``file,group`` and one row per image,
``file`` relative to ``path`` (``cat/001.png``). Files whose names do not end in an image extension
and hidden files are skipped; every image must be readable.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedfew.data.dataset import DataError, LabelledDataset
from fedfew.data.generic import encode_groups, encode_labels, generic_dataset, resolve_path
from fedfew.data.omniglot import require_pillow
from fedfew.data.registry import DATASETS

if TYPE_CHECKING:  # pillow: an optional dependency (fedfew[images]), imported where an image is read
    from PIL import Image

EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
LAYOUTS = ("class", "class/group", "group/class")
GREY_MODES = {"1", "L", "LA", "I", "I;16", "F"}
NAME = "image-folder"


def _folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _images_in(folder: Path) -> list[Path]:
    return sorted(
        p for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in EXTENSIONS
    )  # fmt: skip


def _walk(folder: Path, layout: str) -> list[tuple[Path, str, str | None]]:
    """(image file, class name, group name or None) for every image, in a fixed order."""
    found: list[tuple[Path, str, str | None]] = []
    top = _folders(folder)
    if not top:
        loose = " (it holds images directly: put them in one sub-folder per class)" if _images_in(folder) else ""
        raise DataError(f"{NAME}: {folder} holds no sub-folders; expected {folder}/<class>/<images>{loose}")
    for first in top:
        if layout == "class":
            leaves: list[tuple[Path, str, str | None]] = [(first, first.name, None)]
        else:
            seconds = _folders(first)
            if not seconds:
                level = "group" if layout == "class/group" else "class"
                raise DataError(f"{NAME}: {first} holds no {level} sub-folders (layout {layout!r})")
            leaves = [
                (s, first.name, s.name) if layout == "class/group" else (s, s.name, first.name) for s in seconds
            ]
        for leaf, class_name, group in leaves:
            files = _images_in(leaf)
            if not files:
                raise DataError(f"{NAME}: {leaf} holds no image files ({', '.join(sorted(EXTENSIONS))})")
            found.extend((f, class_name, group) for f in files)
    return found


def _read_groups_csv(path: Path, folder: Path, files: Sequence[Path]) -> list[str]:
    """The group of each file, from a CSV with columns ``file`` and ``group``."""
    groups: dict[str, str] = {}
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            missing = [c for c in ("file", "group") if c not in (reader.fieldnames or [])]
            if missing:
                raise DataError(
                    f"{NAME}: {path} has no column(s) {missing} (found {reader.fieldnames}); "
                    "expected a header file,group"
                )
            for row in reader:
                name, group = (row.get("file") or "").strip(), (row.get("group") or "").strip()
                if not name or not group:
                    raise DataError(f"{NAME}: {path} line {reader.line_num} has an empty file or group")
                groups[Path(name).as_posix()] = group
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataError(f"{NAME}: cannot read {path} ({err})") from err
    out = []
    for file in files:
        key = file.relative_to(folder).as_posix()
        if key not in groups:
            raise DataError(f"{NAME}: {path} gives no group for {key}")
        out.append(groups[key])
    return out


def image_array(img: Image.Image, size: tuple[int, int] | None, channels: int | None) -> np.ndarray:
    """One PIL image as uint8 [H, W] (grey) or [H, W, 3], resized to ``size`` (h, w) if given:
    box (area) averaging when shrinking, bilinear when growing."""
    from PIL import Image

    mode = "L" if (channels == 1 or (channels is None and img.mode in GREY_MODES)) else "RGB"
    img = img.convert(mode)
    if size is not None and img.size != (size[1], size[0]):
        shrink = img.size[0] >= size[1] and img.size[1] >= size[0]
        img = img.resize((size[1], size[0]), Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.uint8)


def stack_images(arrays: Sequence[np.ndarray], sources: Sequence[str], dataset: str) -> np.ndarray:
    """uint8 [n, C, H, W] from :func:`image_array` outputs: C = 1 if all are grey, else 3. Images
    of different sizes are a DataError naming the first odd one (``sources``: file names)."""
    first = arrays[0].shape[:2]
    for array, source in zip(arrays, sources):
        if array.shape[:2] != first:
            raise DataError(
                f"{dataset}: {source} is {array.shape[1]}x{array.shape[0]} pixels but {sources[0]} is "
                f"{first[1]}x{first[0]}; set dataset.options.image_size to resize every image"
            )
    grey = all(a.ndim == 2 for a in arrays)
    return np.stack([a[None] if grey else (np.repeat(a[None], 3, 0) if a.ndim == 2 else a.transpose(2, 0, 1))
                     for a in arrays])  # fmt: skip


def _read_images(files: Sequence[Path], size: tuple[int, int] | None, channels: int | None) -> np.ndarray:
    image_module = require_pillow(NAME)
    arrays: list[np.ndarray] = []
    for file in files:
        try:
            with image_module.open(file) as img:
                arrays.append(image_array(img, size, channels))
        except (OSError, ValueError, SyntaxError) as err:
            raise DataError(f"{NAME}: cannot read image {file} ({err})") from err
    return stack_images(arrays, [str(f) for f in files], NAME)


def image_size_pair(image_size: int | Sequence[int] | None, dataset: str) -> tuple[int, int] | None:
    """``image_size`` (an int or [height, width]) as (h, w), or None."""
    if image_size is None:
        return None
    h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if h < 1 or w < 1:
        raise DataError(f"{dataset}: image_size must be positive, not {image_size}")
    return int(h), int(w)


@DATASETS.register(
    NAME, help="your images: PATH/<class>/<image files> (PNG/JPEG); options path, image_size, channels, layout"
)
def load_image_folder(
    root: Path,
    path: str | None = None,
    image_size: int | list[int] | None = None,
    channels: int | None = None,
    layout: str = "class",
    groups_csv: str | None = None,
    invert: bool = False,
) -> LabelledDataset:
    """Images as float32 [n, C, H, W] in 0..1, classes = folder names in name order.

    ``path``: the image folder, relative to the data folder ``root`` (default: ``root`` itself).
    ``image_size``: resize every image to this size (an int or [height, width]); without it every
    image must have the same size. ``channels``: 1 (grey) or 3 (RGB); by default 1 when every image
    is grey, else 3. ``layout`` and ``groups_csv``: see the module docstring. ``invert`` maps v to
    1 - v (dark strokes on white paper become bright on black). Default class split: a seeded
    60/20/20 (set ``class_split`` to choose). ``extras["path"]`` is the folder,
    ``extras["files"]`` each image's path relative to it, ``extras["group_names"]`` the groups.
    """
    if layout not in LAYOUTS:
        raise DataError(f"{NAME}: layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if channels not in (None, 1, 3):
        raise DataError(f"{NAME}: channels must be 1, 3 or unset, not {channels!r}")
    if groups_csv is not None and layout != "class":
        raise DataError(f"{NAME}: take groups from the folders (layout {layout!r}) or from groups_csv, not both")
    folder = resolve_path(root, path, NAME, "a folder of class sub-folders holding images", folder=True)
    size = image_size_pair(image_size, NAME)
    entries = _walk(folder, layout)
    files = [f for f, _, _ in entries]
    labels, class_names = encode_labels([c for _, c, _ in entries], f"{NAME}: {folder}")
    group_values: Sequence[str | None] | None = [g for _, _, g in entries] if layout != "class" else None
    if groups_csv is not None:
        csv_path = resolve_path(root, groups_csv, NAME, "a CSV file with columns file,group")
        group_values = _read_groups_csv(csv_path, folder, files)
    extras: dict[str, object] = {"path": str(folder), "files": [f.relative_to(folder).as_posix() for f in files]}
    groups = encode_groups(group_values, f"{NAME}: {folder}", extras)
    images = torch.from_numpy(_read_images(files, size, channels)).to(torch.float32).div_(255.0)
    if invert:
        images = 1.0 - images
    return generic_dataset(images, labels, class_names, NAME, groups, extras)
