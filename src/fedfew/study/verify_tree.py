"""``fedfew study verify --old-code TREE``: the stored cells' own code, run again on this machine.

A record made on another machine (another CPU, another torch build) can be compared with a re-run here
only within its interval: two machines round the same arithmetic differently. To verify exactly
wherever the records came from, the older code itself runs here too: ``TREE`` is a checkout of it
(``git worktree add --detach TREE COMMIT``, the commit its records name), and each chosen cell is run by
that checkout's command line (``python -m fedfew run``) in a child process of this interpreter with
``TREE/src`` first on ``PYTHONPATH``: the same Python, torch, CPU and (the config's ``runtime.threads``)
threads, so the code is the only difference and every test number must be the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fedfew.study.cell import cell_record
from fedfew.study.cell_paths import existing_run
from fedfew.study.grid import Cell
from fedfew.study.run_readback import finished, read_summary, run_status
from fedfew.study.sittings import noted_sitting
from fedfew.study.store import CodeVersion, StudyRecord
from fedfew.study.study_file import Study
from fedfew.study.study_sections import StudyError

#: Asks a checkout for its code version. The module has moved once (``fedfew.codeversion`` before the
#: folder moves of issue 52, ``fedfew.core.codeversion`` after), so both places are tried.
_PROBE = ("import importlib\n"
          "for name in ('fedfew.core.codeversion', 'fedfew.codeversion'):\n"
          "    try:\n"
          "        module = importlib.import_module(name)\n"
          "    except ImportError:\n"
          "        continue\n"
          "    print(module.numbers_version())\n"
          "    break\n")


def _child_environment(tree: Path) -> dict[str, str]:
    """This process's environment with ``TREE/src`` first on ``PYTHONPATH`` (ahead of the installed fedfew)."""
    paths = [str(tree / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def tree_code(tree: Path) -> CodeVersion:
    """The code version of the checkout ``tree`` (its ``src/fedfew``'s number code, as it computes it)."""
    package = tree / "src" / "fedfew"
    if not (package / "__init__.py").is_file():
        raise StudyError(f"--old-code {tree}: no fedfew checkout there (no src/fedfew/__init__.py); make one with "
                         f"`git worktree add --detach {tree} COMMIT`")
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=_child_environment(tree),
                          cwd=tree)
    source = done.stdout.strip()
    if done.returncode != 0 or len(source) != 12:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise StudyError(f"--old-code {tree}: cannot read the checkout's code version ({last})")
    from fedfew.study.store import current_code

    try:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = head.stdout.strip() if head.returncode == 0 and head.stdout.strip() else None
    except OSError:  # no git here: the checkout's sources still identify it
        commit = None
    return CodeVersion(current_code().package, source, commit)


def check_tree(tree: Path, code: CodeVersion, wanted: CodeVersion, equal: set[str]) -> None:
    """Refuse a checkout whose code is neither the records' (``wanted``) nor verified to give their numbers
    (``equal``: package+source keys), naming the commit to check out."""
    if code.source == wanted.source or code.key in equal:
        return
    commit = f" {wanted.commit[:10]}" if wanted.commit else ""
    raise StudyError(f"--old-code {tree}: its sources are {code.source}, not those of the records to verify "
                     f"({wanted.source}, or a version verified to give their numbers); check out their commit: "
                     f"`git worktree add --detach DIR{commit or ' COMMIT'}`")


def tree_record(study: Study, budget: str, cell: Cell, stored: StudyRecord, tree: Path, code: CodeVersion,
                runs_base: Path) -> StudyRecord:
    """The cell run by the checkout ``tree`` (of ``code``) here, as a record (not stored: the evidence
    beside this code's re-run). It runs the config of the cell's ``stored`` record, as the older code
    wrote it (this code's resolved config may hold keys added since, which the older code would refuse;
    the two hash alike, :func:`fedfew.study.grid.dump_hash`). Its run folder is under
    ``RUNS/STUDY/older-code/``; a finished one of the same code is read back rather than run again. The
    sitting is noted in this process, whose interpreter, libraries and machine the child shares, so the
    record's environment is this machine's."""
    import yaml

    folder = runs_base / study.name / "older-code" / f"{cell.config_hash}-{code.source}"
    previous = existing_run(folder)
    if previous is None or not finished(previous) or run_status(previous).get("code") != code.source:
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "config.yaml"
        config.write_text(yaml.safe_dump(stored["config"], sort_keys=False))
        command = [sys.executable, "-m", "fedfew", "run", str(config), "--out", str(folder), "--quiet"]
        with noted_sitting(folder, cell.config, fresh=True):
            done = subprocess.run(command, capture_output=True, text=True, env=_child_environment(tree), cwd=tree)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise StudyError(f"{cell.title}: the older code ({tree}) failed to run it (exit {done.returncode}): {last}")
        previous = existing_run(folder)
    if previous is None or not finished(previous):
        raise StudyError(f"{cell.title}: the older code ({tree}) left no finished run in {folder}")
    if run_status(previous).get("code") != code.source:
        raise StudyError(f"{cell.title}: the run in {previous} is not of sources {code.source} (its status.json says "
                         f"{run_status(previous).get('code')}); was {tree} changed while verify ran?")
    return cell_record(study, budget, cell, code, read_summary(previous), previous, 0.0)
