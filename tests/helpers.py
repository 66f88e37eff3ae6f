"""Small builders shared by the engine and algorithm tests (no real data needed)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from fedfew.data import LabelledDataset
from fedfew.interface.algorithm import ClientData, Context, EpisodeShape
from fedfew.models import build_model


def blob_dataset(classes: int = 6, per_class: int = 30, dim: int = 8, seed: int = 0,
                 spread: float = 0.3) -> LabelledDataset:
    """Well-separated Gaussian blobs on flat features: base = first half of the classes."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g) * 3
    labels = torch.arange(classes).repeat_interleave(per_class)
    inputs = centres[labels] + spread * torch.randn(len(labels), dim, generator=g)
    half = classes // 2
    return LabelledDataset(inputs, labels, [str(c) for c in range(classes)], name="blobs",
                           splits={"base": list(range(half)), "val": [], "novel": list(range(half, classes))})


def context_for(data: LabelledDataset, model: str = "mlp", task: str = "fewshot", n_way: int = 3,
                k_shot: int = 1, q_query: int = 5, seed: int = 0, **model_options) -> Context:
    options = {"hidden": 16, **model_options} if model == "mlp" else model_options

    def make_named(name: str, num_classes: int | None, **extra) -> torch.nn.Module:
        return build_model(name, data.input_shape, num_classes, **{**(options if name == model else {}), **extra})

    train = data.splits["base"] if task == "fewshot" else list(range(data.num_classes))
    return Context(seed=seed, make_model=lambda n: make_named(model, n), make_model_named=make_named,
                   input_shape=data.input_shape, num_classes=data.num_classes, train_classes=train,
                   episode=EpisodeShape(n_way, k_shot, q_query), task=task)


def clients_from(data: LabelledDataset, parts: list[torch.Tensor]) -> list[ClientData]:
    return [ClientData(i, data.subset(p)) for i, p in enumerate(parts)]


def cut_and_resumed(config: Any, algorithm_class: type, folder: Path, monkeypatch: Any,
                    cut_at_call: int = 3) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]],
                                                   list[dict[str, Any]]]:
    """A run whole, and the same run interrupted at ``algorithm_class.client_update``'s ``cut_at_call``-th
    call (after round 1) and resumed: (whole summary, resumed summary, the resumed run's metric rows, the
    whole run's), rows without their seconds."""
    from fedfew.run.runner import RunInterrupted, resume_run, run_experiment

    whole = run_experiment(config, folder / "whole", progress=False)
    calls = {"n": 0}
    original = algorithm_class.client_update  # type: ignore[attr-defined]

    def client_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == cut_at_call:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(algorithm_class, "client_update", client_update)
        try:
            run_experiment(config, folder / "cut", progress=False)
        except RunInterrupted as interrupted:
            cut = interrupted
        else:
            raise AssertionError("the run was not interrupted")
    assert cut.round_done == 1
    resumed = resume_run(cut.folder, progress=False)

    def rows(run_folder: Path) -> list[dict[str, Any]]:
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
                for line in (run_folder / "metrics.jsonl").read_text().splitlines()]

    return whole, resumed, rows(cut.folder), rows(Path(whole["folder"]))


def classification_setup(clients: int = 1) -> tuple[LabelledDataset, Context, list[ClientData]]:
    """Four blob classes of 10, an MLP classification context, and the rows split into ``clients`` clients."""
    data = blob_dataset(classes=4, per_class=10)
    ctx = context_for(data, model="mlp", task="classification")
    parts = list(torch.arange(len(data)).chunk(clients))
    return data, ctx, clients_from(data, parts)


def wait_for(predicate: Any, timeout: float, process: subprocess.Popen[str] | None = None) -> None:
    """Poll ``predicate`` until true; fail if ``process`` ends first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the run ended first: {process.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)
