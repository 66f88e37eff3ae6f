"""``hf-disk`` (fedfew.data.hf_disk): a Hugging Face dataset saved to disk, texts with class labels and
splits, and a federated run on images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from fedfew.data import DataError, load_dataset
from tests.data.common import ANIMALS, TOPICS, run_with_dataset, text_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def hf(monkeypatch: pytest.MonkeyPatch) -> Any:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # scoped: the loader's setdefault does not leak
    datasets.disable_progress_bars()
    return datasets


def test_hf_disk_texts_with_class_labels_and_splits(hf: Any, tmp_path: Path) -> None:
    rows = text_rows(per_class=4)
    features = hf.Features({"body": hf.Value("string"), "topic": hf.ClassLabel(names=TOPICS), "user": hf.Value("string")})
    parts = {}
    for part, keep in (("train", lambda i: i % 4 != 0), ("test", lambda i: i % 4 == 0)):
        chosen = [r for i, r in enumerate(rows) if keep(i)]
        parts[part] = hf.Dataset.from_dict(
            {"body": [r["body"] for r in chosen], "topic": [TOPICS.index(r["topic"]) for r in chosen],
             "user": [r["user"] for r in chosen]}, features=features)  # fmt: skip
    hf.DatasetDict(parts).save_to_disk(str(tmp_path / "news_hf"))
    data = load_dataset("hf-disk", tmp_path, path="news_hf", text_field="body", label_field="topic", group_field="user")
    assert data.class_names == TOPICS  # ClassLabel order, not sorted names
    assert data.num_classes == 32 and data.class_counts().tolist() == [4] * 32
    assert data.extras["parts"] == ["test", "train"] and int(data.extras["is_test"].sum()) == 32
    assert data.extras["group_names"] == ["u0", "u1", "u2", "u3"] and data.inputs.dtype == torch.long
    assert not any(f"key{c}" in data.extras["vocab"] for c in data.splits["novel"])
    train_only = load_dataset("hf-disk", tmp_path, path="news_hf", text_field="body", label_field="topic",
                              splits="train")
    assert len(train_only) == 96 and "is_test" not in train_only.extras
    with pytest.raises(DataError, match=r"has no column 'text' \(columns: body, topic, user\)"):
        load_dataset("hf-disk", tmp_path, path="news_hf", text_field="text", label_field="topic")
    with pytest.raises(DataError, match="is not a dataset saved with save_to_disk"):
        load_dataset("hf-disk", REPO, path="configs", text_field="body")


def test_run_hf_disk_images(hf: Any, tmp_path: Path) -> None:
    images, labels, writers = [], [], []
    for c, animal in enumerate(ANIMALS):
        for i in range(6):
            pixels = np.full((10, 10), 30 * c, dtype=np.uint8)
            images.append(Image.fromarray(pixels))
            labels.append(animal)
            writers.append(i % 3)
    features = hf.Features({"img": hf.Image(), "animal": hf.Value("string"), "writer": hf.Value("int64")})
    hf.Dataset.from_dict({"img": images, "animal": labels, "writer": writers}, features=features).save_to_disk(
        str(tmp_path / "pets_hf"))
    data = load_dataset("hf-disk", tmp_path, path="pets_hf", image_field="img", label_field="animal",
                        group_field="writer", image_size=8)
    assert data.class_names == ANIMALS and data.inputs.shape == (48, 1, 8, 8)
    assert torch.allclose(data.inputs[data.labels == 2].mean(), torch.tensor(60 / 255))
    dataset = {"name": "hf-disk", "root": str(tmp_path),
               "options": {"path": "pets_hf", "image_field": "img", "label_field": "animal", "group_field": "writer",
                           "class_split": {"base": 0.5, "val": 0.25, "novel": 0.25, "seed": 1}}}
    code, summary, _ = run_with_dataset(tmp_path, dataset, partition={"name": "natural", "num_clients": 3})
    assert code == 0 and 0.0 <= summary["test"]["accuracy"] <= 1.0
