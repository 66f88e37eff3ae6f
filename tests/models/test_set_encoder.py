"""The set encoder (fedfew.models.set_encoder): permutation equivariance, the padding mask, and its
checks."""

from __future__ import annotations

import pytest
import torch

from fedfew.models import MODELS
from fedfew.models.set_encoder import SetTransformerEncoder


def test_set_encoder_is_permutation_equivariant() -> None:
    torch.manual_seed(0)
    encoder = SetTransformerEncoder(16, heads=4, layers=2).eval()
    x = torch.randn(6, 16)
    perm = torch.randperm(6)
    with torch.no_grad():
        out = encoder(x)
        assert out.shape == x.shape
        torch.testing.assert_close(encoder(x[perm]), out[perm], atol=1e-5, rtol=1e-5)
        batch = torch.randn(3, 5, 16)
        perm = torch.randperm(5)
        out = encoder(batch)
        assert out.shape == batch.shape
        torch.testing.assert_close(encoder(batch[:, perm]), out[:, perm], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out, batch)


def test_set_encoder_padding_mask_and_checks() -> None:
    torch.manual_seed(0)
    encoder = SetTransformerEncoder(8, heads=2).eval()
    x = torch.randn(4, 8)
    padded = torch.cat([x, torch.randn(3, 8)]).unsqueeze(0)
    mask = torch.tensor([[False] * 4 + [True] * 3])
    with torch.no_grad():
        torch.testing.assert_close(
            encoder(padded, key_padding_mask=mask)[0, :4], encoder(x), atol=1e-5, rtol=1e-5
        )
    with pytest.raises(ValueError, match="divisible"):
        SetTransformerEncoder(10, heads=4)
    assert "set_encoder" not in MODELS
