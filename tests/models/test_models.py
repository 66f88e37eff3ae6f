"""The model zoo (fedfew.models): parameter counts, every registered model gives logits and features,
feature sizes follow the input shape, channels_last, and unknown options named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedfew.models import MODELS, build_model, count_parameters

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


@pytest.mark.parametrize("name", MODELS.names())
def test_every_registered_model_gives_logits_and_features(name: str) -> None:
    if name not in CASES:
        pytest.fail(f"model {name!r} has no input spec in tests/models/test_models.py CASES")
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
