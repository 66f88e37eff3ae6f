"""The handlers of ``fedfew run``, ``sweep``, ``resume``, ``evaluate``, ``flower-app`` and ``flower-certs``:
each takes the parsed arguments, does the work through the layers below and prints what it made;
its return value is the exit code."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedfew.config.validation import load_config
from fedfew.core.errors import ConfigError


def _report(summary: Mapping[str, Any]) -> None:
    from fedfew.run.results import format_accuracy, privacy_budget

    budget = privacy_budget(summary)  # a private run's (ε, δ)
    print(f"{summary['name']}: test accuracy {format_accuracy(summary['test'])} % (round "
          f"{summary['selected_round']}/{summary['rounds']}){f' ({budget})' if budget else ''} -> {summary['folder']}")


def cmd_run(args: argparse.Namespace) -> int:
    from fedfew.run.experiment import dataset_cache
    from fedfew.run.folder import check_output_base
    from fedfew.run.runner import run_experiment, validate_all
    from fedfew.run.sweep import write_comparison

    configs = [load_config(path, args.set) for path in args.configs]  # every config, before any work
    table = None
    if len(configs) > 1 or args.table:
        table = Path(args.table or Path(args.out or "runs") / "comparison")
        check_output_base(table, "--table" if args.table else "--out")
    with dataset_cache():
        validate_all(configs, args.out)
        summaries = []
        for config in configs:
            summary = run_experiment(config, args.out, progress=not args.quiet)
            _report(summary)
            summaries.append(summary)
    if table is not None:
        print(write_comparison(summaries, table, "comparison"))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedfew.run.results import markdown_table
    from fedfew.run.sweep import parse_grid, sweep

    summaries = sweep(args.config, parse_grid(args.grid), args.set, args.out, progress=not args.quiet)
    print(markdown_table(summaries, label_key="label"))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from fedfew.run.runner import resume_run

    _report(resume_run(args.run_dir, args.set, progress=not args.quiet, allow_other_version=args.allow_other_version))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from fedfew.run.rescore import evaluate_run
    from fedfew.run.results import format_accuracy

    result = evaluate_run(args.run_dir, args.set)
    extra = {k: v for k, v in result["test"].items() if k not in ("accuracy", "ci95")}
    print(f"{args.run_dir}: test accuracy {format_accuracy(result['test'])} % (saved model of round "
          f"{result['round']}){' ' + json.dumps(extra) if extra else ''}")
    return 0


def cmd_flower_app(args: argparse.Namespace) -> int:
    try:
        from fedfew.flower.local import write_app
    except ImportError:
        raise ConfigError("the Flower app needs Flower: pip install 'fedfew[flower]'") from None
    folder = write_app(Path(args.folder))
    print(f"wrote {folder / 'pyproject.toml'}; run it with: flwr run {folder} <superlink connection> "
          "--run-config 'config-file=\"CONFIG.yaml\" run-dir=\"runs\"'")
    return 0


def cmd_flower_certs(args: argparse.Namespace) -> int:
    try:
        from fedfew.flower.security import make_node_keys, make_tls
    except ImportError:
        raise ConfigError("making certificates needs cryptography: pip install 'fedfew[flower]'") from None
    folder = Path(args.folder)
    paths = make_tls(folder, args.host)
    keys = make_node_keys(folder, args.nodes)
    print(f"wrote {paths['ca']}, {paths['cert']}, {paths['key']}" + (f" and {len(keys)} SuperNode key pairs "
          f"({keys[0][0].name} ... {keys[-1][1].name})" if keys else ""))
    return 0
