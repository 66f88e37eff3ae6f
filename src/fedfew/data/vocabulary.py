"""Words to token ids: the tokenizer, the :class:`Vocabulary` (``<pad>`` = 0, ``<unk>`` = 1) and padding."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

import torch

from fedfew.data.dataset import DataError

PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"
PAD, UNK = 0, 1

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

