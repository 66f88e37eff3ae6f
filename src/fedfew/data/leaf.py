"""The LEAF benchmark's JSON shards, and FEMNIST read from them.

A LEAF shard is ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``,
stored as ``*.json`` or ``*.json.gz`` under ``train/`` and ``test/``. :func:`read_leaf_shards` is
shared with Sent140 (``fedfew.data.text``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset
from fedfew.data.idx import read_bytes
from fedfew.data.registry import DATASETS

LEAF_URL = "https://github.com/TalwalkarLab/leaf"
FEMNIST_HOW = (
    "Generate FEMNIST with LEAF (" + LEAF_URL + ", data/femnist: "
    "./preprocess.sh -s niid --sf 0.05 -k 0 -t sample) and copy its data/train and data/test "
    "folders (*.json, optionally gzipped) to {folder}."
)
FEMNIST_CLASSES = (
    [str(d) for d in range(10)]
    + [chr(ord("A") + i) for i in range(26)]
    + [chr(ord("a") + i) for i in range(26)]
)
#: FRL's split: meta-train on the 52 letters, meta-test on the 10 digits.
FEMNIST_SPLITS = {"base": list(range(10, 62)), "val": [], "novel": list(range(10))}
PARTS = ("train", "test", "all")

LeafUser = tuple[str, list[object], list[object]]


def leaf_shard_files(folder: Path) -> list[Path]:
    """The ``*.json`` and ``*.json.gz`` files in ``folder``, sorted by name."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))


def read_leaf_shard(path: Path, dataset: str = "leaf") -> list[LeafUser]:
    """One LEAF shard as a list of ``(user, x_list, y_list)`` in the order of its ``users``."""
    try:
        shard = json.loads(read_bytes(path, dataset).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{dataset}: {path} is not valid LEAF JSON ({err})") from err
    if not isinstance(shard, dict) or not isinstance(shard.get("user_data"), dict):
        raise DataError(f"{dataset}: {path} has no 'user_data' object; not a LEAF shard")
    user_data = shard["user_data"]
    users = shard.get("users", list(user_data))
    counts = shard.get("num_samples")
    if not isinstance(users, list):
        raise DataError(f"{dataset}: {path}: 'users' must be a list")
    out: list[LeafUser] = []
    for i, user in enumerate(users):
        record = user_data.get(user)
        if (
            not isinstance(record, dict)
            or not isinstance(record.get("x"), list)
            or not isinstance(record.get("y"), list)
        ):
            raise DataError(f"{dataset}: {path}: user {user!r} has no 'x' and 'y' lists in 'user_data'")
        x, y = record["x"], record["y"]
        if len(x) != len(y):
            raise DataError(f"{dataset}: {path}: user {user!r} has {len(x)} inputs but {len(y)} labels")
        if isinstance(counts, list) and i < len(counts) and counts[i] != len(y):
            raise DataError(
                f"{dataset}: {path}: num_samples says {counts[i]} for user {user!r} but it has {len(y)}"
            )
        out.append((str(user), x, y))
    return out


def read_leaf_shards(folder: Path, dataset: str = "leaf", how_to_get: str = "") -> list[LeafUser]:
    """Every user of every shard in ``folder`` as ``(user, x_list, y_list)``, shards in name order.

    A missing folder, or one with no ``*.json[.gz]`` file, is a :class:`DataNotFoundError`.
    """
    folder = Path(folder)
    files = leaf_shard_files(folder)
    if not files:
        raise DataNotFoundError(
            f"{folder}/*.json (or *.json.gz)", dataset, how_to_get or f"Generate it with LEAF: {LEAF_URL}"
        )
    users: list[LeafUser] = []
    for path in files:
        users.extend(read_leaf_shard(path, dataset))
    return users


def leaf_parts(root_folder: Path, part: str, dataset: str, how: str) -> list[tuple[str, list[LeafUser]]]:
    """The ``train`` and/or ``test`` users of a LEAF dataset; "all" takes whichever folders have shards."""
    if part not in PARTS:
        raise DataError(f"{dataset}: part must be one of {PARTS}, not {part!r}")
    if part == "all":
        wanted = [p for p in ("train", "test") if leaf_shard_files(root_folder / p)] or ["train"]
    else:
        wanted = [part]
    return [(p, read_leaf_shards(root_folder / p, dataset, how)) for p in wanted]


def index_users(parts: list[tuple[str, list[LeafUser]]]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Per-sample group ids (one per user name, first-seen order), is_test flags and the user names."""
    names: dict[str, int] = {}
    groups: list[int] = []
    is_test: list[bool] = []
    for part, users in parts:
        for user, _, y in users:
            gid = names.setdefault(user, len(names))
            groups.extend([gid] * len(y))
            is_test.extend([part == "test"] * len(y))
    return (
        torch.tensor(groups, dtype=torch.long),
        torch.tensor(is_test, dtype=torch.bool),
        list(names),
    )


@DATASETS.register(
    "femnist", help="LEAF FEMNIST JSON shards; 62 classes, writer groups; base letters, novel digits"
)
def load_femnist(root: Path, part: str = "all") -> LabelledDataset:
    """FEMNIST (LEAF): 28x28 handwritten characters in 0..1 as LEAF stores them (1.0 = white paper).

    Reads ``root/femnist/train/*.json[.gz]`` and ``root/femnist/test/*.json[.gz]``; ``part`` is
    "train", "test" or "all" (whichever of the two folders exist). 62 classes: digits 0-9, upper
    case 10-35, lower case 36-61. ``groups`` is the writer (the same writer in train and test gets
    the same id), ``extras["writers"]`` the writer names, ``extras["is_test"]`` the test samples.
    Splits (FRL): base = the 52 letters, val = [], novel = the 10 digits.
    """
    folder = Path(root) / "femnist"
    parts = leaf_parts(folder, part, "femnist", FEMNIST_HOW.format(folder=folder))
    images, labels = [], []
    for _, users in parts:
        for user, x, y in users:
            if not x:
                continue
            try:
                array = np.asarray(x, dtype=np.float32)
                targets = np.asarray(y, dtype=np.int64)
            except (ValueError, TypeError) as err:
                raise DataError(f"femnist: writer {user!r} has non-numeric x or y ({err})") from err
            if array.ndim != 2 or array.shape[1] != 784:
                raise DataError(
                    f"femnist: writer {user!r} has inputs of shape {array.shape}, expected [n, 784]"
                )
            if targets.min() < 0 or targets.max() >= len(FEMNIST_CLASSES):
                raise DataError(f"femnist: writer {user!r} has labels outside 0..61")
            images.append(array)
            labels.append(targets)
    groups, is_test, writers = index_users(parts)
    inputs = np.concatenate(images) if images else np.zeros((0, 784), dtype=np.float32)
    return LabelledDataset(
        inputs=torch.from_numpy(inputs).reshape(-1, 1, 28, 28),
        labels=torch.from_numpy(np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)),
        class_names=list(FEMNIST_CLASSES),
        name="femnist",
        groups=groups,
        splits={k: list(v) for k, v in FEMNIST_SPLITS.items()},
        extras={"is_test": is_test, "writers": writers, "parts": [p for p, _ in parts]},
    )
