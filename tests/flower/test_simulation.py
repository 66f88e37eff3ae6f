"""fedfew on Flower's Simulation Engine (``runtime.engine: flower-sim``), with a real Ray cluster of two
nodes on 127.0.0.1 (a head and a second raylet, started once for the module and stopped by PID).

* every algorithm gives exactly the in-process metrics (one simulation, joined to the cluster, serves
  every algorithm's run in turn: Ray and its actors start once);
* the full path (``--set runtime.engine=flower-sim --set flower.sim.address=...``) runs its clients on
  both nodes (each reply records the Ray node it ran on) and leaves no process behind;
* a private Ray instance from the command line, and bad input (an unreachable address, a GPU the
  cluster lacks): one line, exit 2, no process left;
* CPUs another job holds: the run waits for them up to ``flower.startup_timeout``, then one line, exit 2;
* secure aggregation (SecAgg+), with and without central DP: what the server pulls is a masked vector per
  client and nothing else of its result, the unmasked sum is the clients' (clipped) sum within the
  quantisation, and under DP the server's noise is added to that sum.

Marked ``flower``: ``make test-flower`` (CI) runs them; a few minutes in all."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

pytest.importorskip("ray")
pytest.importorskip("flwr")

from fedfew.config.validation import load_config  # noqa: E402
from fedfew.core.processes import descendant_pids  # noqa: E402
from fedfew.flower.simulation import FlowerSimEngine, Simulation  # noqa: E402
from fedfew.run.experiment import NODE_BUILDER, build_experiment  # noqa: E402
from tests.raycluster import MARKER, RayCluster, marked_pids, pids_using  # noqa: E402
from tests.tiny import ALGORITHM_SETUPS, tiny_config, wait_for_logged_round  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.flower


def without_seconds(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in history]


@pytest.fixture(scope="module")
def cluster() -> Any:
    with RayCluster(cpus_per_node=1) as c:
        yield c
    assert not c.left


@pytest.fixture(scope="class")
def simulation(cluster: RayCluster) -> Any:
    """One Simulation Engine (4 virtual SuperNodes) on the cluster, for every algorithm's run (its
    actors hold the cluster's CPUs until the class is done)."""
    before = descendant_pids(os.getpid())
    settings = load_config({}, [f"flower.sim.address={cluster.address}"]).flower.sim
    with Simulation(4, settings, None, startup_timeout=300, builder=NODE_BUILDER) as sim:
        yield sim
    assert not _left_after(before), _described(_left_after(before))


def _left_after(before: set[int], wait: float = 10.0) -> set[int]:
    """Processes below this one that were not there ``before``, once any that are still exiting have
    had ``wait`` seconds to do so (a process ends asynchronously after its SIGTERM)."""
    deadline = time.monotonic() + wait
    while (left := descendant_pids(os.getpid()) - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _described(pids: set[int]) -> str:
    """Each leftover process's pid, status and command line: which part of Ray or Flower it is."""
    lines = []
    for pid in sorted(pids):
        try:
            process = psutil.Process(pid)
            lines.append(f"{pid} {process.status()} {' '.join(process.cmdline())[:200]}")
        except psutil.Error as err:
            lines.append(f"{pid} ({err})")
    return "processes left: " + "; ".join(lines)


def run(config: dict[str, Any], factory: Any = None) -> dict[str, Any]:
    cfg = load_config(config)
    experiment = build_experiment(cfg)
    simulator = experiment.simulator(engine_factory=factory)
    try:
        return simulator.run(cfg.federation.rounds, cfg.federation.clients_per_round, cfg.eval.every,
                             track_test=cfg.eval.track_test)
    finally:
        simulator.engine.close()


class TestEveryAlgorithm:
    @pytest.mark.parametrize("name", sorted(ALGORITHM_SETUPS))
    def test_flower_sim_equals_inprocess(self, name: str, simulation: Simulation, tmp_path: Path) -> None:
        config = tiny_config(name)

        def engine(experiment: Any, states: Any, faults: Any, compute: Any) -> FlowerSimEngine:
            return FlowerSimEngine(experiment, faults, compute, tmp_path, simulation=simulation)

        on_sim = run(config, engine)
        inprocess = run(config)
        assert without_seconds(on_sim["history"]) == without_seconds(inprocess["history"])  # bytes, who replied too
        assert on_sim["test"] == inprocess["test"] and on_sim["selected_round"] == inprocess["selected_round"]
        log = tmp_path / "flower" / "messages.jsonl"  # none where nothing is sent (frl-scratch)
        entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        for entry in entries:  # what left the nodes: uploads, metrics and scores, never a private state
            assert set(entry["records"]) in ({"upload", "upload.meta", "result"}, {"scores", "scores.meta"}), entry["records"]


    def test_an_evaluation_that_sends_a_model(self, simulation: Simulation, tmp_path: Path) -> None:
        """F2L with test_client_model: average: each node sends its client-model for the evaluation (in
        the state form, as uploads travel), and the numbers are the in-process ones."""
        config = tiny_config("f2l")
        config["algorithm"]["options"]["test_client_model"] = "average"

        def engine(experiment: Any, states: Any, faults: Any, compute: Any) -> FlowerSimEngine:
            return FlowerSimEngine(experiment, faults, compute, tmp_path, simulation=simulation)

        on_sim, inprocess = run(config, engine), run(config)
        assert without_seconds(on_sim["history"]) == without_seconds(inprocess["history"])
        assert on_sim["test"] == inprocess["test"]
        entries = [json.loads(line) for line in (tmp_path / "flower" / "messages.jsonl").read_text().splitlines()]
        evaluations = [e for e in entries if e["type"] == "evaluate"]
        assert evaluations and all(e["array_bytes"]["scores"] > 0 for e in evaluations)  # the client-models


class Recording:
    """The Grid as the ServerApp uses it, keeping every reply it pulls: what the server received."""

    def __init__(self, grid: Any) -> None:
        self.grid, self.pulled = grid, []

    def push_messages(self, messages: Any) -> Any:
        return self.grid.push_messages(messages)

    def pull_messages(self, ids: Any) -> Any:
        replies = list(self.grid.pull_messages(ids))
        self.pulled.extend(replies)
        return replies

    def get_node_ids(self) -> Any:
        return self.grid.get_node_ids()


def secure_run(config: dict[str, Any], simulation: Simulation, folder: Path) -> tuple[Any, Any, Recording]:
    """One run of ``config`` on the class's simulation, its grid recorded: (the last global model, the
    engine, the recording)."""
    cfg = load_config(config)
    experiment = build_experiment(cfg)
    made: list[FlowerSimEngine] = []

    def engine(experiment: Any, states: Any, faults: Any, compute: Any) -> FlowerSimEngine:
        made.append(FlowerSimEngine(experiment, faults, compute, folder, simulation=simulation))
        return made[0]

    simulator = experiment.simulator(engine_factory=engine)
    recording = Recording(made[0].grid)
    made[0].grid = recording
    try:
        simulator.run(cfg.federation.rounds, cfg.federation.clients_per_round, cfg.eval.every)
    finally:
        simulator.engine.close()
    return simulator.state.server["model"], made[0], recording


def plain_model(config: dict[str, Any]) -> dict[str, Any]:
    """The last global model of ``config`` without secure aggregation, in this process."""
    plain = {**config, "runtime": {**config["runtime"], "engine": "inprocess"}, "flower": {}}
    cfg = load_config(plain)
    simulator = build_experiment(cfg).simulator()
    simulator.run(cfg.federation.rounds, cfg.federation.clients_per_round, cfg.eval.every)
    return simulator.state.server["model"]


@dataclasses.dataclass
class Capture:
    """A secure run's round 1 as the server saw it, beside the same round's plain vectors in this process."""

    model: dict[str, Any]  # the global model after the round
    entry: dict[str, Any]  # the round's record (RUN/flower/secagg.jsonl)
    rounds: Any  # the engine's SecureRounds (settings, the unmasked sum in .last)
    replies: list[Any]  # what the ServerApp pulled in the collect-masked-vectors stage
    masked: dict[int, Any]  # client -> its masked vector (the weight factor first), as pulled
    plain: dict[int, Any]  # client -> the vector it gave secaggplus_mod to quantise and mask (clipped, under DP)
    setup: dict[str, Any]  # tests.flower.test_secagg.one_round: the server's state and the clients' results
    config: dict[str, Any]
    folder: Path


def masked_capture(config: dict[str, Any], simulation: Simulation, folder: Path) -> Capture:
    """One secure round of ``config`` (3 clients) on the class's simulation, its grid recorded, and the
    clients' plain vectors of the same round computed here (under central DP, their updates clipped to
    C - margin as the nodes clip them)."""
    import numpy as np
    from flwr.common import bytes_to_ndarray

    from fedfew.engine.tasks import ClientTask
    from fedfew.interface.static import static_tensors
    from fedfew.privacy.secure_sum import client_vector, layout
    from tests.flower.test_secagg import one_round

    model, engine, recording = secure_run(config, simulation, folder)
    rounds = engine.secure
    (entry,) = rounds.history
    replies = [m for m in recording.pulled if "secaggplus_configs" in m.content.config_records
               and "masked_params" in m.content.config_records["secaggplus_configs"]]
    client_of = {node: cid for cid, node in engine.node_of.items()}
    masked = {client_of[m.metadata.src_node_id]: np.concatenate([bytes_to_ndarray(b).reshape(-1) for b in
              m.content.config_records["secaggplus_configs"]["masked_params"]]) for m in replies}
    setup = one_round(config)
    server, privacy = setup["server"], setup["experiment"].privacy
    frozen = static_tensors(setup["experiment"].algorithm).keys()
    task = ClientTask(0, "0", privacy=privacy.client_spec(server).to_json() if privacy is not None else None)
    spec, task, _ = rounds.spec(task, layout(server["model"], frozen))  # under central DP: the clip less the margin
    if task.privacy is not None:
        setup = one_round(config, clip=float(task.privacy["clip"]))
    plain = {cid: client_vector(spec, server["model"], r, frozen)[0] for cid, r in setup["results"].items()}
    return Capture(model, dict(entry), rounds, replies, masked, plain, setup, config, folder)


def check_masked_only(capture: Capture) -> float:
    """What the server pulled in the third stage is a masked vector per client, unlike the client's quantised
    vector (the weight factor, then its plain vector), and nothing else of its result: no upload, no
    metrics (the algorithm's training metrics stay on the node), no sample count; the masked vectors' sum
    is still masked; the unmasked sum is the sum of the clients' plain vectors within K steps 2c/T per
    coordinate. Returns the sum's largest error."""
    import numpy as np
    from flwr.common.secure_aggregation.quantization import quantize

    from fedfew.privacy.secure_sum import protocol_sizes
    from tests.flower.test_secagg import one_round

    entry, settings = capture.entry, capture.rounds.settings
    selected = entry["asked"]
    assert entry["summed"] == entry["trained"] == selected and len(selected) == 3 and entry["dropped"] == []
    assert entry["left_after_masking"] == []
    assert (entry["num_shares"], entry["threshold"]) == protocol_sizes(3, 1.0, 0.67) == (3, 2)
    assert len(capture.replies) == 3 and sorted(capture.masked) == selected
    # What the algorithm's training reports on a node (its loss and accuracy) must not travel: not under
    # DP either, where they would be un-noised.
    without_dp = {k: v for k, v in capture.config.items() if k != "privacy"}
    reported = {key for r in one_round(without_dp)["results"].values() for key in r.metrics}
    assert {"loss", "accuracy"} <= reported
    for reply in capture.replies:  # the masked vector, its weight 1 and whether it sat out; no upload, no metrics
        assert set(reply.content.keys()) == {"fitres.parameters", "fitres.num_examples", "fitres.metrics",
                                             "fitres.status", "result", "secaggplus_configs"}
        assert not reply.content.array_records["fitres.parameters"]
        assert dict(reply.content.metric_records["fitres.num_examples"]) == {"num_examples": 1}
        assert dict(reply.content.config_records["fitres.metrics"]) == {"skipped": 0}
        assert set(json.loads(str(reply.content.config_records["result"]["json"]))) == {"where", "timing"}
        keys = {key for record in reply.content.values() for key in record.keys()}
        assert not keys & reported, keys & reported
    c, levels, modulus = settings.clipping_range, settings.quantization_range, settings.modulus_range
    for cid in selected:
        quantised = np.concatenate([[levels], quantize([capture.plain[cid]], c, levels)[0]])  # the weight factor first
        assert capture.masked[cid].shape == quantised.shape
        assert (capture.masked[cid] == quantised).mean() < 0.01  # nothing of the client's vector shows
        assert (capture.masked[cid] > levels).mean() > 0.9  # spread over [0, M): a quantised value is at most T
    summed = sum(capture.masked[cid] for cid in selected) % modulus  # still masked by each client's own mask
    assert (summed > 3 * levels).mean() > 0.9
    truth = sum(capture.plain[cid] for cid in selected)
    error = float(np.abs(capture.rounds.last["sum"] - truth).max())
    assert error <= 3 * settings.step, (error, 3 * settings.step)
    logged = [json.loads(line) for line in (capture.folder / "flower" / "messages.jsonl").read_text().splitlines()]
    assert {e["type"] for e in logged} == {f"secagg-{s}" for s in ("setup", "share_keys", "collect_masked_vectors",
                                                                   "unmask")}
    assert not any("upload" in e["records"] for e in logged)
    return error


class TestSecureAggregation:
    """``flower.secure_aggregation`` on the Simulation Engine: Flower's secaggplus_mod on the virtual
    SuperNodes, the SecAgg+ workflow's stages in the ServerApp (3 of the 4 nodes, one round)."""

    def test_the_server_receives_masked_vectors_and_learns_only_their_sum(self, simulation: Simulation,
                                                                           tmp_path: Path) -> None:
        """(a) What the ServerApp pulls in the third stage is a masked vector per client, unlike the client's
        quantised vector, and nothing else of its result; the unmasked sum is the sum of the clients'
        plain vectors within K steps 2c/T per coordinate (:func:`check_masked_only`); (b) the model is the
        plain run's within the bound the engine records."""
        from tests.flower.test_secagg import secure_config

        config = secure_config("fl-proto")
        capture = masked_capture(config, simulation, tmp_path)
        error = check_masked_only(capture)
        print(f"unmasked sum: max error {error:.3g} <= K step = {3 * capture.rounds.settings.step:.3g}")
        model, entry = capture.model, capture.entry
        expected = plain_model(config)
        difference = max(float((model[k].double() - expected[k].double()).abs().max()) for k in model)
        assert difference <= entry["error_bound"] + 1e-6, (difference, entry["error_bound"])
        print(f"model: max difference {difference:.3g} <= bound {entry['error_bound']:.3g}")

    def test_with_central_dp_the_server_receives_masked_vectors_and_noises_their_sum(
            self, simulation: Simulation, tmp_path: Path) -> None:
        """central-dp + secure aggregation. (a) As without DP (:func:`check_masked_only`): the server pulls a
        masked vector per client and nothing else of its result (no upload, no metrics: nothing un-noised),
        and the unmasked sum is the sum of the clients' *clipped* vectors (clipped to C less the
        quantisation's reach, ``dp_clip_margin``) within K steps. (b) The noise is the server's, added to
        the unmasked sum: the clients' vectors carry none (the unmasked sum is their clipped sum within K
        steps, while the noise on a sum has standard deviation z C = 0.4), and the model less the
        noiseless aggregate w + sum / m is the server's seeded draw times z C / m (research mode,
        ``noise: seeded``), within the float32 rounding; over the model's 1896 coordinates its standard
        deviation is z C / m within 5 standard errors of a sample deviation (1 / sqrt(2 (d - 1)), 1.6%),
        and against the clients' exact clipped sum within (K step) / m more. (c) The model is the plain DP
        run's within the bound the engine records."""
        import numpy as np
        import torch

        from fedfew.core.seeding import torch_generator
        from fedfew.privacy.mechanism import NOISE_KEY
        from tests.flower.test_secagg import CENTRAL, secure_config

        config = secure_config("fl-proto", privacy=CENTRAL)
        capture = masked_capture(config, simulation, tmp_path)
        entry, settings = capture.entry, capture.rounds.settings
        assert entry["mode"] == "dp" and 0 < entry["dp_clip_margin"] < 1e-3
        error = check_masked_only(capture)
        print(f"central-dp, unmasked sum: max error {error:.3g} <= K step = {3 * settings.step:.3g}")
        # (b) the server's noise on the unmasked sum
        privacy, server = capture.setup["experiment"].privacy, capture.setup["server"]
        z, clip, m = privacy.update_noise, privacy.current_clip(server), privacy.per_round
        assert (z, clip, m) == (0.8, 0.5, 3)
        std = z * clip / m
        before = server["model"]
        names = [n for n in sorted(before) if torch.is_floating_point(before[n]) and n not in privacy.frozen]
        generator = torch_generator(config["seed"], NOISE_KEY, "0")  # the server's draw, in sorted order
        draw = np.concatenate([torch.randn(before[n].shape, generator=generator, dtype=torch.float64).reshape(-1).numpy()
                               for n in names])
        after = np.concatenate([capture.model[n].double().reshape(-1).numpy() for n in names])
        start = np.concatenate([before[n].double().reshape(-1).numpy() for n in names])
        residual = after - (start + capture.rounds.last["sum"] / m)  # the model less the noiseless aggregate
        float32 = float(np.abs(after).max()) * 2.0 ** -23
        assert float(np.abs(residual - draw * std).max()) <= float32, float(np.abs(residual - draw * std).max())
        d = residual.size
        assert d == 1896
        deviation = float(residual.std())
        assert abs(deviation / std - 1) <= 5 / np.sqrt(2 * (d - 1)), (deviation, std)
        assert abs(float(residual.mean())) <= 5 * std / np.sqrt(d)
        truth = sum(capture.plain[cid] for cid in entry["summed"])
        against_truth = float(np.abs(after - (start + truth / m) - draw * std).max())
        assert against_truth <= 3 * settings.step / m + float32, against_truth
        print(f"central-dp noise: std {deviation:.4g} (z C / m = {std:.4g}) over {d} coordinates; the model less "
              f"the noiseless aggregate is the server's draw within {against_truth:.3g}")
        # (c) the plain DP run's model
        expected = plain_model(config)
        model = capture.model
        difference = max(float((model[k].double() - expected[k].double()).abs().max()) for k in model)
        assert difference <= entry["error_bound"] + 1e-6, (difference, entry["error_bound"])
        print(f"central-dp model: max difference {difference:.3g} <= bound {entry['error_bound']:.3g}")


def fedfew_run(args: list[str], marker: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, MARKER: marker}
    return subprocess.run([sys.executable, "-m", "fedfew.cli.main", "run", *args, "--quiet"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_run_waits_for_the_cpus_another_job_holds_until_flower_startup_timeout(cluster: RayCluster,
                                                                                tmp_path: Path) -> None:
    """While another job (a long run on the cluster) holds both its CPUs, a run that may wait 3 s says it
    waits and ends with one line and exit 2; a run that may wait longer starts when that job ends (a run
    started just after another has ended meets the same: Ray frees the old actors' CPUs only once it has
    ended them, seconds later on a busy machine)."""
    import signal

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fl-proto", federation={"rounds": 1})))
    long_path = tmp_path / "long.yaml"
    long_path.write_text(yaml.safe_dump(tiny_config("fl-proto", federation={"rounds": 200})))
    on_cluster = ["--set", "runtime.engine=flower-sim", "--set", f"flower.sim.address={cluster.address}", "--quiet"]
    marker = uuid.uuid4().hex

    def start(config: Path, out: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "fedfew.cli.main", "run", str(config), *on_cluster, "--out",
                                 str(tmp_path / out)], cwd=REPO, env={**os.environ, MARKER: marker},
                                stderr=subprocess.PIPE, text=True)

    holder, waiting = start(long_path, "holder"), None
    try:
        wait_for_logged_round(holder, tmp_path / "holder", 400)  # its actors hold both CPUs now
        assert holder.poll() is None, holder.stderr.read() if holder.stderr else ""

        refused = fedfew_run([str(path), *on_cluster[:-1], "--set", "flower.startup_timeout=3", "--out",
                              str(tmp_path / "refused")], marker)
        assert refused.returncode == 2, refused.stderr[-2000:]
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(lines) == 2, refused.stderr[-2000:]
        assert "waiting up to 3 s (flower.startup_timeout) for 1 CPU" in lines[0], lines[0]
        assert ("flower.sim.num_cpus: each client needs 1 CPU, but only 0 of the cluster's 2 were free within 3 s "
                "(flower.startup_timeout; another job holds them)") in lines[1], lines[1]

        waiting = start(path, "out")
        assert waiting.stderr is not None
        first = waiting.stderr.readline()  # blocks until the run says it waits (or ends)
        assert "waiting up to 300 s (flower.startup_timeout) for 1 CPU" in first, first + waiting.stderr.read()
        holder.send_signal(signal.SIGTERM)  # the other job ends (checkpointed, exit 130)
        _, err = holder.communicate(timeout=300)
        assert holder.returncode == 130, err[-2000:]
        _, err = waiting.communicate(timeout=600)
        assert waiting.returncode == 0, err[-2000:]
    finally:
        for process in (holder, waiting):
            if process is not None and process.poll() is None:
                process.kill()
    (folder,) = list((tmp_path / "out").iterdir())
    assert json.loads((folder / "status.json").read_text())["status"] == "complete"
    assert not marked_pids(marker)


def test_a_run_on_the_cluster_uses_both_nodes(cluster: RayCluster, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    marker = uuid.uuid4().hex
    done = fedfew_run([str(path), "--set", "runtime.engine=flower-sim", "--set", f"flower.sim.address={cluster.address}",
                       "--out", str(tmp_path / "out")], marker)
    assert done.returncode == 0, done.stderr[-2000:]
    (folder,) = list((tmp_path / "out").iterdir())
    assert json.loads((folder / "status.json").read_text())["status"] == "complete"
    entries = [json.loads(line) for line in (folder / "flower" / "messages.jsonl").read_text().splitlines()]
    nodes = {e["where"]["ray_node"] for e in entries if e["type"] == "train"}
    assert len(nodes) == 2, nodes  # the head's raylet and the second one
    assert not marked_pids(marker)  # the run's own processes; the cluster stays up for the next test


def test_a_private_ray_from_the_command_line_leaves_no_process(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config("f2l", federation={"rounds": 1})))
    marker, temp = uuid.uuid4().hex, tempfile.mkdtemp(prefix="fr", dir="/tmp")  # short: Ray's socket paths
    done = fedfew_run([str(path), "--set", "runtime.engine=flower-sim", "--set", "flower.sim.init_args.num_cpus=2",
                       "--set", f"flower.sim.init_args._temp_dir={temp}", "--out", str(tmp_path / "out")], marker)
    assert done.returncode == 0, done.stderr[-2000:]
    (folder,) = list((tmp_path / "out").iterdir())
    summary = json.loads((folder / "summary.json").read_text())
    inprocess = run(tiny_config("f2l", federation={"rounds": 1}))
    assert summary["test"] == inprocess["test"]
    assert not marked_pids(marker) and not pids_using(temp)
    shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.parametrize("setting, message", [
    ("flower.sim.address=127.0.0.1:9", "flower.sim.address: no Ray cluster answers at '127.0.0.1:9'"),
    ("flower.sim.num_gpus=1", "flower.sim.num_gpus: each client needs 1 GPU, but the Ray cluster has 0"),
])
def test_bad_ray_settings_are_one_line_and_exit_2(setting: str, message: str, cluster: RayCluster,
                                                  tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fl-proto")))
    marker = uuid.uuid4().hex
    sets = ["--set", setting] + ([] if "address" in setting else ["--set", f"flower.sim.address={cluster.address}"])
    done = fedfew_run([str(path), "--set", "runtime.engine=flower-sim", *sets, "--out", str(tmp_path / "out")],
                      marker, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr[-2000:]
    assert not marked_pids(marker)


def test_an_interrupted_run_leaves_no_process(tmp_path: Path) -> None:
    """SIGTERM (as Ctrl-C) after the first round: exit 130, checkpointed, and no Ray process left."""
    import signal

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fl-proto", federation={"rounds": 200})))
    marker, temp = uuid.uuid4().hex, tempfile.mkdtemp(prefix="fr", dir="/tmp")
    run = subprocess.Popen([sys.executable, "-m", "fedfew.cli.main", "run", str(path), "--set", "runtime.engine=flower-sim",
                            "--set", "flower.sim.init_args.num_cpus=2", "--set", f"flower.sim.init_args._temp_dir={temp}",
                            "--out", str(tmp_path / "out"), "--quiet"],
                           cwd=REPO, env={**os.environ, MARKER: marker}, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_logged_round(run, tmp_path / "out", 400)
        assert run.poll() is None, run.stderr.read() if run.stderr else ""
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, err[-2000:]
    (folder,) = list((tmp_path / "out").iterdir())
    assert json.loads((folder / "status.json").read_text())["status"] == "interrupted"
    assert not marked_pids(marker) and not pids_using(temp)
    shutil.rmtree(temp, ignore_errors=True)
