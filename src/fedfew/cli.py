"""The ``fedfew`` command: ``run``, ``sweep``, ``list`` and ``demo``."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from importlib import resources
from pathlib import Path

from fedfew.config import ConfigError, load_config
from fedfew.plugins import command_line_plugins


def _cmd_run(args: argparse.Namespace) -> int:
    from fedfew.runner import run_experiment, write_comparison

    summaries = []
    for path in args.configs:
        config = load_config(path, args.set)
        summary = run_experiment(config, args.out, progress=not args.quiet)
        print(f"{config.name}: test accuracy {summary['test']} -> {summary['folder']}")
        summaries.append(summary)
    if len(summaries) > 1 or args.table:
        folder = Path(args.table or Path(args.out or "runs") / "comparison")
        print(write_comparison(summaries, folder, "comparison"))
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from fedfew.runner import parse_grid, sweep

    summaries = sweep(args.config, parse_grid(args.grid), args.set, args.out, progress=not args.quiet)
    from fedfew.results import markdown_table

    print(markdown_table(summaries, label_key="label"))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    import fedfew.algorithms  # noqa: F401
    from fedfew.data import DATASETS
    from fedfew.engine import ALGORITHMS
    from fedfew.models import MODELS
    from fedfew.partition import PARTITIONS

    registries = {"algorithms": ALGORITHMS, "datasets": DATASETS, "models": MODELS, "partitions": PARTITIONS}
    for kind, registry in registries.items():
        if args.what and args.what != kind:
            continue
        print(f"{kind}:")
        for name in registry.names():
            print(f"  {name:14s} {registry.describe(name)}")
    return 0


def demo_config_path() -> Path:
    return Path(str(resources.files("fedfew") / "configs" / "demo.yaml"))


def _cmd_demo(args: argparse.Namespace) -> int:
    from fedfew.runner import run_experiment, write_comparison

    start = time.perf_counter()
    print("fedfew demo: federated 5-way 1-shot on the bundled 8x8 digits; clients hold digits 0-4 "
          "(10 clients, Dirichlet alpha=1), meta-test on the unseen digits 5-9.")
    summaries = []
    maml = "{local_steps: 5, lr: 0.001, inner_lr: 0.1, inner_steps: 1, test_inner_steps: 5}"
    runs = {
        # local scores 10 private models per evaluation, so it is evaluated once, at the end.
        "local": [f"algorithm.options={maml}", "eval.every=1000"],
        "fl-maml": [f"algorithm.options={maml}"],
        "fl-proto": ["algorithm.options={local_steps: 5, lr: 0.001}"],
    }
    for algorithm, extra in runs.items():
        config = load_config(demo_config_path(),
                             [f"algorithm.name={algorithm}", f"name=demo-{algorithm}", *extra, *args.set])
        summaries.append(run_experiment(config, Path(args.out) / "runs", progress=not args.quiet, label=algorithm))
    table = write_comparison(summaries, Path(args.out), "fedfew demo")
    print()
    print(table)
    print(f"chance is 20%. {len(summaries)} runs in {time.perf_counter() - start:.0f} s; "
          f"results in {args.out}/results.md")
    return 0


def plugin_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", action="append", default=[], metavar="FILE.py",
                   help="import a Python file that registers datasets, models or algorithms first (repeatable)")


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
    print(f"fedfew: warning: {message}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedfew", description="Federated learning when data or rounds are few.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. --set federation.rounds=50 (repeatable)")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        plugin_option(p)

    run = sub.add_parser("run", help="run one or more experiment configs")
    run.add_argument("configs", nargs="+", help="YAML config file(s)")
    run.add_argument("--out", default=None, help="base folder for run folders (default: runtime.output_dir)")
    run.add_argument("--table", default=None, help="also write a combined results table to this folder")
    common(run)
    run.set_defaults(func=_cmd_run)

    sw = sub.add_parser("sweep", help="run a config over a grid of values")
    sw.add_argument("config")
    sw.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2",
                    help="a key and its values, e.g. --grid partition.num_clients=1,2,5 (repeatable)")
    sw.add_argument("--out", required=True, help="folder for the sweep's runs, table and plot")
    common(sw)
    sw.set_defaults(func=_cmd_sweep)

    ls = sub.add_parser("list", help="list algorithms, datasets, models and partitions")
    ls.add_argument("what", nargs="?", choices=["algorithms", "datasets", "models", "partitions"])
    plugin_option(ls)
    ls.set_defaults(func=_cmd_list)

    dm = sub.add_parser("demo", help="the main job: local vs fl-maml vs fl-proto on bundled digits")
    dm.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    common(dm)
    dm.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings(), command_line_plugins(getattr(args, "plugin", [])):
            warnings.showwarning = _show_warning  # one line each, as errors are
            return args.func(args)
    except ConfigError as err:
        print(f"fedfew: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, KeyError) as err:
        from fedfew.data import DataError
        from fedfew.registry import RegistryError

        if isinstance(err, (DataError, RegistryError, ValueError)):
            print(f"fedfew: error: {err}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
