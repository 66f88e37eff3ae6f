"""The model contract: ``encoder(x) -> features`` and ``head(features) -> logits``."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from fedfew.core.errors import UsageError
from fedfew.core.registry import Registry


class FewShotModel(nn.Module):
    """An encoder and a head. ``head`` is ``nn.Identity`` when the model has no classifier (metric
    methods such as prototypical networks classify by distance instead)."""

    def __init__(self, encoder: nn.Module, feature_dim: int, head: nn.Module | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.feature_dim = feature_dim
        self.head = head if head is not None else nn.Identity()
        self.channels_last = False

    def features(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.encoder(x, *args)

    def forward(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
        return self.head(self.features(x, *args))


#: torch's warning for a layer of size 0: such a model is refused below with a one-line error instead.
_ZERO_SIZE_WARNING = "Initializing zero-element tensors is a no-op"


@contextlib.contextmanager
def _zero_size_warning_hidden() -> Iterator[None]:
    """Drop torch's zero-size warning while a model is built, by wrapping ``warnings.showwarning``
    (not with a filter or ``catch_warnings``, which would reset Python's "warn once" memory and
    repeat every other warning)."""
    shown = warnings.showwarning

    def show(message: Warning | str, *args: Any, **kwargs: Any) -> None:
        if _ZERO_SIZE_WARNING not in str(message):
            shown(message, *args, **kwargs)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


class ModelBuildError(UsageError):
    """A model cannot be built with the options given (``model.options.hidden: 0``); names the model."""


def _shown(options: Mapping[str, object]) -> dict[str, object]:
    return {k: v for k, v in options.items() if not isinstance(v, torch.Tensor)}  # not pretrained vectors


def _cannot_build(name: str, input_shape: tuple[int, ...], options: Mapping[str, object], err: BaseException) -> str:
    """The cause is the options or the data's shape, never the algorithm: both are named."""
    return (f"model {name!r} (model.options {_shown(options)}) cannot be built for the data's inputs of shape "
            f"{tuple(input_shape)}: {_describe(err)}")


def _describe(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


ModelFactory = Callable[..., FewShotModel]
#: name -> factory(input_shape, num_classes, **options) returning a FewShotModel.
MODELS: Registry[ModelFactory] = Registry("model")


def use_channels_last(model: FewShotModel) -> FewShotModel:
    """Store conv weights and feed inputs as NHWC: measured about 1.45x per step for Conv4 on this
    project's 2-core CPU (benchmarks/bench_channels_last.py)."""
    if any(isinstance(m, nn.Conv2d) for m in model.modules()):
        # torch's stubs for Module.to lack the memory_format keyword that Module.to accepts.
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        model.channels_last = True
    return model


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int | None,
    channels_last: bool = True,
    **options: object,
) -> FewShotModel:
    """Build a registered model; ``num_classes=None`` gives a head-less encoder."""
    factory = MODELS.get(name)
    try:
        with _zero_size_warning_hidden():
            model = factory(tuple(input_shape), num_classes, **options)
        empty = [n for n, p in model.named_parameters() if p.numel() == 0]
        if empty:
            raise ValueError(f"parameter {empty[0]} has no elements (shape {tuple(model.get_parameter(empty[0]).shape)})")
    except TypeError as err:
        if "unexpected keyword argument" in str(err):
            import inspect

            allowed = [p for p in inspect.signature(factory).parameters if p not in ("input_shape", "num_classes")]
            raise ValueError(
                f"model {name!r} got an unknown option ({err}); it takes: {', '.join(allowed) or 'none'}"
            ) from None
        raise ModelBuildError(_cannot_build(name, input_shape, options, err)) from None
    except Exception as err:  # the factory's own code (a plugin's too): any error means these options fail
        raise ModelBuildError(_cannot_build(name, input_shape, options, err)) from None
    return use_channels_last(model) if channels_last else model


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def linear_head(feature_dim: int, num_classes: int | None) -> nn.Module | None:
    return None if num_classes is None else nn.Linear(feature_dim, num_classes)
