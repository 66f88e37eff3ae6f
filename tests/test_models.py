"""The model zoo: parameter counts, shapes, the encoder/head contract, channels_last, and the
invariances of the set and text encoders."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedfew.models import MODELS, build_model, count_parameters
from fedfew.models.resnet12 import DropBlock
from fedfew.models.set_encoder import SetTransformerEncoder

VOCAB = 30
LENGTH = 7


def _images(shape: tuple[int, ...]):
    return lambda n: (torch.randn(n, *shape),)


def _tokens(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([LENGTH, 3, 1, 5][:n])
    ids = torch.randint(1, VOCAB, (n, LENGTH))
    ids[torch.arange(LENGTH).unsqueeze(0) >= lengths.unsqueeze(1)] = 0
    return ids, lengths


# name -> (input_shape, options, make_inputs(n)); small inputs keep the suite quick.
CASES = {
    "conv4": ((3, 32, 32), {}, _images((3, 32, 32))),
    "resnet12": ((3, 32, 32), {}, _images((3, 32, 32))),
    "resnet18": ((3, 32, 32), {}, _images((3, 32, 32))),
    "mlp": ((1, 28, 28), {}, _images((1, 28, 28))),
    "lenet5": ((1, 28, 28), {}, _images((1, 28, 28))),
    "cnn1": ((3, 32, 32), {}, _images((3, 32, 32))),
    "cnn2": ((1, 28, 28), {}, _images((1, 28, 28))),
    "adfl_cnn": ((3, 32, 32), {}, _images((3, 32, 32))),
    "feature2d": ((1, 28, 28), {}, _images((1, 28, 28))),
    "gru": ((LENGTH,), {"vocab_size": VOCAB}, _tokens),
    "bilstm": ((LENGTH,), {"vocab_size": VOCAB}, _tokens),
    "sentence_mlp": ((384,), {}, _images((384,))),
}
CONV_MODELS = ["conv4", "resnet12", "resnet18", "lenet5", "cnn1", "cnn2", "adfl_cnn"]


# --- parameter counts -------------------------------------------------------------------------


def resnet12_count_by_hand(in_channels: int = 3, widths=(64, 160, 320, 640)) -> int:
    """Per block: three bias-free 3x3 convs, a bias-free 1x1 shortcut conv, four BatchNorms (2 x out)."""
    total, previous = 0, in_channels
    for out in widths:
        convs = 9 * previous * out + 2 * 9 * out * out
        shortcut = previous * out
        batch_norms = 4 * 2 * out
        total += convs + shortcut + batch_norms
        previous = out
    return total


def test_resnet12_has_about_12_4_million_parameters() -> None:
    expected = resnet12_count_by_hand()
    assert expected == 12_424_320
    model = build_model("resnet12", (3, 84, 84), None)
    measured = count_parameters(model)
    assert abs(measured - expected) <= 0.01 * expected
    assert 12_300_000 <= measured <= 12_500_000
    assert model.feature_dim == 640


@pytest.mark.parametrize(
    ("name", "input_shape", "num_classes", "expected"),
    [
        ("conv4", (3, 84, 84), None, 113_088),
        ("mlp", (784,), 10, 199_210),
        ("mlp", (1, 28, 28), 10, 199_210),
        ("resnet18", (3, 32, 32), 10, 11_173_962),
        # 6*(25+1) + 16*(6*25+1) + (400*120+120) + (120*84+84) + (84*10+10)
        ("lenet5", (1, 28, 28), 10, 61_706),
        ("lenet5", (3, 32, 32), 10, 62_006),
        # 6*(9+1) + 16*(54+1) + (16*7*7*10 + 10)
        ("cnn1", (1, 28, 28), 10, 8_790),
        # (384*256+256) + (256*100+100) + (100*5+5)
        ("sentence_mlp", (384,), 5, 124_765),
    ],
)
def test_known_parameter_counts(name, input_shape, num_classes, expected) -> None:
    assert count_parameters(build_model(name, input_shape, num_classes)) == expected


def test_resnet18_stems() -> None:
    small = build_model("resnet18", (3, 32, 32), None)
    large = build_model("resnet18", (3, 224, 224), None)
    assert small.encoder.stem[0].kernel_size == (3, 3) and small.encoder.stem[0].stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in small.encoder.stem)
    assert large.encoder.stem[0].kernel_size == (7, 7) and isinstance(large.encoder.stem[-1], nn.MaxPool2d)
    assert all(m.track_running_stats for m in small.modules() if isinstance(m, nn.BatchNorm2d))


# --- shapes and the encoder/head contract -----------------------------------------------------


@pytest.mark.parametrize("name", MODELS.names())
def test_every_registered_model_gives_logits_and_features(name: str) -> None:
    if name not in CASES:
        pytest.fail(f"model {name!r} has no input spec in tests/test_models.py CASES")
    torch.manual_seed(0)
    input_shape, options, make_inputs = CASES[name]
    inputs = make_inputs(2)

    model = build_model(name, input_shape, 5, **options).eval()
    with torch.no_grad():
        logits = model(*inputs)
        features = model.features(*inputs)
        assert logits.shape == (2, 5)
        assert features.shape == (2, model.feature_dim)
        torch.testing.assert_close(model.head(features), logits)

    headless = build_model(name, input_shape, None, **options).eval()
    assert isinstance(headless.head, nn.Identity)
    with torch.no_grad():
        out = headless(*inputs)
        assert out.shape == (2, headless.feature_dim)
        torch.testing.assert_close(out, headless.features(*inputs))


@pytest.mark.parametrize(
    ("name", "input_shape"),
    [
        ("lenet5", (3, 32, 32)),
        ("cnn1", (1, 28, 28)),
        ("cnn2", (3, 32, 32)),
        ("adfl_cnn", (3, 48, 40)),
        ("mlp", (20,)),
    ],
)
def test_feature_dim_follows_the_input_shape(name: str, input_shape: tuple[int, ...]) -> None:
    model = build_model(name, input_shape, 3).eval()
    with torch.no_grad():
        assert model.features(torch.randn(2, *input_shape)).shape == (2, model.feature_dim)


@pytest.mark.parametrize("name", ["lenet5", "cnn1", "cnn2", "adfl_cnn", "resnet12", "resnet18"])
def test_image_models_reject_flat_inputs(name: str) -> None:
    with pytest.raises(ValueError, match="needs image inputs"):
        build_model(name, (784,), 10)


@pytest.mark.parametrize("name", CONV_MODELS)
def test_channels_last_gives_the_same_outputs(name: str) -> None:
    torch.manual_seed(0)
    input_shape, options, make_inputs = CASES[name]
    (x,) = make_inputs(2)
    fast = build_model(name, input_shape, 4, channels_last=True, **options).eval()
    plain = build_model(name, input_shape, 4, channels_last=False, **options).eval()
    plain.load_state_dict(fast.state_dict())
    assert fast.channels_last and not plain.channels_last
    with torch.no_grad():
        expected = plain(x.contiguous())
        torch.testing.assert_close(
            fast(x.contiguous(memory_format=torch.channels_last)), expected, atol=1e-5, rtol=1e-5
        )
        torch.testing.assert_close(fast(x), expected, atol=1e-5, rtol=1e-5)


def test_unknown_option_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="drop_block") as info:
        build_model("resnet12", (3, 32, 32), 5, dropblock=0.1)
    assert "channels" in str(info.value) and "block_size" in str(info.value)
    with pytest.raises(ValueError, match="freeze_embedding"):
        build_model("bilstm", (LENGTH,), 5, vocab_size=VOCAB, freeze=True)


# --- ResNet-12 and DropBlock ------------------------------------------------------------------


def test_resnet12_custom_channels() -> None:
    model = build_model("resnet12", (3, 32, 32), None, channels=(8, 16, 24, 32))
    assert model.feature_dim == 32
    assert count_parameters(model) == resnet12_count_by_hand(3, (8, 16, 24, 32))


def test_dropblock_drops_square_blocks_only_in_training() -> None:
    torch.manual_seed(0)
    drop = DropBlock(0.2, block_size=3)
    x = torch.ones(4, 8, 12, 12)
    assert torch.equal(drop.eval()(x), x)
    out = drop.train()(x)
    dropped = (out == 0).float().mean().item()
    assert 0.05 < dropped < 0.45
    kept = out[out != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, out.numel() / (out != 0).sum().item()))
    # Every dropped pixel lies in a fully dropped 3x3 square inside the map: the mask equals its
    # morphological opening (erode, then dilate) by a 3x3 square.
    zero = (out == 0).float()
    eroded = -nn.functional.max_pool2d(-zero, 3, stride=1)  # 1 where a whole 3x3 window is dropped
    opened = nn.functional.max_pool2d(nn.functional.pad(eroded, (2, 2, 2, 2)), 3, stride=1)
    assert torch.equal(opened, zero)
    assert torch.equal(DropBlock(0.0).train()(x), x)


def test_resnet12_dropblock_is_active_in_training_only() -> None:
    torch.manual_seed(0)
    options = {"channels": (8, 16, 24, 32)}
    plain = build_model("resnet12", (3, 32, 32), None, **options)
    dropping = build_model("resnet12", (3, 32, 32), None, drop_block=0.3, block_size=2, **options)
    dropping.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(dropping.eval()(x), plain.eval()(x))
        assert not torch.allclose(dropping.train()(x), plain.train()(x))


# --- set encoder ------------------------------------------------------------------------------


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


# --- text encoders ----------------------------------------------------------------------------


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
