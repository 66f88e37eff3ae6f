"""README's promises checked against the code: every `fedfew ...` line of the command blocks of README
and of the site pages that took over its sections (start, running, library, data, developing) parses
(and the cheap ones run, shortened), every row of the data table names the folder its loader reads,
and the demo section matches the demo's settings. README keeps its first screen; every command it
had before the site is in those pages (``test_no_command_of_the_old_readme_is_lost``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from fedfew.cli.demo import DEMO_RUNS, showcase_config_path
from fedfew.cli.main import build_parser, main
from fedfew.data import load_dataset
from fedfew.data.dataset import DataError

REPO = Path(__file__).resolve().parents[2]
#: README and the pages its sections moved to (the site's Start and Reference pages), in that order.
README_PAGES = ["README.md", "docs/index.md", "docs/running.md", "docs/library.md", "docs/data.md",
                "docs/developing.md"]
README = "\n".join((REPO / page).read_text() for page in README_PAGES)

#: Appended to every README command that trains, so the test stays quick (the README's own values
#: are what a user runs).
SHORT = ["--quiet", "--set", "federation.rounds=1", "--set", "episodes.test_episodes=5",
         "--set", "episodes.val_episodes=5", "--set", "runtime.threads=1"]


def readme_commands() -> list[list[str]]:
    """Every `fedfew ...` command in the bash blocks of README and its pages, as argv (comments dropped)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "fedfew":
                commands.append(words[1:])
    return commands


def test_readme_has_commands_for_every_subcommand_a_newcomer_needs() -> None:
    used = {argv[0] for argv in readme_commands()}
    assert {"run", "sweep", "list", "resume", "evaluate"} <= used


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda argv: " ".join(argv)[:60])
def test_readme_command_parses(argv: list[str]) -> None:
    build_parser().parse_args(argv)  # argparse exits (a failure here) on anything it does not take


def test_no_command_of_the_old_readme_is_lost() -> None:
    """Every command line README's bash blocks had before its sections moved to the site is still in a
    bash block of README or of those pages (tests/readme_commands_before_site.txt lists them)."""
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", README, flags=re.S))
    before = [line for line in (REPO / "tests" / "readme_commands_before_site.txt").read_text().splitlines()
              if line and not line.startswith("# ")]
    assert len(before) == 36
    lost = [line for line in before if line not in blocks]
    assert not lost, lost


def test_readme_first_screen_says_what_fedfew_is() -> None:
    """README's first 30 lines: what fedfew is for, what it found (the benchmark's summary block, written
    from the store), the two commands and the way to the site."""
    first = (REPO / "README.md").read_text().splitlines()[:30]
    text = "\n".join(first)
    assert "<!-- study:benchmark-fewshot:summary begin -->" in first
    summary = first[first.index("<!-- study:benchmark-fewshot:summary begin -->") + 1]
    assert summary.startswith("Cross-paper benchmark") and "best (the highest mean over seeds)" in summary
    assert "make demo" in text and "make test" in text and "make docs" in text and "docs/index.md" in text


def test_readme_says_how_to_put_fedfew_on_the_path() -> None:
    assert ". .venv/bin/activate" in README and ".venv/bin/fedfew" in README


@pytest.fixture
def repo_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder that sees the repository's src/ and configs/ as README's commands expect,
    with the outputs (runs/) kept out of the repository."""
    for name in ("src", "configs"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def cheap(argv: list[str]) -> bool:
    """Commands that need no data folder and no optional extra: list, and runs of the bundled configs
    (not those of configs/, which read real data, nor the own-data example, which reads your images)."""
    if argv[0] == "list":
        return True
    configs = [a for a in argv[1:] if a.endswith(".yaml")]
    bundled = bool(configs) and all(a.startswith("src/fedfew/configs/") for a in configs)
    return argv[0] in ("run", "sweep") and bundled and not any("engine=flower" in a for a in argv)


def test_readme_commands_run(repo_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The cheap commands, as written but shortened (one round, a few tasks), from a fresh folder."""
    ran = 0
    for argv in readme_commands():
        if not cheap(argv):
            continue
        extra = SHORT if argv[0] in ("run", "sweep") else []
        assert main(argv + extra) == 0, argv
        ran += 1
    assert ran >= 4
    runs = sorted(p.name for p in (repo_cwd / "runs").iterdir())
    assert any(name.startswith("demo-") for name in runs) and "clients" in runs


def test_resume_and_evaluate_paths_are_where_the_demo_writes() -> None:
    """README's resume/evaluate folder has the shape the demo's run folders have."""
    from fedfew.cli.main import build_parser as parser

    demo_out = parser().parse_args(["demo"]).out
    for argv in readme_commands():
        if argv[0] in ("resume", "evaluate"):
            assert re.fullmatch(rf"{re.escape(demo_out)}/runs/demo-({'|'.join(map(re.escape, DEMO_RUNS))})"
                                r"-\d{8}-\d{6}", argv[1]), argv[1]


# -- the data table --------------------------------------------------------------------------------
def data_table_rows() -> list[tuple[list[str], list[str]]]:
    start = README.index("| dataset | expected under the data folder |")
    rows = []
    for line in README[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        names_cell, where_cell = line.split("|")[1:3]
        names = re.findall(r"`([^`]+)`", names_cell)
        folders = [path.split("/")[0] for path in re.findall(r"`([^`]+)`", where_cell) if "/" in path]
        rows.append((names, folders))
    return rows


@pytest.mark.parametrize("names,folders", data_table_rows(), ids=lambda v: ",".join(v) if isinstance(v, list) else v)
def test_data_table_row_names_the_folder_its_loader_reads(names: list[str], folders: list[str],
                                                          tmp_path: Path) -> None:
    assert folders, names
    for name in names:
        with pytest.raises(DataError) as caught:
            load_dataset(name, tmp_path)  # an empty data folder: the error names what it looked for
        message = str(caught.value)
        assert any(f"{tmp_path / folder}" in message for folder in folders), (name, folders, message)


# -- the demo --------------------------------------------------------------------------------------
def test_readme_demo_section_matches_the_demo_settings() -> None:
    config = yaml.safe_load(showcase_config_path().read_text())
    section = README[README.index("### The demo"):README.index("# Running experiments")]
    text = " ".join(section.split())
    clients = int(re.search(r"(\d+) clients hold", text).group(1))
    characters = int(re.search(r"hold (\d+) characters each", text).group(1))
    assert clients == config["partition"]["num_clients"] == config["federation"]["clients_per_round"]
    assert characters == config["partition"]["options"]["shards_per_client"]
    assert int(re.search(r"selected on (\d+) validation tasks", text).group(1)) == config["episodes"]["val_episodes"]
    assert int(re.search(r"the (\d+) fixed test tasks", text).group(1)) == config["episodes"]["test_episodes"]
    assert f"{config['episodes']['n_way']}-way {config['episodes']['k_shot']}-shot" in text
    assert f"{config['federation']['rounds']} rounds" in text
    # The table README shows is the one the demo prints: one row per demo run, in its order.
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")][1:]
    assert rows == list(DEMO_RUNS)
