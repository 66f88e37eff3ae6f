"""The ``fedfew`` command: ``run``, ``sweep``, ``resume``, ``evaluate``, ``list``, ``demo``, ``study``
(fedfew.cli.study) and the Flower helpers.

Conventions: warnings and notes go through :mod:`logging` (one logger per module, under ``fedfew``);
:func:`main` installs the one handler that prints them to stderr as ``fedfew: warning: ...``
(``--quiet``: warnings only; ``-v``: debug too), and a study command's progress lines (logger
``fedfew.study``) as they are. Exit codes come from the exception's class
(:mod:`fedfew.core.errors`): 2 for usage and config errors, 1 for a run that failed, 130 for an interrupt.
An unexpected exception prints one line and where its traceback was written (the run folder's
``error.log``, else a temporary file); ``--traceback`` prints it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, cast

from fedfew.config.plugins import command_line_plugins
from fedfew.config.validation import ExperimentConfig, load_config
from fedfew.core.allocator import keep_large_blocks
from fedfew.core.codeversion import package_version
from fedfew.core.errors import ConfigError, FedfewError, RunInterrupted, UsageError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from fedfew.interface.algorithm import Algorithm

logger = logging.getLogger(__name__)


def _report(summary: Mapping[str, Any]) -> None:
    from fedfew.run.results import format_accuracy, privacy_budget

    budget = privacy_budget(summary)  # a private run's (ε, δ)
    print(f"{summary['name']}: test accuracy {format_accuracy(summary['test'])} % (round "
          f"{summary['selected_round']}/{summary['rounds']}){f' ({budget})' if budget else ''} -> {summary['folder']}")


def _cmd_run(args: argparse.Namespace) -> int:
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


def _cmd_sweep(args: argparse.Namespace) -> int:
    from fedfew.run.results import markdown_table
    from fedfew.run.sweep import parse_grid, sweep

    summaries = sweep(args.config, parse_grid(args.grid), args.set, args.out, progress=not args.quiet)
    print(markdown_table(summaries, label_key="label"))
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    from fedfew.run.runner import resume_run

    _report(resume_run(args.run_dir, args.set, progress=not args.quiet, allow_other_version=args.allow_other_version))
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from fedfew.run.rescore import evaluate_run
    from fedfew.run.results import format_accuracy

    result = evaluate_run(args.run_dir, args.set)
    extra = {k: v for k, v in result["test"].items() if k not in ("accuracy", "ci95")}
    print(f"{args.run_dir}: test accuracy {format_accuracy(result['test'])} % (saved model of round "
          f"{result['round']}){' ' + json.dumps(extra) if extra else ''}")
    return 0


def _type_name(annotation: object) -> str:
    """An option's type as a config writer reads it: ``adam | sgd``, ``int | None``, ``list[str]``."""
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _options_lines(model: type[BaseModel], indent: str, prefix: str = "") -> list[str]:
    """One entry per option of the pydantic ``model``: ``name: type = default, bounds`` and its
    ``Field(description=...)`` wrapped beneath; nested sections (FRL's ``deployment``) follow as
    ``section.option``."""
    import shutil
    import textwrap
    import typing

    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 110))
    lines = []
    for name, field in model.model_fields.items():
        if field.default_factory is not None:
            default: object = field.default_factory()  # type: ignore[call-arg]
        else:
            default = field.default
        value = ("required" if default is PydanticUndefined
                 else f"= {default if isinstance(default, str) else json.dumps(default, default=str)}")
        bounds = [f"{symbol} {getattr(m, attr)}" for m in field.metadata
                  for attr, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "min length"))
                  if getattr(m, attr, None) is not None]
        nested = [a for a in (field.annotation, *typing.get_args(field.annotation))
                  if isinstance(a, type) and issubclass(a, BaseModel)]
        head = f"{prefix}{name}: {_type_name(field.annotation)} {value}"
        lines.append(f"{indent}{head}{', ' + ', '.join(bounds) if bounds else ''}"
                     if not nested else f"{indent}{prefix}{name}: {_type_name(field.annotation)} (a section)")
        if field.description:
            lines += textwrap.wrap(field.description, width, initial_indent=indent + "    ",
                                   subsequent_indent=indent + "    ", break_on_hyphens=False,
                                   break_long_words=False)

        for section in nested:
            lines += _options_lines(section, indent, f"{prefix}{name}.")
    return lines


def _cmd_list(args: argparse.Namespace) -> int:
    from fedfew.algorithms import register_all
    register_all()  # the built-in algorithms, registered
    from fedfew.config.engines import ENGINES
    from fedfew.core.registry import Registry
    from fedfew.data import DATASETS
    from fedfew.fewshot.partition import PARTITIONS
    from fedfew.interface.algorithm import ALGORITHMS
    from fedfew.models import MODELS

    if args.name is not None:  # one algorithm and its options (what a config's algorithm.options may set)
        if args.what != "algorithms":
            raise ConfigError(f"fedfew list {args.what} {args.name}: only algorithms have their options listed "
                              "(fedfew list algorithms NAME)")

        cls = ALGORITHMS.get(args.name)  # an unknown name: one line with the close matches, exit 2
        print(f"{args.name}: {ALGORITHMS.describe(args.name)}")
        options = _options_lines(cls.Options, "  ")
        print("algorithm.options:" if options else "algorithm.options: none")
        print("\n".join(options))
        return 0
    registries: dict[str, Registry[Any]] = {"algorithms": ALGORITHMS, "datasets": DATASETS, "engines": ENGINES, "models": MODELS,
                  "partitions": PARTITIONS}
    if args.what == "privacy":
        _list_privacy(ALGORITHMS)
        return 0
    if args.what == "secure-aggregation":
        _list_secure_aggregation(ALGORITHMS, ENGINES)
        return 0
    for kind, registry in registries.items():
        if args.what and args.what != kind:
            continue
        print(f"{kind}:")
        names = registry.names()
        width = max((len(n) for n in names), default=0)  # long names (plugins) keep the columns aligned
        for name in names:
            print(f"  {name:{width}s}  {registry.describe(name)}")
            if args.show_options and kind == "algorithms":
                for line in _options_lines(registry.get(name).Options, "      "):
                    print(line)
    return 0


class _Names(Protocol):
    """What the listings read of a registry (:class:`fedfew.core.registry.Registry`)."""

    def names(self) -> list[str]: ...

    def get(self, name: str) -> object: ...


def _list_privacy(algorithms: _Names) -> None:
    """The privacy mechanisms (config ``privacy.mechanism``) and, per algorithm, whether differential
    privacy covers its upload (docs/privacy.md)."""
    from typing import get_args

    from fedfew.config.validation import PrivacyConfig
    from fedfew.privacy.coverage import COVERED_UPLOADS, refused_because

    meaning = {"none": "off (the default)",
               "central-dp": "DP-FedAvg: clients clip their update, the server adds Gaussian noise",
               "local-dp": "each client clips and noises its own update: the server need not be trusted"}
    print("privacy mechanisms (privacy.mechanism; docs/privacy.md):")
    for name in get_args(PrivacyConfig.model_fields["mechanism"].annotation):  # the schema's, never a copy
        print(f"  {name:10s}  {meaning.get(name, 'docs/privacy.md')}")
    from fedfew.privacy.accounting import ACCOUNTING

    print("what epsilon assumes about who took part (privacy.accounting; default poisson, none in research mode "
          "and under local-dp):")
    for name, what in ACCOUNTING.items():
        print(f"  {name:19s}  {what}")
    print("noise (privacy.noise): secure (the default: OS randomness, nobody can regenerate it); seeded (research "
          "mode: reproducible, not private against anyone who holds the seed)")
    print("algorithms under privacy:")
    names = algorithms.names()
    width = max((len(n) for n in names), default=0)
    for name in names:
        kind = cast("type[Algorithm]", algorithms.get(name))
        upload = getattr(kind, "dp_upload", None)
        if isinstance(upload, str) and upload in COVERED_UPLOADS:
            shown = f"covered: {COVERED_UPLOADS[upload]}"
        elif isinstance(upload, property):  # depends on the options: covered with some, refused with others
            shown = f"depends on its options: {vars(kind).get('dp_refused') or 'docs/privacy.md says which are covered'}"
        else:
            shown = f"refused: {refused_because(kind)}"
        print(f"  {name:{width}s}  {shown}")


def _list_secure_aggregation(algorithms: _Names, engines: _Names) -> None:
    """The engines that can run ``flower.secure_aggregation`` and, per algorithm, whether it covers its
    rounds (docs/privacy.md, "Secure aggregation")."""
    able = [n for n in engines.names() if getattr(engines.get(n), "honours_secure_aggregation", False)]
    print(f"secure aggregation (flower.secure_aggregation, Flower's SecAgg+; docs/privacy.md) on: {', '.join(able)}")
    print("algorithms under secure aggregation (the server sees only the sum of a round's updates):")
    names = algorithms.names()
    width = max((len(n) for n in names), default=0)
    for name in names:
        kind = cast("type[Algorithm]", algorithms.get(name))
        covers = vars(kind).get("secure_sum")  # each class declares its own (Algorithm.secure_sum)
        if covers is None:
            shown = f"refused: {kind.secure_sum_refusal(None)}"
        else:
            shown = "covered: its aggregate is a weighted mean of the uploaded models" + (
                f"; {covers} (refused otherwise: {kind.secure_sum_refused})" if covers else "")
        print(f"  {name:{width}s}  {shown}")


def _cmd_flower_app(args: argparse.Namespace) -> int:
    try:
        from fedfew.flower.local import write_app
    except ImportError:
        raise ConfigError("the Flower app needs Flower: pip install 'fedfew[flower]'") from None
    folder = write_app(Path(args.folder))
    print(f"wrote {folder / 'pyproject.toml'}; run it with: flwr run {folder} <superlink connection> "
          "--run-config 'config-file=\"CONFIG.yaml\" run-dir=\"runs\"'")
    return 0


def _cmd_flower_certs(args: argparse.Namespace) -> int:
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


def demo_config_path() -> Path:
    """A quick config on the bundled 8x8 digits (the README's and the tests' small example)."""
    return Path(str(resources.files("fedfew") / "configs" / "demo.yaml"))


def showcase_config_path() -> Path:
    """The config ``fedfew demo`` runs: federated few-shot on the bundled Omniglot."""
    return Path(str(resources.files("fedfew") / "configs" / "omniglot-demo.yaml"))


DEMO_DATA = ("federated 5-way 1-shot on Omniglot's handwritten characters (the bundled omniglot-mini, 28x28, "
             "MIT licence): 10 clients hold 10 characters each from the 30 background alphabets; the round is "
             "selected on, and the test tasks drawn from, characters of the 20 evaluation alphabets that no "
             "client has seen")

#: label -> overrides of the demo config. Every method uses the config's rounds, clients, episodes and
#: Adam lr; "untrained" is the same network at round 0 scored the same way (prototypes on its features).
DEMO_RUNS: dict[str, list[str]] = {
    "untrained": ["algorithm.name=fl-proto", "federation.rounds=0"],
    "local": ["algorithm.name=local", "algorithm.options={learner: proto, local_steps: 5, lr: 0.001}"],
    "fl-proto": ["algorithm.name=fl-proto"],
    # FedAvg's own optimiser (McMahan et al.: SGD); with the episodic methods' Adam lr 0.001 it scored
    # 45.6% here, with SGD lr 0.05 65.3% (README, The demo).
    "fedavg": ["algorithm.name=fedavg", "algorithm.options={local_epochs: 1, batch_size: 32, lr: 0.05}"],
}


def _demo_configs(assignments: list[str], out: Path) -> dict[str, ExperimentConfig]:
    """The demo's rows with the user's ``--set``, each checked before any run. A ``--set`` that every row
    refuses is the user's error as it is; one that only some rows cannot take names those rows (they are
    the demo's, not the user's) and the way out: ``fedfew run`` of the demo's config."""
    from fedfew.run.runner import preflight

    configs: dict[str, ExperimentConfig] = {}
    refused: dict[str, UsageError] = {}
    for label, overrides in DEMO_RUNS.items():
        try:
            configs[label] = load_config(showcase_config_path(), [
                *overrides, f"name=demo-{label}", *assignments, *(["federation.rounds=0"] if label == "untrained" else [])])
            preflight(configs[label], out)
        except UsageError as err:
            refused[label] = err
    if refused and (not configs or not assignments):
        raise next(iter(refused.values()))
    if refused:
        given = " ".join(f"--set {a}" for a in assignments)
        first = next(iter(refused.values()))
        raise UsageError(f"fedfew demo: {given} cannot apply to the demo's {', '.join(map(repr, refused))} row(s), which "
                         f"the demo always runs ({', '.join(DEMO_RUNS)}): {first}; to run one method with these "
                         f"settings, use `fedfew run {showcase_config_path()} --set algorithm.name=... {given}`")
    return configs


def _cmd_demo(args: argparse.Namespace) -> int:
    from fedfew.run.experiment import dataset_cache
    from fedfew.run.runner import run_experiment
    from fedfew.run.sweep import write_comparison

    start = time.perf_counter()
    print(f"fedfew demo: {DEMO_DATA}.")
    # The control stays at round 0 whatever --set says about rounds.
    with dataset_cache():
        configs = _demo_configs(args.set, Path(args.out) / "runs")
        summaries = []
        for label, config in configs.items():
            summaries.append(run_experiment(config, Path(args.out) / "runs", progress=not args.quiet, label=label))
    table = write_comparison(summaries, Path(args.out), "fedfew demo")
    print()
    print(table)
    print(f"chance is 20%. {len(summaries)} runs in {time.perf_counter() - start:.0f} s; "
          f"results in {args.out}/results.md, run folders in {args.out}/runs/")
    return 0


def plugin_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", action="append", default=[], metavar="FILE.py",
                   help="import a Python file that registers datasets, models or algorithms first (repeatable)")


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
    logging.getLogger("fedfew").warning("%s", message)  # warnings.warn from fedfew: one line each


#: Loggers whose INFO records are a command's progress lines, printed as they are (``[3/12] cell: ...``),
#: not as notes: ``fedfew.study`` (`fedfew study run` and `verify`; its child loggers' records are notes).
PROGRESS_LOGGERS = frozenset({"fedfew.study"})


class _OneLine(logging.Formatter):
    """``fedfew: warning: ...`` (``fedfew: ...`` for notes), one line per record; progress lines bare."""

    def format(self, record: logging.LogRecord) -> str:
        if record.name in PROGRESS_LOGGERS and record.levelno == logging.INFO:
            return record.getMessage()
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"fedfew: {level}{record.getMessage()}"


@contextlib.contextmanager
def logging_to_stderr(level: int) -> Iterator[None]:
    """Print fedfew's log records at ``level`` and above on stderr (through tqdm, so a progress bar
    survives them) while the command runs."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    package = logging.getLogger("fedfew")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    previous = (package.level, package.propagate)
    package.addHandler(handler)
    package.setLevel(level)
    package.propagate = False
    try:
        with logging_redirect_tqdm([package]):
            for redirected in package.handlers:
                redirected.setFormatter(_OneLine())
            yield
    finally:
        package.removeHandler(handler)
        package.setLevel(previous[0])
        package.propagate = previous[1]


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
    run.set_defaults(func=_cmd_run)

    sw = sub.add_parser("sweep", help="run a config over a grid of values")
    sw.add_argument("config", help="the YAML config every grid point starts from")
    sw.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2",
                    help="a key and its values, e.g. --grid partition.num_clients=1,2,5 (repeatable)")
    sw.add_argument("--out", required=True, help="folder for the sweep's runs, table and plot")
    common(sw)
    sw.set_defaults(func=_cmd_sweep)

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

    ls.set_defaults(func=_cmd_list)

    rs = sub.add_parser("resume", help="continue an interrupted or killed run from its last checkpoint")
    rs.add_argument("run_dir", help="the run's folder")
    rs.add_argument("--allow-other-version", action="store_true",
                    help="continue a run written by another fedfew version or other number code (refused "
                         "otherwise: its rounds would mix two versions; the summary records both)")
    common(rs, "override a runtime.* value only (the run's config is fixed), e.g. --set runtime.workers=2 "
               "(repeatable)")
    rs.set_defaults(func=_cmd_resume)

    ev = sub.add_parser("evaluate", help="re-score a finished run's saved model(s) without training")
    ev.add_argument("run_dir", help="the run's folder")
    common(ev, "change how the model is scored (episodes.*, eval.*, runtime.*, classification.test_fraction, "
               "algorithm.options.test_*), e.g. --set episodes.test_episodes=2000 (repeatable)")
    ev.set_defaults(func=_cmd_evaluate)

    fa = sub.add_parser("flower-app", help="write fedfew's Flower app project (for `flwr run DIR ...`)")
    fa.add_argument("folder", help="where to write pyproject.toml")
    fa.set_defaults(func=_cmd_flower_app)

    fc = sub.add_parser("flower-certs", help="make TLS certificates and SuperNode keys for a Flower deployment")
    fc.add_argument("folder", help="where to write ca.pem, server.pem, server.key and node-K / node-K.pub")
    fc.add_argument("--host", action="append", required=True,
                    help="a name or address the SuperNodes dial the SuperLink by (repeatable)")
    fc.add_argument("--nodes", type=int, default=0, help="how many SuperNode key pairs to make")
    fc.set_defaults(func=_cmd_flower_certs)

    dm = sub.add_parser("demo", help="the main job: untrained vs local vs federated few-shot on bundled Omniglot",
                        description=f"The demo: {DEMO_DATA}. It runs {', '.join(DEMO_RUNS)} with the settings of "
                                    "src/fedfew/configs/omniglot-demo.yaml and prints one table (no data folder "
                                    "needed).")
    dm.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    common(dm)
    dm.set_defaults(func=_cmd_demo)

    from fedfew.cli.study import add_parser as add_study_parser

    add_study_parser(sub, plugin_option)
    return parser


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a run as Ctrl-C does: checkpointed, resumable


def _traceback_file(err: BaseException) -> Path:
    """Where the traceback of an unexpected error goes: the run folder's ``error.log`` when the run
    wrote one (it holds this traceback), else a new temporary file."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    folder = getattr(err, "run_folder", None)
    if folder is not None and (Path(folder) / "error.log").is_file():
        return Path(folder) / "error.log"
    with tempfile.NamedTemporaryFile("w", prefix="fedfew-error-", suffix=".log", delete=False) as f:
        f.write(text)
    return Path(f.name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_large_blocks()  # before the first tensor: a run's large activations are reused, not re-mapped
    level = logging.DEBUG if args.verbose else logging.WARNING if getattr(args, "quiet", False) else logging.INFO
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread (a test calling main from a thread)
        previous = None
    try:
        with logging_to_stderr(level), warnings.catch_warnings():
            warnings.showwarning = _show_warning  # one line each, as errors are
            try:
                with command_line_plugins(getattr(args, "plugin", [])):
                    code = int(args.func(args))
                sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
                return code
            except BrokenPipeError:
                # The reader stopped reading (`fedfew list | head -1`): what it read is what it wanted.
                # stdout goes to /dev/null so that the interpreter's own flush at exit stays quiet.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 0
            except RunInterrupted as err:
                print(f"fedfew: {err}", file=sys.stderr)
                return err.exit_code
            except KeyboardInterrupt:
                print("fedfew: interrupted before any round finished", file=sys.stderr)
                return 130
            except FedfewError as err:
                kind = "error" if err.exit_code == 2 else "run failed"
                message = _one_line(err)
                print(f"fedfew: {message if message.startswith(kind) else kind + ': ' + message}", file=sys.stderr)
                return err.exit_code
            except Exception as err:  # a bug, or a failure fedfew did not foresee: keep the traceback
                where = _traceback_file(err)
                print(f"fedfew: unexpected {type(err).__name__}: {_one_line(err)} (traceback in {where})",
                      file=sys.stderr)
                if args.traceback:
                    traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
                return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run_command() -> NoReturn:
    """The ``fedfew`` command (and ``python -m fedfew``): :func:`main` on ``sys.argv``, then
    :func:`exit_quickly` with its exit code."""
    exit_quickly(main())


def exit_quickly(code: int) -> NoReturn:
    """End the process with ``code`` once the exit handlers have run, without Python's own shutdown.

    That shutdown (every module torn down, every object collected: torch's are many) costs a run about
    half a second after its results are written (docs/performance.md, "exit"), and frees only memory
    the process is about to give back. The exit handlers still run: logging's flush, weakref
    finalizers (temporary folders), multiprocessing's joins of its children, Ray's shutdown. A
    non-daemon thread still running (a tracker's writer, say) keeps the ordinary exit, which waits for
    it."""
    main_thread = threading.main_thread()
    if any(thread is not main_thread and not thread.daemon for thread in threading.enumerate()):
        sys.exit(code)  # the ordinary exit waits for it (daemon threads, such as tqdm's monitor, it does not)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing left to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run_command()
