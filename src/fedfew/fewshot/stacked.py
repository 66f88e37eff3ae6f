"""Many copies of one model, one per client, run as a single computation: "stacked" parameters.

A stacked parameter is the clients' copies of one parameter stacked on a new first dimension ``[C,
...]``. :func:`stacked_forward` runs ``model``'s layers with client ``c``'s parameters on client
``c``'s inputs ``x[c]`` for every ``c`` at once: images travel as one tensor ``[B, C * channels, H,
W]`` (client ``c`` owns channels ``c * channels ..``), so a convolution is one grouped convolution
(``groups = C``), BatchNorm's per-channel batch statistics are per client and per channel, and ReLU
and pooling act per channel anyway; after ``Flatten`` features travel as ``[C, B, F]`` and a linear
layer is one batched matrix product. Each client's outputs are the ones ``model`` itself would
give with that client's parameters (up to floating-point summation order), and the gradient of
``sum_c loss_c`` with respect to a stacked parameter holds every client's own gradient, because the
clients share nothing.

Only models built from the layers in :data:`STACKED_LAYERS`, chained by ``nn.Sequential`` inside a
:class:`~fedfew.models.base.FewShotModel`, can be stacked (Conv4 and its heads); :func:`why_not_stackable`
says what stands in the way otherwise. We chose explicit grouped layers over ``torch.func.vmap`` of
``functional_call``: on this project's CPU vmap's batching rules for BatchNorm and pooling cost 3.6x the
sequential time for the Conv4 FO-MAML step, and vmap cannot keep the channels_last layout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from fedfew.fewshot.episodes import Episode
from fedfew.models.base import FewShotModel

Params = dict[str, torch.Tensor]


class Stacked:
    """A batch of per-client activations: ``grouped`` images ``[B, C * ch, H, W]`` or ``[C, B, ...]``."""

    def __init__(self, value: torch.Tensor, clients: int, grouped: bool) -> None:
        self.value, self.clients, self.grouped = value, clients, grouped

    def ungrouped(self) -> torch.Tensor:
        """``[C, B, ...]`` whatever the current form."""
        if not self.grouped:
            return self.value
        b, cc, *spatial = self.value.shape
        return self.value.reshape(b, self.clients, cc // self.clients, *spatial).transpose(0, 1)


Layer = Callable[[nn.Module, Params, str, Stacked], Stacked]
#: module type -> how it runs on stacked activations with stacked parameters (``prefix`` names its
#: parameters in the params dict).
STACKED_LAYERS: dict[type[nn.Module], Layer] = {}


def stacked_layer(*types: type[nn.Module]) -> Callable[[Layer], Layer]:
    def decorate(fn: Layer) -> Layer:
        for t in types:
            STACKED_LAYERS[t] = fn
        return fn

    return decorate


def group_images(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """``[C, B, ch, H, W]`` -> ``[B, C * ch, H, W]``."""
    c, b, ch, *spatial = x.shape
    out = x.transpose(0, 1).reshape(b, c * ch, *spatial)
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out.contiguous()


@stacked_layer(nn.Conv2d)
def _conv(m: nn.Module, params: Params, prefix: str, x: Stacked) -> Stacked:
    assert isinstance(m, nn.Conv2d) and x.grouped
    weight = params[prefix + "weight"]
    c, o, i, kh, kw = weight.shape
    weight = weight.reshape(c * o, i, kh, kw)
    if x.value.is_contiguous(memory_format=torch.channels_last) and i > 1:
        weight = weight.contiguous(memory_format=torch.channels_last)
    bias = params.get(prefix + "bias")
    out = F.conv2d(x.value, weight, None if bias is None else bias.reshape(-1), m.stride, m.padding,
                   m.dilation, groups=c * m.groups)
    return Stacked(out, c, True)


@stacked_layer(nn.BatchNorm2d)
def _batch_norm(m: nn.Module, params: Params, prefix: str, x: Stacked) -> Stacked:
    assert isinstance(m, nn.BatchNorm2d) and x.grouped
    weight, bias = params.get(prefix + "weight"), params.get(prefix + "bias")
    out = F.batch_norm(x.value, None, None, None if weight is None else weight.reshape(-1),
                       None if bias is None else bias.reshape(-1), True, 0.0, m.eps)
    return Stacked(out, x.clients, True)


@stacked_layer(nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.Identity)
def _per_channel(m: nn.Module, params: Params, prefix: str, x: Stacked) -> Stacked:
    """Parameter-free layers that act on each channel (or element) alone."""
    return Stacked(m(x.value), x.clients, x.grouped)


@stacked_layer(nn.Flatten)
def _flatten(m: nn.Module, params: Params, prefix: str, x: Stacked) -> Stacked:
    value = x.ungrouped()
    return Stacked(value.reshape(*value.shape[:2], -1), x.clients, False)


@stacked_layer(nn.Linear)
def _linear(m: nn.Module, params: Params, prefix: str, x: Stacked) -> Stacked:
    value = x.ungrouped()
    weight, bias = params[prefix + "weight"], params.get(prefix + "bias")  # [C, out, in], [C, out]
    flat = value.reshape(value.shape[0], -1, value.shape[-1])
    out = torch.bmm(flat, weight.transpose(1, 2)) if bias is None else torch.baddbmm(bias.unsqueeze(1), flat,
                                                                                        weight.transpose(1, 2))
    return Stacked(out.reshape(*value.shape[:-1], -1), x.clients, False)


def _chain(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """The leaf layers a stackable module applies, in order, with their parameter-name prefixes."""
    if isinstance(module, FewShotModel):
        yield from _chain(module.encoder, prefix + "encoder.")
        yield from _chain(module.head, prefix + "head.")
    elif isinstance(module, nn.Sequential):
        for name, child in module.named_children():
            yield from _chain(child, f"{prefix}{name}.")
    else:
        yield prefix, module


def why_not_stackable(model: nn.Module) -> str | None:
    """None when :func:`stacked_forward` can run ``model``; otherwise what stands in the way."""
    if not isinstance(model, FewShotModel) or type(model).forward is not FewShotModel.forward:
        return f"{type(model).__name__} is not a plain encoder + head model"
    if any(True for _ in model.buffers()):
        return "the model has buffers (BatchNorm running statistics); use track_running_stats: false"
    if any(not p.requires_grad for p in model.parameters()):
        return "the model has frozen parameters"
    for module in model.modules():
        if isinstance(module, nn.Sequential) and type(module).forward is not nn.Sequential.forward:
            return f"{type(module).__name__} overrides Sequential.forward"
    for _, layer in _chain(model):
        if type(layer) not in STACKED_LAYERS:
            return f"layer {type(layer).__name__} has no stacked form"
        if isinstance(layer, nn.Flatten) and (layer.start_dim != 1 or layer.end_dim != -1):
            return "Flatten other than from dimension 1"
        if isinstance(layer, nn.Conv2d) and layer.padding_mode != "zeros":
            return "a convolution with non-zero padding"
    return None


def stacked_forward(model: FewShotModel, params: Params, x: torch.Tensor, features: bool = False) -> torch.Tensor:
    """``out[c] = model(x[c])`` (``model.features(x[c])`` with ``features``) with client ``c``'s
    parameters ``params[name][c]``, for every client at once: ``x`` is ``[C, B, ...]``, the result
    ``[C, B, ...]``."""
    clients = x.shape[0]
    state = Stacked(group_images(x, model.channels_last), clients, True) if x.dim() == 5 else Stacked(x, clients, False)
    for prefix, layer in _chain(model.encoder if features else model, "encoder." if features else ""):
        state = STACKED_LAYERS[type(layer)](layer, params, prefix, state)
    return state.ungrouped()


def stack_states(states: list[dict[str, torch.Tensor]], names: list[str]) -> Params:
    """``{name: [C, ...]}`` from per-client state dicts, as fresh leaf tensors."""
    return {name: torch.stack([s[name].detach() for s in states]).contiguous() for name in names}


def unstack(params: Params, client: int) -> dict[str, torch.Tensor]:
    return {name: p[client].detach().clone() for name, p in params.items()}


class StackedEpisodes:
    """One episode per client, all of one shape, stacked: ``support [C, N*K, ...]``,
    ``support_labels [C, N*K]``, ``query [C, N*Q, ...]``, ``query_labels [C, N*Q]``."""

    def __init__(self, episodes: list[Episode]) -> None:
        first = episodes[0]
        if any(e.support_lengths is not None for e in episodes):
            raise ValueError("stacked episodes of token sequences are not supported")
        self.n_way = first.n_way
        self.support = torch.stack([e.support for e in episodes])
        self.support_labels = torch.stack([e.support_labels for e in episodes])
        self.query = torch.stack([e.query for e in episodes])
        self.query_labels = torch.stack([e.query_labels for e in episodes])

    @property
    def clients(self) -> int:
        return len(self.support)


def per_client_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``[C]``: client ``c``'s mean cross-entropy of ``logits[c]`` ``[B, n]`` against ``labels[c]``."""
    c, b, n = logits.shape
    return F.cross_entropy(logits.reshape(c * b, n), labels.reshape(c * b), reduction="none").view(c, b).mean(1)
