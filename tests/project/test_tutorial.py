"""The algorithm API as an author meets it: docs/writing-an-algorithm.md's Reptile and FedProto, taken
from the page's own code blocks, run by the command line as plugins on every engine with the same numbers
(the engine contract; FedProto also with the page's ``privacy:`` section, in research mode), their hooks
keeping the contract (pure client updates, Reptile's outer step and FedProto's count-weighted prototypes
by hand, FedProto's scores of the clients' own models), the complete example in ``fedfew.Algorithm``'s
docstring, and the message of a hook left out.

The page's runs go through ``python -m fedfew.cli.main run`` in a child process: a plugin registers its
algorithm for good, and this process's registry must keep exactly the built-in algorithms
(tests/engine/test_engines.py checks that each has a tiny config). The in-process checks register into a
throwaway registry for the same reason."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import fedfew
import fedfew.interface.algorithm as algorithm_module
import fedfew.interface.registration as registration_module
from fedfew.algorithms import register_all
from fedfew.core.registry import Registry
from fedfew.engine.round import simulate_round
from fedfew.interface.protocol import initial_server_state
from tests.helpers import blob_dataset, clients_from, context_for

register_all()  # the built-ins register now, before any test swaps the registry

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "writing-an-algorithm.md"

#: The page's config made small: a federation of 4 clients for 2 rounds, every round scored.
TINY = ["federation.rounds=2", "partition.num_clients=4", "federation.clients_per_round=4",
        "episodes.test_episodes=6", "eval.every=1", "model.options={hidden: 8}",
        "algorithm.options.inner_steps=2"]
#: The page's FedProto config made small the same way (its own options: one local epoch).
TINY_FEDPROTO = ["federation.rounds=2", "partition.num_clients=4", "federation.clients_per_round=4",
                 "eval.every=1", "model.options={hidden: 8}", "algorithm.options.local_epochs=1"]
#: Each run of the page a test makes: the config file the page writes, and the overrides that make it small.
EXAMPLES = {"reptile": ("reptile.yaml", TINY), "fedproto": ("fedproto.yaml", TINY_FEDPROTO),
            "fedproto-dp": ("fedproto-dp.yaml", TINY_FEDPROTO)}
ENGINES = {
    "inprocess": [],
    "workers": ["runtime.engine=workers", "runtime.engine_options={workers: 2}"],
    "flower-sim": ["runtime.engine=flower-sim", "flower.sim.init_args.num_cpus=2"],
}
#: What differs between two equal runs: wall-clock time.
TIMING = {"seconds", "data_seconds"}


def page_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", PAGE.read_text(), flags=re.M | re.S)


def page_block(language: str, containing: str) -> str:
    """The one block of ``language`` on the page that contains ``containing``."""
    (block,) = [block for block in page_blocks(language) if containing in block]
    return block


def reptile_code() -> str:
    return page_block("python", '@register("reptile"')


def fedproto_code() -> str:
    return page_block("python", '@register("fedproto"')


def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Registry[Any]:
    """``register`` writes into a throwaway registry until the test ends."""
    registry: Registry[Any] = Registry("algorithm")
    monkeypatch.setattr(registration_module, "ALGORITHMS", registry)
    return registry


def exec_module(source: str, name: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": name}
    exec(compile(source, f"<{name}>", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def page_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """reptile.py, reptile.yaml, fedproto.py and fedproto.yaml exactly as the page shows them, side by
    side, and fedproto-dp.yaml: fedproto.yaml with the page's privacy line added, as the page says."""
    folder = tmp_path_factory.mktemp("tutorial")
    (folder / "reptile.py").write_text(reptile_code())
    (folder / "reptile.yaml").write_text(page_block("yaml", "plugins: [reptile.py]"))
    (folder / "fedproto.py").write_text(fedproto_code())
    fedproto = page_block("yaml", "plugins: [fedproto.py]")
    (folder / "fedproto.yaml").write_text(fedproto)
    (folder / "fedproto-dp.yaml").write_text(fedproto + page_block("yaml", "privacy:"))
    return folder


def run_page(folder: Path, out: Path, sets: list[str], env: dict[str, str] | None = None,
             example: str = "reptile") -> dict[str, Any]:
    """``fedfew run reptile.yaml`` (or another of the page's configs, ``example``) as the page writes it
    (plus ``sets``), in a child process; the run's summary and per-round history, wall-clock times left
    out."""
    config, tiny = EXAMPLES[example]
    argv = [sys.executable, "-m", "fedfew.cli.main", "run", config, "--out", str(out), "--quiet"]
    for item in tiny + sets:
        argv += ["--set", item]
    done = subprocess.run(argv, cwd=folder, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_folder,) = out.iterdir()
    summary = json.loads((run_folder / "summary.json").read_text())
    history = [json.loads(line) for line in (run_folder / "metrics.jsonl").read_text().splitlines()]
    return {"summary": {k: v for k, v in summary.items() if k not in TIMING},
            "history": [{k: v for k, v in row.items() if k not in TIMING} for row in history],
            "status": json.loads((run_folder / "status.json").read_text())["status"],
            "config": yaml.safe_load((run_folder / "config.yaml").read_text()), "folder": run_folder}


@pytest.fixture(scope="module")
def reference(page_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The page's run in this process's engine, ``inprocess``: what every other engine must give."""
    return run_page(page_folder, tmp_path_factory.mktemp("inprocess"), ENGINES["inprocess"])


@pytest.fixture(scope="module")
def fedproto_reference(page_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The page's FedProto run in process: what every other engine must give."""
    return run_page(page_folder, tmp_path_factory.mktemp("fedproto"), ENGINES["inprocess"], example="fedproto")


@pytest.fixture(scope="module")
def fedproto_private_reference(page_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The page's FedProto run with its privacy line, in process."""
    return run_page(page_folder, tmp_path_factory.mktemp("fedproto-dp"), ENGINES["inprocess"],
                    example="fedproto-dp")


REFERENCES = {"reptile": "reference", "fedproto": "fedproto_reference", "fedproto-dp": "fedproto_private_reference"}


def test_the_page_shows_one_complete_algorithm_in_under_60_lines() -> None:
    code, config = reptile_code(), page_block("yaml", "plugins: [reptile.py]")
    assert len(code.splitlines()) < 60
    # `import fedfew` is all an author needs: no internal module is imported.
    assert not re.findall(r"^\s*(?:from|import) fedfew\.", code, flags=re.M)
    assert '@register("reptile"' in code
    settings = yaml.safe_load(config)
    assert settings["plugins"] == ["reptile.py"] and settings["algorithm"]["name"] == "reptile"
    assert {"task", "dataset", "algorithm"} <= set(settings)
    assert "$ fedfew run reptile.yaml" in PAGE.read_text()


def test_the_page_runs_in_process(reference: dict[str, Any], page_folder: Path) -> None:
    summary = reference["summary"]
    assert reference["status"] == "complete" and summary["algorithm"] == "reptile"
    assert reference["config"]["plugins"] == [str(page_folder / "reptile.py")]  # recorded absolute
    assert [row["round"] for row in reference["history"]] == [1, 2]
    for row in reference["history"]:  # every client trained and reported its loss
        assert row["clients"]["trained"] == [0, 1, 2, 3] and math.isfinite(row["train_loss"])
        assert row["bytes_up"] == row["bytes_down"] > 0  # the model down, the model up
    assert 0.0 <= summary["test"]["accuracy"] <= 1.0


@pytest.mark.parametrize("example", list(EXAMPLES))
@pytest.mark.parametrize("engine", ["workers", pytest.param("flower-sim", marks=pytest.mark.flower)])
def test_every_engine_gives_the_page_the_same_numbers(engine: str, example: str, page_folder: Path, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    """Reptile, FedProto (each client scored on its own model where it runs) and FedProto with the page's
    privacy line (noise seeded, so that the engines draw the same noise): the in-process numbers."""
    reference = request.getfixturevalue(REFERENCES[example])
    sets, env, temp = list(ENGINES[engine]), {}, None
    if engine == "flower-sim":
        pytest.importorskip("ray")
        pytest.importorskip("flwr")
        from tests.raycluster import MARKER, marked_pids, pids_using

        temp = tempfile.mkdtemp(prefix="fr", dir="/tmp")  # short: Ray's socket paths
        sets.append(f"flower.sim.init_args._temp_dir={temp}")
        env = {MARKER: uuid.uuid4().hex}
    try:
        other = run_page(page_folder, tmp_path / "out", sets, env, example=example)
    finally:
        if temp is not None:  # a private Ray instance leaves no process behind
            assert not marked_pids(env[MARKER]) and not pids_using(temp)
            shutil.rmtree(temp, ignore_errors=True)
    assert other["config"]["runtime"]["engine"] == engine
    if engine == "flower-sim":  # the clients ran on the virtual SuperNodes, as Flower messages
        log = other["folder"] / "flower" / "messages.jsonl"
        trained = {json.loads(line)["type"] for line in log.read_text().splitlines()}
        assert "train" in trained, trained

    assert other["history"] == reference["history"]  # losses, bytes and who trained, round by round
    assert other["summary"] == reference["summary"]  # test accuracy and interval, initial score, ...


@pytest.fixture
def reptile(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The page's module, executed here with ``register`` writing into a throwaway registry."""
    registry = fresh_registry(monkeypatch)
    module = exec_module(reptile_code(), "tutorial_reptile")
    assert registry.get("reptile") is module["Reptile"] and module["Reptile"].name == "reptile"
    return module


def test_the_outer_step_is_reptiles(reptile: dict[str, Any]) -> None:
    """phi <- phi + epsilon (mean_k w_k - phi) for floating tensors, by hand; an integer buffer takes
    the mean's value; a client that sat out does not count; the server state is not written to."""
    algorithm = reptile["Reptile"](reptile["ReptileOptions"](outer_lr=0.5), context_for(blob_dataset()))
    result = fedfew.ClientResult
    server = {"model": {"w": torch.tensor([1.0, 2.0]), "steps": torch.tensor(3)}, "note": "kept"}
    results = {0: result(upload={"model": {"w": torch.tensor([3.0, 2.0]), "steps": torch.tensor(5)}}),
               1: result.sat_out(None),
               2: result(upload={"model": {"w": torch.tensor([5.0, 6.0]), "steps": torch.tensor(7)}})}
    new = algorithm.aggregate(server, results, torch.Generator())
    # mean_k w_k = [4, 4]; phi = [1, 2] + 0.5 ([4, 4] - [1, 2]) = [2.5, 3.0]
    assert torch.equal(new["model"]["w"], torch.tensor([2.5, 3.0])) and new["note"] == "kept"
    assert torch.equal(new["model"]["steps"], torch.tensor(5))
    assert torch.equal(server["model"]["w"], torch.tensor([1.0, 2.0]))  # untouched
    stayed = algorithm.aggregate(server, {1: result.sat_out(None)}, torch.Generator())
    assert torch.equal(stayed["model"]["w"], server["model"]["w"])  # nobody trained: phi stays


def test_the_client_update_is_pure_and_seeded(reptile: dict[str, Any]) -> None:
    data = blob_dataset(classes=6, per_class=10)
    context = context_for(data, n_way=3, k_shot=1, q_query=2)
    algorithm = reptile["Reptile"](reptile["ReptileOptions"](inner_steps=3, inner_lr=0.1), context)
    server = initial_server_state(algorithm, torch.Generator().manual_seed(0))
    payload = algorithm.broadcast(server, 0)
    sent = {k: v.clone() for k, v in payload["model"].items()}
    (client,) = clients_from(data.split("base"), [torch.arange(len(data.split("base")))])

    def update(seed: int) -> fedfew.ClientResult:
        return algorithm.client_update(payload, None, client, torch.Generator().manual_seed(seed))

    first, again, other = update(1), update(1), update(2)
    assert all(torch.equal(payload["model"][k], sent[k]) for k in sent)  # the payload is not written to
    assert all(torch.equal(first.upload["model"][k], again.upload["model"][k]) for k in sent)  # seeded
    assert any(not torch.equal(first.upload["model"][k], sent[k]) for k in sent)  # it trained
    assert any(not torch.equal(first.upload["model"][k], other.upload["model"][k]) for k in sent)
    assert first.num_episodes == 3 and first.num_samples == len(data.split("base")) and not first.skipped
    (tiny,) = clients_from(data.split("base"), [torch.tensor([0])])  # one sample: no episode fits
    assert algorithm.client_update(payload, "mine", tiny, torch.Generator()).skipped


# -- FedProto: private models, prototypes, private scores, privacy ---------------------------------------
def test_the_page_shows_fedproto_complete_in_one_file() -> None:
    code, config = fedproto_code(), yaml.safe_load(page_block("yaml", "plugins: [fedproto.py]"))
    assert len(code.splitlines()) <= 105  # a page, next to Reptile's 59 lines
    assert not re.findall(r"^\s*(?:from|import) fedfew\.", code, flags=re.M)  # `import fedfew` is all it needs
    assert "evaluates_clients = True" in code and 'dp_upload = "shared-model-delta"' in code
    assert config["plugins"] == ["fedproto.py"] and config["algorithm"]["name"] == "fedproto"
    assert config["task"] == "classification" and config["classification"]["client_val_fraction"] > 0
    privacy = yaml.safe_load(page_block("yaml", "privacy:"))
    assert list(privacy) == ["privacy"] and privacy["privacy"]["noise"] == "seeded"  # one line, research mode
    text = PAGE.read_text()
    assert "$ fedfew run fedproto.yaml" in text and "$ fedfew run fedproto-dp.yaml" in text


def test_fedproto_runs_in_process_sending_prototypes_not_models(fedproto_reference: dict[str, Any],
                                                                page_folder: Path) -> None:
    summary = fedproto_reference["summary"]
    assert fedproto_reference["status"] == "complete" and summary["algorithm"] == "fedproto"
    assert fedproto_reference["config"]["plugins"] == [str(page_folder / "fedproto.py")]
    classes, hidden, clients = 10, 8, 4  # the digits; the tiny MLP's embedding; the clients asked each round
    for row in fedproto_reference["history"]:
        assert row["clients"]["trained"] == [0, 1, 2, 3] and math.isfinite(row["train_loss"])
        assert row["bytes_down"] == clients * (classes * hidden * 4 + classes)  # float32 table, bool "known"
        assert row["bytes_up"] == clients * (classes * hidden * 4 + classes * 4)  # float32 table and counts
    test = summary["test"]  # each client's own model: its held-out samples, and the run's test set
    assert 0.0 <= test["accuracy"] <= 1.0 and 0.0 <= test["test_set_accuracy"] <= 1.0 and test["ci95"] >= 0
    assert summary["initial_score"]["accuracy"] != test["accuracy"]


@pytest.fixture
def fedproto(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The page's FedProto module, executed here with ``register`` writing into a throwaway registry."""
    registry = fresh_registry(monkeypatch)
    module = exec_module(fedproto_code(), "tutorial_fedproto")
    assert registry.get("fedproto") is module["FedProto"]
    assert registration_module.missing_hooks(module["FedProto"]) == []
    return module


def test_the_server_averages_each_class_s_prototypes_weighted_by_count(fedproto: dict[str, Any]) -> None:
    """Two made-up clients, three classes, two features, by hand: client 0 holds one sample of class 0
    and three of class 1; client 2 three of class 0; client 1 sat out and does not count. A class nobody
    sent keeps its prototype; the server state is not written to."""
    context = context_for(blob_dataset(), task="classification")
    algorithm = fedproto["FedProto"](fedproto["FedProtoOptions"](), context)
    result = fedfew.ClientResult
    old = torch.tensor([[0.0, 0.0], [0.0, 0.0], [9.0, 9.0]])
    server = {"model": {"prototypes": old.clone()}, "known": torch.tensor([False, False, True])}
    results = {  # rows of classes a client lacks are the global rows it received, with count 0
        0: result(upload={"model": {"prototypes": torch.tensor([[1.0, 0.0], [2.0, 2.0], [9.0, 9.0]])},
                          "counts": torch.tensor([1.0, 3.0, 0.0])}),
        1: result.sat_out(None),
        2: result(upload={"model": {"prototypes": torch.tensor([[5.0, 4.0], [0.0, 0.0], [9.0, 9.0]])},
                          "counts": torch.tensor([3.0, 0.0, 0.0])})}
    new = algorithm.aggregate(server, results, torch.Generator())
    # class 0: (1 [1, 0] + 3 [5, 4]) / 4 = [4, 3]; class 1: client 0's alone; class 2: nobody sent it
    assert torch.equal(new["model"]["prototypes"], torch.tensor([[4.0, 3.0], [2.0, 2.0], [9.0, 9.0]]))
    assert new["known"].tolist() == [True, True, True]
    assert torch.equal(server["model"]["prototypes"], old) and server["known"].tolist() == [False, False, True]
    assert algorithm.aggregate(server, {1: result.sat_out(None)}, torch.Generator()) is server  # nobody trained
    # Under privacy the noised mean replaces aggregate and sets every row: dp_advance marks them known.
    assert algorithm.dp_advance(server)["known"].tolist() == [True, True, True]


def test_a_fedproto_client_uploads_its_class_means_and_keeps_its_model(fedproto: dict[str, Any]) -> None:
    """The upload is the mean embedding of each class the client holds (under the model it keeps) with
    the counts, and the received row elsewhere; the update is seeded and writes to nothing it was given."""
    data = blob_dataset(classes=6, per_class=10)
    context = context_for(data, task="classification")
    algorithm = fedproto["FedProto"](fedproto["FedProtoOptions"](lr=0.1), context)
    server = algorithm.init_server(torch.Generator())
    payload = {"model": {"prototypes": torch.randn(6, 16, generator=torch.Generator().manual_seed(1))},
               "known": torch.tensor([True, False, True, True, True, True])}
    mine = torch.cat([torch.nonzero(data.labels == c).flatten() for c in (0, 1, 3)])  # classes 0, 1 and 3
    (client,) = clients_from(data, [mine])
    state = algorithm.init_client_state(client, torch.Generator().manual_seed(0))
    sent = payload["model"]["prototypes"].clone()
    kept = {k: v.clone() for k, v in state["model"].items()}

    def update(seed: int) -> fedfew.ClientResult:
        return algorithm.client_update(payload, state, client, torch.Generator().manual_seed(seed))

    first, again = update(1), update(1)
    assert torch.equal(payload["model"]["prototypes"], sent)  # nothing given is written to
    assert all(torch.equal(state["model"][k], kept[k]) for k in kept)
    assert torch.equal(first.upload["model"]["prototypes"], again.upload["model"]["prototypes"])  # seeded
    assert any(not torch.equal(first.state["model"][k], kept[k]) for k in kept)  # it trained its own model
    assert first.upload["counts"].tolist() == [10.0, 10.0, 0.0, 10.0, 0.0, 0.0]
    model = fedfew.load_state_(context.make_model(6), first.state["model"])
    with torch.no_grad():
        z = model.features(client.train.inputs)
    rows = first.upload["model"]["prototypes"]
    for c in (0, 1, 3):
        assert torch.allclose(rows[c], z[client.train.labels == c].mean(0), atol=1e-5)
    for c in (2, 4, 5):  # a class it lacks: the global row, unchanged
        assert torch.equal(rows[c], sent[c])
    assert set(first.upload) == {"model", "counts"} and first.num_samples == 30 and server["known"].sum() == 0


def test_fedproto_scores_each_client_by_the_nearest_global_prototype(fedproto: dict[str, Any]) -> None:
    """A client's score is its own encoder's nearest known global prototype, on its held-out samples and
    on the test set; the run's accuracy is the mean over the clients that have held-out samples, with
    1.96 (population) standard deviations over sqrt(clients)."""
    data = blob_dataset(classes=4, per_class=10)
    algorithm = fedproto["FedProto"](fedproto["FedProtoOptions"](), context_for(data, task="classification"))
    (client,) = clients_from(data, [torch.arange(len(data))])
    client = fedfew.ClientData(0, client.train, val=data.subset(torch.arange(0, len(data), 2)))
    state = algorithm.init_client_state(client, torch.Generator().manual_seed(0))
    model = fedfew.load_state_(algorithm.context.make_model(4), state["model"])
    with torch.no_grad():
        z = model.features(data.inputs)
    means = torch.stack([z[data.labels == c].mean(0) for c in range(4)])
    test = fedfew.EvalData("test", dataset=data)
    known = {"model": {"prototypes": means}, "known": torch.ones(4, dtype=torch.bool)}
    expected = (torch.cdist(z, means).argmin(1) == data.labels).float().mean().item()
    scores = algorithm.evaluate_client(known, state, client, test, torch.Generator())
    assert scores["test"] == pytest.approx(expected) and 0 <= scores["local"] <= 1
    only_first = {"model": {"prototypes": means}, "known": torch.tensor([True, False, False, False])}
    assert algorithm.evaluate_client(only_first, state, client, test, torch.Generator())["test"] == 0.25  # class 0
    scored = {0: {"local": 0.5, "test": 0.2}, 1: {}, 2: {"local": 1.0, "test": 0.4}}  # client 1: nothing held out
    combined = algorithm.combine_evaluations({}, scored, test, torch.Generator())
    assert combined == pytest.approx({"accuracy": 0.75, "test_set_accuracy": 0.3, "ci95": 1.96 * 0.25 / 2 ** 0.5})
    with pytest.raises(ValueError, match="client_val_fraction"):
        algorithm.evaluate_client(known, state, fedfew.ClientData(0, client.train), test, torch.Generator())


def test_fedproto_with_privacy_reports_an_epsilon_that_covers_the_shared_model_only(
        fedproto_private_reference: dict[str, Any], fedproto_reference: dict[str, Any]) -> None:
    """The page's privacy line: each round's change of the prototype table is clipped and noised; the
    summary says the guarantee covers the shared table, not the private models the score comes from."""
    from fedfew.privacy.coverage import COVERED_UPLOADS, SHARED_ONLY

    run, summary = fedproto_private_reference, fedproto_private_reference["summary"]
    assert run["status"] == "complete" and run["config"]["privacy"]["noise"] == "seeded"
    privacy = summary["privacy"]
    assert privacy["mechanism"] == "central-dp" and privacy["epsilon"] > 0 and privacy["rounds"] == 2
    covers = privacy["covers"]
    assert covers["models"].startswith("the shared model only")
    assert "the clients' private models are not covered" in covers["models"]
    assert covers["score_covered"] is False and "private, un-noised models" in covers["score"]
    assert SHARED_ONLY in covers["short"] and COVERED_UPLOADS["shared-model-delta"] in covers["what"]
    assert summary["selected_round"] == 2  # scores of private models select no round: the last one stands
    for row, plain in zip(run["history"], fedproto_reference["history"]):
        assert row["dp_clip"] == run["config"]["privacy"]["clip"] and row["dp_epsilon"] > 0
        assert "train_loss" not in row  # the clients' training metrics stay on the clients
        assert row["bytes_down"] == plain["bytes_down"] and row["bytes_up"] < plain["bytes_up"]  # no counts sent
    assert summary["test"] != fedproto_reference["summary"]["test"]  # the noise changed the numbers


def docstring_example() -> str:
    """The complete algorithm in ``fedfew.Algorithm``'s docstring (its ``::`` block)."""
    doc = fedfew.Algorithm.__doc__ or ""
    block = doc.split("A complete algorithm", 1)[1].split("::\n", 1)[1].split("\n    Saved in a file", 1)[0]
    return textwrap.dedent(block)


def test_the_algorithm_docstring_example_is_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    """It registers, and ten rounds of it average the uploads by samples and learn well-separated blobs."""
    registry = fresh_registry(monkeypatch)
    module = exec_module(docstring_example(), "docstring_fedavg")
    cls = registry.get("my-fedavg")
    data = blob_dataset(classes=4, per_class=20)
    algorithm = cls(cls.Options(), context_for(data, task="classification"))
    clients = clients_from(data, list(torch.randperm(len(data), generator=torch.Generator().manual_seed(0))
                                      .split([30, 50])))
    server = initial_server_state(algorithm, torch.Generator().manual_seed(0))
    test = fedfew.EvalData("test", dataset=data)
    before = algorithm.evaluate(server, test, torch.Generator())["accuracy"]
    for r in range(10):
        outcome = simulate_round(algorithm, server, clients, {}, [0, 1], seed=0, round_key=r)
        uploads = [outcome.results[c].upload["model"] for c in (0, 1)]
        for name, value in outcome.server["model"].items():  # (30 w_0 + 50 w_1) / 80
            assert torch.allclose(value, (30 * uploads[0][name] + 50 * uploads[1][name]) / 80, atol=1e-6)
        server = outcome.server
    after = algorithm.evaluate(server, test, torch.Generator())["accuracy"]
    assert after > max(before, 0.9), (before, after)
    assert module["SGDOptions"].model_fields["lr"].description  # the options say what they mean


def test_a_hook_left_out_says_which_class_and_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unregistered class fails where the hook is called; a registered one fails when it is registered
    (the class statement), naming every hook it needs and lacks."""
    class Bare(fedfew.Algorithm):
        pass

    bare = Bare(fedfew.Options(), context_for(blob_dataset()))
    with pytest.raises(NotImplementedError, match=r"^Bare does not implement init_server\(generator\)"):
        bare.init_server(torch.Generator())
    fresh_registry(monkeypatch)
    with pytest.raises(algorithm_module.AlgorithmDefinitionError,
                       match=r"^algorithm 'bare-test' \(Named\) does not implement init_server, client_update, "
                             r"aggregate, evaluate: override them") as info:
        fedfew.register("bare-test")(type("Named", (fedfew.Algorithm,), {}))
    assert info.value.exit_code == 2 and "bare-test" not in fedfew.ALGORITHMS


def hooks(*names: str, **flags: object) -> type[fedfew.Algorithm]:
    """A class that writes the named hooks (as stubs) and sets the flags."""
    body: dict[str, object] = {name: (lambda self, *args: None) for name in names}
    return type("Made", (fedfew.Algorithm,), {**body, **flags})


@pytest.mark.parametrize("made, missing", [
    (hooks("init_server", "client_update", "aggregate", "evaluate"), []),
    (hooks("init_server", trains=False), ["evaluate"]),  # trains nothing: no update, no aggregate
    (hooks("init_server", "play_round", "evaluate"), []),  # plays its own rounds
    (hooks("init_server", "client_update", "aggregate", splits_evaluation=True), ["episode_scores"]),
    (hooks("init_server", "client_update", "aggregate", "episode_scores", splits_evaluation=True), []),
    (hooks("init_server", "client_update", "aggregate", evaluates_clients=True),
     ["evaluate_client", "combine_evaluations"]),
    (hooks("init_server", "client_update", "aggregate", evaluates_clients=property(lambda self: False)), []),
])
def test_which_hooks_a_class_must_write(made: type[fedfew.Algorithm], missing: list[str]) -> None:
    """The rules of Algorithm's docstring: a flag set by the options (a property) asks nothing of the class."""
    assert registration_module.missing_hooks(made) == missing


def test_every_registered_algorithm_writes_the_hooks_it_needs() -> None:
    for name in fedfew.ALGORITHMS.names():
        assert registration_module.missing_hooks(fedfew.ALGORITHMS.get(name)) == [], name


class _AOptions(fedfew.Options):
    a: int = 1


class _BOptions(_AOptions):
    b: int = 2


def test_the_options_class_is_named_once_in_the_generic_base() -> None:
    """``class A(Algorithm[X])`` makes ``A.Options`` X (what a config is validated by and ``fedfew list``
    prints); a subclass that names none inherits it; a subclass of a generic class names its own; a
    class generic in a type variable takes the variable's bound; the older ``Options = X`` still works,
    and a class that names two options classes is an error when it is defined."""
    from typing import TypeVar

    class A(fedfew.Algorithm[_AOptions]):
        pass

    class SubA(A):
        pass

    assert A.Options is _AOptions and SubA.Options is _AOptions and fedfew.Algorithm.Options is fedfew.Options
    assert "Options" in vars(A) and "Options" not in vars(SubA)  # inherited, not set again

    T = TypeVar("T", bound=_AOptions)

    class Generic(fedfew.Algorithm[T]):  # a base for algorithms of several options classes
        pass

    class B(Generic[_BOptions]):
        pass

    class SubB(B):
        pass

    assert Generic.Options is _AOptions and B.Options is _BOptions and SubB.Options is _BOptions

    class Old(fedfew.Algorithm):  # before Algorithm was generic
        Options = _BOptions

    class SubOld(Old):
        pass

    class Both(fedfew.Algorithm[_AOptions]):  # the same class twice is no conflict
        Options = _AOptions

    assert Old.Options is _BOptions and SubOld.Options is _BOptions and Both.Options is _AOptions
    built = B(_BOptions(), context_for(blob_dataset()))
    assert built.options.b == 2
    with pytest.raises(algorithm_module.AlgorithmDefinitionError, match="assigns Options = _BOptions but its base "
                                                                        "names _AOptions"):
        class Clash(fedfew.Algorithm[_AOptions]):
            Options = _BOptions
    with pytest.raises(algorithm_module.AlgorithmDefinitionError, match="not an options class"):
        class NotOptions(fedfew.Algorithm[int]):
            pass


def test_the_framework_seeds_the_initial_model() -> None:
    """``initial_server_state`` seeds torch's global RNG from ``init_server``'s generator just before the
    call (``seeds_init_server``, the default), so a hook builds its model without seeding: the same model
    as a hook written to seed itself first (whose own first call is then that seeding, not a second
    draw); a hook that seeds twice draws twice as before; ``seeds_init_server = False`` leaves the
    generator and torch's RNG alone; ``seeds_init_client_state`` does the same for the clients."""
    from fedfew.core.seeding import seed_torch_init
    from fedfew.interface.protocol import initial_client_state, initial_server_state

    context = context_for(blob_dataset())

    class Plain(fedfew.Algorithm):
        def init_server(self, generator):
            return {"model": fedfew.get_state(self.context.make_model(None))}

    class SeedsItself(Plain):  # written before fedfew seeded: the first hook call is the framework's seeding
        def init_server(self, generator):
            seed_torch_init(generator)
            return super().init_server(generator)

    class SeedsTwice(Plain):
        def init_server(self, generator):
            seed_torch_init(generator)
            seed_torch_init(generator)
            return super().init_server(generator)

    class NoModel(Plain):
        seeds_init_server = False

        def init_server(self, generator):
            return {"draw": torch.randint(0, 2**62, (1,), generator=generator)}

    class OwnModels(Plain):
        seeds_init_client_state = True

        def init_client_state(self, client, generator):
            return {"model": fedfew.get_state(self.context.make_model(None))}

    def server(cls: type[fedfew.Algorithm]) -> dict[str, torch.Tensor]:
        torch.manual_seed(99)  # what ran before: it must not matter
        return initial_server_state(cls(fedfew.Options(), context), torch.Generator().manual_seed(5))["model"]

    by_hand = torch.Generator().manual_seed(5)  # what the hook did itself before the framework seeded
    seed_torch_init(by_hand)
    expected = fedfew.get_state(context.make_model(None))
    twice = torch.Generator().manual_seed(5)
    seed_torch_init(twice)
    seed_torch_init(twice)
    expected_twice = fedfew.get_state(context.make_model(None))
    for cls, want in ((Plain, expected), (SeedsItself, expected), (SeedsTwice, expected_twice)):
        got = server(cls)
        assert all(torch.equal(got[k], want[k]) for k in want), cls.__name__
    assert not all(torch.equal(expected[k], expected_twice[k]) for k in expected)

    torch.manual_seed(99)
    before = torch.random.get_rng_state()
    drawn = initial_server_state(NoModel(fedfew.Options(), context), torch.Generator().manual_seed(5))["draw"]
    assert torch.equal(drawn, torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(5)))
    assert torch.equal(torch.random.get_rng_state(), before)  # not seeded: torch's RNG as it was

    client = fedfew.ClientData(0, blob_dataset())
    own = initial_client_state(OwnModels(fedfew.Options(), context), client, torch.Generator().manual_seed(5))
    assert all(torch.equal(own["model"][k], expected[k]) for k in expected)
    assert initial_client_state(Plain(fedfew.Options(), context), client, torch.Generator()) is None


def test_a_plugin_missing_a_hook_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.cli.main import main

    plugin = tmp_path / "half.py"
    plugin.write_text("import fedfew\n\n@fedfew.register('half-done')\nclass Half(fedfew.Algorithm):\n"
                      "    def init_server(self, generator):\n        return {}\n")
    assert main(["list", "algorithms", "--plugin", str(plugin)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "half.py" in err and "client_update, aggregate, evaluate" in err, err


def test_fedfew_list_shows_each_option_and_what_it_means(capsys: pytest.CaptureFixture[str]) -> None:
    from fedfew.algorithms.f2l import F2LOptions
    from fedfew.cli.main import main

    assert main(["list", "algorithms", "f2l"]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for name, field in F2LOptions.model_fields.items():
        assert f"\n  {name}: " in out and " ".join(str(field.description).split()) in flat, name
    assert "\n  lambda_mi: float = 0.5, >= 0, <= 1\n" in out
    assert "\n  test_finetune_steps: int | None = null, >= 1\n" in out
    assert "\n  kd_temperature: adaptive | float = adaptive\n" in out
    assert main(["list", "algorithms"]) == 0
    assert "lambda_mi" not in capsys.readouterr().out  # one line per algorithm without -v
    assert main(["list", "algorithms", "-v"]) == 0
    out = capsys.readouterr().out
    for name in fedfew.ALGORITHMS.names():  # each algorithm's options follow its line
        options = list(fedfew.ALGORITHMS.get(name).Options.model_fields)
        below = out.split(f"\n  {name} ", 1)[1].split("\n")[1]
        assert below.startswith(f"      {options[0]}: "), (name, below)

    assert main(["list", "algorithms", "fl-mam"]) == 2
    assert "Did you mean 'fl-maml'" in capsys.readouterr().err
    assert main(["list", "datasets", "digits"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_page_shows_what_fedfew_list_prints(page_folder: Path) -> None:
    command = "fedfew list algorithms reptile --plugin reptile.py"
    shown = PAGE.read_text().split(f"$ {command}\n", 1)[1].split("\n$ ", 1)[0]
    done = subprocess.run([sys.executable, "-m", "fedfew.cli.main", *command.split()[1:]], cwd=page_folder,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == shown + "\n"
