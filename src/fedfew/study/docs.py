"""Generated docs: each study's report goes between ``<!-- study:NAME begin -->`` and
``<!-- study:NAME end -->`` in the docs pages (``study:NAME:claims`` for the verdicts alone, as
docs/results.md shows them; ``study:NAME:winners`` for the best method per setting and
those not separated from it; ``study:NAME:aggregate`` for the view over all settings
(:mod:`fedfew.study.aggregate`, with its performance-profile figure); ``study:NAME:intervals`` for the
interval figure (:mod:`fedfew.study.intervals`) with the full table below it in a collapsible block;
``study:NAME:summary`` for the study in one sentence (:mod:`fedfew.study.summary`; README's "what it
found"); ``study:NAME:epsilon`` for accuracy
against the privacy budget (:mod:`fedfew.study.epsilon`, with its figure); ``study:NAME:choice-KEY`` for a
choice the study makes on validation numbers (:mod:`fedfew.study.choose`); ``study:NAME:curve-KEY`` for a
number the records keep at each evaluated round (``val_accuracy``) against the round, with its figure;
``study:NAME:convergence`` for the convergence rule on every run's validation curve
(:mod:`fedfew.study.convergence`); ``study:NAME@BUDGET`` for any of these at a budget other than the study's
docs budget, such as a paper-budget cell; ``study:NAME@A+B`` for budgets side by side, as column groups
(``study:NAME@A+B:summary``: one line over them); ``<!-- studies:compute begin -->`` for every study's
progress and compute time), made from the committed store alone (no number in those blocks is typed by hand;
tests/study/test_docs.py fails when a page differs from what the store gives)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from fedfew.study.aggregate import aggregate_markdown, profile_figure
from fedfew.study.choose import choice_markdown, make_choice
from fedfew.study.collect import StudyResults, collect
from fedfew.study.compute import compute_table
from fedfew.study.convergence import convergence_markdown
from fedfew.study.epsilon import epsilon_figure, epsilon_markdown
from fedfew.study.figures import curve_figure, curve_keys, figure, mean_curve, untrained_bands
from fedfew.study.intervals import interval_figure
from fedfew.study.report import budgets_markdown, claims_markdown, markdown
from fedfew.study.study_file import Study, load_study
from fedfew.study.study_sections import StudyError
from fedfew.study.summary import summary_line
from fedfew.study.winners import winners_markdown

#: A marker is a line of its own (a marker quoted inside a sentence, as in docs/studies.md, is not one).
#: ``@a+b+c`` puts several budgets side by side (budgets as column groups; the table view only).
MARKER = re.compile(r"^<!-- study:([A-Za-z0-9_.-]+)(@[A-Za-z0-9_.-]+(?:\+[A-Za-z0-9_.-]+)*)?(:claims|:winners|:aggregate|:intervals|:summary|:epsilon|:choice-[A-Za-z0-9_.-]+|:curve-[A-Za-z0-9_]+|:convergence)? "
                    r"begin -->$", re.MULTILINE)
#: The one block about all studies: cells in the store, seeds and compute time per study.
COMPUTE = "studies:compute"

def _between(body: str) -> Callable[[re.Match[str]], str]:
    """A replacement that keeps a marker pair and puts ``body`` between them."""
    return lambda m: m.group(1) + body + m.group(3)

def marker_pattern(name: str, prefix: str = "study:") -> re.Pattern[str]:
    tag = re.escape(prefix + name)
    return re.compile(rf"(^<!-- {tag} begin -->\n)(.*?)(^<!-- {tag} end -->$)", re.DOTALL | re.MULTILINE)


def study_files(root: Path) -> list[Path]:
    return sorted((root / "studies").glob("*.yaml"))


#: Results already collected, by (study name, budget): shared by the pages and the citation check.
Collected = dict[tuple[str, str], StudyResults]


def render_pages(root: Path, store_base: Path | None = None, figures: bool = False,
                 collected: Collected | None = None) -> dict[Path, str]:
    """Every docs page with a study marker, as the store makes it: {page: new text}. ``collected``: a
    cache of the studies' results to fill (or reuse)."""
    default = root / "studies" / "store"
    # `study docs --store S`: the blocks' commands name S, so they reproduce what the blocks show
    store_option = str(store_base) if store_base and store_base.resolve() != default.resolve() else None
    store_base = store_base or default
    studies: dict[str, tuple[Study, Path]] = {}
    for path in study_files(root):
        study, _ = load_study(path)
        if study.name in studies:
            raise StudyError(f"study name {study.name!r} is used by {studies[study.name][1]} and {path}")
        studies[study.name] = (study, path)
    collected = {} if collected is None else collected
    damaged: dict[Path, str] = {}  # each damaged record named once, however many blocks read its study

    def results_of(name: str, budget: str | None = None) -> StudyResults:
        """A study's results at ``budget`` (default: its docs budget), collected once however many
        blocks and pages show them."""
        study, _ = studies[name]
        key = (name, budget or study.docs_budget)
        if key not in collected:
            collected[key] = collect(study, root, store_base, budget, damaged)
        return collected[key]

    compute = marker_pattern(COMPUTE, prefix="")
    pages: dict[Path, str] = {}
    for page in doc_pages(root):
        text = original = page.read_text()
        for name, at, view in MARKER.findall(original):
            if name not in studies:
                raise StudyError(f"{page}: marker study:{name} names no study in {root / 'studies'}")
            study, path = studies[name]
            budgets = at[1:].split("+") if at else []
            for budget in budgets:
                if budget not in study.budgets:
                    raise StudyError(f"{page}: marker study:{name}{at} names no budget {budget!r} of "
                                     f"{path.relative_to(root)} (it has {', '.join(study.budgets)})")
            if len(budgets) > 1 and view == ":summary":  # one line over the budgets' settings
                body = summary_line([results_of(name, b) for b in budgets], str(path.relative_to(root)))
                text = marker_pattern(name + at + view).sub(_between(body), text)
                continue
            if len(budgets) > 1:
                if view:
                    raise StudyError(f"{page}: marker study:{name}{at}{view}: several budgets take the table "
                                     f"and summary views only (study:{name}{at}, study:{name}{at}:summary)")
                body = budgets_markdown([results_of(name, b) for b in budgets], str(path.relative_to(root)),
                                        store_option)
                text = marker_pattern(name + at).sub(_between(body), text)
                continue
            budget = budgets[0] if budgets else None
            results = results_of(name, budget)
            if view == ":aggregate":  # its figure, like a table's, is drawn by write_docs
                stem = name + (f"-{budget}" if budget else "") + "-profile"
                body = aggregate_markdown(results, str(path.relative_to(root)), f"studies/{stem}.png")
                if figures:
                    profile_figure(results, root / "docs" / "studies" / f"{stem}.png")
                text = marker_pattern(name + at + view).sub(_between(body), text)
                continue
            if view == ":epsilon":  # accuracy against the privacy budget (fedfew.study.epsilon)
                stem = name + (f"-{budget}" if budget else "") + "-epsilon"
                body = epsilon_markdown(results, f"studies/{stem}.png")
                if figures:
                    epsilon_figure(results, root, root / "docs" / "studies" / f"{stem}.png")
                text = marker_pattern(name + at + view).sub(_between(body), text)
                continue
            if view == ":intervals":  # the figure first, the full table below it (collapsed)
                stem = name + (f"-{budget}" if budget else "") + "-intervals"
                body = intervals_markdown(results, str(path.relative_to(root)), store_option, f"studies/{stem}.svg")
                if figures and results.values:
                    interval_figure(results, root / "docs" / "studies" / f"{stem}.svg")
                text = marker_pattern(name + at + view).sub(_between(body), text)
                continue
            if view.startswith(":curve-"):  # a history number against the round (fedfew.study.figures)
                key = view.removeprefix(":curve-")
                stem = name + (f"-{budget}" if budget else "") + f"-curve-{key}"
                body = curve_markdown(results, str(path.relative_to(root)), key, f"studies/{stem}.png")
                if figures and results.histories:
                    curve_figure(results, key, root / "docs" / "studies" / f"{stem}.png")
                text = marker_pattern(name + at + view).sub(_between(body), text)
                continue
            if view == ":convergence":  # the convergence rule on every run's validation curve
                body = convergence_markdown(results, str(path.relative_to(root)))
                text = marker_pattern(name + at + view).sub(_between(body), text)
                continue
            if view == ":summary":
                body = summary_line(results, str(path.relative_to(root)))
                text = marker_pattern(name + at + view).sub(_between(body), text)
                continue
            if view.startswith(":choice-"):
                if budgets:
                    raise StudyError(f"{page}: marker study:{name}{at}{view}: a choice names its own budget; drop {at}")
                made = make_choice(study, root, store_base, view.removeprefix(":choice-"))
                body = choice_markdown(made, study, str(path.relative_to(root)))
                text = marker_pattern(name + view).sub(_between(body), text)
                continue
            if view:
                render = claims_markdown if view == ":claims" else winners_markdown
                body = render(results, str(path.relative_to(root)))
                text = marker_pattern(name + at + view).sub(_between(body), text)
                continue
            body = markdown(results, str(path.relative_to(root)), store_option)
            if results.values:  # the figure's link depends on the store alone; the file is made by write_docs
                stem = name + (f"-{budget}" if budget else "")
                body += f"\n![{study.title or name}{f' ({budget} budget)' if budget else ''}](studies/{stem}.png)\n"
                if figures:
                    figure(results, root / "docs" / "studies" / f"{stem}.png")
            text = marker_pattern(name + at).sub(_between(body), text)
        if compute.search(original):
            text = compute.sub(_between(compute_table(studies, root, results_of)), text)
        if text != original or name_markers(original) or compute.search(original):
            pages[page] = text
    return pages


def doc_pages(root: Path) -> list[Path]:
    """The pages whose blocks the store writes: docs/*.md and README.md (its "what it found" line)."""
    readme = root / "README.md"
    return sorted((root / "docs").glob("*.md")) + ([readme] if readme.is_file() else [])


def curve_markdown(results: StudyResults, study_path: str, key: str, figure_link: str) -> str:
    """The ``:curve-KEY`` view: ``key`` (a number the records keep at each evaluated round, such as
    ``val_accuracy``) against the round, one panel per setting and one line per method, the mean over
    seeds with its 95% band, and where each line ends (its last round and value). A key no record keeps
    is an error naming the keys they do keep."""
    budget = results.budget
    command = f"`fedfew study report {study_path} --budget {budget} --curve {key} FILE.png`"
    if not results.histories:
        return f"*No record of the {budget} budget keeps its evaluated rounds yet*: {command} draws it once one does.\n"
    known = curve_keys(results)
    if key not in known:
        raise StudyError(f"marker study:{results.study.name}:curve-{key}: no stored record of the {budget} budget has "
                         f"{key!r} at its evaluated rounds; they have {', '.join(known)}")
    ends = []
    for (method, setting), per_seed in sorted(results.histories.items(), key=lambda item: results.table_order(item[0])):
        points = mean_curve(per_seed, key)  # the figure's own line: its last point is where the text says it ends
        if points:
            last_round, mean = points[-1][:2]
            ends.append(f"{results.study.label(method)}, {setting}: {mean:.2f} at round {last_round} "
                        f"({len(per_seed)} seed{'' if len(per_seed) == 1 else 's'})")
    bands = [f"{results.study.label(method)}, {setting}: {band.mean:.2f} "
             + (f"[{band.low:.2f}, {band.high:.2f}]" if band.low is not None and band.high is not None else "(one seed)")
             for setting in results.settings for method, band in untrained_bands(results, setting, key)]
    controls = (f" The untrained controls' {key} at round 0, the grey bands (mean and 95% interval over seeds; "
                f"a dotted line alone for one seed): {'; '.join(bands)}." if bands else "")
    alt = f"{results.study.title or results.study.name} ({budget} budget): {key} against the round"
    return (f"![{alt}]({figure_link})\n\n{key} at each evaluated round, the mean over seeds with its 95% band, from "
            f"the records' histories ({command}). Where each line ends: {'; '.join(ends)}.{controls}\n")


def intervals_markdown(results: StudyResults, study_path: str, store_option: str | None, figure_link: str) -> str:
    """The ``:intervals`` view: the interval figure, then the table view's whole text (table, claims,
    legend) in a ``<details>`` block that GitHub and the site both render collapsed."""
    study = results.study
    table = markdown(results, study_path, store_option)
    if not results.values:
        return table
    alt = (f"{study.title or study.name} ({results.budget} budget): each method's mean and 95% interval over "
           "seeds per setting, its own untrained control as a grey band")
    # The figure links to itself (full size); <summary> takes no Markdown, so its path is HTML code.
    return (f"[![{alt}]({figure_link})]({figure_link})\n\n<details markdown=\"1\">\n<summary>The full table: "
            f"{len(results.methods)} rows x {len(results.settings)} settings, with the claims "
            f"(<code>{study_path}</code>, {results.budget} budget)</summary>\n\n{table}\n</details>\n")


def name_markers(text: str) -> list[tuple[str, str, str]]:
    return MARKER.findall(text)


def write_docs(root: Path, store_base: Path | None = None, collected: Collected | None = None) -> list[Path]:
    """Rewrite the study blocks of every docs page; returns the pages that changed."""
    changed = []
    for page, text in render_pages(root, store_base, figures=True, collected=collected).items():
        if page.read_text() != text:
            page.write_text(text)
            changed.append(page)
    return changed
