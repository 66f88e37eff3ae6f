"""The fixed cost of one ``fedfew run``, phase by phase (issue 42, item 1).

    python benchmarks/bench_fixed_cost.py [CONFIG] [--set key=value ...] [--repeat N] [--json FILE] [--src DIR]
    python benchmarks/bench_fixed_cost.py --table LABEL=FILE,FILE,... [--table LABEL=...]   # the docs' table

Runs CONFIG (default ``benchmarks/peers.yaml``) in a child process, as ``fedfew run`` would (the same
``run_experiment``, into a temporary output folder), and times each phase from outside the code that
does it (wrappers installed by the child before the run; nothing in fedfew is changed):

    interpreter   process start until the child's first line (Python start-up, site)
    imports       ``import fedfew.cli.main, fedfew.run.runner`` (torch, pydantic, numpy, ...)
    config        load_config and the run folder
    data          build_experiment: dataset, partition, clients, test tasks, algorithm
    workers       Experiment.simulator: the model, the client states, the engine (worker processes)
    round 0       Simulator.score_initial (the initial model on validation, else test)
    rounds        the federated rounds, with their own validation
    final test    Simulator.finish (the selected round on the test tasks)
    model         RunFolder.save_model
    summary       summarise, participation
    results.md    the table
    plot          accuracy.png (matplotlib)
    close         the engine closed (worker processes stopped), summary.json, the rest of the run
    exit          the child's last line until the process is gone (exit handlers; the interpreter's
                  shutdown too where the sources predate ``fedfew.cli.main.exit_quickly``)

Prints one line per phase with its seconds and share of the whole, and the load average before and
after. Seconds on a busy machine mean little; the shares within one run say where the fixed cost is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PHASES = ["interpreter", "imports", "config", "data", "workers", "round 0", "rounds", "final test", "model",
          "summary", "results.md", "plot", "close", "exit"]


def child(config_path: str, overrides: list[str], out: str) -> None:
    marks: dict[str, float] = {"start": time.time()}
    import fedfew.cli.main  # noqa: F401  (what `fedfew run` imports before it parses)
    import fedfew.run.runner as runner
    from fedfew.config.validation import load_config
    from fedfew.engine.simulator import Simulator
    from fedfew.run.experiment import Experiment
    from fedfew.run.folder import RunFolder

    marks["imported"] = time.time()
    spent: dict[str, float] = {}

    def timed(owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                spent[phase] = spent.get(phase, 0.0) + time.time() - t0

        setattr(owner, name, wrapper)

    timed(runner, "build_experiment", "data")
    timed(Experiment, "simulator", "workers")
    timed(Simulator, "score_initial", "round 0")
    timed(Simulator, "finish", "final test")
    timed(Simulator, "run", "run")
    timed(RunFolder, "save_model", "model")
    timed(runner, "summarise", "summary")
    timed(runner, "participation", "summary")
    timed(runner, "markdown_table", "results.md")
    timed(runner, "plot_curves", "plot")
    timed(runner, "_train", "train")

    config = load_config(config_path, overrides)
    t0 = time.time()
    summary = runner.run_experiment(config, out_base=out, progress=False)
    marks["done"] = time.time()
    train = spent.pop("train")
    inside = sum(spent.get(k, 0.0) for k in ("data", "workers", "run", "model", "summary", "results.md", "plot"))
    spent["close"] = train - inside  # the engine closed, summary.json, the run folder's status
    spent["config"] = (t0 - marks["imported"]) + (marks["done"] - t0 - train)
    spent["rounds"] = spent.pop("run") - spent.get("round 0", 0.0) - spent.get("final test", 0.0)
    print("PHASES " + json.dumps({"marks": marks, "spent": spent, "initial_scored": "initial_score" in summary,
                                  "test_accuracy": summary["test"].get("accuracy"),
                                  "round_seconds": [row.get("seconds") for row in summary["history"]]}), flush=True)
    marks_end = time.time()
    print("LAST " + repr(marks_end), flush=True)
    try:  # end as the `fedfew` command does
        from fedfew.cli.main import exit_quickly
    except ImportError:  # sources from before it (--src): the ordinary exit
        return
    exit_quickly(0)


def one(args: argparse.Namespace) -> dict[str, Any]:
    out = tempfile.mkdtemp(prefix="fedfew-fixed-cost-")
    command = [sys.executable, str(Path(__file__).resolve()), "--child", args.config, "--out", out]
    for override in args.set:
        command += ["--set", override]
    src = Path(args.src).resolve() if args.src else REPO / "src"  # another checkout's fedfew: a before/after
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    load = os.getloadavg()[0]
    t0 = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    t_end = time.time()
    if done.returncode:
        sys.exit(f"the run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("PHASES "))
    last = float(next(line for line in done.stdout.splitlines() if line.startswith("LAST "))[5:])
    record = json.loads(line[7:])
    marks, spent = record["marks"], record["spent"]
    phases = {"interpreter": marks["start"] - t0, "imports": marks["imported"] - marks["start"],
              **{k: spent.get(k, 0.0) for k in PHASES if k in spent}, "exit": t_end - last}
    return {"phases": {k: phases.get(k, 0.0) for k in PHASES}, "total": t_end - t0, "load_before": load,
            "load_after": os.getloadavg()[0], "initial_scored": record["initial_scored"],
            "test_accuracy": record["test_accuracy"], "round_seconds": record["round_seconds"]}


def table(columns: list[str]) -> str:
    """The markdown table docs/performance.md shows: per phase, each column's median seconds over its
    JSON files' runs (min-max) and the median's share of the median whole process."""
    runs_of: dict[str, list[dict[str, Any]]] = {}
    for column in columns:
        label, _, files = column.partition("=")
        if not files:
            sys.exit(f"--table {column!r}: expected LABEL=FILE,FILE,...")
        runs_of[label] = [run for name in files.split(",") for run in json.loads(Path(name).read_text())["runs"]]

    def cell(values: list[float], whole: float) -> str:
        middle = statistics.median(values)
        return f"{middle:.2f} ({min(values):.2f}-{max(values):.2f}), {100 * middle / whole:.1f}%"

    wholes = {label: statistics.median(run["total"] for run in runs) for label, runs in runs_of.items()}

    def row(name: str, seconds_of: Callable[[dict[str, Any]], float]) -> str:
        return f"| {name} | " + " | ".join(cell([seconds_of(run) for run in runs], wholes[label])
                                          for label, runs in runs_of.items()) + " |"

    def middle_round(run: dict[str, Any]) -> float:
        ends = run["round_seconds"]  # each round's end, cumulative
        return statistics.median(b - a for a, b in zip(ends[:-2], ends[1:-1]))

    lines = ["| phase | " + " | ".join(f"{label} ({len(runs)} runs)" for label, runs in runs_of.items()) + " |",
             "|---" * (len(runs_of) + 1) + "|"]
    for phase in PHASES:
        lines.append(row(phase, lambda run, phase=phase: run["phases"][phase]))
        if phase == "rounds":  # round 1 carries each process's warm-up; the last round, the test
            lines.append(row("of which round 1", lambda run: run["round_seconds"][0]))
            lines.append(row("of which a middle round (median of rounds 2 to n-1)", middle_round))
    lines.append("| **whole process** | " + " | ".join(
        f"{wholes[label]:.2f} ({min(r['total'] for r in runs):.2f}-{max(r['total'] for r in runs):.2f})"
        for label, runs in runs_of.items()) + " |")
    loads = [load for runs in runs_of.values() for run in runs for load in (run["load_before"], run["load_after"])]
    lines.append(f"\nLoad average before and after the runs: {min(loads):.2f}-{max(loads):.2f}.")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", default=str(REPO / "benchmarks" / "peers.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--src", default=None, help="the fedfew source folder to run (default: this checkout's src)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--table", action="append", default=[], metavar="LABEL=FILE,FILE",
                        help="print the phase table of these --json files (one column per --table) and stop")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.config, args.set, args.out)
        return 0
    if args.table:
        print(table(args.table))
        return 0
    os.environ.setdefault("FEDFEW_DATA", str(REPO.parent / "shared" / "data"))
    runs = []
    for i in range(args.repeat):
        run = one(args)
        runs.append(run)
        print(f"run {i + 1}: {run['total']:.2f} s, load average {run['load_before']:.2f} -> {run['load_after']:.2f}, "
              f"round 0 scored: {run['initial_scored']}, test accuracy {run['test_accuracy']}, "
              f"seconds at the end of each round {[round(x, 2) for x in run['round_seconds']]}")
        for phase, seconds in run["phases"].items():
            print(f"  {phase:<12} {seconds:7.2f} s  {100 * seconds / run['total']:5.1f}%")
    if args.json:
        args.json.write_text(json.dumps({"config": args.config, "set": args.set, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
