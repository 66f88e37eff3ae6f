"""mini-ImageNet (Vinyals et al. 2016, Ravi and Larochelle's class split): 100 classes x 600 images.

Two layouts are read from ``root/miniimagenet/``:

(a) the pickle caches ``mini-imagenet-cache-train.pkl``, ``-val.pkl``, ``-test.pkl``: each a dict with
    ``"image_data"`` (uint8 [n, 84, 84, 3]) and ``"class_dict"`` ({wnid: [indices into image_data]});
(b) ``images/*.jpg`` with ``train.csv``, ``val.csv`` and ``test.csv`` (header ``filename,label``, the
    label a WordNet id), resized to 84x84 with Pillow.

(a) is used when any pickle is present. The 64/16/20 classes of the three files are base/val/novel.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset
from fedfew.data.omniglot import require_pillow, to_float_images
from fedfew.data.registry import DATASETS
from fedfew.data.safe_pickle import load_data_pickle

FILES = ("train", "val", "test")
SPLIT_OF = {"train": "base", "val": "val", "test": "novel"}
HOW = (
    "Put the pickle caches mini-imagenet-cache-{{train,val,test}}.pkl (as distributed by learn2learn, "
    "https://github.com/learnables/learn2learn) in {folder}; or the Ravi and Larochelle split files "
    "train.csv, val.csv, test.csv (https://github.com/twitter/meta-learning-lstm/tree/master/data/miniImagenet) "
    "with the images in {folder}/images/, made from ImageNet (https://image-net.org) with "
    "https://github.com/yaoyao-liu/mini-imagenet-tools."
)


def _read_pickle(path: Path, how: str) -> tuple[np.ndarray, dict[str, list[int]]]:
    if not path.is_file():
        raise DataNotFoundError(path, "miniimagenet", how)
    try:
        with open(path, "rb") as f:
            content: object = load_data_pickle(f, encoding="latin1")
    except Exception as err:  # unpickling can fail in many ways; all mean a corrupt file
        raise DataError(f"miniimagenet: cannot unpickle {path} ({type(err).__name__}: {err})") from err
    if isinstance(content, dict):
        content = {k.decode() if isinstance(k, bytes) else k: v for k, v in content.items()}
    if not isinstance(content, dict) or "image_data" not in content or "class_dict" not in content:
        raise DataError(f"miniimagenet: {path} is not a dict with 'image_data' and 'class_dict'")
    images = np.asarray(content["image_data"])
    if images.ndim != 4 or images.shape[3] != 3 or images.dtype != np.uint8:
        raise DataError(
            f"miniimagenet: {path} 'image_data' is {images.dtype} {images.shape}, expected uint8 [n, 84, 84, 3]"
        )
    class_dict = content["class_dict"]
    if not isinstance(class_dict, dict):
        raise DataError(f"miniimagenet: {path} 'class_dict' is not a dict")
    classes: dict[str, list[int]] = {}
    for wnid, indices in class_dict.items():
        name = wnid.decode() if isinstance(wnid, bytes) else str(wnid)
        idx = [int(i) for i in np.asarray(indices).reshape(-1)]
        if idx and (min(idx) < 0 or max(idx) >= len(images)):
            raise DataError(
                f"miniimagenet: {path} class {name} indexes images beyond the {len(images)} there are"
            )
        classes[name] = idx
    return images, classes


def _load_pickles(folder: Path, image_size: int | None, how: str):
    images, labels, splits = [], [], {}
    names: list[str] = []
    for file in FILES:
        data, classes = _read_pickle(folder / f"mini-imagenet-cache-{file}.pkl", how)
        split = []
        for wnid in sorted(classes):
            idx = classes[wnid]
            split.append(len(names))
            labels.append(torch.full((len(idx),), len(names), dtype=torch.long))
            images.append(to_float_images(data[idx], image_size, scale=255.0, channels_last=True))
            names.append(wnid)
        splits[SPLIT_OF[file]] = split
    return images, labels, names, splits


def _read_csv(path: Path, how: str) -> list[tuple[str, str]]:
    if not path.is_file():
        raise DataNotFoundError(path, "miniimagenet", how)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataError(f"miniimagenet: cannot read {path} ({err})") from err
    if not rows or [c.strip() for c in rows[0][:2]] != ["filename", "label"]:
        raise DataError(f"miniimagenet: {path} must start with the header 'filename,label'")
    out = []
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) < 2:
            raise DataError(f"miniimagenet: {path} line {line} has no label: {row}")
        out.append((row[0].strip(), row[1].strip()))
    return out


def _load_jpgs(folder: Path, image_size: int | None, how: str):
    image_module = require_pillow("miniimagenet")
    size = 84 if image_size is None else image_size
    rows = {file: _read_csv(folder / f"{file}.csv", how) for file in FILES}
    images, labels, splits = [], [], {}
    names: list[str] = []
    for file in FILES:
        by_class: dict[str, list[str]] = {}
        for filename, wnid in rows[file]:
            by_class.setdefault(wnid, []).append(filename)
        split = []
        for wnid in sorted(by_class):
            arrays = []
            for filename in by_class[wnid]:
                path = folder / "images" / filename
                if not path.is_file():
                    raise DataNotFoundError(path, "miniimagenet", how)
                try:
                    with image_module.open(path) as img:
                        img = img.convert("RGB").resize((size, size), image_module.BILINEAR)
                        arrays.append(np.asarray(img, dtype=np.uint8))
                except (OSError, ValueError, SyntaxError) as err:
                    raise DataError(f"miniimagenet: cannot read image {path} ({err})") from err
            split.append(len(names))
            labels.append(torch.full((len(arrays),), len(names), dtype=torch.long))
            images.append(to_float_images(np.stack(arrays), None, scale=255.0, channels_last=True))
            names.append(wnid)
        splits[SPLIT_OF[file]] = split
    return images, labels, names, splits


@DATASETS.register(
    "miniimagenet", help="mini-ImageNet (pickle caches or images + csv); 64/16/20 classes, 84x84"
)
def load_miniimagenet(root: Path, image_size: int | None = 84) -> LabelledDataset:
    """mini-ImageNet as float32 [n, 3, 84, 84] in 0..1 (``image_size`` resizes; 32 saves memory).

    The classes of train / val / test are base / val / novel (64 / 16 / 20 in the standard split);
    within each file classes are ordered by WordNet id, which is the class name.
    Note: the full 60,000 images take 5 GB as float32 at 84x84.
    """
    folder = Path(root) / "miniimagenet"
    how = HOW.format(folder=folder)
    pickles = [folder / f"mini-imagenet-cache-{f}.pkl" for f in FILES]
    csvs = [folder / f"{f}.csv" for f in FILES]
    if any(p.is_file() for p in pickles) or not any(p.is_file() for p in csvs):
        images, labels, names, splits = _load_pickles(folder, image_size, how)
        source = "pkl"
    else:
        images, labels, names, splits = _load_jpgs(folder, image_size, how)
        source = "csv"
    return LabelledDataset(
        inputs=torch.cat(images) if images else torch.zeros(0, 3, 84, 84),
        labels=torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long),
        class_names=names,
        name="miniimagenet",
        splits=splits,
        extras={"source": source},
    )
