"""The documentation site's sources: every interval figure in the docs plots what the store
gives (its data, read from the SVG's metadata, not its pixels) and redraws byte for byte; the figure
comes first and the full table below it; README's summary line is the store's; mkdocs.yml's navigation
holds every page; the API reference documents every name ``fedfew`` exports."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import fedfew
from fedfew.study.collect import StudyResults, collect
from fedfew.study.docs import MARKER, doc_pages, marker_pattern
from fedfew.study.intervals import interval_figure, own_control, plotted, read_plotted
from fedfew.study.study_file import Study, load_study
from fedfew.study.study_sections import CONTROL
from fedfew.study.summary import summary_line

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "studies" / "store"


def studies() -> dict[str, tuple[Study, Path]]:
    found = {}
    for path in sorted((REPO / "studies").glob("*.yaml")):
        study, _ = load_study(path)
        found[study.name] = (study, path)
    return found


def interval_blocks() -> list[tuple[Path, str, str | None]]:
    """(page, study name, budget or None) of every ``study:NAME[@BUDGET]:intervals`` block."""
    return [(page, name, at[1:] or None) for page in doc_pages(REPO)
            for name, at, view in MARKER.findall(page.read_text()) if view == ":intervals"]


_collected: dict[tuple[str, str | None], StudyResults] = {}


def results_of(name: str, budget: str | None) -> StudyResults:
    if (name, budget) not in _collected:
        _collected[name, budget] = collect(studies()[name][0], REPO, STORE, budget)
    return _collected[name, budget]


def figure_path(name: str, budget: str | None) -> Path:
    return REPO / "docs" / "studies" / f"{name}{f'-{budget}' if budget else ''}-intervals.svg"


def test_the_benchmark_and_each_papers_headline_have_a_figure() -> None:
    shown = {(name, budget) for _, name, budget in interval_blocks()}
    assert {("benchmark-fewshot", None), ("benchmark-fewshot", "headline"), ("benchmark-classification", None),
            ("fedfsl-table3", None), ("f2l-table1-huffpost", None), ("fml-tables", None), ("frl-femnist", None),
            ("adfl-mnist", None)} <= shown
    drawn = {p.name for p in (REPO / "docs" / "studies").glob("*-intervals.svg")}
    assert drawn == {figure_path(name, budget).name for name, budget in shown}, "a figure no block shows"


@pytest.mark.parametrize("page,name,budget", interval_blocks(),
                         ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_each_docs_figure_plots_what_the_store_gives(page: Path, name: str, budget: str | None) -> None:
    results = results_of(name, budget)
    svg = figure_path(name, budget)
    drawn = read_plotted(svg)
    assert drawn == plotted(results)  # every mean, interval bound, seed count, control band and paper mark
    assert len(drawn["rows"]) == sum(1 for m in results.methods for s in results.settings
                                     if results.study.ranked(m) and results.values.get((m, s)))
    for row in drawn["rows"]:  # spot-check against the table's own numbers
        interval = results.interval(row["method"], row["setting"])
        assert interval is not None and (row["mean"], row["low"], row["high"]) == (interval.mean, interval.low, interval.high)
    # On the page: the figure first, then the collapsed full table of the same study and budget.
    tag = name + (f"@{budget}" if budget else "") + ":intervals"
    block = marker_pattern(tag).search(page.read_text())
    assert block is not None
    body = block.group(2)
    link = f"studies/{svg.name}"
    assert body.index(link) < body.index('<details markdown="1">') < body.index("| method |") < body.index("</details>")


def test_each_method_is_drawn_against_its_own_control() -> None:
    """FL-Proto's band is its own prototypes at round 0, FL-MAML's the study's control (its linear
    head): the control each claim "above its own control" names."""
    results = results_of("benchmark-fewshot", "headline")
    rows = {(r["method"], r["setting"]): r for r in plotted(results)["rows"]}
    setting = "Omniglot non-IID 1-shot"
    assert rows["FL-Proto", setting]["control"] == "FL-Proto, untrained" == own_control(results, "FL-Proto")
    assert rows["FL-MAML", setting]["control"] == CONTROL
    band = results.interval("FL-Proto, untrained", setting)
    assert band is not None and rows["FL-Proto", setting]["control_bounds"]["mean"] == band.mean
    assert not any(r["method"] in ("FL-Proto, untrained", CONTROL) for r in rows.values())  # bands, not rows


def test_a_figure_redraws_byte_for_byte(tmp_path: Path) -> None:
    """No date, a fixed hash salt: `fedfew study docs` on a clean clone rewrites no figure."""
    results = results_of("benchmark-fewshot", "headline")
    assert interval_figure(results, tmp_path / "again.svg")
    assert (tmp_path / "again.svg").read_bytes() == figure_path("benchmark-fewshot", "headline").read_bytes()


def test_readme_summary_is_the_stores() -> None:
    readme = (REPO / "README.md").read_text()
    block = marker_pattern("benchmark-fewshot:summary").search(readme)
    assert block is not None
    results = results_of("benchmark-fewshot", None)
    assert block.group(2) == summary_line(results, "studies/benchmark_fewshot.yaml")
    # The line's content, from the winners rule: who is best where, and by how much over its own control.
    line = block.group(2)
    assert "FL-Proto in 8 of 12 settings (all 4 Omniglot, all 4 FEMNIST;" in line
    assert "F2L in 4 of 12 settings (all 4 HuffPost;" in line
    assert "576/576 cells" in line and "8 methods compared" in line
    # The converged line above it: one line over the two converged budgets' columns, the centralised
    # twins (ceilings) never counted among the methods compared.
    both = "benchmark-fewshot@converged-omniglot+converged-femnist:summary"
    block = marker_pattern(both).search(readme)
    assert block is not None
    runs = [results_of("benchmark-fewshot", b) for b in ("converged-omniglot", "converged-femnist")]
    assert block.group(2) == summary_line(runs, "studies/benchmark_fewshot.yaml")
    assert "budgets converged-omniglot (" in block.group(2) and "8 methods compared" in block.group(2)


def _nav_files(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [f for item in node for f in _nav_files(item)]
    if isinstance(node, dict):
        return [f for value in node.values() for f in _nav_files(value)]
    return []


class _Loader(yaml.SafeLoader):
    """YAML with mkdocs.yml's ``!ENV [NAME, default]`` tag read as its default."""


_Loader.add_constructor("!ENV", lambda loader, node: loader.construct_sequence(node)[-1])


def mkdocs_config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=_Loader)
    return loaded


def test_the_navigation_holds_every_page_once() -> None:
    nav = _nav_files(mkdocs_config()["nav"])
    pages = sorted(str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*")
                   if p.suffix in (".md", ".ipynb") and ".ipynb_checkpoints" not in p.parts)
    assert sorted(nav) == pages
    assert nav[0] == "index.md"
    sections = [next(iter(item)) for item in mkdocs_config()["nav"]]
    assert sections == ["Start", "The five papers", "The benchmark", "Privacy", "Beyond one machine",
                        "Writing an algorithm", "Reference"]


def test_the_api_reference_documents_every_public_name() -> None:
    text = (REPO / "docs" / "reference" / "api.md").read_text()
    documented = re.findall(r"^::: ([\w.]+)$", text, flags=re.M)
    exports = fedfew._EXPORTS  # the public name -> the module it lives in
    assert sorted(f"{module}.{name}" for name, module in exports.items()) == sorted(d for d in documented if d != "fedfew")
    assert sorted(exports) == sorted(n for n in fedfew.__all__ if n != "__version__")
    for name, module in exports.items():  # each directive names the object fedfew.NAME is
        assert getattr(__import__(module, fromlist=[name]), name) is getattr(fedfew, name)


def test_citations_render_as_labels_and_code_stays_code() -> None:
    """The site's hook (scripts/docs_hooks.py): two citations side by side are two labels, not a
    reference link; a citation shown as syntax inside code is left alone."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    text = ("above [claim: s#a:x>y = holds] [claim: s@b#a:x>y = reversed; Holm: not resolved] and "
            "`[claim: s#a:x>y = holds]`")
    rendered = hooks.render_citations(text)
    assert rendered.count('<span class="claim') == 2
    assert 'claim-holds" ' in rendered and 'claim-not-resolved" ' in rendered  # the Holm verdict colours it
    assert "x&gt;y" in rendered and rendered.endswith("`[claim: s#a:x>y = holds]`")


def test_study_report_draws_the_docs_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`fedfew study report --intervals` is the docs' figure, byte for byte (the same committed command
    draws the figure and the table); with --budgets it is one line, exit 2."""
    from fedfew.cli.main import main

    target = tmp_path / "headline.svg"
    assert main(["study", "report", str(REPO / "studies" / "benchmark_fewshot.yaml"), "--budget", "headline",
                 "--intervals", str(target)]) == 0
    assert f"interval figure: {target}" in capsys.readouterr().out
    assert target.read_bytes() == figure_path("benchmark-fewshot", "headline").read_bytes()
    assert main(["study", "report", str(REPO / "studies" / "benchmark_fewshot.yaml"), "--budgets", "cpu,headline",
                 "--intervals", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--intervals" in err and len(err.splitlines()) == 1
