"""fedfew on Flower's deployment runtime, with real processes on 127.0.0.1.

Tests marked ``flower`` start a real SuperLink and SuperNodes (TLS and SuperNode authentication on)
and run through ``flwr run``: six algorithms (all of them with ``make test-flower-all``) give exactly
the in-process metrics, private states never leave their nodes, an unregistered SuperNode is refused,
a killed SuperNode leaves a finished run with its missing replies recorded, and ``fedfew run`` leaves
no process behind. They take minutes (a ClientApp process per message): ``make test-flower`` runs
them. The others run in the default suite."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("flwr")

from fedfew.cli.main import demo_config_path, main  # noqa: E402
from fedfew.config.validation import load_config  # noqa: E402
from fedfew.engine.tasks import MAIN  # noqa: E402
from fedfew.flower.launch import run_on_federation  # noqa: E402
from fedfew.flower.local import FlowerSettings, LocalFederation  # noqa: E402
from fedfew.flower.node import read_state, write_state  # noqa: E402
from fedfew.flower.records import array_bytes, from_records, to_records  # noqa: E402
from fedfew.flower.security import make_node_key, make_tls  # noqa: E402
from fedfew.interface.state import payload_bytes  # noqa: E402
from fedfew.run.experiment import build_experiment  # noqa: E402
from fedfew.run.runner import new_run, run_experiment  # noqa: E402
from tests.tiny import ALGORITHM_SETUPS, tiny_config, wait_for_logged_round  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PRIVATE = {"f2l", "fml", "local"}  # algorithms whose clients keep a private model


def history(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in summary["history"]]


def federation_markers() -> set[bytes]:
    """The markers of the fedfew federations whose processes are alive (their environment carries one)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for item in (entry / "environ").read_bytes().split(b"\0"):
                if item.startswith(b"FEDFEW_FLOWER_FEDERATION="):
                    found.add(item)
        except OSError:
            continue
    return found


def no_fedfew_processes_left(before: set[bytes] | None = None) -> bool:
    """No process of a federation started since ``before`` (a set of markers) is alive."""
    return not (federation_markers() - (before or set()))


# -- default suite: the pieces --------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALGORITHM_SETUPS))
def test_records_carry_exactly_the_counted_bytes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every payload and upload of a round, through Flower records and back: the same tensors, and
    the bytes the arrays carry are the bytes the in-process engine counts."""
    from fedfew.engine.base import InProcessEngine

    seen: list[Any] = []
    original = InProcessEngine.execute

    def recording(self: InProcessEngine, task: Any, payloads: Any) -> Any:
        replies = original(self, task, payloads)
        seen.extend(payloads.values())
        seen.extend(r.upload for r in replies.results.values())
        return replies

    monkeypatch.setattr(InProcessEngine, "execute", recording)
    experiment = build_experiment(load_config(tiny_config(name, federation={"rounds": 1})))
    experiment.simulator().run(1, 4, 1)
    if name != "frl-scratch":
        assert seen
    for obj in seen:
        arrays, meta = to_records(obj)
        assert array_bytes(arrays) == payload_bytes(obj)
        back = _tensors(from_records(arrays, meta))
        assert len(back) == len(_tensors(obj)) and all(torch.equal(a, b) for a, b in zip(_tensors(obj), back))


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def test_node_state_namespaces() -> None:
    from flwr.app import RecordDict

    state = RecordDict()
    write_state(state, MAIN, 0, {"client": {"w": torch.ones(2)}, "rounds": 1})
    write_state(state, "frl/0", 0, {"initial": {"w": torch.zeros(2)}})
    assert read_state(state, "frl/0", 0)["initial"]["w"].sum() == 0
    assert read_state(state, "frl/1", 1) is None  # a new top-level round: last round's namespace is gone
    assert read_state(state, "frl/0", 1) is None
    assert read_state(state, MAIN, 1)["rounds"] == 1  # the persistent state stays
    write_state(state, MAIN, 1, None)
    assert read_state(state, MAIN, 1) is None


def test_certificates_and_keys(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    paths = make_tls(tmp_path, ["127.0.0.1", "localhost"])
    ca = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
    cert = x509.load_pem_x509_certificate(paths["cert"].read_bytes())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    private, public = make_node_key(tmp_path, "node-0")
    serialization.load_ssh_private_key(private.read_bytes(), password=None)
    assert public.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert oct(private.stat().st_mode)[-3:] == "600"


def test_a_taken_port_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = federation_markers()
        code = main(["run", str(demo_config_path()), "--out", str(tmp_path), "--quiet", "--set", "runtime.engine=flower",
                     "--set", f"flower.port={port}", "--set", "federation.rounds=1"])
    err = capsys.readouterr().err
    assert code == 2 and f"port {port}" in err and "in use" in err and len(err.strip().splitlines()) == 1
    assert no_fedfew_processes_left(before)


# -- real processes ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A SuperLink and 4 SuperNodes, TLS and SuperNode authentication on, for the whole module."""
    folder = tmp_path_factory.mktemp("federation")
    before = federation_markers()
    with LocalFederation(folder, 4, FlowerSettings(round_timeout=300, startup_timeout=300), None) as fed:
        yield fed
    assert no_fedfew_processes_left(before)


def run_flower(fed: LocalFederation, config: dict[str, Any], out: Path) -> dict[str, Any]:
    cfg = load_config(config, ["runtime.engine=flower"])
    folder = new_run(cfg, out)
    return run_on_federation(fed, folder, load_config(folder.path / "config.yaml"))


#: The algorithms CI runs on the deployment runtime: one for each way a client's work reaches the
#: server (F2L: a private client-model in the node's state, half of it uploaded, scored on the node; FML:
#: a private model of another design; FRL: meta-training, then deployment groups; FRL one-shot: kept
#: models combined; AdFL: one upload, the server's adversarial scoring; FedFSL-MI-Adv: the adversarial
#: few-shot round). Every algorithm runs through the same ClientApp handlers and server engine on the
#: Simulation Engine (tests/flower/test_simulation.py); the rest are marked slow here (`make test-flower-all`),
#: because each run costs a ClientApp process per message and CI has 45 minutes.
DEPLOYED = {"f2l", "fml", "frl", "frl-oneshot", "adfl", "fedfsl-mi-adv"}


@pytest.mark.flower
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in DEPLOYED else pytest.mark.slow)
                                  for n in sorted(ALGORITHM_SETUPS)])
def test_flower_equals_inprocess(name: str, federation: LocalFederation, tmp_path: Path) -> None:
    config = tiny_config(name)
    on_flower = run_flower(federation, config, tmp_path / "flower")
    inprocess = run_experiment(load_config(config), tmp_path / "inprocess", progress=False)
    assert history(on_flower) == history(inprocess)  # metrics, bytes down and up, who replied
    assert on_flower["test"] == inprocess["test"] and on_flower["selected_round"] == inprocess["selected_round"]
    # What left the nodes: uploads, metrics and scores, never a private state.
    log = Path(on_flower["folder"]) / "flower" / "messages.jsonl"
    entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    for entry in entries:
        assert set(entry["records"]) in ({"upload", "upload.meta", "result"}, {"scores", "scores.meta"}), entry["records"]
        assert not any(key.startswith("fedfew.state") for key in entry["records"])
    if name == "f2l":  # the client-model (psi) stays: only the server-model (phi) goes up
        uploads = [e for e in entries if e["type"] == "train"]
        assert uploads and all(e["array_bytes"]["upload"] > 0 for e in uploads)
        assert not (Path(on_flower["folder"]) / "model" / "clients").exists()  # nor is it on the server's disk
    if name in PRIVATE:
        assert any(e["type"] == "evaluate" for e in entries)  # scored where the private models are


@pytest.mark.flower
def test_an_unregistered_supernode_is_refused(federation: LocalFederation) -> None:
    key = federation.node_key(99, register=False)
    intruder = federation.start_node(99, key, client_id=1)
    deadline = time.monotonic() + 60
    while intruder.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert intruder.popen.returncode not in (None, 0)
    assert "Failed to activate SuperNode" in intruder.log.read_text()
    listed = subprocess.run([str(federation.bin / "flwr"), "supernode", "list", "local", "--format", "json"],
                            env=federation.env(federation.cli_home()), capture_output=True, text=True, timeout=120)
    assert listed.stdout.count('"online"') == 4


@pytest.mark.flower
def test_a_killed_supernode_leaves_a_finished_run(tmp_path: Path) -> None:
    # The timeout must outlast a round of three live nodes on a loaded 2-core machine (CI once took
    # more than 20 s for round 1, and the live node counted as failed); the dead node costs round 2 at most
    # this long.
    config = tiny_config("fl-proto", federation={"rounds": 2, "clients_per_round": 3},
                         partition={"num_clients": 3})
    config["flower"] = {"round_timeout": 90}
    before = federation_markers()
    fed = LocalFederation(tmp_path / "fed", 3, FlowerSettings(round_timeout=90, tls=False, node_auth=False), None)
    with fed:
        cfg = load_config(config, ["runtime.engine=flower"])
        folder = new_run(cfg, tmp_path / "out")
        result: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: result.update(run_on_federation(fed, folder, cfg)))
        worker.start()
        metrics = folder.path / "metrics.jsonl"
        while worker.is_alive() and (not metrics.exists() or not metrics.read_text().strip()):
            time.sleep(0.2)
        victim = next(p for p in fed.processes if p.name == "supernode-2")
        for pid, _ in [(victim.popen.pid, "")] + sorted(victim.known):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        worker.join(timeout=600)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert json.loads((folder.path / "status.json").read_text())["status"] == "complete"
    assert rows[0]["clients"]["replied"] == [0, 1, 2]
    assert len(rows) == 2 and rows[1]["clients"]["failed"] == [2] and rows[1]["clients"]["replied"] == [0, 1]
    assert "accuracy" in result["test"]
    assert no_fedfew_processes_left(before)


@pytest.mark.flower
def test_fedfew_run_on_flower_from_the_command_line(tmp_path: Path) -> None:
    """The README's command, as a user runs it (10 SuperNodes, TLS and node authentication)."""
    before = federation_markers()
    done = subprocess.run([sys.executable, "-m", "fedfew.cli.main", "run", str(demo_config_path()), "--set",
                           "runtime.engine=flower", "--set", "federation.rounds=2", "--set",
                           "episodes.test_episodes=50", "--out", str(tmp_path), "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert json.loads((folder / "status.json").read_text())["status"] == "complete"
    assert (folder / "summary.json").is_file() and (folder / "flower" / "tls" / "ca.pem").is_file()
    assert no_fedfew_processes_left(before)



@pytest.mark.flower
def test_the_walkthrough_commands(federation: LocalFederation, tmp_path: Path) -> None:
    """docs/deployment.md's path: the app written by `fedfew flower-app`, a config file and a run-dir
    base folder given to `flwr run` (the ServerApp makes the run folder)."""
    import yaml

    config = tiny_config("fl-proto", federation={"rounds": 1})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["flower-app", str(tmp_path / "app")]) == 0
    federation.run_app({"config-file": str(path), "run-dir": str(tmp_path / "runs")}, app=tmp_path / "app")
    (folder,) = list((tmp_path / "runs").iterdir())
    assert json.loads((folder / "status.json").read_text())["status"] == "complete"
    assert json.loads((folder / "summary.json").read_text())["test"]["accuracy"] > 0


@pytest.mark.flower
def test_a_second_sigterm_while_stopping_leaves_no_process(tmp_path: Path) -> None:
    """A user's second Ctrl-C (or a supervisor's repeated SIGTERM) must not abandon the federation."""
    import signal

    import yaml

    config = tiny_config("fl-proto", federation={"rounds": 50})
    # The four SuperNodes may take minutes to start on a loaded 2-core machine: the run must be training
    # when the signals come, so it may wait as long as the test waits for its first round.
    config["flower"] = {**config.get("flower", {}), "startup_timeout": 900}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    before = federation_markers()
    run = subprocess.Popen([sys.executable, "-m", "fedfew.cli.main", "run", str(path), "--set", "runtime.engine=flower",
                            "--out", str(tmp_path / "out"), "--quiet"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_logged_round(run, tmp_path / "out", 900)
        assert run.poll() is None, run.stderr.read() if run.stderr else ""
        run.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, err[-2000:]
    assert "fedfew resume" in err.strip().splitlines()[-1]
    (folder,) = list((tmp_path / "out").iterdir())
    assert json.loads((folder / "status.json").read_text())["status"] == "interrupted"
    assert no_fedfew_processes_left(before)


# -- secure aggregation: SuperNodes stopped after the key exchange -----------------------------------------------
def _stop_node(fed: LocalFederation, k: int) -> None:
    """SIGTERM SuperNode k (it leaves the federation) and every process it started, by PID."""
    victim = next(p for p in fed.processes if p.name == f"supernode-{k}")
    fed.note_descendants()
    for pid in [victim.popen.pid] + sorted(pid for pid, _ in victim.known):
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass
    victim.popen.wait(timeout=60)


@pytest.mark.flower
def test_secure_aggregation_with_supernodes_stopped_after_the_key_exchange(tmp_path: Path) -> None:
    """SecAgg+ on three SuperNodes (real processes), 2 of a client's 3 shares to unmask it. Round 1: client 2's
    SuperNode is stopped once its answer to the key exchange is in; the round completes (each client keeps 2
    live neighbours), the others' shares remove its masks, and the model is the plain round's of clients 0
    and 1 within the recorded bound. Round 2: client 2 is gone and client 1 is stopped the same way: one live
    client cannot be unmasked, and the run fails with one line that says why."""
    from fedfew.flower.errors import FlowerRunError
    from fedfew.interface import serialize
    from tests.flower.test_secagg import aggregate, one_round

    config = tiny_config("fl-proto", federation={"rounds": 2, "clients_per_round": 3}, partition={"num_clients": 3})
    config["flower"] = {"round_timeout": 120, "secure_aggregation": {"enabled": True}}  # 2 of 3 shares unmask
    cfg = load_config(config, ["runtime.engine=flower"])
    before = federation_markers()
    fed = LocalFederation(tmp_path / "fed", 3, FlowerSettings(round_timeout=120, tls=False, node_auth=False), None)
    with fed:
        folder = new_run(cfg, tmp_path / "out")
        failure: list[BaseException] = []

        def run() -> None:
            try:
                run_on_federation(fed, folder, cfg)
            except BaseException as err:  # the run fails in round 2: its error is the test's subject
                failure.append(err)

        worker = threading.Thread(target=run)
        worker.start()
        log = folder.path / "flower" / "messages.jsonl"
        for key, victim in (("0", 2), ("1", 1)):
            deadline = time.monotonic() + 600
            while worker.is_alive() and time.monotonic() < deadline:
                entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
                if any(e["type"] == "secagg-share_keys" and e["key"] == key and e["client"] == victim for e in entries):
                    _stop_node(fed, victim)
                    break
                time.sleep(0.1)
        worker.join(timeout=600)
        assert not worker.is_alive()
    assert no_fedfew_processes_left(before)
    rows = [json.loads(line) for line in (folder.path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["clients"]["replied"] == [0, 1] and rows[0]["clients"]["failed"] == [2]
    entry = json.loads((folder.path / "flower" / "secagg.jsonl").read_text().splitlines()[0])
    assert entry["summed"] == [0, 1] and entry["dropped"] == [2] and entry["threshold"] == 2
    assert entry["left_after_masking"] == []
    server, _ = serialize.load(folder.path / "checkpoint" / "server-r1.safetensors")
    setup = one_round({**config, "federation": {"rounds": 1, "clients_per_round": 3},
                       "runtime": {**config["runtime"], "engine": "flower"}})
    expected = aggregate(setup["experiment"], setup["server"], {c: setup["results"][c] for c in (0, 1)})
    difference = max(float((server["model"][k].double() - expected[k].double()).abs().max()) for k in expected)
    assert difference <= entry["error_bound"] + 1e-6, (difference, entry["error_bound"])
    print(f"deployment, one dropout: model max difference {difference:.3g} <= bound {entry['error_bound']:.3g}")
    (error,) = failure
    assert isinstance(error, FlowerRunError), error
    message = str(error)
    assert "\n" not in message and "round 2 failed at stage collect_masked_vectors: client(s) [1, 2] dropped" in message
    assert "fewer than the 2 shares needed to unmask" in message, message
    assert json.loads((folder.path / "status.json").read_text())["status"] == "failed"


@pytest.mark.flower
def test_secure_aggregation_with_a_supernode_stopped_after_its_masked_vector(tmp_path: Path) -> None:
    """SecAgg+ on three SuperNodes (real processes), 2 of a client's 3 shares to unmask it; client 2's SuperNode
    is stopped once its masked vector is in (its ``secagg-collect_masked_vectors`` entry), before the unmask
    stage. What SecAgg+ does (Bell et al. 2020; Flower's ``SecAggPlusWorkflow.unmask_stage``): the clients
    the server has a masked vector from are the round's survivors, whatever happens later. Their vectors are
    already in the masked sum, so client 2's pairwise masks cancel there as everyone's do; the unmask stage
    asks the live neighbours of each survivor for the shares of its *private-mask seed* (never of its key,
    which would also reveal its pairwise masks and so its vector), and the 2 shares clients 0 and 1 hold of
    client 2's seed remove its private mask. The round completes and client 2's input stays in the sum:
    the model is the plain aggregate of all three clients within the recorded bound, and the round records
    client 2 as summed, not dropped, and as ``left_after_masking`` (no unmask reply from it). Its update
    counts in full, as if it had stayed: under DP it took part in the round (DP-FedAvg's denominator is m
    whoever answers; docs/privacy.md, "Threshold and dropouts")."""
    from fedfew.interface import serialize
    from tests.flower.test_secagg import aggregate, one_round

    config = tiny_config("fl-proto", federation={"rounds": 1, "clients_per_round": 3}, partition={"num_clients": 3})
    config["flower"] = {"round_timeout": 120, "secure_aggregation": {"enabled": True}}  # 2 of 3 shares unmask
    cfg = load_config(config, ["runtime.engine=flower"])
    before = federation_markers()
    fed = LocalFederation(tmp_path / "fed", 3, FlowerSettings(round_timeout=120, tls=False, node_auth=False), None)
    stopped = False
    with fed:
        folder = new_run(cfg, tmp_path / "out")
        worker = threading.Thread(target=run_on_federation, args=(fed, folder, cfg))
        worker.start()
        log = folder.path / "flower" / "messages.jsonl"
        deadline = time.monotonic() + 600
        while worker.is_alive() and time.monotonic() < deadline:
            entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
            if any(e["type"] == "secagg-collect_masked_vectors" and e["client"] == 2 for e in entries):
                _stop_node(fed, 2)
                stopped = True
                break
            time.sleep(0.1)
        worker.join(timeout=600)
        assert not worker.is_alive()
    assert stopped and no_fedfew_processes_left(before)
    assert json.loads((folder.path / "status.json").read_text())["status"] == "complete"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    answered = {(e["type"], e["client"]) for e in entries}
    assert {("secagg-collect_masked_vectors", c) for c in (0, 1, 2)} <= answered
    assert {c for t, c in answered if t == "secagg-unmask"} == {0, 1}  # client 2 was gone before the unmask stage
    entry = json.loads((folder.path / "flower" / "secagg.jsonl").read_text().splitlines()[0])
    assert entry["summed"] == entry["trained"] == [0, 1, 2] and entry["dropped"] == [] and entry["threshold"] == 2
    assert entry["left_after_masking"] == [2]
    (row,) = [json.loads(line) for line in (folder.path / "metrics.jsonl").read_text().splitlines()]
    assert row["clients"]["replied"] == [0, 1, 2] and not row["clients"].get("failed")
    server, _ = serialize.load(folder.path / "checkpoint" / "server-r1.safetensors")
    setup = one_round({**config, "runtime": {**config["runtime"], "engine": "flower"}})
    assert sorted(setup["results"]) == [0, 1, 2]
    expected = setup["aggregate"]  # the plain round of all three
    difference = max(float((server["model"][k].double() - expected[k].double()).abs().max()) for k in expected)
    assert difference <= entry["error_bound"] + 1e-6, (difference, entry["error_bound"])
    two = {c: setup["results"][c] for c in (0, 1)}  # and not the round of the two that answered the unmask stage
    without = aggregate(setup["experiment"], setup["server"], two)
    assert max(float((server["model"][k].double() - without[k].double()).abs().max()) for k in without) > 100 * (
        entry["error_bound"] + 1e-6)
    print(f"deployment, a dropout after its masked vector: model max difference {difference:.3g} <= bound "
          f"{entry['error_bound']:.3g} (all three summed)")

