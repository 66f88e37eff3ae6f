"""The text encoders (fedfew.models.text_encoders): padding never changes the features, and pretrained
embeddings are taken."""

from __future__ import annotations

import pytest
import torch

from fedfew.models import build_model

VOCAB = 30
LENGTH = 7


def _tokens(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([LENGTH, 3, 1, 5][:n])
    ids = torch.randint(1, VOCAB, (n, LENGTH))
    ids[torch.arange(LENGTH).unsqueeze(0) >= lengths.unsqueeze(1)] = 0
    return ids, lengths


@pytest.mark.parametrize(("name", "feature_dim"), [("gru", 128), ("bilstm", 100)])
def test_text_encoders_ignore_padding(name: str, feature_dim: int) -> None:
    torch.manual_seed(0)
    model = build_model(name, (LENGTH,), None, vocab_size=VOCAB).eval()
    assert model.feature_dim == feature_dim
    ids, lengths = _tokens(4)
    longer = torch.cat([ids, torch.zeros(4, 5, dtype=torch.int64)], dim=1)
    with torch.no_grad():
        features = model(ids, lengths)
        assert features.shape == (4, feature_dim)
        torch.testing.assert_close(model(longer, lengths), features)
        torch.testing.assert_close(model(ids), features)  # lengths inferred from the padding
        # Each row's features depend only on that row's valid tokens.
        torch.testing.assert_close(model(ids[1:2, :3], lengths[1:2]), features[1:2])


@pytest.mark.parametrize("name", ["gru", "bilstm"])
def test_text_encoders_take_pretrained_embeddings(name: str) -> None:
    pretrained = torch.randn(VOCAB, 12)
    model = build_model(name, (LENGTH,), 3, pretrained=pretrained, freeze_embedding=True, hidden=8)
    embedding = model.encoder.embedding
    assert embedding.weight.shape == (VOCAB, 12) and not embedding.weight.requires_grad
    torch.testing.assert_close(embedding.weight, pretrained)
    ids, lengths = _tokens(2)
    model(ids, lengths).sum().backward()
    assert embedding.weight.grad is None
    with pytest.raises(ValueError, match="vocab_size"):
        build_model(name, (LENGTH,), 3, vocab_size=VOCAB + 1, pretrained=pretrained)
    with pytest.raises(ValueError, match="vocab_size"):
        build_model(name, (LENGTH,), 3)
