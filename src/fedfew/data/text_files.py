"""``text-jsonl`` and ``text-csv``: your own labelled texts, any number of classes.

    {"text": "Stocks rally as ...", "label": "business", "user": "u17"}    one JSON object per line
    text,label,user                                                     or a CSV with a header row
    "Stocks rally as ...",business,u17

Field names are options (``text_field``, ``label_field``, optional ``group_field`` for the
``natural`` partition); labels are integers or strings. The texts become token ids for the word
models (``bilstm``, ``gru``; vocabulary from the base classes' texts only, so no test words leak
into training) or, with ``sentence_encoder``, frozen sentence vectors for ``sentence_mlp``: the
tools of :mod:`fedfew.data.text`.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from fedfew.data.dataset import DataError, LabelledDataset
from fedfew.data.generic import check_label_value, encode_groups, encode_labels, resolve_path
from fedfew.data.registry import DATASETS
from fedfew.data.splits import default_split
from fedfew.data.text import check_sentence_encoder, text_dataset
from fedfew.data.text_options import TextOptions, text_options

logger = logging.getLogger(__name__)

Row = tuple[str, int | str, int | str | None]  # (text, label, group or None)


def _field(row: Mapping[str, object], field: str, where: str) -> object:
    if field not in row:
        found = ", ".join(map(str, row)) or "none"
        raise DataError(f"{where} has no field {field!r} (fields: {found}); set the field name in dataset.options")
    return row[field]


def _text(value: object, where: str, field: str) -> str:
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return " ".join(value)  # pre-tokenised text
    if not isinstance(value, str):
        raise DataError(f"{where}: field {field!r} must be a string, not {type(value).__name__}")
    return value


def _unique_fields(where: str) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    """A ``json.loads`` hook refusing a field given twice in one object (plain JSON keeps the last)."""
    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in pairs:
            if key in out:
                raise DataError(f"{where} gives the field {key!r} twice; give it once")
            out[key] = value
        return out

    return hook


#: Above this share of empty texts a warning says so (every text empty is an error: nothing to learn).
EMPTY_WARNING = 0.1


def _check_texts(texts: list[str], path: Path, dataset: str) -> None:
    empty = sum(1 for t in texts if not t.strip())
    if empty == len(texts):
        raise DataError(f"{dataset}: every text in {path} is empty ({empty} rows); check dataset.options.text_field")
    if empty > EMPTY_WARNING * len(texts):
        logger.warning("%s: %d of the %d texts in %s are empty (%.0f%%): they carry only their label",
                       dataset, empty, len(texts), path, 100 * empty / len(texts))


def _jsonl_rows(path: Path, dataset: str, fields: tuple[str, str, str | None]) -> Iterator[Row]:
    text_field, label_field, group_field = fields
    try:
        with open(path, encoding="utf-8-sig") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{dataset}: {path} line {line_no}"
                try:
                    row = json.loads(line, object_pairs_hook=_unique_fields(where))
                except json.JSONDecodeError as err:
                    raise DataError(f"{where} is not valid JSON ({err})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{where} is a JSON {type(row).__name__}, expected an object")
                text = _text(_field(row, text_field, where), where, text_field)
                label = check_label_value(_field(row, label_field, where), where, label_field)
                group = None
                if group_field is not None:
                    group = check_label_value(_field(row, group_field, where), where, group_field)
                yield text, label, group
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{dataset}: cannot read {path} ({err})") from err


def _csv_rows(path: Path, dataset: str, fields: tuple[str, str, str | None], delimiter: str) -> Iterator[Row]:
    text_field, label_field, group_field = fields
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f, delimiter=delimiter)
            header = reader.fieldnames or []
            for field in (text_field, label_field, group_field):
                if field is not None and field not in header:
                    raise DataError(
                        f"{dataset}: {path} has no column {field!r} (columns: {', '.join(header) or 'none'}); "
                        "set the field name in dataset.options"
                    )
            for row in reader:
                where = f"{dataset}: {path} line {reader.line_num}"
                if None in row or any(row[f] is None for f in header):
                    raise DataError(f"{where} has {len(header)} columns in its header but not in this row")
                label = check_label_value(row[label_field].strip(), where, label_field)
                group = None if group_field is None else check_label_value(row[group_field].strip(), where, group_field)
                yield row[text_field], label, group
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataError(f"{dataset}: cannot read {path} ({err})") from err


def _build(
    rows: list[Row], path: Path, dataset: str, numeric_strings: bool, text_options: TextOptions
) -> LabelledDataset:
    if not rows:
        raise DataError(f"{dataset}: {path} holds no texts")
    texts = [r[0] for r in rows]
    _check_texts(texts, path, dataset)
    labels, class_names = encode_labels([r[1] for r in rows], f"{dataset}: {path}", numeric_strings)
    extras: dict[str, object] = {"path": str(path)}
    groups = encode_groups([r[2] for r in rows] if rows[0][2] is not None else None, f"{dataset}: {path}", extras)
    return text_dataset(
        texts, labels, class_names, dataset, default_split(len(class_names)), groups=groups, extras=extras,
        vocab_split="base", **text_options,
    )


@DATASETS.register(
    "text-jsonl", help="your texts: JSON lines {text, label[, group]}; field names and labels of any kind"
)
@text_options()
def load_text_jsonl(
    root: Path,
    path: str | None = None,
    text_field: str = "text",
    label_field: str = "label",
    group_field: str | None = None,
    *,
    text_options: TextOptions,
) -> LabelledDataset:
    """One JSON object per line. ``path``: the file, relative to the data folder ``root``.
    ``text_field`` holds a string (or a list of tokens, joined with spaces), ``label_field`` an
    integer or a string, ``group_field`` (optional) the writer/user. ``max_len``, ``min_freq``,
    ``vocab_size``, ``glove``, ``sentence_encoder``: as for ``huffpost``. Classes: integer labels
    in numeric order, string labels in name order; default class split a seeded 60/20/20.
    For the HuffPost format (``{"raw", "label"}``) set ``text_field: raw``."""
    check_sentence_encoder("text-jsonl", text_options["sentence_encoder"], text_options["glove"])
    file = resolve_path(root, path, "text-jsonl", "a JSON-lines file of labelled texts")
    rows = list(_jsonl_rows(file, "text-jsonl", (text_field, label_field, group_field)))
    return _build(rows, file, "text-jsonl", False, text_options)


@DATASETS.register("text-csv", help="your texts: a CSV (or TSV) with a header; columns text, label[, group]")
@text_options()
def load_text_csv(
    root: Path,
    path: str | None = None,
    text_field: str = "text",
    label_field: str = "label",
    group_field: str | None = None,
    delimiter: str | None = None,
    *,
    text_options: TextOptions,
) -> LabelledDataset:
    """A CSV file with a header row naming its columns. ``delimiter``: "," by default, a tab for
    ``.tsv`` files. Labels that all read as integers are ordered as numbers. Other options as for
    ``text-jsonl``."""
    check_sentence_encoder("text-csv", text_options["sentence_encoder"], text_options["glove"])
    file = resolve_path(root, path, "text-csv", "a CSV file of labelled texts with a header row")
    if delimiter is None:
        delimiter = "\t" if file.suffix.lower() == ".tsv" else ","
    if len(delimiter) != 1:
        raise DataError(f"text-csv: delimiter must be one character, not {delimiter!r}")
    rows = list(_csv_rows(file, "text-csv", (text_field, label_field, group_field), delimiter))
    return _build(rows, file, "text-csv", True, text_options)
