"""The data folder the generic loaders' tests read: images by class (and by writer), labelled texts as
CSV and JSON lines, and arrays with groups, written once per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.common import text_rows, write_arrays, write_csv, write_image_folder, write_jsonl


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_image_folder(root / "pets")
    write_image_folder(root / "pets_by_writer", groups=True)
    rows = text_rows()
    write_csv(root / "news.csv", rows, ["body", "topic", "user"])
    write_jsonl(root / "news.jsonl", [{"raw": r["body"], "label": r["topic"], "user": r["user"]} for r in rows])
    write_arrays(root / "blobs.npz")
    return root
