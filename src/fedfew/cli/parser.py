"""The ``fedfew`` command's argument parser: its options and subcommands, each with the handler it runs
(``fedfew study``'s are :mod:`fedfew.cli.study`'s)."""

from __future__ import annotations

import argparse

from fedfew.cli.commands import cmd_evaluate, cmd_flower_app, cmd_flower_certs, cmd_resume, cmd_run, cmd_sweep
from fedfew.cli.demo import DEMO_DATA, DEMO_RUNS, cmd_demo
from fedfew.cli.listing import cmd_list
from fedfew.core.codeversion import package_version


def plugin_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", action="append", default=[], metavar="FILE.py",
                   help="import a Python file that registers datasets, models or algorithms first (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedfew", description="Federated learning when data or rounds are few.")
    parser.add_argument("--version", action="version", version=f"fedfew {package_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="also print debug messages")
    parser.add_argument("--traceback", action="store_true",
                        help="print the full traceback of an unexpected error (it is always written to a file)")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, example: str = "override a config value, e.g. --set "
               "federation.rounds=50 (repeatable)") -> None:
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=example)
        p.add_argument("--quiet", action="store_true", help="no progress bar and no notes (warnings still)")
        plugin_option(p)

    run = sub.add_parser("run", help="run one or more experiment configs")
    run.add_argument("configs", nargs="+", help="YAML config file(s)")
    run.add_argument("--out", default=None, help="base folder for run folders (default: runtime.output_dir)")
    run.add_argument("--table", default=None, help="also write a combined results table to this folder")
    common(run)
    run.set_defaults(func=cmd_run)

    sw = sub.add_parser("sweep", help="run a config over a grid of values")
    sw.add_argument("config", help="the YAML config every grid point starts from")
    sw.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2",
                    help="a key and its values, e.g. --grid partition.num_clients=1,2,5 (repeatable)")
    sw.add_argument("--out", required=True, help="folder for the sweep's runs, table and plot")
    common(sw)
    sw.set_defaults(func=cmd_sweep)

    ls = sub.add_parser("list", help="list algorithms, datasets, engines, models, partitions, privacy, "
                        "secure-aggregation",
                        description="List what a config may name. `fedfew list algorithms NAME` prints one "
                                    "algorithm's options with their types, defaults, bounds and meaning; -v "
                                    "prints them for every algorithm.")
    ls.add_argument("what", nargs="?", choices=["algorithms", "datasets", "engines", "models", "partitions", "privacy",
                                                 "secure-aggregation"])
    ls.add_argument("name", nargs="?", help="an algorithm: print its options (algorithm.options)")
    ls.add_argument("-v", "--options", dest="show_options", action="store_true",
                    help="also print every algorithm's options and what each means")
    plugin_option(ls)

    ls.set_defaults(func=cmd_list)

    rs = sub.add_parser("resume", help="continue an interrupted or killed run from its last checkpoint")
    rs.add_argument("run_dir", help="the run's folder")
    rs.add_argument("--allow-other-version", action="store_true",
                    help="continue a run written by another fedfew version or other number code (refused "
                         "otherwise: its rounds would mix two versions; the summary records both)")
    common(rs, "override a runtime.* value only (the run's config is fixed), e.g. --set runtime.workers=2 "
               "(repeatable)")
    rs.set_defaults(func=cmd_resume)

    ev = sub.add_parser("evaluate", help="re-score a finished run's saved model(s) without training")
    ev.add_argument("run_dir", help="the run's folder")
    common(ev, "change how the model is scored (episodes.*, eval.*, runtime.*, classification.test_fraction, "
               "algorithm.options.test_*), e.g. --set episodes.test_episodes=2000 (repeatable)")
    ev.set_defaults(func=cmd_evaluate)

    fa = sub.add_parser("flower-app", help="write fedfew's Flower app project (for `flwr run DIR ...`)")
    fa.add_argument("folder", help="where to write pyproject.toml")
    fa.set_defaults(func=cmd_flower_app)

    fc = sub.add_parser("flower-certs", help="make TLS certificates and SuperNode keys for a Flower deployment")
    fc.add_argument("folder", help="where to write ca.pem, server.pem, server.key and node-K / node-K.pub")
    fc.add_argument("--host", action="append", required=True,
                    help="a name or address the SuperNodes dial the SuperLink by (repeatable)")
    fc.add_argument("--nodes", type=int, default=0, help="how many SuperNode key pairs to make")
    fc.set_defaults(func=cmd_flower_certs)

    dm = sub.add_parser("demo", help="the main job: untrained vs local vs federated few-shot on bundled Omniglot",
                        description=f"The demo: {DEMO_DATA}. It runs {', '.join(DEMO_RUNS)} with the settings of "
                                    "src/fedfew/configs/omniglot-demo.yaml and prints one table (no data folder "
                                    "needed).")
    dm.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    common(dm)
    dm.set_defaults(func=cmd_demo)

    from fedfew.cli.study import add_parser as add_study_parser

    add_study_parser(sub, plugin_option)
    return parser
