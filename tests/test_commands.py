"""The commands that had no test: sweep and its grid parsing, resume from a checkpoint older than the
last round (checkpoint_every > 1), flower-certs; and bf16 precision against fp32."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedfew.cli.main import main
from fedfew.config.validation import ConfigError, load_config
from fedfew.run.folder import RunFolder
from fedfew.run.runner import resume_run, run_experiment
from fedfew.run.sweep import parse_grid, sweep_configs
from fedfew.study.run_readback import run_seconds
from tests.tiny import tiny_config


def metrics(folder: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("seconds")
    return rows


# -- sweep --------------------------------------------------------------------------------------------
def test_grid_items_parse_as_yaml_values() -> None:
    grid = parse_grid(["partition.num_clients=2,4", "algorithm.options.lr=0.1,1.0e-3", "splits.val=null,val",
                       "name=a"])
    assert grid == [("partition.num_clients", [2, 4]), ("algorithm.options.lr", [0.1, 0.001]),
                    ("splits.val", [None, "val"]), ("name", ["a"])]
    with pytest.raises(ConfigError, match="key=v1,v2"):
        parse_grid(["partition.num_clients"])
    with pytest.raises(ConfigError, match="federation.rounds"):
        parse_grid(["federation.rounds=[1,2"])


def test_sweep_configs_are_the_product_of_the_grid_each_validated() -> None:
    config = tiny_config("fl-proto")
    points = sweep_configs(config, parse_grid(["partition.num_clients=4,6", "federation.rounds=1,3"]),
                           ["seed=5"])
    assert [label for label, _ in points] == ["num_clients=4, rounds=1", "num_clients=4, rounds=3",
                                              "num_clients=6, rounds=1", "num_clients=6, rounds=3"]
    assert [(c.partition.num_clients, c.federation.rounds) for _, c in points] == [(4, 1), (4, 3), (6, 1), (6, 3)]
    assert all(c.seed == 5 for _, c in points)  # the overrides apply to every point
    with pytest.raises(ConfigError, match="federation.clients_per_round=4 exceeds partition.num_clients=2"):
        sweep_configs(config, parse_grid(["partition.num_clients=6,2"]), [])  # one bad point stops them all


def test_sweep_command_runs_every_point_and_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config("fl-proto", federation={"rounds": 1})))
    assert main(["sweep", str(path), "--grid", "seed=0,1", "--out", str(tmp_path / "sweep"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "seed=0" in out and "seed=1" in out
    rows = [json.loads(line) for line in (tmp_path / "sweep" / "summaries.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == ["seed=0", "seed=1"]
    assert (tmp_path / "sweep" / "results.md").is_file() and len(list((tmp_path / "sweep" / "runs").iterdir())) == 2
    assert main(["sweep", str(path), "--grid", "seed", "--out", str(tmp_path / "bad"), "--quiet"]) == 2


# -- resume from an older checkpoint ----------------------------------------------------------------------
def test_resume_from_a_checkpoint_two_rounds_back_equals_uninterrupted(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """checkpoint_every: 2 and the process lost after round 3 (no checkpoint written at the end, as
    with kill -9): the resume starts again from round 2, drops round 3's line and ends where a run
    that was never stopped ends."""
    config = load_config(tiny_config("f2l", federation={"rounds": 5, "clients_per_round": 3},
                                     partition={"num_clients": 3}), ["runtime.checkpoint_every=2"])
    whole = run_experiment(config, tmp_path / "whole", progress=False)
    original = RunFolder.append_metrics

    class MachineLost(BaseException):
        """Neither an Exception nor SystemExit (which a run records as a crash): nothing runs on the way out."""

    def lost_after_round_3(self: RunFolder, record: dict[str, Any]) -> None:
        original(self, record)
        if record["round"] == 3:
            raise MachineLost("the machine went away")

    with monkeypatch.context() as patch:
        patch.setattr(RunFolder, "append_metrics", lost_after_round_3)
        with pytest.raises(MachineLost):
            run_experiment(config, tmp_path / "cut", progress=False)
    (folder,) = (tmp_path / "cut").iterdir()
    assert len(metrics(folder)) == 3
    assert json.loads((RunFolder(folder).checkpoint_dir / "run.json").read_text())["round"] == 2
    started = time.perf_counter()
    resumed = resume_run(folder, progress=False)
    sitting = time.perf_counter() - started
    assert metrics(folder) == metrics(Path(whole["folder"]))
    assert resumed["test"] == whole["test"] and resumed["selected_round"] == whole["selected_round"]
    # Its time: this sitting's plus the rounds' seconds at the checkpoint (round 2), each counted once.
    round_2 = json.loads((folder / "metrics.jsonl").read_text().splitlines()[1])
    assert round_2["round"] == 2 and resumed["seconds_resumed_from"] == round(round_2["seconds"], 2)
    assert resumed["seconds"] <= resumed["seconds_resumed_from"] + sitting + 0.01  # 0.01: both rounded
    assert run_seconds(folder, resumed) == resumed["seconds"]  # the study's correction is for older summaries
    assert "seconds_resumed_from" not in whole


# -- flower-certs ---------------------------------------------------------------------------------------
def test_flower_certs_writes_a_ca_a_server_certificate_and_node_keys(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    folder = tmp_path / "certs"
    assert main(["flower-certs", str(folder), "--host", "127.0.0.1", "--host", "link.example", "--nodes", "2"]) == 0
    assert "node-0" in capsys.readouterr().out
    ca = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    cert = x509.load_pem_x509_certificate((folder / "server.pem").read_bytes())
    assert cert.issuer == ca.subject  # the server certificate is signed by the CA
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "link.example" in names.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    for k in range(2):
        serialization.load_ssh_private_key((folder / f"node-{k}").read_bytes(), password=None)
        assert oct((folder / f"node-{k}").stat().st_mode)[-3:] == "600"
        assert (folder / f"node-{k}.pub").read_text().startswith("ecdsa-sha2-nistp384 ")


# -- bf16 precision ------------------------------------------------------------------------------------------
def test_bf16_gives_the_fp32_accuracy_within_three_points() -> None:
    """runtime.precision: bf16 (autocast of matrix products and convolutions) on a small config: the
    test accuracy over the same 150 episodes is within 3 points of fp32's (the 95% interval of either
    is about 4 points), and the numbers are not fp32's (bf16 was really used)."""
    from fedfew.run.experiment import build_experiment

    results = {}
    for precision in ("fp32", "bf16"):
        config = load_config(tiny_config("fl-proto", episodes={"n_way": 3, "k_shot": 1, "q_query": 3,
                                                               "test_episodes": 150}),
                             [f"runtime.precision={precision}", "federation.rounds=3"])
        simulator = build_experiment(config).simulator()
        results[precision] = simulator.run(3, 4, 3)
    fp32, bf16 = results["fp32"], results["bf16"]
    assert abs(bf16["test"]["accuracy"] - fp32["test"]["accuracy"]) <= 0.03, (fp32["test"], bf16["test"])
    assert bf16["history"][0]["train_loss"] != fp32["history"][0]["train_loss"]
