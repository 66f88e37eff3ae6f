"""The command line: list, run (one folder with every promised file), errors, and the demo path."""

import json
from pathlib import Path

import pytest

from fedfew.cli.main import demo_config_path, main

TINY = [
    "federation.rounds=2", "partition.num_clients=4", "federation.clients_per_round=4",
    "episodes.test_episodes=10", "eval.every=1", "model.options={hidden: 8}",
    "algorithm.options.local_steps=1", "runtime.threads=1",
]


def test_list_shows_every_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("algorithms:", "fl-maml", "datasets:", "omniglot", "models:", "conv4", "partitions:", "dirichlet"):
        assert word in out


def test_run_writes_a_complete_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", str(demo_config_path()), "--out", str(tmp_path), "--quiet"]
    for item in TINY:
        args += ["--set", item]
    assert main(args) == 0
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "results.md", "accuracy.png"):
        assert (folder / name).is_file(), name
    rounds = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]
    summary = json.loads((folder / "summary.json").read_text())
    assert 0 <= summary["test"]["accuracy"] <= 1 and summary["bytes_up"] > 0


def test_bad_config_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(demo_config_path()), "--set", "federation.roudns=2", "--quiet", "--out", str(tmp_path)])
    assert code == 2
    assert "federation.roudns" in capsys.readouterr().err


def test_impossible_episode_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(demo_config_path()), "--set", "episodes.k_shot=500", "--quiet", "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err  # read once: a second readouterr() would see ""
    assert "k_shot" in err and len(err.strip().splitlines()) == 1


def test_demo_end_to_end_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["demo", "--out", str(tmp_path), "--quiet"]
    for item in ("federation.rounds=1", "partition.num_clients=4", "federation.clients_per_round=4",
                 "episodes.test_episodes=5", "episodes.val_episodes=5", "model.options={hidden: 8}"):
        args += ["--set", item]
    assert main(args) == 0
    out = capsys.readouterr().out
    for name in ("| untrained |", "| local |", "| fl-proto |", "| fedavg |", "omniglot-mini"):
        assert name in out
    assert (tmp_path / "results.md").is_file() and (tmp_path / "accuracy.png").is_file()


def test_the_command_exits_with_mains_code_after_the_exit_handlers_and_every_line(tmp_path: Path) -> None:
    """`fedfew` ends without Python's own shutdown (exit_quickly), daemon threads alive or not: the exit
    code is main's, every line written to a pipe arrives, exit handlers (here a plugin's) still run,
    and a non-daemon thread still running is waited for as by an ordinary exit."""
    import subprocess
    import sys
    import time

    plugin = tmp_path / "exits.py"
    plugin.write_text(
        "import atexit, pathlib, threading, time\n"
        f"folder = pathlib.Path({str(tmp_path)!r})\n"
        "atexit.register(lambda: (folder / 'handler-ran').write_text('yes'))\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # not waited for\n"
        "if (folder / 'with-thread').exists():\n"
        "    threading.Thread(target=lambda: (time.sleep(1.0), (folder / 'thread-done').write_text('yes'))).start()\n"
        "print('\\n'.join(f'line {i}' for i in range(20000)))\n")
    command = [sys.executable, "-m", "fedfew", "list", "algorithms", "--plugin", str(plugin)]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 50  # the daemon thread's 60 s sleep did not hold the exit
    assert done.stdout.splitlines()[19999] == "line 19999" and "fl-maml" in done.stdout
    assert (tmp_path / "handler-ran").read_text() == "yes"
    (tmp_path / "with-thread").write_text("")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and (tmp_path / "thread-done").read_text() == "yes"
    bad = subprocess.run([sys.executable, "-m", "fedfew", "list", "algorithms", "no-such-algorithm"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("fedfew: ") and bad.stderr.count("\n") == 1


@pytest.mark.parametrize("daemon, quick", [(True, True), (False, False)])
def test_exit_quickly_skips_the_shutdown_unless_a_non_daemon_thread_runs(tmp_path: Path, daemon: bool,
                                                                        quick: bool) -> None:
    import subprocess
    import sys

    marker = tmp_path / "quick"
    script = (
        "import os, threading, time\n"
        "real_exit = os._exit\n"
        f"os._exit = lambda code: (open({str(marker)!r}, 'w').close(), real_exit(code))\n"
        f"threading.Thread(target=time.sleep, args=(1.0,), daemon={daemon}).start()\n"
        "from fedfew.cli.main import exit_quickly\n"
        "exit_quickly(3)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert marker.exists() == quick
