"""Text encoders over padded token ids: ``model(ids, lengths)`` with ids int64 [n, L] (padding id 0)
and lengths int64 [n]. Padding never affects the features: the recurrent layers run on packed
sequences and attention pooling masks padded positions out."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from fedfew.models.base import MODELS, FewShotModel, linear_head

PAD_ID = 0


def make_embedding(
    vocab_size: int | None, embed_dim: int, pretrained: torch.Tensor | None, freeze_embedding: bool
) -> nn.Embedding:
    """An embedding with ``PAD_ID`` as padding index, from ``pretrained`` ([vocab, dim]) when given
    (its shape then sets the vocabulary size and dimension)."""
    if pretrained is not None:
        pretrained = torch.as_tensor(pretrained, dtype=torch.float32)
        if pretrained.dim() != 2:
            raise ValueError(
                f"pretrained embeddings must be [vocab_size, dim], got shape {tuple(pretrained.shape)}"
            )
        if vocab_size is not None and vocab_size != pretrained.shape[0]:
            raise ValueError(
                f"vocab_size {vocab_size} does not match pretrained embeddings {tuple(pretrained.shape)}"
            )
        return nn.Embedding.from_pretrained(pretrained.clone(), freeze=freeze_embedding, padding_idx=PAD_ID)
    if vocab_size is None:
        raise ValueError("text encoders need vocab_size (or a pretrained embedding matrix)")
    embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD_ID)
    embedding.weight.requires_grad_(not freeze_embedding)
    return embedding


def infer_lengths(ids: torch.Tensor) -> torch.Tensor:
    """Length of each row up to and including its last non-padding token."""
    positions = torch.arange(1, ids.shape[1] + 1, device=ids.device).expand_as(ids)
    return (positions * (ids != PAD_ID)).amax(dim=1)


def _pack(embedded: torch.Tensor, lengths: torch.Tensor):
    # pack_padded_sequence needs lengths >= 1 on the CPU; an all-padding row is read as one pad token.
    lengths = lengths.to("cpu", torch.int64).clamp(1, embedded.shape[1])
    return pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False), lengths


class GRUEncoder(nn.Module):
    """Embedding -> dropout -> GRU -> the hidden state after each row's last valid token."""

    def __init__(self, embedding: nn.Embedding, hidden: int, dropout: float) -> None:
        super().__init__()
        self.embedding = embedding
        self.dropout = nn.Dropout(dropout)
        self.rnn = nn.GRU(embedding.embedding_dim, hidden, batch_first=True)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        if lengths is None:
            lengths = infer_lengths(ids)
        packed, _ = _pack(self.dropout(self.embedding(ids)), lengths)
        _, last = self.rnn(packed)  # [layers, n, hidden], in the input's row order
        return last[-1]


class BiLSTMAttentionEncoder(nn.Module):
    """Embedding -> dropout -> BiLSTM -> attention pooling: score_t = v . tanh(W h_t + b), softmax
    over the valid positions only, features = sum_t a_t h_t ([n, 2 * hidden])."""

    def __init__(self, embedding: nn.Embedding, hidden: int, dropout: float) -> None:
        super().__init__()
        self.embedding = embedding
        self.dropout = nn.Dropout(dropout)
        self.rnn = nn.LSTM(embedding.embedding_dim, hidden, batch_first=True, bidirectional=True)
        self.attention = nn.Linear(2 * hidden, 2 * hidden)
        self.context = nn.Linear(2 * hidden, 1, bias=False)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        if lengths is None:
            lengths = infer_lengths(ids)
        packed, lengths = _pack(self.dropout(self.embedding(ids)), lengths)
        out, _ = self.rnn(packed)
        states, _ = pad_packed_sequence(out, batch_first=True)  # [n, max(lengths), 2 * hidden]
        states = self.dropout(states)
        scores = self.context(torch.tanh(self.attention(states))).squeeze(-1)
        positions = torch.arange(states.shape[1], device=states.device)
        valid = positions.unsqueeze(0) < lengths.to(states.device).unsqueeze(1)
        weights = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=1)
        return torch.bmm(weights.unsqueeze(1), states).squeeze(1)


def _check_text_shape(name: str, input_shape: tuple[int, ...]) -> None:
    if len(input_shape) != 1:
        raise ValueError(f"{name} needs token-id inputs of shape (L,), got {input_shape}")


@MODELS.register("gru", help="embedding -> GRU (hidden 128) -> last valid state; call model(ids, lengths)")
def gru(
    input_shape: tuple[int, ...],
    num_classes: int | None,
    vocab_size: int | None = None,
    embed_dim: int = 50,
    hidden: int = 128,
    pretrained: torch.Tensor | None = None,
    freeze_embedding: bool = False,
    dropout: float = 0.1,
) -> FewShotModel:
    """GRU text encoder; ``vocab_size`` may be left out when ``pretrained`` ([vocab, dim]) is given."""
    _check_text_shape("gru", input_shape)
    embedding = make_embedding(vocab_size, embed_dim, pretrained, freeze_embedding)
    encoder = GRUEncoder(embedding, hidden, dropout)
    return FewShotModel(encoder, hidden, linear_head(hidden, num_classes))


@MODELS.register(
    "bilstm", help="embedding -> BiLSTM (hidden 50 per direction) -> attention pooling; model(ids, lengths)"
)
def bilstm(
    input_shape: tuple[int, ...],
    num_classes: int | None,
    vocab_size: int | None = None,
    embed_dim: int = 50,
    hidden: int = 50,
    pretrained: torch.Tensor | None = None,
    freeze_embedding: bool = False,
    dropout: float = 0.1,
) -> FewShotModel:
    """BiLSTM with attention pooling -> 2 * ``hidden`` features; ``vocab_size`` may be left out when
    ``pretrained`` is given. Dropout is applied to the embeddings and to the LSTM states."""
    _check_text_shape("bilstm", input_shape)
    embedding = make_embedding(vocab_size, embed_dim, pretrained, freeze_embedding)
    encoder = BiLSTMAttentionEncoder(embedding, hidden, dropout)
    return FewShotModel(encoder, 2 * hidden, linear_head(2 * hidden, num_classes))
