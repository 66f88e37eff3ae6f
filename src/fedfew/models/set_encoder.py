"""A permutation-equivariant set encoder (no positional encoding): a building block of F2L's client
model, not a registered model."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SetTransformerEncoder"]


class SetTransformerEncoder(nn.Module):
    """``layers`` Transformer encoder layers (self-attention over the set, batch_first) applied to a
    set of feature vectors [n, d] or a batch of sets [b, n, d]; the output has the input's shape.

    Without positional encoding, permuting the set permutes the output the same way. The
    feed-forward width is ``feedforward`` (default 2 * dim); ``key_padding_mask`` ([b, n] or [n],
    True = padding) lets sets of different sizes share a batch."""

    def __init__(
        self, dim: int, heads: int = 4, layers: int = 1, dropout: float = 0.1, feedforward: int | None = None
    ) -> None:
        super().__init__()
        if dim % heads != 0:
            raise ValueError(f"SetTransformerEncoder needs dim ({dim}) divisible by heads ({heads})")
        layer = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=feedforward or 2 * dim, dropout=dropout, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.dim = dim

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() not in (2, 3) or x.shape[-1] != self.dim:
            raise ValueError(
                f"SetTransformerEncoder({self.dim}) needs [n, {self.dim}] or [b, n, {self.dim}], got {tuple(x.shape)}"
            )
        single = x.dim() == 2
        if single:
            x = x.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        out = self.encoder(x, src_key_padding_mask=key_padding_mask)
        return out.squeeze(0) if single else out
