"""ResNet-18 (fedfew.models.resnet18): its stems."""

from __future__ import annotations

from torch import nn

from fedfew.models import build_model


def test_resnet18_stems() -> None:
    small = build_model("resnet18", (3, 32, 32), None)
    large = build_model("resnet18", (3, 224, 224), None)
    assert small.encoder.stem[0].kernel_size == (3, 3) and small.encoder.stem[0].stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in small.encoder.stem)
    assert large.encoder.stem[0].kernel_size == (7, 7) and isinstance(large.encoder.stem[-1], nn.MaxPool2d)
    assert all(m.track_running_stats for m in small.modules() if isinstance(m, nn.BatchNorm2d))
