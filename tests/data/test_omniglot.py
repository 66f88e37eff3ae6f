"""Omniglot (fedfew.data.omniglot): the npz release and the PNG tree, the resized images' cache, missing
and corrupt files named; Vinyals et al.'s class split (ProtoNet's lists) and the four rotations as
classes, on small files written here in the real layout and on the real data in ../shared/data."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedfew.data import DataError, DataNotFoundError, load_dataset
from fedfew.data.omniglot import ROTATIONS, with_rotations
from tests.data.common import assert_corrupt, assert_splits_partition

HEADER = "half\tindex\talphabet\tcharacter"


def write_small_omniglot(root: Path, background: int = 3, evaluation: int = 2) -> np.ndarray:
    """Two npz halves whose character c is a square of c+1 pixels' side at the top left (so its rotations
    can be told apart), and the Vinyals files naming each character ``A/characterNN`` in file order."""
    folder = root / "omniglot"
    (folder / "splits" / "vinyals").mkdir(parents=True)
    all_images = []
    for half, chars in (("background", background), ("evaluation", evaluation)):
        images = np.ones((chars, 20, 105, 105), dtype=bool)
        for c in range(chars):
            images[c, :, : 10 * (c + 1), : 5 * (c + 1)] = False  # ink: a box at the top left
        labels = np.repeat(np.arange(chars, dtype=np.int64)[:, None], 20, axis=1)
        np.savez_compressed(folder / f"images_{half}.npz", images=images, labels=labels)
        all_images.append(images)
    rows = [HEADER] + [f"background\t{i}\tA\tcharacter{i + 1:02d}" for i in range(background)] + \
        [f"evaluation\t{i}\tB\tcharacter{i + 1:02d}" for i in range(evaluation)]
    (folder / "splits" / "vinyals" / "characters.tsv").write_text("\n".join(rows) + "\n")
    return np.concatenate(all_images)


def write_lists(root: Path, lists: dict[str, list[str]]) -> None:
    folder = root / "omniglot" / "splits" / "vinyals"
    for file_name in ("train.txt", "val.txt", "test.txt"):
        lines = [f"{name}/rot{d:03d}" for name in lists.get(file_name, []) for d in ROTATIONS]
        (folder / file_name).write_text("".join(line + "\n" for line in lines))


STANDARD = {"train.txt": ["A/character01", "A/character03"], "val.txt": ["B/character02"],
            "test.txt": ["A/character02", "B/character01"]}


def test_vinyals_split_maps_the_lists_onto_the_npz_characters(tmp_path: Path) -> None:
    write_small_omniglot(tmp_path)
    write_lists(tmp_path, STANDARD)
    data = load_dataset("omniglot", tmp_path, split="vinyals", image_size=None)
    # background characters are classes 0-2, evaluation ones 3-4 (the loaded order)
    assert data.splits == {"base": [0, 2], "val": [4], "novel": [1, 3]}
    assert data.class_names == ["A/character01", "A/character02", "A/character03", "B/character01", "B/character02"]
    assert int((data.labels == 4).sum()) == 20


def test_rotations_make_four_classes_per_character_in_its_split(tmp_path: Path) -> None:
    raw = write_small_omniglot(tmp_path)
    write_lists(tmp_path, STANDARD)
    data = load_dataset("omniglot", tmp_path, split="vinyals", image_size=None, rotations=True)
    assert len(data.class_names) == 20
    assert data.splits["base"] == [0, 1, 2, 3, 8, 9, 10, 11]
    assert data.class_names[9] == "A/character03/rot090"
    for split, classes in data.splits.items():  # every rotation class of a character in its split
        characters = {c // 4 for c in classes}
        assert classes == sorted(4 * ch + k for ch in characters for k in range(4)), split
    # class 4c + k holds character c's drawings rotated by 90k degrees counter-clockwise
    strokes = torch.from_numpy(~raw[2, 0]).float()  # invert=True: ink is 1
    for k in range(4):
        images = data.inputs[data.labels == 4 * 2 + k]
        assert images.shape == (20, 1, 105, 105)
        assert torch.equal(images[0, 0], torch.rot90(strokes, k))
    assert torch.equal(torch.rot90(torch.tensor([[1, 2], [3, 4]]), 1), torch.tensor([[2, 4], [1, 3]]))  # ccw


def test_rotations_with_the_random_split_keep_a_characters_classes_together(tmp_path: Path) -> None:
    write_small_omniglot(tmp_path)
    data = load_dataset("omniglot", tmp_path, image_size=8, rotations=True, num_base=3, num_val=1, num_novel=1)
    plain = load_dataset("omniglot", tmp_path, image_size=8, num_base=3, num_val=1, num_novel=1)
    for split, characters in plain.splits.items():
        assert data.splits[split] == [4 * c + k for c in characters for k in range(4)]
    assert len(data.labels) == 4 * len(plain.labels)


def test_with_rotations_on_its_own() -> None:
    inputs = torch.arange(8.0).reshape(2, 1, 2, 2)
    x, y, names, splits = with_rotations(inputs, torch.tensor([0, 1]), ["a", "b"], {"base": [1], "novel": [0]})
    assert y.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert names[:5] == ["a/rot000", "a/rot090", "a/rot180", "a/rot270", "b/rot000"]
    assert splits == {"base": [4, 5, 6, 7], "novel": [0, 1, 2, 3]}
    assert torch.equal(x[2], torch.rot90(inputs[0], 1, dims=(-2, -1)))


@pytest.mark.parametrize("lists, message", [
    ({**STANDARD, "val.txt": ["B/character02", "A/character01"]}, "in both train.txt and val.txt"),
    ({**STANDARD, "val.txt": []}, "characters are in none of the Vinyals lists"),
    ({**STANDARD, "val.txt": ["B/character09"]}, "is not a known"),
])
def test_bad_lists_are_refused_naming_the_file(tmp_path: Path, lists: dict[str, list[str]], message: str) -> None:
    write_small_omniglot(tmp_path)
    write_lists(tmp_path, lists)
    with pytest.raises(DataError, match=message):
        load_dataset("omniglot", tmp_path, split="vinyals", image_size=None)


def test_a_character_in_fewer_than_four_rotations_is_refused(tmp_path: Path) -> None:
    write_small_omniglot(tmp_path)
    write_lists(tmp_path, STANDARD)
    test_list = tmp_path / "omniglot" / "splits" / "vinyals" / "test.txt"
    test_list.write_text("".join(line + "\n" for line in test_list.read_text().split()[:-1]))
    with pytest.raises(DataError, match=r"test.txt lists B/character01 in 3 of the 4 rotations"):
        load_dataset("omniglot", tmp_path, split="vinyals", image_size=None)


def test_missing_lists_name_the_file(tmp_path: Path) -> None:
    write_small_omniglot(tmp_path)
    with pytest.raises(DataNotFoundError, match="train.txt"):
        load_dataset("omniglot", tmp_path, split="vinyals", image_size=None)
    (tmp_path / "omniglot" / "splits" / "vinyals" / "characters.tsv").unlink()
    with pytest.raises(DataNotFoundError, match="characters.tsv"):
        load_dataset("omniglot", tmp_path, split="vinyals", image_size=None)


@pytest.fixture(scope="module")
def real_vinyals(shared_data: Path):
    return load_dataset("omniglot", shared_data, split="vinyals", rotations=True)


def test_real_vinyals_split_has_the_literatures_class_counts(real_vinyals) -> None:
    counts = {split: len(classes) for split, classes in real_vinyals.splits.items()}
    assert counts == {"base": 4112, "val": 688, "novel": 1692}
    assert len(real_vinyals.class_names) == 4 * 1623 and len(real_vinyals.labels) == 4 * 1623 * 20
    characters = {split: {c // 4 for c in classes} for split, classes in real_vinyals.splits.items()}
    assert [len(c) for c in characters.values()] == [1028, 172, 423]
    assert not (characters["base"] & characters["val"] or characters["base"] & characters["novel"]
                or characters["val"] & characters["novel"])
    for classes in real_vinyals.splits.values():
        assert set(classes) == {4 * ch + k for ch in {c // 4 for c in classes} for k in range(4)}


def ink_aspect(drawings: np.ndarray) -> float:
    """The ink's median height / width over a character's drawings (False = ink)."""
    ratios = []
    for drawing in drawings:
        rows, cols = np.nonzero(~drawing)
        ratios.append((np.ptp(rows) + 1) / (np.ptp(cols) + 1))
    return float(np.median(ratios))


def test_real_mapping_agrees_with_the_npz_files(shared_data: Path) -> None:
    """characters.tsv's ``index`` is the position on the npz file's first axis, which holds the official
    character IDs in order (its labels are ID - 1 / ID - 965): so each half's labels must be 0..n-1 along
    that axis, each alphabet a contiguous run of indices whose size is its count in the split lists, and
    the images must be the characters the names say: Latin's character12 ('l') is a tall thin stroke and
    character13 ('m') a wide one."""
    folder = shared_data / "omniglot"
    rows = [line.split("\t") for line in (folder / "splits/vinyals/characters.tsv").read_text().splitlines()[1:]]
    listed: dict[str, int] = {}
    for file_name in ("train.txt", "val.txt", "test.txt"):
        for line in (folder / "splits/vinyals" / file_name).read_text().split():
            listed[line.split("/")[0]] = listed.get(line.split("/")[0], 0) + 1
    for half in ("background", "evaluation"):
        with np.load(folder / f"images_{half}.npz") as archive:
            labels = archive["labels"]
            images = archive["images"] if half == "background" else None
        assert (labels == np.arange(len(labels))[:, None]).all(), half
        indices = {}
        for row_half, index, alphabet, _ in rows:
            if row_half == half:
                indices.setdefault(alphabet, []).append(int(index))
        assert sorted(i for run in indices.values() for i in run) == list(range(len(labels)))
        for alphabet, run in indices.items():
            assert run == list(range(run[0], run[0] + len(run))), alphabet
            assert 4 * len(run) == listed[alphabet], alphabet
        if images is not None:
            index_of = {f"{a}/{c}": int(i) for h, i, a, c in rows if h == half}
            aspect = {name: ink_aspect(images[index_of[name]]) for name in ("Latin/character12", "Latin/character13")}
            assert aspect["Latin/character12"] > 3 and aspect["Latin/character13"] < 1


def test_the_default_split_is_unchanged_by_the_new_options(shared_data: Path) -> None:
    plain = load_dataset("omniglot", shared_data)
    assert {k: len(v) for k, v in plain.splits.items()} == {"base": 1100, "val": 100, "novel": 423}
    assert len(plain.class_names) == 1623 and plain.class_names[0] == "background/0000"


def test_npz_magic_check_names_the_file(tmp_path: Path) -> None:
    from fedfew.data.dataset import DataError
    from fedfew.data.omniglot import _read_npz

    path = tmp_path / "images_background.npz"
    np.savez(path, images=np.zeros((2, 2, 4, 4), bool), labels=np.zeros((2, 2), np.int64))
    assert zipfile.is_zipfile(path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DataError, match="images_background.npz"):
        _read_npz(path)


Image = pytest.importorskip("PIL.Image")


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
