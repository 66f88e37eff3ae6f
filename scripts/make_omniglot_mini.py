"""Make fedfew's bundled ``omniglot-mini`` (src/fedfew/data/omniglot_mini.npz) from Omniglot's
original release files.

Omniglot (Lake, Salakhutdinov & Tenenbaum 2015; https://github.com/brendenlake/omniglot, MIT licence):
1,623 handwritten characters x 20 drawers, 105x105 binary images, in two halves by alphabet:
``images_background`` (964 characters, 30 alphabets) and ``images_evaluation`` (659 characters,
20 alphabets). This script reads the halves as npz files (keys ``images`` bool [chars, 20, 105, 105],
True = paper, and ``labels``), inverts them (strokes 1), shrinks every image to 28x28 by area
averaging, binarises at ``THRESHOLD`` and packs 8 pixels a byte. Every character is kept.

    python scripts/make_omniglot_mini.py ../shared/data/omniglot   # writes src/fedfew/data/omniglot_mini.npz
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

SIZE = 28
#: A pixel is ink when at least this fraction of its 105/28 x 105/28 source block is ink: keeps the
#: thin strokes of the original (a stroke 2-3 source pixels wide covers 0.3-0.8 of a block).
THRESHOLD = 0.25
OUT = Path(__file__).resolve().parents[1] / "src" / "fedfew" / "data" / "omniglot_mini.npz"


def shrink(paper: np.ndarray) -> np.ndarray:
    """bool [n, 105, 105] with True = paper -> bool [n, 28, 28] with True = ink."""
    ink = torch.from_numpy(~paper).float().unsqueeze(1)
    small = torch.cat([F.interpolate(ink[i : i + 1024], size=(SIZE, SIZE), mode="area")
                       for i in range(0, len(ink), 1024)])
    return (small.squeeze(1) >= THRESHOLD).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="folder holding images_background.npz and images_evaluation.npz")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    images, half_of_class, sources = [], [], {}
    for half_id, half in enumerate(("background", "evaluation")):
        path = Path(args.folder) / f"images_{half}.npz"
        sources[half] = hashlib.sha256(path.read_bytes()).hexdigest()
        with np.load(path) as archive:
            raw = archive["images"]  # [chars, 20, 105, 105]
        chars, drawers = raw.shape[:2]
        images.append(shrink(raw.reshape(-1, 105, 105)).reshape(chars, drawers, SIZE, SIZE))
        half_of_class += [half_id] * chars
    ink = np.concatenate(images)  # [1623, 20, 28, 28] bool
    np.savez_compressed(
        args.out,
        packed=np.packbits(ink.reshape(len(ink), ink.shape[1], -1), axis=-1),  # [1623, 20, 98] uint8
        shape=np.array(ink.shape),
        half=np.array(half_of_class, dtype=np.int8),  # 0: background alphabets, 1: evaluation alphabets
        source_sha256=np.array([sources["background"], sources["evaluation"]]),
    )
    print(f"wrote {args.out} ({Path(args.out).stat().st_size / 1e6:.2f} MB): {ink.shape[0]} characters x "
          f"{ink.shape[1]} drawers, {SIZE}x{SIZE}, {ink.mean():.3f} of pixels ink")


if __name__ == "__main__":
    main()
