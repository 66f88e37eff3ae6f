"""``sentence_mlp``: a small trainable encoder over frozen sentence embeddings (vector inputs [n, d],
e.g. the 384-d all-MiniLM-L6-v2 vectors of a text loader's ``sentence_encoder`` option)."""

from __future__ import annotations

from torch import nn

from fedfew.models.base import MODELS, FewShotModel, linear_head


@MODELS.register(
    "sentence_mlp",
    help="frozen sentence vectors [d] -> Linear 256 -> ReLU -> dropout -> Linear 100; options hidden, "
    "feature_dim, dropout",
)
def sentence_mlp(
    input_shape: tuple[int, ...],
    num_classes: int | None,
    hidden: int = 256,
    feature_dim: int = 100,
    dropout: float = 0.1,
) -> FewShotModel:
    """Linear(d, ``hidden``) -> ReLU -> Dropout -> Linear(``hidden``, ``feature_dim``).

    Not ``mlp``: that one ends in a ReLU at its hidden width (200) and has no dropout; this one gives
    signed features of the BiLSTM's size (100) so the two text encoders compare like for like.
    """
    if len(input_shape) != 1 or int(input_shape[0]) < 1:
        raise ValueError(f"sentence_mlp needs vector inputs of shape (d,), got {input_shape}")
    if hidden < 1 or feature_dim < 1:
        raise ValueError(f"sentence_mlp needs hidden and feature_dim >= 1, got {hidden} and {feature_dim}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"sentence_mlp dropout must lie in [0, 1), got {dropout}")
    encoder = nn.Sequential(
        nn.Linear(int(input_shape[0]), hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, feature_dim),
    )
    return FewShotModel(encoder, feature_dim, linear_head(feature_dim, num_classes))
