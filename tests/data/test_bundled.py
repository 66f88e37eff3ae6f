"""The bundled datasets (fedfew.data.bundled): Omniglot-mini needs no data folder, keeps the alphabet
splits and is what scripts/make_omniglot_mini.py makes from the original files."""

from __future__ import annotations

from pathlib import Path


# -- the bundled Omniglot --------------------------------------------------------------------------
def test_omniglot_mini_is_bundled_with_alphabet_splits() -> None:
    from fedfew.data import load_dataset

    data = load_dataset("omniglot-mini", "/nonexistent")  # no data folder needed
    assert tuple(data.inputs.shape) == (1623 * 20, 1, 28, 28) and data.num_classes == 1623
    assert set(data.inputs.unique().tolist()) == {0.0, 1.0}
    splits = {k: set(v) for k, v in data.splits.items()}
    assert len(splits["base"]) == 964 and len(splits["val"]) == 100 and len(splits["novel"]) == 559
    assert splits["base"] == set(range(964))  # the 30 background alphabets
    assert not (splits["val"] & splits["novel"]) and splits["val"] | splits["novel"] == set(range(964, 1623))
    assert all(data.class_names[c].startswith("evaluation/") for c in splits["novel"])


def test_omniglot_mini_is_made_from_the_original_files(shared_data: Path) -> None:
    """The committed file is what scripts/make_omniglot_mini.py makes from Omniglot's npz release."""
    import importlib.util

    import numpy as np

    from fedfew.data import load_dataset

    spec = importlib.util.spec_from_file_location("make", Path(__file__).parents[2] / "scripts" / "make_omniglot_mini.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    with np.load(shared_data / "omniglot" / "images_evaluation.npz") as archive:
        original = archive["images"][[0, 658]]  # the first and last evaluation characters
    data = load_dataset("omniglot-mini")
    for k, char in enumerate((964, 1622)):
        expected = make.shrink(original[k].reshape(-1, 105, 105))
        mine = data.inputs[data.labels == char][:, 0].numpy().astype(bool)
        assert np.array_equal(mine, expected)
