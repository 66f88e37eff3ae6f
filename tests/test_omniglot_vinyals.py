"""Omniglot's few-shot protocol: Vinyals et al.'s class split (ProtoNet's lists) and the four rotations as
classes, on small files written here in the real layout and on the real data in ../shared/data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedfew.data import DataError, DataNotFoundError, load_dataset
from fedfew.data.omniglot import ROTATIONS, with_rotations

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


# --------------------------------------------------------------------------- the real lists


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
