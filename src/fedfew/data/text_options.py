"""The options every text loader takes (``dataset.options``: ``max_len``, ``min_freq``, ``vocab_size``,
``glove``, ``sentence_encoder``), declared once: :func:`text_options` adds them to a loader's signature
and hands them to it as one dict, which it passes on to
:func:`~fedfew.data.text_datasets.text_dataset`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TypedDict, TypeVar

#: Each text option: (name, type, default), in the order a loader's signature lists them.
TEXT_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("max_len", int, 64),  # tokens kept per text (padded to it)
    ("min_freq", int, 1),  # a word's count below which it is <unk>
    ("vocab_size", int | None, None),  # the most frequent words kept (None: all)
    ("glove", str | None, None),  # word vectors for extras["embeddings"] (attach_glove)
    ("sentence_encoder", str | None, None),  # inputs become frozen sentence embeddings instead
)
#: The parameter through which a decorated loader receives them.
PARAMETER = "text_options"

Loader = TypeVar("Loader", bound=Callable[..., object])


class TextOptions(TypedDict, total=False):
    """The text options as a decorated loader receives them (its ``text_options``; ``glove`` only where
    the loader takes word vectors)."""

    max_len: int
    min_freq: int
    vocab_size: int | None
    glove: str | None
    sentence_encoder: str | None


def text_options(glove: bool = True) -> Callable[[Loader], Loader]:
    """Give a loader the text options: its signature (what ``fedfew`` lists as the dataset's options,
    and what an unknown option is checked against) gains them in place of its ``text_options``
    parameter, and a call's values (or the defaults) reach it as the dict ``text_options``.
    ``glove=False``: a loader without word vectors (its token ids only, or sentence embeddings)."""
    options = [(name, kind, default) for name, kind, default in TEXT_OPTIONS if glove or name != "glove"]

    def decorate(loader: Loader) -> Loader:
        signature = inspect.signature(loader)
        own = [p for p in signature.parameters.values() if p.name != PARAMETER]
        at = list(signature.parameters).index(PARAMETER)
        added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=kind)
                 for name, kind, default in options]

        @functools.wraps(loader)
        def wrapper(*args: object, **kwargs: object) -> object:
            if PARAMETER in kwargs:  # not an option of the dataset: the loader's own error for it
                raise TypeError(f"{loader.__name__}() got an unexpected keyword argument {PARAMETER!r}")
            given = {name: kwargs.pop(name, default) for name, _, default in options}
            return loader(*args, **kwargs, **{PARAMETER: given})

        wrapper.__signature__ = signature.replace(parameters=own[:at] + added + own[at:])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {**{k: v for k, v in loader.__annotations__.items() if k != PARAMETER},
                                   **{name: kind for name, kind, _ in options}}
        return wrapper  # type: ignore[return-value]

    return decorate
