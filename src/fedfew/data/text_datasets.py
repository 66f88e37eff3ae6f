"""Text datasets from texts and labels: token ids with a vocabulary (optionally GloVe vectors), or
sentence embeddings; the loaders' common ending (:func:`text_dataset`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from fedfew.data.dataset import LabelledDataset
from fedfew.data.embeddings import attach_glove
from fedfew.data.sentences import build_sentence_dataset, check_sentence_encoder
from fedfew.data.vocabulary import UNK, Vocabulary, pad_sequences, tokenize


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
    extras: dict[str, object] | None = None,
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
    extras: dict[str, object] | None = None,
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

