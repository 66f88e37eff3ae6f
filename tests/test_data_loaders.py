"""Image dataset loaders: each reads small files written here in the real on-disk format, and the
real data in ../shared/data when it is present."""

from __future__ import annotations

import csv
import gzip
import json
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfew.data import DATASETS, DataError, DataNotFoundError, load_dataset
from fedfew.data.leaf import read_leaf_shards

Image = pytest.importorskip("PIL.Image")


def assert_corrupt(excinfo: pytest.ExceptionInfo, name: str) -> None:
    """A corrupt file is a DataError (not "missing") whose message names the file."""
    assert not isinstance(excinfo.value, DataNotFoundError)
    assert name in str(excinfo.value)


def assert_splits_partition(splits: dict[str, list[int]], num_classes: int) -> None:
    classes = splits["base"] + splits["val"] + splits["novel"]
    assert len(classes) == len(set(classes)) == num_classes
    assert sorted(classes) == list(range(num_classes))


def test_all_loaders_registered() -> None:
    for name in ["omniglot", "mnist", "fashion-mnist", "femnist", "cifar10", "cifar100", "fc100",
                 "miniimagenet", "huffpost", "reuters", "20newsgroups", "sent140"]:  # fmt: skip
        assert name in DATASETS


# --------------------------------------------------------------------------- Omniglot


def write_omniglot_npz(path: Path, chars: int, drawers: int = 20, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    images = np.ones((chars, drawers, 105, 105), dtype=bool)  # True = white paper
    images[:, :, 40:60, 50:55] = False  # a vertical stroke
    images &= rng.random(images.shape) > 0.01
    labels = np.repeat(np.arange(chars, dtype=np.int64)[:, None], drawers, axis=1)
    np.savez_compressed(path, images=images, labels=labels)
    return images


def test_omniglot_npz(tmp_path: Path) -> None:
    folder = tmp_path / "omniglot"
    folder.mkdir()
    bg = write_omniglot_npz(folder / "images_background.npz", chars=3)
    write_omniglot_npz(folder / "images_evaluation.npz", chars=2, seed=1)
    data = load_dataset("omniglot", tmp_path, image_size=None, num_base=2, num_val=1, num_novel=2)
    assert data.inputs.shape == (100, 1, 105, 105) and data.inputs.dtype == torch.float32
    assert data.class_names == ["background/0000", "background/0001", "background/0002",
                                "evaluation/0000", "evaluation/0001"]  # fmt: skip
    assert data.labels.tolist() == [c for c in range(5) for _ in range(20)]
    # inverted: strokes (False in the file) are 1, paper 0
    assert torch.equal(data.inputs[:60, 0], torch.from_numpy(~bg.reshape(60, 105, 105)).float())
    assert_splits_partition(data.splits, 5)
    assert [len(data.splits[k]) for k in ("base", "val", "novel")] == [2, 1, 2]

    small = load_dataset("omniglot", tmp_path, split="official", invert=False)
    assert small.inputs.shape == (100, 1, 28, 28)
    assert 0.0 <= float(small.inputs.min()) and float(small.inputs.max()) <= 1.0
    assert float(small.inputs.mean()) > 0.9  # not inverted: mostly white paper
    assert small.splits == {"base": [0, 1, 2], "val": [], "novel": [3, 4]}
    other = load_dataset("omniglot", tmp_path, split_seed=1, num_base=2, num_val=1, num_novel=2)
    seeds = [load_dataset("omniglot", tmp_path, split_seed=s, num_base=2, num_val=1, num_novel=2).splits
             for s in range(2, 8)]  # fmt: skip
    assert any(s != other.splits for s in seeds)  # the seed changes the split
    with pytest.raises(DataError, match="split sizes"):
        load_dataset("omniglot", tmp_path)  # 1100/100/423 of only 5 classes


def test_omniglot_resized_images_are_cached_by_content_and_read_back_equal(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The resized images come back from the cache bit for bit; a changed file or option is a new
    entry, and a damaged cache file is computed again, not trusted."""
    monkeypatch.setenv("FEDFEW_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "data" / "omniglot"
    folder.mkdir(parents=True)
    write_omniglot_npz(folder / "images_background.npz", chars=3)
    write_omniglot_npz(folder / "images_evaluation.npz", chars=2, seed=1)
    computed = load_dataset("omniglot", tmp_path / "data", split="official")
    entries = sorted((tmp_path / "cache" / "omniglot").glob("*.safetensors"))
    assert len(entries) == 2  # one a half
    cached = load_dataset("omniglot", tmp_path / "data", split="official")
    assert torch.equal(cached.inputs, computed.inputs) and torch.equal(cached.labels, computed.labels)
    assert cached.class_names == computed.class_names
    load_dataset("omniglot", tmp_path / "data", split="official", image_size=14)
    assert len(list((tmp_path / "cache" / "omniglot").glob("*.safetensors"))) == 4  # another option, other entries
    write_omniglot_npz(folder / "images_evaluation.npz", chars=2, seed=2)  # other bytes, same name
    changed = load_dataset("omniglot", tmp_path / "data", split="official")
    assert not torch.equal(changed.inputs, computed.inputs)
    for entry in (tmp_path / "cache" / "omniglot").glob("*.safetensors"):
        entry.write_bytes(b"not a safetensors file")
    again = load_dataset("omniglot", tmp_path / "data", split="official")
    assert torch.equal(again.inputs, changed.inputs)


def test_omniglot_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="images_background.npz") as err:
        load_dataset("omniglot", tmp_path)
    assert "github.com/brendenlake/omniglot" in str(err.value)
    folder = tmp_path / "omniglot"
    folder.mkdir()
    write_omniglot_npz(folder / "images_background.npz", chars=2)
    with pytest.raises(DataNotFoundError, match="images_evaluation"):
        load_dataset("omniglot", tmp_path)
    (folder / "images_evaluation.npz").write_bytes(b"PK\x03\x04 this is not a zip")
    with pytest.raises(DataError) as err:
        load_dataset("omniglot", tmp_path)
    assert_corrupt(err, "images_evaluation.npz")
    np.savez(folder / "images_evaluation.npz", pictures=np.zeros((2, 2, 3, 3), dtype=bool))
    with pytest.raises(DataError, match="images") as err:
        load_dataset("omniglot", tmp_path)
    assert_corrupt(err, "images_evaluation.npz")


def write_png_tree(root: Path) -> dict[str, list[np.ndarray]]:
    """The official layout: images_<half>/<alphabet>/<character>/<drawing>.png, 105x105 mode '1'."""
    drawn: dict[str, list[np.ndarray]] = {}
    layout = {"background": {"Alphabet_of_the_Magi": 2, "Greek": 1}, "evaluation": {"Angelic": 2}}
    k = 0
    for half, alphabets in layout.items():
        for alphabet, chars in alphabets.items():
            for c in range(1, chars + 1):
                folder = root / "omniglot" / f"images_{half}" / alphabet / f"character{c:02d}"
                folder.mkdir(parents=True)
                for d in range(1, 4):
                    pixels = np.full((105, 105), 255, dtype=np.uint8)
                    pixels[10 + k : 30 + k, 20:25] = 0  # a black stroke, different per drawing
                    Image.fromarray(pixels).convert("1").save(folder / f"{900 + c:04d}_{d:02d}.png")
                    drawn.setdefault(f"{alphabet}/character{c:02d}", []).append(pixels)
                    k += 1
    return drawn


def test_omniglot_png_tree(tmp_path: Path) -> None:
    drawn = write_png_tree(tmp_path)
    data = load_dataset("omniglot", tmp_path, image_size=None, split="official")
    assert data.class_names == ["Alphabet_of_the_Magi/character01", "Alphabet_of_the_Magi/character02",
                                "Greek/character01", "Angelic/character01", "Angelic/character02"]  # fmt: skip
    assert data.inputs.shape == (15, 1, 105, 105)
    assert data.labels.tolist() == [c for c in range(5) for _ in range(3)]
    assert data.splits == {"base": [0, 1, 2], "val": [], "novel": [3, 4]}
    expected = torch.from_numpy(drawn["Greek/character01"][0] == 0).float()
    assert torch.equal(data.inputs[6, 0], expected)  # strokes are 1 after inversion
    assert data.extras["source"] == {"background": "png", "evaluation": "png"}
    resized = load_dataset("omniglot", tmp_path, num_base=3, num_val=1, num_novel=1)
    assert resized.inputs.shape == (15, 1, 28, 28)
    expected_small = torch.nn.functional.interpolate(data.inputs, size=(28, 28), mode="area")
    assert torch.allclose(resized.inputs, expected_small, atol=1e-6)
    bad = tmp_path / "omniglot" / "images_evaluation" / "Angelic" / "character01" / "0901_01.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(DataError) as err:
        load_dataset("omniglot", tmp_path)
    assert_corrupt(err, "0901_01.png")


@pytest.fixture(scope="module")
def omniglot_random(shared_data: Path):
    return load_dataset("omniglot", shared_data)


def test_shared_omniglot_random_split(omniglot_random) -> None:
    data = omniglot_random
    assert data.num_classes == 1623 and len(data) == 1623 * 20
    assert data.inputs.shape[1:] == (1, 28, 28)
    assert [len(data.splits[k]) for k in ("base", "val", "novel")] == [1100, 100, 423]
    assert_splits_partition(data.splits, 1623)
    assert torch.equal(data.class_counts(), torch.full((1623,), 20))
    assert 0.02 < float(data.inputs.mean()) < 0.2  # inverted: mostly 0 with strokes near 1


def test_shared_omniglot_official_split(shared_data: Path) -> None:
    data = load_dataset("omniglot", shared_data, split="official", image_size=14)
    assert data.splits["base"] == list(range(964)) and data.splits["val"] == []
    assert data.splits["novel"] == list(range(964, 1623))
    assert data.class_names[0] == "background/0000" and data.class_names[964] == "evaluation/0000"


# --------------------------------------------------------------------------- MNIST / Fashion-MNIST


def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def write_mnist(
    folder: Path, prefix: str, n: int, gz: bool = True, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = np.arange(n, dtype=np.uint8) % 10
    ext = ".gz" if gz else ""
    write_idx(folder / f"{prefix}-images-idx3-ubyte{ext}", images, 2051)
    write_idx(folder / f"{prefix}-labels-idx1-ubyte{ext}", labels, 2049)
    return images, labels


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_loaders(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    test_images, test_labels = write_mnist(folder, "t10k", 7)
    only_test = load_dataset(name, tmp_path)  # "all" with only the test files present
    assert only_test.inputs.shape == (7, 1, 28, 28) and only_test.inputs.dtype == torch.float32
    assert torch.allclose(only_test.inputs[:, 0], torch.from_numpy(test_images).float() / 255)
    assert only_test.labels.tolist() == test_labels.tolist()
    assert only_test.extras["is_test"].all()
    assert only_test.splits == {"base": [0, 1, 2, 3, 4], "val": [], "novel": [5, 6, 7, 8, 9]}
    with pytest.raises(DataNotFoundError, match="train-images-idx3-ubyte"):
        load_dataset(name, tmp_path, part="train")

    write_mnist(folder, "train", 12, gz=False, seed=1)  # uncompressed files work too
    full = load_dataset(name, tmp_path)
    assert len(full) == 19 and full.extras["is_test"].tolist() == [False] * 12 + [True] * 7
    assert len(load_dataset(name, tmp_path, part="train")) == 12
    assert len(load_dataset(name, tmp_path, part="test")) == 7
    assert len(full.class_names) == 10
    if name == "fashion-mnist":
        assert full.class_names[9] == "Ankle boot"


def test_idx_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="train-images-idx3-ubyte") as err:
        load_dataset("mnist", tmp_path)
    assert "yann.lecun.com" in str(err.value)
    folder = tmp_path / "mnist"
    write_mnist(folder, "t10k", 5)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_dataset("mnist", tmp_path)
    # images and labels swapped: wrong magic number
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros((5, 28, 28)), 2051)
    with pytest.raises(DataError, match="magic") as err:
        load_dataset("mnist", tmp_path)
    assert_corrupt(err, "t10k-labels-idx1-ubyte.gz")
    # truncated data
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(5), 2049)
    blob = gzip.decompress((folder / "t10k-images-idx3-ubyte.gz").read_bytes())
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(blob[:-100]))
    with pytest.raises(DataError, match="truncated") as err:
        load_dataset("mnist", tmp_path)
    assert_corrupt(err, "t10k-images-idx3-ubyte.gz")
    # a broken gzip stream
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(blob)[:50])
    with pytest.raises(DataError) as err:
        load_dataset("mnist", tmp_path)
    assert_corrupt(err, "t10k-images-idx3-ubyte.gz")
    with pytest.raises(DataError, match="part"):
        load_dataset("mnist", tmp_path, part="validation")


def test_shared_mnist_test_part(shared_data: Path) -> None:
    data = load_dataset("mnist", shared_data, part="test")
    assert data.inputs.shape == (10000, 1, 28, 28)
    assert torch.equal(data.class_counts() > 800, torch.ones(10, dtype=torch.bool))
    assert len(load_dataset("mnist", shared_data)) == 10000  # only the test files are there


# --------------------------------------------------------------------------- FEMNIST (LEAF)


def write_leaf(path: Path, users: dict[str, tuple[list, list]]) -> None:
    shard = {
        "users": list(users),
        "num_samples": [len(y) for _, y in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(shard)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def femnist_user(labels: list[int], value: float) -> tuple[list, list]:
    return [[value] * 784 for _ in labels], labels


def write_femnist(root: Path) -> None:
    folder = root / "femnist"
    write_leaf(
        folder / "train" / "all_data_0_niid_05_keep_0_train_9.json.gz",
        {"f0001_01": femnist_user([0, 10, 36], 0.1), "f0002_02": femnist_user([61, 5], 0.2)},
    )
    write_leaf(
        folder / "train" / "all_data_1_niid_05_keep_0_train_9.json", {"f0003_03": femnist_user([1], 0.3)}
    )
    write_leaf(folder / "test" / "all_data_0_niid_05_keep_0_test_9.json.gz",
               {"f0002_02": femnist_user([7], 0.4), "f0001_01": femnist_user([35], 0.5)})  # fmt: skip


def test_femnist(tmp_path: Path) -> None:
    write_femnist(tmp_path)
    data = load_dataset("femnist", tmp_path)
    assert data.inputs.shape == (8, 1, 28, 28) and data.inputs.dtype == torch.float32
    assert data.labels.tolist() == [0, 10, 36, 61, 5, 1, 7, 35]
    assert data.inputs[:, 0, 0, 0].tolist() == pytest.approx([0.1] * 3 + [0.2] * 2 + [0.3, 0.4, 0.5])
    assert data.extras["writers"] == ["f0001_01", "f0002_02", "f0003_03"]
    assert data.groups.tolist() == [0, 0, 0, 1, 1, 2, 1, 0]  # the same writer keeps its id in test
    assert data.extras["is_test"].tolist() == [False] * 6 + [True] * 2
    assert data.class_names[:11] == [str(d) for d in range(10)] + ["A"]
    assert data.class_names[35:37] == ["Z", "a"] and data.class_names[61] == "z"
    assert data.splits == {"base": list(range(10, 62)), "val": [], "novel": list(range(10))}
    assert len(load_dataset("femnist", tmp_path, part="test")) == 2
    users = read_leaf_shards(tmp_path / "femnist" / "train")
    assert [u for u, _, _ in users] == ["f0001_01", "f0002_02", "f0003_03"]


def test_femnist_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="femnist") as err:
        load_dataset("femnist", tmp_path)
    assert "train" in str(err.value) and "TalwalkarLab/leaf" in str(err.value)
    write_femnist(tmp_path)
    with pytest.raises(DataNotFoundError, match="test"):
        load_dataset("femnist", tmp_path / "nowhere", part="test")
    bad = tmp_path / "femnist" / "test" / "all_data_0_niid_05_keep_0_test_9.json.gz"
    with gzip.open(bad, "wt") as f:
        f.write('{"users": ["a"], "user_data": {"a": {"x": [[0.1, ')
    with pytest.raises(DataError) as err:
        load_dataset("femnist", tmp_path)
    assert_corrupt(err, bad.name)
    write_leaf(bad, {"w": ([[0.0] * 784, [0.0] * 784], [1])})
    with pytest.raises(DataError, match="2 inputs but 1 labels"):
        load_dataset("femnist", tmp_path)
    write_leaf(bad, {"w": ([[0.0] * 100], [1])})
    with pytest.raises(DataError, match="784"):
        load_dataset("femnist", tmp_path)


@pytest.fixture(scope="module")
def femnist_shared(shared_data: Path):
    return load_dataset("femnist", shared_data)


def test_shared_femnist(femnist_shared) -> None:
    data = femnist_shared
    is_test = data.extras["is_test"]
    assert int((~is_test).sum()) == 14708 and int(is_test.sum()) == 1685
    assert len(data.extras["writers"]) == 105 and int(data.groups.max()) == 104
    assert set(data.groups[is_test].tolist()) <= set(data.groups[~is_test].tolist())
    assert data.num_classes == 62 and data.inputs.shape[1:] == (1, 28, 28)
    assert 0.0 <= float(data.inputs.min()) and float(data.inputs.max()) <= 1.0


# --------------------------------------------------------------------------- CIFAR


def write_cifar_batch(path: Path, n: int, labels: dict[bytes, list[int]], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    batch = {b"batch_label": b"batch", b"filenames": [b"img_%d.png" % i for i in range(n)], b"data": data}
    batch.update(labels)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(batch, f)
    return data


CIFAR10_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer",
                 b"dog", b"frog", b"horse", b"ship", b"truck"]  # fmt: skip


def write_cifar10(root: Path) -> list[np.ndarray]:
    folder = root / "cifar-10-batches-py"
    arrays = [
        write_cifar_batch(folder / f"data_batch_{i}", 2, {b"labels": [i, (i + 5) % 10]}, seed=i)
        for i in range(1, 6)
    ]
    arrays.append(write_cifar_batch(folder / "test_batch", 3, {b"labels": [9, 0, 1]}, seed=9))
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": CIFAR10_NAMES, b"num_cases_per_batch": 2, b"num_vis": 3072}, f)
    return arrays


def test_cifar10(tmp_path: Path) -> None:
    arrays = write_cifar10(tmp_path)
    data = load_dataset("cifar10", tmp_path)
    assert data.inputs.shape == (13, 3, 32, 32) and data.inputs.dtype == torch.float32
    expected = torch.from_numpy(np.concatenate(arrays).reshape(-1, 3, 32, 32)).float() / 255
    assert torch.allclose(data.inputs, expected)
    assert data.labels.tolist() == [1, 6, 2, 7, 3, 8, 4, 9, 5, 0, 9, 0, 1]
    assert data.class_names[0] == "airplane" and data.class_names[9] == "truck"
    assert data.extras["is_test"].tolist() == [False] * 10 + [True] * 3
    assert data.splits == {"base": list(range(10)), "val": [], "novel": []}
    assert len(load_dataset("cifar10", tmp_path, part="test")) == 3

    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataNotFoundError, match="data_batch_3") as err:
        load_dataset("cifar10", tmp_path)
    assert "cs.toronto.edu/~kriz" in str(err.value)
    assert len(load_dataset("cifar10", tmp_path, part="test")) == 3
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x80\x02}q\x00(U\x04data")
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", tmp_path, part="test")
    assert_corrupt(err, "test_batch")
    write_cifar_batch(tmp_path / "cifar-10-batches-py" / "test_batch", 3, {b"labels": [1, 2]}, seed=0)
    with pytest.raises(DataError, match="3 images but 2"):
        load_dataset("cifar10", tmp_path, part="test")


def write_cifar100(root: Path) -> None:
    folder = root / "cifar-100-python"
    fine_to_coarse = {f: f % 20 for f in range(100)}  # superclass c holds fines c, c+20, ..., c+80
    train_fine = list(range(100))
    test_fine = [0, 7, 12]
    for name, fine in (("train", train_fine), ("test", test_fine)):
        labels = {b"fine_labels": fine, b"coarse_labels": [fine_to_coarse[f] for f in fine]}
        write_cifar_batch(folder / name, len(fine), labels, seed=len(fine))
    meta = {b"fine_label_names": [b"fine%d" % i for i in range(100)],
            b"coarse_label_names": [b"coarse%d" % i for i in range(20)]}  # fmt: skip
    with open(folder / "meta", "wb") as f:
        pickle.dump(meta, f)


def test_cifar100_and_fc100(tmp_path: Path) -> None:
    write_cifar100(tmp_path)
    data = load_dataset("cifar100", tmp_path)
    assert data.inputs.shape == (103, 3, 32, 32)
    assert data.class_names[5] == "fine5" and data.extras["coarse_names"][3] == "coarse3"
    assert data.extras["coarse_labels"].tolist()[:3] == [0, 1, 2]
    assert data.extras["is_test"].sum() == 3
    assert [len(data.splits[k]) for k in ("base", "val", "novel")] == [64, 16, 20]
    assert_splits_partition(data.splits, 100)
    assert load_dataset("cifar100", tmp_path).splits == data.splits
    assert load_dataset("cifar100", tmp_path, split_seed=1).splits != data.splits

    fc = load_dataset("fc100", tmp_path)
    assert [len(fc.splits[k]) for k in ("base", "val", "novel")] == [60, 20, 20]
    assert_splits_partition(fc.splits, 100)
    assert fc.splits["novel"] == sorted(c + 20 * k for c in (0, 7, 12, 14) for k in range(5))
    assert fc.splits["val"] == sorted(c + 20 * k for c in (8, 11, 13, 16) for k in range(5))
    assert len(load_dataset("fc100", tmp_path, part="train")) == 100


def test_cifar100_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="meta") as err:
        load_dataset("fc100", tmp_path)
    assert "cifar-100-python.tar.gz" in str(err.value)
    write_cifar100(tmp_path)
    write_cifar_batch(tmp_path / "cifar-100-python" / "test", 2, {b"fine_labels": [1, 2]}, seed=0)
    with pytest.raises(DataError, match="coarse_labels") as err:
        load_dataset("cifar100", tmp_path)
    assert_corrupt(err, "test")
    (tmp_path / "cifar-100-python" / "train").write_bytes(b"not a pickle at all")
    with pytest.raises(DataError) as err:
        load_dataset("cifar100", tmp_path)
    assert_corrupt(err, "train")


# --------------------------------------------------------------------------- mini-ImageNet


def write_mini_pkl(root: Path) -> dict[str, list[str]]:
    folder = root / "miniimagenet"
    folder.mkdir(parents=True, exist_ok=True)
    layout = {"train": ["n02110063", "n01532829"], "val": ["n01855672"], "test": ["n01930112", "n01981276"]}
    value = 0
    for file, wnids in layout.items():
        n = 2 * len(wnids)
        images = np.zeros((n, 84, 84, 3), dtype=np.uint8)
        class_dict = {}
        for k, wnid in enumerate(wnids):
            idx = [k, k + len(wnids)]  # interleaved, as the indices need not be contiguous
            class_dict[wnid] = idx
            for i in idx:
                images[i, :, :, 0] = value  # red channel encodes the class
                images[i, :, :, 2] = 255
            value += 40
        with open(folder / f"mini-imagenet-cache-{file}.pkl", "wb") as f:
            pickle.dump({"image_data": images, "class_dict": class_dict}, f)
    return layout


def test_miniimagenet_pickles(tmp_path: Path) -> None:
    write_mini_pkl(tmp_path)
    data = load_dataset("miniimagenet", tmp_path)
    assert data.inputs.shape == (10, 3, 84, 84) and data.inputs.dtype == torch.float32
    # classes are sorted by WordNet id inside each file
    assert data.class_names == ["n01532829", "n02110063", "n01855672", "n01930112", "n01981276"]
    assert data.splits == {"base": [0, 1], "val": [2], "novel": [3, 4]}
    assert data.labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    red = {0: 40, 1: 0, 2: 80, 3: 120, 4: 160}
    for label, value in red.items():
        chosen = data.inputs[data.labels == label]
        assert torch.allclose(chosen[:, 0], torch.full_like(chosen[:, 0], value / 255))
        assert torch.allclose(chosen[:, 2], torch.ones_like(chosen[:, 2]))  # channels first
    assert data.extras["source"] == "pkl"
    assert load_dataset("miniimagenet", tmp_path, image_size=32).inputs.shape == (10, 3, 32, 32)

    (tmp_path / "miniimagenet" / "mini-imagenet-cache-val.pkl").write_bytes(b"\x80\x04garbage")
    with pytest.raises(DataError) as err:
        load_dataset("miniimagenet", tmp_path)
    assert_corrupt(err, "mini-imagenet-cache-val.pkl")
    (tmp_path / "miniimagenet" / "mini-imagenet-cache-val.pkl").unlink()
    with pytest.raises(DataNotFoundError, match="mini-imagenet-cache-val.pkl"):
        load_dataset("miniimagenet", tmp_path)


def test_miniimagenet_csv_and_jpg(tmp_path: Path) -> None:
    folder = tmp_path / "miniimagenet"
    (folder / "images").mkdir(parents=True)
    layout = {"train": ["n02110063", "n01532829"], "val": ["n01855672"], "test": ["n01930112"]}
    colours = {
        "n02110063": (255, 0, 0),
        "n01532829": (0, 255, 0),
        "n01855672": (0, 0, 255),
        "n01930112": (255, 255, 255),
    }
    for file, wnids in layout.items():
        with open(folder / f"{file}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["filename", "label"])
            for wnid in wnids:
                for i in range(2):
                    name = f"{wnid}{i:08d}.jpg"
                    Image.new("RGB", (100, 90), colours[wnid]).save(folder / "images" / name)
                    writer.writerow([name, wnid])
    data = load_dataset("miniimagenet", tmp_path)
    assert data.inputs.shape == (8, 3, 84, 84)
    assert data.class_names == ["n01532829", "n02110063", "n01855672", "n01930112"]
    assert data.splits == {"base": [0, 1], "val": [2], "novel": [3]}
    assert data.extras["source"] == "csv"
    for label, wnid in enumerate(data.class_names):
        mean = data.inputs[data.labels == label].mean(dim=(0, 2, 3))
        assert torch.allclose(mean, torch.tensor(colours[wnid], dtype=torch.float32) / 255, atol=0.03)

    (folder / "images" / "n0185567200000001.jpg").write_bytes(b"\xff\xd8\xff broken jpeg")
    with pytest.raises(DataError) as err:
        load_dataset("miniimagenet", tmp_path)
    assert_corrupt(err, "n0185567200000001.jpg")
    (folder / "images" / "n0185567200000001.jpg").unlink()
    with pytest.raises(DataNotFoundError, match="n0185567200000001.jpg"):
        load_dataset("miniimagenet", tmp_path)


def test_miniimagenet_missing(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="mini-imagenet-cache-train.pkl") as err:
        load_dataset("miniimagenet", tmp_path)
    assert "train.csv" in str(err.value)
