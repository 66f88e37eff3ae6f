"""Class splits (base / val / novel) chosen by the user for any dataset: ``dataset.options.class_split``.

Two forms, applied by :func:`fedfew.data.load_dataset` after the loader returns, so every dataset,
named, generic or from a plugin, takes the same spec:

* explicit lists of class names or ids: ``{base: [cat, dog], val: [fox], novel: rest}``;
* numbers, drawn from a seeded permutation of all classes: fractions (floats) or counts (ints),
  ``{base: 0.6, val: 0.2, novel: 0.2, seed: 0}``.

A split that is left out is empty; ``rest`` (for one split) takes every class the others do not.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from fedfew.data.dataset import SPLITS, DataError, LabelledDataset

REST = "rest"


def _counts(fractions: dict[str, float], num_classes: int) -> dict[str, int]:
    """Class counts for ``fractions`` of ``num_classes``: floors, then the largest remainders get
    the classes left (ties in the order base, val, novel), so the counts sum to round(sum * n)."""
    exact = {k: f * num_classes for k, f in fractions.items()}
    counts = {k: math.floor(v + 1e-9) for k, v in exact.items()}
    total = min(num_classes, round(sum(exact.values())))
    for k in sorted(exact, key=lambda k: -(exact[k] - counts[k]))[: max(0, total - sum(counts.values()))]:
        counts[k] += 1
    return counts


def _draw(counts: dict[str, int], num_classes: int, seed: int) -> dict[str, list[int]]:
    """Disjoint splits of the given sizes from one permutation seeded with ``seed`` (numpy's default
    generator: the same classes on every machine), taken in the order base, val, novel."""
    perm = np.random.default_rng(seed).permutation(num_classes).tolist()
    splits, start = {}, 0
    for name in SPLITS:
        if name in counts:
            splits[name] = sorted(perm[start : start + counts[name]])
            start += counts[name]
    return splits


def default_split(num_classes: int) -> dict[str, list[int]]:
    """The generic loaders' default: about 60/20/20 of the classes, drawn with seed 0. Val and
    novel get round(20%) each (novel at least one class), base the rest: 8 classes give 4/2/2,
    where largest remainders would give 5/2/1 and leave too few novel classes for a 2-way task."""
    n = num_classes
    novel = max(1, round(0.2 * n)) if n >= 2 else 0
    val = round(0.2 * n) if n >= 3 else 0
    return _draw({"base": n - val - novel, "val": val, "novel": novel}, n, seed=0)


def class_id(item: object, class_names: list[str], where: str) -> int:
    if isinstance(item, bool) or not isinstance(item, (int, str)):
        raise DataError(f"{where}: {item!r} is neither a class name nor a class id")
    if isinstance(item, int):
        if not 0 <= item < len(class_names):
            raise DataError(f"{where}: class id {item} is out of range 0..{len(class_names) - 1}")
        return item
    try:
        return class_names.index(item)
    except ValueError:
        close = difflib.get_close_matches(item, class_names, n=3)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        shown = ", ".join(class_names[:8]) + (", ..." if len(class_names) > 8 else "")
        raise DataError(f"{where}: unknown class {item!r}{hint}; classes: {shown}") from None


def resolve_class_split(spec: object, class_names: list[str], dataset: str) -> dict[str, list[int]]:
    """The base/val/novel class ids that ``spec`` (see the module docstring) names."""
    where = f"{dataset}: class_split"
    if not isinstance(spec, dict):
        raise DataError(
            f"{where} must be a mapping such as {{base: [...], val: [...], novel: [...]}} or "
            f"{{base: 0.6, val: 0.2, novel: 0.2, seed: 0}}, not {spec!r}"
        )
    unknown = sorted(set(spec) - {*SPLITS, "seed"})
    if unknown:
        raise DataError(f"{where}: unknown key(s) {unknown}; allowed: base, val, novel, seed")
    values = {k: spec[k] for k in SPLITS if k in spec}
    if not values:
        raise DataError(f"{where} names no split; give base, val and/or novel")
    rest = [k for k, v in values.items() if v == REST]
    if len(rest) > 1:
        raise DataError(f"{where}: only one split can be {REST!r}, not {', '.join(rest)}")
    lists = {k: v for k, v in values.items() if isinstance(v, (list, tuple))}
    numbers = {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for key, value in values.items():
        if key not in lists and key not in numbers and value != REST:
            raise DataError(
                f"{where}.{key} must be a list of classes, a fraction, a count or {REST!r}, not {value!r}"
            )
    if lists and numbers:
        raise DataError(f"{where}: give every split as a list of classes, or every split as a number, not both")
    n = len(class_names)
    if numbers:
        splits = _numeric_split(numbers, spec.get("seed", 0), n, where)
    else:
        if "seed" in spec:
            raise DataError(f"{where}: seed applies only to fractions or counts, not to lists of classes")
        splits = _explicit_split(lists, class_names, where)
    if rest:
        taken = {c for classes in splits.values() for c in classes}
        splits[rest[0]] = [c for c in range(n) if c not in taken]
    for name in SPLITS:
        splits.setdefault(name, [])
    if not splits["base"]:
        raise DataError(f"{where}: the base split is empty; it holds the classes the clients train on")
    return {name: splits[name] for name in SPLITS}


def _numeric_split(numbers: dict[str, int | float], seed: object, n: int, where: str) -> dict[str, list[int]]:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataError(f"{where}.seed must be an integer, not {seed!r}")
    counts: dict[str, int] = {}
    fractions: dict[str, float] = {}
    for key, value in numbers.items():
        if isinstance(value, int):
            if value < 0:
                raise DataError(f"{where}.{key}: a class count must be >= 0, not {value}")
            counts[key] = value
        else:
            if not 0.0 <= value <= 1.0:
                raise DataError(f"{where}.{key}: a fraction must lie in [0, 1], not {value}")
            fractions[key] = value
    if sum(fractions.values()) > 1.0 + 1e-9:
        raise DataError(f"{where}: fractions {fractions} add up to more than 1")
    counts.update(_counts(fractions, n))
    if sum(counts.values()) > n:
        raise DataError(f"{where}: {counts} needs {sum(counts.values())} classes but the dataset has {n}")
    for key, value in numbers.items():
        if value > 0 and counts[key] == 0:
            raise DataError(
                f"{where}.{key}: {value} of {n} classes is no class at all; give a larger fraction or a count"
            )
    return _draw(counts, n, seed)


def _explicit_split(lists: Mapping[str, Sequence[object]], class_names: list[str], where: str) -> dict[str, list[int]]:
    splits: dict[str, list[int]] = {}
    owner: dict[int, str] = {}
    for key, items in lists.items():
        ids = []
        for item in items:
            cid = class_id(item, class_names, f"{where}.{key}")
            if cid in owner:
                also = "twice" if owner[cid] == key else f"in both {owner[cid]} and {key}"
                raise DataError(f"{where}: class {class_names[cid]!r} (id {cid}) is listed {also}")
            owner[cid] = key
            ids.append(cid)
        splits[key] = sorted(ids)
    return splits


def apply_class_split(dataset: LabelledDataset, spec: object) -> LabelledDataset:
    """A copy of ``dataset`` (sharing its tensors) with the splits ``spec`` names; the loader's own
    object is left alone, in case a loader hands out a cached one."""
    return replace(dataset, splits=resolve_class_split(spec, dataset.class_names, dataset.name))
