"""The text datasets (fedfew.data.text): HuffPost, Reuters, 20 Newsgroups and Sent140 from small files
written here in their real formats (and the real data when it is present), missing and corrupt
files named."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from fedfew.data import DataError, DataNotFoundError, load_dataset
from fedfew.data.text import UNK


def assert_corrupt(excinfo: pytest.ExceptionInfo, name: str) -> None:
    assert not isinstance(excinfo.value, DataNotFoundError)
    assert name in str(excinfo.value)


def write_json_lines(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize(
    ("name", "num_classes", "sizes"), [("huffpost", 41, (20, 5, 16)), ("reuters", 31, (15, 5, 11))]
)
def test_fewshot_text_files(tmp_path: Path, name: str, num_classes: int, sizes: tuple[int, int, int]) -> None:
    rows = [{"raw": f"Headline number {i} about class {i % num_classes} !", "label": i % num_classes}
            for i in range(2 * num_classes)] + [{"raw": "", "label": 0}]  # fmt: skip
    write_json_lines(tmp_path / "text" / f"{name}.json", rows)
    data = load_dataset(name, tmp_path, max_len=5)
    assert data.inputs.shape == (len(rows), 5) and data.inputs.dtype == torch.long
    assert data.labels.tolist() == [r["label"] for r in rows]
    assert data.num_classes == num_classes and data.is_text
    assert tuple(len(data.splits[k]) for k in ("base", "val", "novel")) == sizes
    classes = data.splits["base"] + data.splits["val"] + data.splits["novel"]
    assert sorted(classes) == list(range(num_classes))
    assert data.lengths.tolist() == [5] * (len(rows) - 1) + [1]  # cut to max_len; empty -> one <unk>
    assert data.inputs[-1].tolist() == [UNK, 0, 0, 0, 0]
    vocab = data.extras["vocab"]
    assert vocab.decode(data.inputs[0]) == ["headline", "number", "0", "about", "class"]
    assert data.extras["texts"][3] == rows[3]["raw"]
    small = load_dataset(name, tmp_path, vocab_size=4, min_freq=1)
    assert len(small.extras["vocab"]) == 4 and int(small.inputs.max()) <= 3


def test_fewshot_text_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="huffpost.json") as err:
        load_dataset("huffpost", tmp_path)
    assert "Distributional-Signatures" in str(err.value)
    path = tmp_path / "text" / "reuters.json"
    path.parent.mkdir()
    path.write_text('{"raw": "fine", "label": 1}\n{"raw": "broken", "lab\n')
    with pytest.raises(DataError, match="line 2") as err:
        load_dataset("reuters", tmp_path)
    assert_corrupt(err, "reuters.json")
    path.write_text('{"raw": "fine", "label": 31}\n')
    with pytest.raises(DataError, match="label 31"):
        load_dataset("reuters", tmp_path)


@pytest.fixture(scope="module")
def huffpost_shared(shared_data: Path):
    return load_dataset("huffpost", shared_data)


def test_shared_huffpost(huffpost_shared) -> None:
    data = huffpost_shared
    assert len(data) == 36900 and data.num_classes == 41
    assert torch.equal(data.class_counts(), torch.full((41,), 900))
    assert data.inputs.shape == (36900, 64) and int(data.lengths.min()) >= 1
    assert data.splits["val"] == list(range(20, 25))
    assert len(data.split("novel")) == 16 * 900


def test_shared_reuters(shared_data: Path) -> None:
    data = load_dataset("reuters", shared_data, max_len=128)
    assert len(data) == 620 and data.num_classes == 31
    assert torch.equal(data.class_counts(), torch.full((31,), 20))
    assert int(data.lengths.max()) == 128


def write_newsgroups(root: Path) -> None:
    posts = {
        "train": {"alt.atheism": 2, "comp.graphics": 1, "rec.autos": 1, "sci.space": 2},
        "test": {"comp.graphics": 1, "talk.politics.guns": 1},
    }
    for part, groups in posts.items():
        for group, count in groups.items():
            folder = root / "20newsgroups" / f"20news-bydate-{part}" / group
            folder.mkdir(parents=True)
            for i in range(count):
                body = (
                    f"From: someone@example.com\nSubject: {group} post {i}\n\nCaf\xe9 talk about {group}.\n"
                )
                (folder / str(51000 + i * 10)).write_bytes(body.encode("latin-1"))


def test_20newsgroups(tmp_path: Path) -> None:
    write_newsgroups(tmp_path)
    data = load_dataset("20newsgroups", tmp_path, max_len=200)
    assert data.class_names == [
        "alt.atheism",
        "comp.graphics",
        "rec.autos",
        "sci.space",
        "talk.politics.guns",
    ]
    assert data.labels.tolist() == [0, 0, 1, 2, 3, 3, 1, 4]
    assert data.splits == {"base": [2, 3], "val": [1], "novel": [0, 4]}
    assert data.extras["is_test"].tolist() == [False] * 6 + [True] * 2
    assert "Café talk about alt.atheism." in data.extras["texts"][0]  # read as latin-1
    assert "café" in data.extras["vocab"]
    stripped = load_dataset("20newsgroups", tmp_path, strip_headers=True, part="train")
    assert stripped.extras["texts"][0] == "Café talk about alt.atheism.\n"
    assert len(stripped) == 6 and stripped.num_classes == 4
    with pytest.raises(DataNotFoundError, match="20news-bydate-train") as err:
        load_dataset("20newsgroups", tmp_path / "elsewhere")
    assert "qwone.com" in str(err.value)


def tweet(user: str, text: str) -> list[str]:
    return ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user, text]


def write_sent140(root: Path) -> None:
    shards = {
        "train": {"alice": ([tweet("alice", "I love it"), tweet("alice", "so sad today")], [1, 0]),
                  "bob": ([tweet("bob", "meh.")], [0])},
        "test": {"bob": ([tweet("bob", "Great game!")], [1])},
    }  # fmt: skip
    for part, users in shards.items():
        shard = {
            "users": list(users),
            "num_samples": [len(y) for _, y in users.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
        }
        folder = root / "sent140" / part
        folder.mkdir(parents=True)
        with gzip.open(folder / f"all_data_niid_1_keep_50_{part}_9.json.gz", "wt") as f:
            json.dump(shard, f)


def test_sent140(tmp_path: Path) -> None:
    write_sent140(tmp_path)
    data = load_dataset("sent140", tmp_path, max_len=4)
    assert data.extras["texts"] == ["I love it", "so sad today", "meh.", "Great game!"]
    assert data.labels.tolist() == [1, 0, 0, 1]
    assert data.class_names == ["negative", "positive"]
    assert data.groups.tolist() == [0, 0, 1, 1] and data.extras["users"] == ["alice", "bob"]
    assert data.extras["is_test"].tolist() == [False, False, False, True]
    assert data.lengths.tolist() == [3, 3, 2, 3]
    assert data.splits["base"] == [0, 1]
    assert data.extras["vocab"].decode(data.inputs[3]) == ["great", "game", "!"]

    bad = tmp_path / "sent140" / "test" / "all_data_niid_1_keep_50_test_9.json.gz"
    bad.write_bytes(gzip.compress(b'{"users": ["bob"], "user_data": '))
    with pytest.raises(DataError) as err:
        load_dataset("sent140", tmp_path)
    assert_corrupt(err, bad.name)
    with pytest.raises(DataNotFoundError, match="sent140"):
        load_dataset("sent140", tmp_path / "nowhere")
