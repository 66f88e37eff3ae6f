"""The ``fedfew study`` subcommand: ``run``, ``verify``, ``report``, ``choose``, ``status`` and ``docs`` (added to fedfew's parser by
:func:`add_parser`)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from fedfew.study.grid import parse_seeds
from fedfew.study.options import check_figure, check_folder, check_root, check_store
from fedfew.study.study_file import Study, load_study
from fedfew.study.study_sections import StudyError

if TYPE_CHECKING:
    from fedfew.study.collect import StudyResults


def _store(args: argparse.Namespace, root: Path) -> Path:
    return Path(args.store) if args.store else root / "studies" / "store"


def _checked(args: argparse.Namespace, study: Study, root: Path, write: bool) -> Path:
    """The store and the run folders' base ``--runs`` (where the command has one), checked before any
    work (:mod:`fedfew.study.options`); with ``write``, that they can be written."""
    store = _store(args, root)
    check_store(store, study.name, write)
    if getattr(args, "runs", None) is not None:
        check_folder(Path(args.runs), "--runs", write=write)
    return store


def _store_option(args: argparse.Namespace, root: Path) -> str | None:
    """``--store`` as given, for the commands a report names, when it is not the study's default store."""
    if not args.store or Path(args.store).resolve() == (root / "studies" / "store").resolve():
        return None
    return str(args.store)


def _in_repository(path: str, root: Path) -> bool:
    """Whether the study file is one of a repository's (in ``studies/`` under its root, whose docs
    `fedfew study docs` writes), as :func:`fedfew.study.study_file.load_study` decides its root."""
    return Path(path).resolve().parent != root.resolve()


def _cmd_run(args: argparse.Namespace) -> int:
    from fedfew.study.run import run_study

    study, root = load_study(args.study)
    seeds = parse_seeds(args.seeds) if args.seeds is not None else None  # --seeds "": an error, not the default
    counts = run_study(study, root, args.budget, _checked(args, study, root, write=True), Path(args.runs), seeds, args.set, args.new_code,
                       reuse=not args.no_reuse, methods=args.method)
    held = f", {counts['held']} left to other processes" if counts.get("held") else ""
    reused = f", {counts['reused']} copied from other studies' stores" if counts.get("reused") else ""
    others = f", {counts['stored_by_others']} stored by other processes" if counts.get("stored_by_others") else ""
    print(f"study {study.name}: {counts['run']} cells run, {counts['skipped']} already stored{reused}{others}{held}; "
          f"`fedfew study report {args.study} --budget {args.budget}` shows the table")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from fedfew.study.verify import verify_study

    study, root = load_study(args.study)
    done = verify_study(study, root, args.budget, _checked(args, study, root, write=True), Path(args.runs), args.per_method,
                        args.set, older_tree=Path(args.old_code) if args.old_code else None)
    print(done["verdict"])  # after the drift table verify_study printed
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from fedfew.study.collect import collect
    from fedfew.study.figures import curve_figure, curve_keys, figure
    from fedfew.study.report import markdown

    study, root = load_study(args.study)
    _checked(args, study, root, write=False)
    if args.figure:
        check_figure(args.figure, "--figure")
    if args.curve:
        check_figure(args.curve[1], f"--curve {args.curve[0]}")
    if args.budgets is not None:
        return _report_budgets(args, study, root)
    study.budget(args.budget or study.docs_budget)  # a budget that does not exist: one line, exit 2
    results = collect(study, root, _store(args, root), args.budget)
    if results.cells_found and results.cells_without_metric == results.cells_found:
        kept = sorted(results.run_records[0]["metrics"]) if results.run_records else []
        raise StudyError(f"metric {results.study.metric}: none of the {results.cells_found} stored cells of study "
                         f"{study.name} at budget {results.budget} has it (their records keep {', '.join(kept)}); "
                         "check the study's metric")
    if args.curve:  # before the report: a curve that cannot be drawn is one line, not a report and a shrug
        key, known = args.curve[0], curve_keys(results)
        where = f"study {study.name} at budget {results.budget}"
        if not known:
            raise StudyError(f"--curve {key}: no stored record of {where} keeps its evaluated rounds (none stored "
                             "yet, or round-0 runs only); nothing to draw")
        if key not in known:
            raise StudyError(f"--curve {key}: no stored record of {where} has {key!r} at its evaluated rounds; they "
                             f"have {', '.join(known)}")
    print(markdown(results, args.study, _store_option(args, root), _in_repository(args.study, root)))
    if args.figure:
        if figure(results, Path(args.figure)):
            print(f"figure: {args.figure}")
        else:
            print("no figure: nothing in the store for this budget")
    if args.intervals:
        from fedfew.study.intervals import interval_figure

        if interval_figure(results, Path(args.intervals)):
            print(f"interval figure: {args.intervals}")
        else:
            print("no interval figure: nothing in the store for this budget")
    if args.curve:
        key, target = args.curve
        if curve_figure(results, key, Path(target)):
            print(f"curves of {key}: {target}")
        else:
            print(f"no curves: no stored record of this budget keeps its evaluated rounds with {key}")
    return 0


def _report_budgets(args: argparse.Namespace, study: Study, root: Path) -> int:
    """``report --budgets a,b``: the budgets side by side (the table and each budget's verdicts)."""
    from fedfew.study.collect import collect
    from fedfew.study.report import budgets_markdown

    names = [b.strip() for b in args.budgets.split(",") if b.strip()]
    if len(names) < 2 or len(set(names)) != len(names):
        raise StudyError(f"--budgets {args.budgets!r}: give two or more distinct budgets separated by commas, "
                         f"e.g. --budgets {','.join(list(study.budgets)[:2])}")
    if args.budget or args.figure or args.curve or args.intervals:
        raise StudyError("--budgets: prints the table over budgets only; give --budget, --figure, --intervals or --curve "
                         "without it")
    for name in names:
        study.budget(name)  # one that does not exist: one line, exit 2
    damaged: dict[Path, str] = {}  # each damaged record named once, not once per budget
    print(budgets_markdown([collect(study, root, _store(args, root), name, damaged) for name in names], args.study,
                           _store_option(args, root)))
    return 0


def _cmd_choose(args: argparse.Namespace) -> int:
    from fedfew.study.choose import choice_markdown, make_choice

    study, root = load_study(args.study)
    made = make_choice(study, root, _checked(args, study, root, write=False), args.choice)
    print(choice_markdown(made, study, args.study), end="")
    return 0 if not made.missing else 1


def _cmd_status(args: argparse.Namespace) -> int:
    from fedfew.study.docs import study_files
    from fedfew.study.status import budget_status, status_text
    from fedfew.study.store import current_code

    if not args.studies:
        check_root(Path(args.root))
    paths = [Path(p) for p in args.studies] or study_files(Path(args.root))
    if not paths:
        raise StudyError(f"no study files: none given and none in {Path(args.root) / 'studies'}")
    code = current_code()
    # resolving the cells logs each override's dropped options once: `study run`'s to show, not this view's
    # (the level is put back after, so a caller in the same process, a test, still sees them)
    config_logger = logging.getLogger("fedfew.config.validation")
    level = config_logger.level
    config_logger.setLevel(logging.ERROR)
    statuses = []
    damaged: dict[Path, str] = {}  # each damaged record named once, not once per budget
    try:
        for path in paths:
            study, root = load_study(path)
            _checked(args, study, root, write=False)
            if args.budget is not None and args.studies:
                study.budget(args.budget)  # a budget a named study does not have: one line, exit 2
            # smoke budgets are the test suite's (seconds, never stored): left out unless asked for by name
            names = [args.budget] if args.budget is not None else [b for b in study.budgets if b != "smoke"]
            statuses += [budget_status(study, root, name, _store(args, root), Path(args.runs), code, damaged)
                         for name in names if name in study.budgets]
    finally:
        config_logger.setLevel(level)
    if not statuses:
        raise StudyError(f"--budget {args.budget}: no study in {Path(args.root) / 'studies'} has this budget")
    print(status_text(statuses, every_cell=args.cells, complete_too=args.all))
    return 0


def _cmd_docs(args: argparse.Namespace) -> int:
    import sys

    from fedfew.study.citations import check_pages
    from fedfew.study.collect import collect
    from fedfew.study.docs import Collected, write_docs

    root = Path(args.root)
    check_root(root)
    store = Path(args.store) if args.store else None
    if store is not None:
        check_folder(store, "--store", write=False)
    collected: Collected = {}
    changed = write_docs(root, store, collected)
    print(f"{len(changed)} page(s) rewritten" + (f": {', '.join(str(p) for p in changed)}" if changed else ""))

    def results_of(study: Study, budget: str) -> StudyResults:  # the blocks' results, not collected twice
        if (study.name, budget) not in collected:
            collected[study.name, budget] = collect(study, root, store or root / "studies" / "store", budget)
        return collected[study.name, budget]

    # The prose's citations against the verdicts just written: a claim whose verdict moved leaves a
    # sentence that now says something else, to be rewritten by hand.
    count, problems = check_pages(root, store, results_of)
    for problem in problems:
        print(f"citation disagrees: {problem}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} of {count} claim citations in the docs' prose disagree with the store; "
              "rewrite those sentences", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: argparse._SubParsersAction, plugin_option: object = None) -> None:
    study = sub.add_parser("study", help="run a study (a grid of runs over seeds) and report it against the paper")
    actions = study.add_subparsers(dest="study_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--store", default=None, help="result store folder (default: studies/store beside the study)")
        if callable(plugin_option):
            plugin_option(p)

    run = actions.add_parser("run", help="run every cell not yet in the store (resumes interrupted cells)")
    run.add_argument("study", help="a study file, e.g. studies/fedfsl_table3.yaml")
    run.add_argument("--budget", default="cpu", help="budget preset: smoke, cpu, paper, ... (default cpu)")
    run.add_argument("--seeds", default=None, help="comma-separated seeds in place of the budget's (e.g. 0,1,2)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config value in every cell (repeatable); part of each cell's key")
    run.add_argument("--runs", default="runs/studies", help="base folder for the cells' run folders")
    run.add_argument("--method", action="append", default=None, metavar="ROW",
                     help="run only this row's cells (repeatable; a row as the study names it, e.g. "
                          "'FL-Proto, untrained'): a long budget's cheap rows first")
    run.add_argument("--new-code", action="store_true",
                     help="the store holds these cells from other code: add this version's results beside them")
    run.add_argument("--no-reuse", action="store_true",
                     help="run every cell, even one whose run (same config and code) another study's store holds")
    common(run)
    run.set_defaults(func=_cmd_run)

    verify = actions.add_parser("verify", help="re-run a few stored cells with this code; if every number is the "
                                               "same, the older code's records count as this version's")
    verify.add_argument("study")
    verify.add_argument("--budget", default="cpu", help="budget whose cells are checked (default cpu)")
    verify.add_argument("--per-method", type=int, default=1, help="cells re-run per method (default 1)")
    verify.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="the same --set the study was run with (part of each cell's key)")
    verify.add_argument("--runs", default="runs/studies", help="base folder for the re-run cells' run folders")
    verify.add_argument("--old-code", default=None, metavar="CHECKOUT",
                        help="a checkout of the records' code (git worktree add --detach CHECKOUT COMMIT): run each "
                             "cell with it here too and compare exactly, wherever the records were made")
    common(verify)
    verify.set_defaults(func=_cmd_verify)

    report = actions.add_parser("report", help="the table, the claims' verdicts and a figure, from the store")
    report.add_argument("study")
    report.add_argument("--budget", default=None, help="budget to report (default: the study's docs_budget)")
    report.add_argument("--budgets", default=None, metavar="A,B",
                        help="several budgets side by side (budgets as column groups), e.g. --budgets cpu,x5,x10")
    report.add_argument("--figure", default=None, metavar="PNG", help="also draw the bars with intervals here")
    report.add_argument("--intervals", default=None, metavar="SVG",
                        help="also draw each method's interval beside its own untrained control, per setting "
                             "(the docs' figure; SVG with the plotted values in its metadata)")
    report.add_argument("--curve", nargs=2, default=None, metavar=("KEY", "PNG"),
                        help="also draw KEY (test_accuracy, val_accuracy, train_loss, train_l_mi, ...) against the "
                             "round, mean over seeds with its 95%% band, into PNG (accuracies in %%, other numbers "
                             "as they are; train_* at the evaluated rounds)")
    common(report)
    report.set_defaults(func=_cmd_report)

    choose = actions.add_parser("choose", help="a choice the study makes from its results (its `choices:`), "
                                               "computed from the store on validation numbers only")
    choose.add_argument("study")
    choose.add_argument("choice", help="the choice's name in the study file's `choices:`")
    common(choose)
    choose.set_defaults(func=_cmd_choose)

    status = actions.add_parser("status", help="what each study has left at each budget: runs stored, running now "
                                               "(and their round), interrupted, and the compute left")
    status.add_argument("studies", nargs="*", help="study files (default: every one under ROOT/studies)")
    status.add_argument("--budget", default=None,
                        help="this budget only (default: every budget of each study but smoke, the test suite's)")
    status.add_argument("--runs", default="runs/studies", help="base folder of the cells' run folders, as given "
                                                               "to `study run` (default runs/studies)")
    status.add_argument("--root", default=".", help="repository root holding studies/ (default .)")
    status.add_argument("--cells", action="store_true", help="list every run still to go, not only running ones")
    status.add_argument("--all", action="store_true", help="also list the complete study budgets")
    common(status)
    status.set_defaults(func=_cmd_status)

    docs = actions.add_parser("docs", help="rewrite the study blocks of docs/*.md and README.md from the store")
    docs.add_argument("--root", default=".", help="repository root (with studies/ and docs/)")
    common(docs)
    docs.set_defaults(func=_cmd_docs)
