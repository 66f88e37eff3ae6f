"""Omniglot (Lake et al. 2015): 1,623 handwritten characters from 50 alphabets, 20 drawers each.

Two on-disk layouts are read from ``root/omniglot/``:

* ``images_background.npz`` and ``images_evaluation.npz``: keys ``images`` (bool [chars, 20, 105, 105],
  True = white paper) and ``labels`` (int64 [chars, 20], the character id within the file);
* the official PNG folders ``images_background/<alphabet>/<character>/*.png`` and
  ``images_evaluation/...`` (unzipped from the official ``images_background.zip`` and
  ``images_evaluation.zip``; reading them needs Pillow).

For each of the two halves the npz file is used when present, otherwise the PNG folder.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F

from fedfew.core.integrity import sha256_file
from fedfew.data.cache import cached_tensors
from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset
from fedfew.data.registry import DATASETS

OMNIGLOT_URL = (
    "Download images_background.zip and images_evaluation.zip from the official repository "
    "https://github.com/brendenlake/omniglot (folder python/) and unzip them into {folder}, "
    "or put the npz files images_background.npz / images_evaluation.npz there."
)
HALVES = ("background", "evaluation")
#: Images are converted to float and resized this many at a time: small enough to stay in cache.
BATCH = 256


def require_pillow(dataset: str) -> ModuleType:
    """Import Pillow's ``Image`` module, or explain how to install it."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is a dev dependency
        raise DataError(
            f"{dataset}: reading image files needs Pillow; install it with "
            "`pip install pillow` (or `pip install fedfew[images]`)"
        ) from None
    return Image


def random_class_split(
    num_classes: int, counts: dict[str, int], seed: int, dataset: str
) -> dict[str, list[int]]:
    """Disjoint seeded random class splits of the given sizes (in the order of ``counts``)."""
    total = sum(counts.values())
    if any(c < 0 for c in counts.values()) or total > num_classes:
        raise DataError(
            f"{dataset}: split sizes {counts} need {total} classes but the dataset has {num_classes}"
        )
    perm = torch.randperm(num_classes, generator=torch.Generator().manual_seed(seed), device="cpu").tolist()
    splits: dict[str, list[int]] = {}
    start = 0
    for name, count in counts.items():
        splits[name] = sorted(perm[start : start + count])
        start += count
    return splits


def to_float_images(
    images: np.ndarray | torch.Tensor,
    image_size: int | tuple[int, int] | None,
    invert: bool = False,
    scale: float = 1.0,
    channels_last: bool = False,
) -> torch.Tensor:
    """uint8/bool images [n, C, H, W] (or [n, H, W, C]) -> float32 [n, C, h, w] in 0..1, batch by batch.

    ``scale`` divides the raw values (255 for uint8); ``invert`` maps v -> 1 - v; ``image_size``
    resizes with area averaging when shrinking and antialiased bilinear otherwise.
    """
    data = torch.from_numpy(np.ascontiguousarray(images)) if isinstance(images, np.ndarray) else images
    if data.dim() != 4:
        raise DataError(f"expected a 4-d image array, got shape {tuple(data.shape)}")
    if channels_last:
        data = data.permute(0, 3, 1, 2)
    n, c, h, w = data.shape
    size = (image_size, image_size) if isinstance(image_size, int) else image_size
    out_h, out_w = size if size is not None else (h, w)
    if out_h < 1 or out_w < 1:
        raise DataError(f"image_size must be positive (or None), not {image_size}")
    out = torch.empty((n, c, out_h, out_w), dtype=torch.float32)
    for start in range(0, n, BATCH):
        chunk = data[start : start + BATCH].to(torch.float32)
        if scale != 1.0:
            chunk = chunk / scale
        if invert:
            chunk = 1.0 - chunk
        if (out_h, out_w) != (h, w):
            if out_h <= h and out_w <= w:
                chunk = F.interpolate(chunk, size=(out_h, out_w), mode="area")
            else:
                chunk = F.interpolate(
                    chunk, size=(out_h, out_w), mode="bilinear", align_corners=False, antialias=True
                )
        out[start : start + BATCH] = chunk.clamp_(0.0, 1.0)
    return out


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images [n, H, W] bool and per-image character labels [n] from one npz file."""
    if not zipfile.is_zipfile(path):  # np.load would try it as a pickle and complain about allow_pickle
        raise DataError(f"omniglot: {path} is not a numpy .npz archive (not a zip file: corrupt or truncated?)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [k for k in ("images", "labels") if k not in archive.files]
            if missing:
                raise DataError(
                    f"omniglot: {path} has no key(s) {missing} (found {archive.files}); "
                    "expected 'images' [chars, 20, 105, 105] and 'labels' [chars, 20]"
                )
            images = archive["images"]
            labels = archive["labels"]
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as err:
        raise DataError(f"omniglot: cannot read {path} as a numpy npz file ({err})") from err
    if images.ndim != 4 or labels.shape != images.shape[:2]:
        raise DataError(
            f"omniglot: {path} holds images {images.shape} and labels {labels.shape}; "
            "expected images [chars, drawers, H, W] and labels [chars, drawers]"
        )
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"omniglot: {path} labels have dtype {labels.dtype}, expected integers")
    if images.dtype != np.bool_:
        if images.dtype != np.uint8:
            raise DataError(f"omniglot: {path} images have dtype {images.dtype}, expected bool")
        images = images > 127
    return images.reshape(-1, *images.shape[2:]), labels.reshape(-1)


def _read_png_tree(folder: Path) -> tuple[list[np.ndarray], list[int], list[str]]:
    """Grey images (1.0 = white paper), their class index and class names 'Alphabet/characterNN'."""
    image_module = require_pillow("omniglot")
    images: list[np.ndarray] = []
    labels: list[int] = []
    names: list[str] = []
    for alphabet in sorted(p for p in folder.iterdir() if p.is_dir()):
        for character in sorted(p for p in alphabet.iterdir() if p.is_dir()):
            files = sorted(character.glob("*.png"))
            if not files:
                continue
            class_id = len(names)
            names.append(f"{alphabet.name}/{character.name}")
            for file in files:
                try:
                    with image_module.open(file) as img:
                        array = np.asarray(img.convert("L"), dtype=np.uint8)
                except (OSError, ValueError, SyntaxError) as err:
                    raise DataError(f"omniglot: cannot read image {file} ({err})") from err
                if images and array.shape != images[0].shape:
                    raise DataError(
                        f"omniglot: {file} is {array.shape[1]}x{array.shape[0]} pixels but earlier "
                        f"images are {images[0].shape[1]}x{images[0].shape[0]}"
                    )
                images.append(array)
                labels.append(class_id)
    if not names:
        raise DataError(f"omniglot: {folder} holds no <alphabet>/<character>/*.png images")
    return images, labels, names


def _resized_npz(npz: Path, image_size: int | None, invert: bool) -> tuple[torch.Tensor, np.ndarray]:
    """One npz file's images as float [n, 1, h, w] and their character ids [n]. Decompressing and
    resizing 32,460 images of 105x105 is most of a run's data time, so the result is kept in the cache
    folder under the file's content digest, the options and the torch version (whose resize it is):
    the same bytes give the same tensors, read back instead of computed."""
    key = f"{sha256_file(npz)[:32]}-size{image_size}-invert{int(invert)}-torch{torch.__version__}"

    def compute() -> dict[str, torch.Tensor]:
        raw, char_ids = _read_npz(npz)
        return {"images": to_float_images(raw[:, None], image_size, invert=invert),
                "char_ids": torch.from_numpy(np.ascontiguousarray(char_ids, dtype=np.int64))}

    tensors = cached_tensors("omniglot", key, compute)
    return tensors["images"], tensors["char_ids"].numpy()


def _load_half(folder: Path, half: str, image_size: int | None, invert: bool):
    npz = folder / f"images_{half}.npz"
    tree = folder / f"images_{half}"
    if npz.is_file():
        images, char_ids = _resized_npz(npz, image_size, invert)
        unique, labels = np.unique(char_ids, return_inverse=True)
        names = [f"{half}/{int(u):04d}" for u in unique]
        return images, torch.from_numpy(labels.astype(np.int64).reshape(-1)), names, "npz"
    if tree.is_dir():
        arrays, label_list, names = _read_png_tree(tree)
        stacked = np.stack(arrays)[:, None]
        images = to_float_images(stacked, image_size, invert=invert, scale=255.0)
        return images, torch.tensor(label_list, dtype=torch.long), names, "png"
    raise DataNotFoundError(
        f"{npz} (or the folder {tree}/<alphabet>/<character>/*.png)",
        "omniglot",
        OMNIGLOT_URL.format(folder=folder),
    )


#: Vinyals et al.'s split lists (ProtoNet's), relative to ``root/omniglot/``: which list is which split.
VINYALS_FOLDER = Path("splits") / "vinyals"
VINYALS_LISTS = {"base": "train.txt", "val": "val.txt", "novel": "test.txt"}
#: The four rotations of Vinyals et al.'s protocol, in degrees; each makes a class of its own.
ROTATIONS = (0, 90, 180, 270)


def _vinyals_character_names(folder: Path, names: list[str]) -> dict[str, int]:
    """``Alphabet/characterNN`` -> the class index of that character in ``names`` (the loaded order), read
    from ``characters.tsv``: the npz files' classes are named ``half/NNNN`` (the position in that file),
    the PNG folders' ``Alphabet/characterNN``."""
    table = folder / VINYALS_FOLDER / "characters.tsv"
    if not table.is_file():
        raise DataNotFoundError(str(table), "omniglot (split: vinyals)",
                                "it ships with the ProtoNet split lists (train.txt, val.txt, test.txt) in "
                                f"{folder / VINYALS_FOLDER}; see docs/benchmark.md")
    position = {name: i for i, name in enumerate(names)}
    mapping: dict[str, int] = {}
    lines = table.read_text().splitlines()
    if not lines or lines[0].split("\t") != ["half", "index", "alphabet", "character"]:
        raise DataError(f"omniglot: {table} must start with the header 'half, index, alphabet, character' "
                        "(tab-separated)")
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != 4 or fields[0] not in HALVES or not fields[1].isdigit():
            raise DataError(f"omniglot: {table} line {number} is not 'half<TAB>index<TAB>alphabet<TAB>character'")
        half, index, alphabet, character = fields
        character_name = f"{alphabet}/{character}"
        found = position.get(f"{half}/{int(index):04d}", position.get(character_name))
        if found is None:
            raise DataError(f"omniglot: {table} line {number} names {half} character {index} ({character_name}), "
                            "which the loaded images do not have")
        if character_name in mapping:
            raise DataError(f"omniglot: {table} lists {character_name} twice")
        mapping[character_name] = found
    if sorted(mapping.values()) != list(range(len(names))):
        raise DataError(f"omniglot: {table} maps {len(set(mapping.values()))} of the {len(names)} loaded characters; "
                        "it must map each exactly once")
    return mapping


def vinyals_splits(folder: Path, names: list[str]) -> tuple[dict[str, list[int]], list[str]]:
    """Vinyals et al.'s character split: base/val/novel as character indices of ``names`` (1,028 / 172 /
    423), and each character's ``Alphabet/characterNN``. Every line of the lists is
    ``Alphabet/characterNN/rotDDD``; the four rotations of a character must be in one list, the lists
    disjoint and together every character."""
    mapping = _vinyals_character_names(folder, names)
    splits: dict[str, list[int]] = {}
    owner: dict[str, str] = {}
    for split, file_name in VINYALS_LISTS.items():
        path = folder / VINYALS_FOLDER / file_name
        if not path.is_file():
            raise DataNotFoundError(str(path), "omniglot (split: vinyals)",
                                    f"the ProtoNet split lists belong in {folder / VINYALS_FOLDER}")
        rotations: dict[str, set[int]] = {}
        for number, line in enumerate(path.read_text().split(), start=1):
            character_name, _, rotation = line.rpartition("/")
            if character_name not in mapping or not rotation.startswith("rot") \
                    or not rotation[3:].isdigit() or int(rotation[3:]) not in ROTATIONS:
                raise DataError(f"omniglot: {path} entry {number} ({line!r}) is not a known "
                                "'Alphabet/characterNN/rotDDD' (DDD one of 000, 090, 180, 270)")
            if owner.setdefault(character_name, split) != split:
                raise DataError(f"omniglot: {character_name} is in both {VINYALS_LISTS[owner[character_name]]} "
                                f"and {file_name}: a character's rotations must stay in one split")
            rotations.setdefault(character_name, set()).add(int(rotation[3:]))
        partial = [name for name, seen in rotations.items() if seen != set(ROTATIONS)]
        if partial:
            raise DataError(f"omniglot: {path} lists {partial[0]} in {len(rotations[partial[0]])} of the 4 rotations")
        splits[split] = sorted(mapping[name] for name in rotations)
    missing = sorted(set(mapping) - set(owner))
    if missing:
        raise DataError(f"omniglot: {len(missing)} characters are in none of the Vinyals lists (first: {missing[0]})")
    character_names = [""] * len(names)
    for name, index in mapping.items():
        character_names[index] = name
    return splits, character_names


def with_rotations(inputs: torch.Tensor, labels: torch.Tensor, names: list[str],
                   splits: dict[str, list[int]]) -> tuple[torch.Tensor, torch.Tensor, list[str], dict[str, list[int]]]:
    """Each character in its four rotations (counter-clockwise, as PIL's ``rotate``), each a class:
    character c rotated by ROTATIONS[r] is class 4c + r, so its rotation classes sit together and stay in
    c's split. The inputs are the four rotated copies one after another."""
    count = len(ROTATIONS)
    rotated = torch.cat([torch.rot90(inputs, k, dims=(-2, -1)) for k in range(count)])
    new_labels = torch.cat([labels * count + k for k in range(count)])
    new_names = [f"{name}/rot{degrees:03d}" for name in names for degrees in ROTATIONS]
    new_splits = {split: [c * count + k for c in classes for k in range(count)] for split, classes in splits.items()}
    return rotated, new_labels, new_names, new_splits


@DATASETS.register(
    "omniglot", help="Omniglot, 1,623 characters x 20 drawers (npz or official PNG folders); 28x28"
)
def load_omniglot(
    root: Path,
    image_size: int | None = 28,
    invert: bool = True,
    split: str = "random",
    split_seed: int = 0,
    num_base: int = 1100,
    num_val: int = 100,
    num_novel: int = 423,
    rotations: bool = False,
) -> LabelledDataset:
    """Omniglot's 1,623 characters as classes: the 964 background ones first, then the 659 evaluation ones.

    ``image_size`` resizes the 105x105 images (area averaging; ``None`` keeps 105). ``invert=True``
    makes strokes 1 and paper 0. ``split="random"`` draws disjoint base/val/novel characters
    (``num_base``/``num_val``/``num_novel``, default 1100/100/423) with ``split_seed``;
    ``split="official"`` is base = background characters, val = [], novel = evaluation characters (Lake's
    alphabets); ``split="vinyals"`` is the few-shot literature's split (Vinyals et al. 2016, ProtoNet's
    lists in ``root/omniglot/splits/vinyals/``): 1,028 / 172 / 423 characters drawn across all 50
    alphabets. ``rotations=True`` makes each character four classes, rotated by 0/90/180/270 degrees
    (class 4c + r), all in the character's split: with ``split="vinyals"`` the literature's 4,112 / 688 /
    1,692 classes.
    Class names are ``"Alphabet/characterNN"`` from PNG folders and ``"background/0012"`` from npz
    (``split="vinyals"``: ``"Alphabet/characterNN"`` always), with ``"/rotDDD"`` under rotations.
    """
    if split not in ("random", "official", "vinyals"):
        raise DataError(f"omniglot: split must be 'random', 'official' or 'vinyals', not {split!r}")
    folder = Path(root) / "omniglot"
    parts = [_load_half(folder, half, image_size, invert) for half in HALVES]
    offset = 0
    labels, names, official = [], [], {}
    for half, (_, half_labels, half_names, _) in zip(HALVES, parts):
        labels.append(half_labels + offset)
        names.extend(half_names)
        official[half] = list(range(offset, offset + len(half_names)))
        offset += len(half_names)
    if split == "official":
        splits = {"base": official["background"], "val": [], "novel": official["evaluation"]}
    elif split == "vinyals":
        splits, names = vinyals_splits(folder, names)
    else:
        counts = {"base": num_base, "val": num_val, "novel": num_novel}
        splits = random_class_split(len(names), counts, split_seed, "omniglot")
    inputs, all_labels = torch.cat([p[0] for p in parts]), torch.cat(labels)
    halves = {"background_classes": official["background"], "evaluation_classes": official["evaluation"]}
    if rotations:
        inputs, all_labels, names, splits = with_rotations(inputs, all_labels, names, splits)
        halves = {key: [c * len(ROTATIONS) + k for c in classes for k in range(len(ROTATIONS))]
                  for key, classes in halves.items()}
    return LabelledDataset(
        inputs=inputs,
        labels=all_labels,
        class_names=names,
        name="omniglot",
        splits=splits,
        extras={"source": {half: p[3] for half, p in zip(HALVES, parts)}, **halves},
    )
