"""Small datasets written on the fly for the loaders' tests (tiny images with Pillow, texts with 32
string-labelled classes, arrays with groups), a small federated config to run them with, and the
checks every loader's errors share."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image

from fedfew.cli.main import main
from fedfew.data import DataNotFoundError


def assert_corrupt(excinfo: pytest.ExceptionInfo, name: str) -> None:
    """A corrupt file is a DataError (not "missing") whose message names the file."""
    assert not isinstance(excinfo.value, DataNotFoundError)
    assert name in str(excinfo.value)


def assert_splits_partition(splits: dict[str, list[int]], num_classes: int) -> None:
    classes = splits["base"] + splits["val"] + splits["novel"]
    assert len(classes) == len(set(classes)) == num_classes
    assert sorted(classes) == list(range(num_classes))


ANIMALS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen"]
WRITERS = ["w0", "w1", "w2"]
TOPICS = [f"topic {chr(65 + i % 26)}{i // 26}" for i in range(32)]  # "topic A0" .. "topic F1"


def write_image(path: Path, value: float, size: tuple[int, int] = (8, 8), mode: str = "L", seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    pixels = np.clip(value * 255 + rng.normal(0, 20, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    path.parent.mkdir(parents=True, exist_ok=True)
    (image.convert("L") if mode == "L" else image).save(path)


def write_image_folder(folder: Path, per_writer: int = 2, groups: bool = False, jpeg: bool = True) -> Path:
    """ANIMALS x WRITERS x per_writer grey 8x8 images, PNG (some JPEG): <class>/<writer>/<i> when
    ``groups``, else <class>/<writer>_<i>."""
    for c, animal in enumerate(ANIMALS):
        for w, writer in enumerate(WRITERS):
            for i in range(per_writer):
                ext = ".jpg" if jpeg and i == 0 and w == 0 else ".png"
                name = f"{writer}/{i}{ext}" if groups else f"{writer}_{i}{ext}"
                write_image(folder / animal / name, c / len(ANIMALS), seed=100 * c + 10 * w + i)
    return folder


def text_rows(per_class: int = 8) -> list[dict[str, Any]]:
    """32 string-labelled classes; each class has its own keyword ("key7") beside common words."""
    rows = []
    for c, topic in enumerate(TOPICS):
        for i in range(per_class):
            rows.append({"body": f"the news of day {i} is about key{c} and more", "topic": topic, "user": f"u{i % 4}"})
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]], fields: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row[k] for k in fields})
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_arrays(path: Path, classes: int = 10, per_class: int = 12, groups: int = 3) -> Path:
    """Gaussian blobs [n, 6] with string labels and writer groups."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 3, (classes, 6))
    y = np.repeat(np.arange(classes), per_class)
    x = (centres[y] + rng.normal(0, 0.3, (len(y), 6))).astype(np.float32)
    names = np.array([f"blob{c}" for c in range(classes)])
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x, y=names[y], groups=np.array([f"site{i % groups}" for i in range(len(y))]))
    return path


SMALL = {
    "seed": 0,
    "task": "fewshot",
    "partition": {"name": "iid", "num_clients": 2},
    "model": {"name": "mlp", "options": {"hidden": 8}},
    "algorithm": {"name": "fl-proto", "options": {"local_steps": 1}},
    "federation": {"rounds": 2, "clients_per_round": 2},
    "episodes": {"n_way": 2, "k_shot": 1, "q_query": 2, "val_episodes": 4, "test_episodes": 6},
    "eval": {"every": 1},
    "runtime": {"threads": 1, "progress": False},
}


def run_with_dataset(tmp_path: Path, dataset: dict[str, Any], *args: str, **sections: Any) -> tuple[int, dict[str, Any], Path]:
    """``fedfew run`` on a config of SMALL plus ``dataset`` and ``sections``; (exit code, summary, folder)."""
    config = {"name": "own", **SMALL, "dataset": dataset, **sections}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "runs"
    code = main(["run", str(path), "--out", str(out), "--quiet", *args])
    if code != 0:
        return code, {}, out
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return code, json.loads((folder / "summary.json").read_text()), folder


def rounds_of(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
