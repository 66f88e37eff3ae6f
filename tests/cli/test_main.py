"""The ``fedfew`` command's entry point (fedfew.cli.main): exit codes (a bad config is exit 2 in one
line, a bug exit 1 with its traceback in a file), the exit after the exit handlers, a closed stdout
pipe, and --version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedfew.cli.main import demo_config_path, main
from tests.tiny import tiny_config


def test_bad_config_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(demo_config_path()), "--set", "federation.roudns=2", "--quiet", "--out", str(tmp_path)])
    assert code == 2
    assert "federation.roudns" in capsys.readouterr().err


def test_impossible_episode_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(demo_config_path()), "--set", "episodes.k_shot=500", "--quiet", "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err  # read once: a second readouterr() would see ""
    assert "k_shot" in err and len(err.strip().splitlines()) == 1


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


# -- a closed pipe -------------------------------------------------------------------------------------
def test_a_closed_stdout_pipe_exits_quietly() -> None:
    process = subprocess.Popen([sys.executable, "-m", "fedfew.cli.main", "list"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None and process.stderr is not None
    process.stdout.readline()
    process.stdout.close()  # `| head -1`
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0 and err == "", err


# -- exit codes and tracebacks ------------------------------------------------------------------------------
BROKEN = '''
from fedfew.data import DATASETS


@DATASETS.register("broken-{kind}", help="a loader with a bug")
def load(root, **options):
    raise {kind}("a bug in a loader")
'''


@pytest.mark.parametrize("kind", ["ValueError", "ZeroDivisionError"])
def test_a_bug_is_exit_1_with_one_line_and_the_traceback_in_a_file(kind: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A ValueError from a bug is not a usage error: exit 1, one line naming the file that holds the
    traceback; --traceback prints it as well."""
    plugin = tmp_path / f"broken_{kind}.py"
    plugin.write_text(BROKEN.format(kind=kind))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_config("fl-proto", dataset={"name": f"broken-{kind}"})))
    args = ["run", str(config), "--out", str(tmp_path / "out"), "--quiet", "--plugin", str(plugin)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"unexpected {kind}: a bug in a loader (traceback in " in err
    saved = Path(err.strip().rsplit("traceback in ", 1)[1].rstrip(")"))
    assert "Traceback" in saved.read_text() and "a bug in a loader" in saved.read_text()
    saved.unlink()
    assert main(["--traceback", *args]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and f"{kind}: a bug in a loader" in err
    Path(err.split("traceback in ", 1)[1].split(")", 1)[0]).unlink()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import fedfew

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"fedfew {fedfew.__version__}"
