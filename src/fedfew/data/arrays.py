"""``arrays``: your own NumPy arrays, as one ``.npz`` file or a folder of ``.npy`` files.

The file (or folder) holds ``x`` (inputs, any shape [n, ...]), ``y`` (labels [n], integers or
strings) and optionally ``groups`` ([n] writer/user/site ids or names, for the ``natural``
partition) and ``class_names`` ([num_classes] strings, when ``y`` holds ids 0..num_classes-1):

    np.savez("mydata.npz", x=images, y=labels, groups=writers)       # or a folder:
    np.save("mydata/x.npy", images); np.save("mydata/y.npy", labels)

Files are read without pickle: save strings as a numpy string array (``np.array(names)``), not as
Python objects.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedfew.data.dataset import DataError, DataNotFoundError, LabelledDataset
from fedfew.data.generic import PATH_HOW, encode_groups, encode_labels, generic_dataset
from fedfew.data.registry import DATASETS
from fedfew.data.transforms import Resize

NAME = "arrays"
HOW = "an .npz file with arrays x and y (optional groups), or a folder with x.npy and y.npy"


def _read(target: Path, keys: dict[str, str]) -> tuple[dict[str, np.ndarray], dict[str, Path]]:
    """The arrays named in ``keys`` (role -> key) that exist, and the file each came from."""
    arrays: dict[str, np.ndarray] = {}
    where: dict[str, Path] = {}
    if target.is_dir():
        for role, key in keys.items():
            file = target / f"{key}.npy"
            if not file.is_file():
                continue
            try:
                arrays[role] = np.load(file, allow_pickle=False)
            except (OSError, ValueError, EOFError) as err:
                raise DataError(f"{NAME}: cannot read {file} as a numpy .npy file ({_why(err, file)})") from err
            where[role] = file
        return arrays, where
    try:
        with np.load(target, allow_pickle=False) as archive:
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise DataError(f"{NAME}: {target} is a single .npy array; expected {HOW}")
            for role, key in keys.items():
                if key in archive.files:
                    arrays[role] = archive[key]
                    where[role] = target
            found = archive.files
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as err:
        raise DataError(f"{NAME}: cannot read {target} as a numpy .npz file ({_why(err, target)})") from err
    for role in ("x", "y"):
        if role not in arrays:
            raise DataError(f"{NAME}: {target} has no array {keys[role]!r} (found: {', '.join(found) or 'none'})")
    return arrays, where


#: How numpy's own files begin: a zip archive (.npz) or the .npy magic string. numpy takes anything
#: else for a pickle, so its "allow_pickle" error is only about Python objects when the file is one.
NUMPY_MAGIC = (b"PK\x03\x04", b"\x93NUMPY")
PICKLE_START = b"\x80"


def _why(err: Exception, file: Path) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "allow_pickle" in text:
        try:
            with open(file, "rb") as f:
                start = f.read(8)
        except OSError:
            start = b""
        if start.startswith(NUMPY_MAGIC):  # a numpy file holding an object array
            return "it holds Python objects; save strings as a numpy string array, e.g. np.array(list_of_str)"
        if start.startswith(PICKLE_START):
            return "it holds pickled Python objects; save strings as a numpy string array, e.g. np.array(list_of_str)"
        shown = start.decode("ascii", "replace") if start.isascii() else start.hex(" ")
        return (f"it is not a numpy file: it begins with {shown!r}"
                f"{' (text)' if start.isascii() else ''}; save arrays with np.savez or np.save")
    return text


def _values(array: np.ndarray, file: Path, key: str, n: int) -> list[Any]:
    """A 1-d array of n integers or strings as Python values."""
    if array.ndim != 1 or len(array) != n:
        raise DataError(f"{NAME}: {file} {key!r} has shape {array.shape}, expected ({n},) like x")
    if np.issubdtype(array.dtype, np.integer):
        return [int(v) for v in array]
    if array.dtype.kind in ("U", "S"):
        return [v.decode() if isinstance(v, bytes) else str(v) for v in array.tolist()]
    raise DataError(f"{NAME}: {file} {key!r} has dtype {array.dtype}; expected integers or strings")


def _inputs(x: np.ndarray, file: Path, key: str, image_size: int | None, channels_last: bool | None) -> torch.Tensor:
    """float32 inputs: [n, d] features, or images [n, C, H, W] (from [n, H, W], NCHW or NHWC)."""
    if x.ndim < 1 or len(x) == 0:
        raise DataError(f"{NAME}: {file} {key!r} has shape {x.shape}; expected [n, ...] with n > 0")
    if not (x.dtype == np.bool_ or np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise DataError(f"{NAME}: {file} {key!r} has dtype {x.dtype}; expected numbers")
    scale = 255.0 if x.dtype == np.uint8 else 1.0  # 8-bit pixels -> 0..1; other numbers as they are
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim == 3:
        x = x[:, None]  # grey images [n, H, W]
    data = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32) / scale
    if x.ndim == 4:
        nhwc = channels_last
        if nhwc is None:  # a small last axis and a larger second one: channels last
            nhwc = x.shape[3] in (1, 3, 4) and x.shape[1] not in (1, 3, 4)
        if nhwc:
            data = data.permute(0, 3, 1, 2)
        if image_size is not None:
            data = Resize(image_size)(data)
        data = data.contiguous()
    elif image_size is not None:
        raise DataError(f"{NAME}: image_size applies to images [n, H, W] or [n, C, H, W], not {x.shape}")
    if not torch.isfinite(data).all():
        raise DataError(f"{NAME}: {file} {key!r} holds NaN or infinite values")
    return data


@DATASETS.register(NAME, help="your arrays: .npz (or a folder of .npy) with x, y, optional groups; any shape")
def load_arrays(
    root: Path,
    path: str | None = None,
    x_key: str = "x",
    y_key: str = "y",
    groups_key: str = "groups",
    image_size: int | None = None,
    channels_last: bool | None = None,
) -> LabelledDataset:
    """Inputs as float32: [n, d] features stay flat; images ([n, H, W], [n, C, H, W] or, detected or
    with ``channels_last``, [n, H, W, C]) become [n, C, H, W], resized to ``image_size`` if given.
    uint8 inputs are divided by 255 (pixels -> 0..1); other numbers are kept as they are.

    ``path``: the .npz file or .npy folder, relative to the data folder ``root``. ``x_key``,
    ``y_key``, ``groups_key``: the array names. Labels: see :func:`fedfew.data.generic.encode_labels`
    (or ids into a ``class_names`` array). Default class split: a seeded 60/20/20.
    """
    target = Path(root) if path is None else Path(root) / Path(path).expanduser()
    if not target.exists():
        raise DataNotFoundError(target, NAME, f"Expected {HOW}. {PATH_HOW}")
    keys = {"x": x_key, "y": y_key, "groups": groups_key, "class_names": "class_names"}
    arrays, where = _read(target, keys)
    for role in ("x", "y"):
        if role not in arrays:
            raise DataNotFoundError(target / f"{keys[role]}.npy", NAME, f"Expected {HOW}. {PATH_HOW}")
    x = arrays["x"]
    inputs = _inputs(x, where["x"], x_key, image_size, channels_last)
    n = len(inputs)
    label_values = _values(arrays["y"], where["y"], y_key, n)
    if "class_names" in arrays:
        names = arrays["class_names"]
        if names.ndim != 1 or names.dtype.kind not in ("U", "S"):
            raise DataError(f"{NAME}: {where['class_names']} 'class_names' must be a 1-d array of strings")
        class_names = [v.decode() if isinstance(v, bytes) else str(v) for v in names.tolist()]
        if not all(isinstance(v, int) and 0 <= v < len(class_names) for v in label_values):
            raise DataError(
                f"{NAME}: {where['y']} {y_key!r} must hold ids 0..{len(class_names) - 1} into 'class_names'"
            )
        labels = label_values
    else:
        labels, class_names = encode_labels(label_values, f"{NAME}: {where['y']} {y_key!r}")
    extras: dict[str, object] = {"path": str(target)}
    group_values = _values(arrays["groups"], where["groups"], groups_key, n) if "groups" in arrays else None
    groups = encode_groups(group_values, f"{NAME}: {where.get('groups')}", extras)
    return generic_dataset(inputs, labels, class_names, NAME, groups, extras)
