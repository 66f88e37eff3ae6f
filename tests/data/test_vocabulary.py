"""Words to token ids (fedfew.data.vocabulary): the tokenizer, the vocabulary and padding."""

from __future__ import annotations

import pytest
import torch

from fedfew.data import DataError
from fedfew.data.text import PAD, UNK, Vocabulary, pad_sequences, tokenize


def test_tokenize() -> None:
    assert tokenize("Hello, World! It's 2018...") == [
        "hello",
        ",",
        "world",
        "!",
        "it's",
        "2018",
        ".",
        ".",
        ".",
    ]
    assert tokenize("  ") == []
    assert tokenize("Café au-lait") == ["café", "au", "-", "lait"]


def test_vocabulary() -> None:
    docs = [["b", "a", "a"], ["c", "a", "b"], ["d"]]
    vocab = Vocabulary.build(docs)
    assert vocab.itos[:2] == ["<pad>", "<unk>"] and vocab.stoi["<pad>"] == PAD and vocab.stoi["<unk>"] == UNK
    assert vocab.itos[2:] == ["a", "b", "c", "d"]  # by frequency, ties alphabetical
    assert len(vocab) == 6 and "c" in vocab and "z" not in vocab
    assert vocab.encode(["a", "z", "d"]) == [2, UNK, 5]
    assert vocab.decode([2, 1, 0, 0]) == ["a", "<unk>"]
    assert all(vocab.stoi[t] == i for i, t in enumerate(vocab.itos))
    assert Vocabulary.build(docs, min_freq=2).itos == ["<pad>", "<unk>", "a", "b"]
    assert Vocabulary.build(docs, max_size=3).itos == ["<pad>", "<unk>", "a"]
    with pytest.raises(DataError):
        Vocabulary.build(docs, max_size=1)


def test_pad_sequences() -> None:
    ids, lengths = pad_sequences([[5, 6, 7], [8], [], [1, 2, 3, 4, 5, 6]], max_len=4)
    assert ids.dtype == torch.long and ids.shape == (4, 4)
    assert ids.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0], [0, 0, 0, 0], [1, 2, 3, 4]]
    assert lengths.tolist() == [3, 1, 0, 4]
    with pytest.raises(DataError):
        pad_sequences([[1]], max_len=0)
