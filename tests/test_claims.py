"""Claims a statistician would sign, and prose that cannot drift (issue 39, items 4-6): Holm over each
family beside the raw verdict, the chain rule with each link shown, claim ids and families (bad ones:
one line, exit 2), accuracy intervals inside [0, 100], the benchmark's aggregate view, and the docs'
citations of claims checked against the store."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fedfew.study.aggregate import aggregate, aggregate_markdown
from fedfew.study.citations import Citation, check_citation, check_pages, find_citations
from fedfew.study.claim_verdicts import JudgedClaim, claims, claims_table
from fedfew.study.collect import StudyResults, collect
from fedfew.study.docs import MARKER, marker_pattern, study_files
from fedfew.study.study_file import Study, load_study
from fedfew.study.study_sections import CONTROL, claim_id
from fedfew.study.verdict import (
    HOLDS,
    NOT_RESOLVED,
    REVERSED,
    Interval,
    PairVerdict,
    adjust,
    chain_verdict,
    judge_order,
)
from tests.test_study import DIGITS_STUDY, REPO, run_cli, write_study

#: The docs pages whose prose reads the studies' results.
READING_PAGES = ("adfl.md", "benchmark.md", "f2l.md", "fedfsl.md", "fml.md", "frl.md", "privacy-study.md",
                 "results.md")


def _link(mean: float, p: float | None, verdict: str = NOT_RESOLVED) -> PairVerdict:
    return PairVerdict("a", "b", verdict, Interval(mean, 1.0, 3), p)


# -- Holm over a family, the chain rule ---------------------------------------------------------------
def test_holm_over_a_family_by_hand() -> None:
    """Four one-link claims with p = 0.01, 0.04, 0.03, 0.005 (R's p.adjust: 0.03, 0.06, 0.06, 0.02): the
    first and the fourth stay resolved on the side of their mean, the others become not resolved; a
    link without a test is left out of the count."""
    family = [[_link(2.0, 0.01, HOLDS)], [_link(1.0, 0.04, HOLDS)], [_link(-1.0, 0.03, REVERSED)],
              [_link(-3.0, 0.005, REVERSED)], [_link(5.0, None)]]
    judged = adjust(family)
    assert [j[0].adjusted_p for j in judged] == pytest.approx([0.03, 0.06, 0.06, 0.02, None])
    assert [j[0].adjusted for j in judged] == [HOLDS, NOT_RESOLVED, NOT_RESOLVED, REVERSED, NOT_RESOLVED]
    assert [j[0].verdict for j in judged] == [HOLDS, HOLDS, REVERSED, REVERSED, NOT_RESOLVED]  # raw kept
    alone = adjust([[_link(1.0, 0.04, HOLDS)]])  # a family of one: Holm is the raw test
    assert alone[0][0].adjusted == HOLDS and alone[0][0].adjusted_p == 0.04


def test_the_chain_rule() -> None:
    assert chain_verdict([HOLDS, HOLDS]) == HOLDS
    assert chain_verdict([HOLDS, NOT_RESOLVED]) == NOT_RESOLVED
    assert chain_verdict([NOT_RESOLVED, REVERSED]) == REVERSED  # one reversed link reverses the chain
    assert chain_verdict([HOLDS, REVERSED]) == REVERSED
    assert chain_verdict([]) == NOT_RESOLVED
    # issue 39's FRL chain: the first link not resolved (+2.09 ± 5.47), the second reversed (-9.60 ± 4.58)
    a, b, c = {0: 30.0, 1: 35.0, 2: 31.0}, {0: 29.0, 1: 30.0, 2: 30.0}, {0: 38.0, 1: 40.0, 2: 41.0}
    verdict, pairs = judge_order({"a": a, "b": b, "c": c}, ["a", "b", "c"])
    assert verdict == REVERSED and [p.verdict for p in pairs] == [NOT_RESOLVED, REVERSED]


def _results(tmp_path: Path, data: dict, values: dict[tuple[str, str], dict[int, float]]) -> StudyResults:
    study, _ = load_study(write_study(tmp_path, data))
    results = StudyResults(study, "cpu", None, cells_total=12, cells_found=12, methods=list(study.methods),
                           settings=list(study.settings))
    results.values = values
    return results


CHAIN = {**DIGITS_STUDY, "claims": [
    {"setting": "IID 1-shot", "order": ["fl-proto", "fl-maml", CONTROL], "source": "a chain"},
    {"setting": "IID 1-shot", "order": ["fl-proto", CONTROL], "id": "proto-trained"},
    {"setting": "non-IID 1-shot", "order": ["fl-proto", "fl-maml"]},
]}
CHAIN_VALUES = {("fl-proto", "IID 1-shot"): {0: 60.0, 1: 61.0, 2: 60.5},
                ("fl-maml", "IID 1-shot"): {0: 59.0, 1: 62.0, 2: 58.0},  # proto - maml: 1, -1, 2.5: not resolved
                (CONTROL, "IID 1-shot"): {0: 50.0, 1: 50.5, 2: 50.2},  # maml - control: 9, 11.5, 7.8
                ("fl-proto", "non-IID 1-shot"): {0: 40.0, 1: 42.0, 2: 41.0},
                ("fl-maml", "non-IID 1-shot"): {0: 30.0, 1: 31.0, 2: 30.9}}


def test_a_chain_shows_each_links_verdict_raw_and_holm_beside_the_chains(tmp_path: Path) -> None:
    results = _results(tmp_path, CHAIN, CHAIN_VALUES)
    judged = {j.id: j for j in claims(results)}
    chain = judged["iid-1-shot:fl-proto>fl-maml>control"]
    assert [p.verdict for p in chain.pairs] == [NOT_RESOLVED, HOLDS] and chain.verdict == NOT_RESOLVED
    assert chain.family == "all" and chain.family_claims == 3 and chain.family_tests == 4
    # Holm over the family's 4 tests: each p-value times up to 4
    raw = sorted(p.p_value for j in judged.values() for p in j.pairs)
    assert sorted(p.adjusted_p for j in judged.values() for p in j.pairs)[0] == pytest.approx(min(1.0, 4 * raw[0]))
    table = claims_table(results)
    row = next(line for line in table.splitlines() if "`iid-1-shot:fl-proto>fl-maml>control`" in line)
    cells = row.split(" | ")
    assert cells[3] == "**not resolved**" and cells[4] == "**not resolved**"  # the chain's raw, then Holm
    assert ": not resolved / not resolved;" in cells[5] and cells[5].count(" / ") == 2  # each link: raw / Holm
    assert "(p " in cells[5] and ", Holm " in cells[5]
    assert "`all`: 3 claims, 4 comparisons with a test" in table
    assert "A chain A > B > C holds when every link holds" in table


def test_declared_families_are_judged_apart(tmp_path: Path) -> None:
    data = {**CHAIN, "families": {"trained": ["proto-trained"]}}
    results = _results(tmp_path, data, CHAIN_VALUES)
    judged = {j.id: j for j in claims(results)}
    assert judged["proto-trained"].family == "trained" and judged["proto-trained"].family_claims == 1
    assert judged["non-iid-1-shot:fl-proto>fl-maml"].family == "other"
    alone = judged["proto-trained"].pairs[0]
    assert alone.adjusted_p == alone.p_value  # a family of one
    table = claims_table(results)
    assert "`trained`: 1 claim, 1 comparison with a test" in table and "`other`: 2 claims" in table
    assert "**holds** (trained)" in table  # the Holm cell names the family when the study declares families


def test_claim_ids_are_made_from_setting_and_order_and_do_not_move(tmp_path: Path) -> None:
    assert claim_id("IID 1-shot", ["F2L", "FL-MAML"]) == "iid-1-shot:f2l>fl-maml"
    assert claim_id("non-IID (Table 2)", ["frl_linear", CONTROL]) == "non-iid-table-2:frl-linear>control"
    study, _ = load_study(write_study(tmp_path, CHAIN))
    ids = study.claim_ids()
    assert ids == ["iid-1-shot:fl-proto>fl-maml>control", "proto-trained", "non-iid-1-shot:fl-proto>fl-maml"]
    moved, _ = load_study(write_study(tmp_path, {**CHAIN, "claims": CHAIN["claims"][::-1]}, "moved.yaml"))
    assert moved.claim_ids() == ids[::-1]  # an id belongs to its claim, not to its place
    twice = {**CHAIN, "claims": [CHAIN["claims"][2], CHAIN["claims"][2]]}
    study, _ = load_study(write_study(tmp_path, twice, "twice.yaml"))
    assert study.claim_ids() == ["non-iid-1-shot:fl-proto>fl-maml", "non-iid-1-shot:fl-proto>fl-maml~2"]


@pytest.mark.parametrize("change, expected", [
    ({"families": {"f": ["nonesuch"]}}, "families.f: 'nonesuch' is not one of this study's claim ids"),
    ({"families": {"f": ["proto-trained"], "g": ["proto-trained"]}}, "already in family 'f'"),
    ({"families": {"all": ["proto-trained"]}}, "'all' is not a family name"),
    ({"families": {"f": []}}, "families.f"),
    ({"claims": [{"setting": "IID 1-shot", "order": ["fl-proto", CONTROL], "id": "x"},
                 {"setting": "IID 1-shot", "order": ["fl-maml", CONTROL], "id": "x"}]}, "'x' is the id of another claim"),
    ({"claims": [{"setting": "IID 1-shot", "order": ["fl-proto", CONTROL], "id": "has space"}]}, "claims.0.id"),
    ({"claims": [{"setting": "IID 1-shot", "order": ["fl-proto", "nonesuch"]}]}, "'nonesuch' is not one of"),
])
def test_bad_claims_and_families_are_one_line_exit_2(change: dict, expected: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, {**CHAIN, **change})
    code, _, err = run_cli(["study", "report", str(path), "--store", str(tmp_path / "store")], capsys)
    assert code == 2 and expected in err and str(path) in err and len(err.strip().splitlines()) == 1, err


# -- accuracies inside [0, 100] -----------------------------------------------------------------------
INTERVAL = re.compile(r"(-?\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\]")


def test_a_cell_far_apart_over_seeds_stays_inside_0_100(tmp_path: Path) -> None:
    """Two seeds at 5% and 99%: Student's t gives 52 ± 597; the table's interval is inside [0, 100]."""
    from fedfew.study.tables import table

    results = _results(tmp_path, CHAIN, {("fl-proto", "IID 1-shot"): {0: 5.0, 1: 99.0},
                                         ("fl-maml", "IID 1-shot"): {0: 100.0, 1: 100.0, 2: 100.0}})
    text = table(results)
    found = [tuple(map(float, m)) for m in INTERVAL.findall(text)]
    assert (52.0, 0.0, 100.0) in found and (100.0, 100.0, 100.0) in found
    assert all(0.0 <= low <= high <= 100.0 for _, low, high in found)


def _blocks(text: str) -> list[str]:
    """The generated blocks of a page with accuracies (the aggregate view's scores are normalised, not
    accuracies: they may be below 0)."""
    return [m.group(2) for name, at, view in MARKER.findall(text) if view != ":aggregate"
            for m in [marker_pattern(name + at + view).search(text)] if m]


def test_no_accuracy_interval_in_the_docs_leaves_0_100() -> None:
    """Every "mean [low, high]" of every generated block (what the committed-docs test keeps equal to the
    store) is inside [0, 100]."""
    found = 0
    for page in sorted((REPO / "docs").glob("*.md")):
        for block in _blocks(page.read_text()):
            for mean, low, high in (tuple(map(float, m)) for m in INTERVAL.findall(block)):
                found += 1
                assert 0.0 <= low <= high <= 100.0, f"{page.name}: {mean} [{low}, {high}]"
    assert found > 800


# -- the aggregate view -------------------------------------------------------------------------------
def test_the_aggregate_view_by_hand(tmp_path: Path) -> None:
    """Two settings, two seeds. Setting A: control mean 40, best mean (fl-proto) 60; setting B: control
    40, best (fl-maml) 50. Normalised: fl-proto A 0.9, 1.1, B 0.0, 0.4; fl-maml A 0.4, 0.6, B 0.9, 1.1;
    IQM of 4 values = the mean of the middle two: fl-proto (0.4 + 0.9) / 2, fl-maml (0.6 + 0.9) / 2."""
    values = {("fl-proto", "IID 1-shot"): {0: 58.0, 1: 62.0}, ("fl-maml", "IID 1-shot"): {0: 48.0, 1: 52.0},
              (CONTROL, "IID 1-shot"): {0: 39.0, 1: 41.0},
              ("fl-proto", "non-IID 1-shot"): {0: 40.0, 1: 44.0}, ("fl-maml", "non-IID 1-shot"): {0: 49.0, 1: 51.0},
              (CONTROL, "non-IID 1-shot"): {0: 40.0, 1: 40.0}}
    results = _results(tmp_path, DIGITS_STUDY, values)
    results.missing = {}
    view = aggregate(results, reps=500)
    assert not isinstance(view, str)
    assert view.best == "fl-maml" and view.methods == ["fl-maml", "fl-proto"]
    assert view.score["fl-maml"][0] == pytest.approx(0.75) and view.score["fl-proto"][0] == pytest.approx(0.65)
    assert view.rank["fl-maml"][0] == pytest.approx(1.5) and view.rank["fl-proto"][0] == pytest.approx(1.5)
    # P(fl-maml > fl-proto): setting IID 0 of 4 pairs, non-IID 4 of 4 -> (0 + 1) / 2
    assert view.improvement["fl-proto"][0] == pytest.approx(0.5)
    assert view.references["IID 1-shot"] == (40.0, 60.0)
    for low_high in (view.score["fl-proto"], view.rank["fl-maml"], view.improvement["fl-proto"]):
        assert low_high[1] <= low_high[2]
    again = aggregate(results, reps=500)
    assert not isinstance(again, str) and again.score == view.score  # seeded: the same every time
    text = aggregate_markdown(results, "studies/x.yaml", "studies/x-profile.png")
    assert "| FL-MAML | 0.75 [" in text and "![Performance profile" in text
    results.missing = {"IID 1-shot": 1}
    assert "incomplete" in aggregate_markdown(results, "studies/x.yaml")


def test_the_benchmark_page_has_the_aggregate_view() -> None:
    text = (REPO / "docs" / "benchmark.md").read_text()
    block = marker_pattern("benchmark-fewshot:aggregate").search(text)
    assert block is not None and "| method | aggregate score (IQM of normalised accuracy) |" in block.group(2)
    assert "docs/studies/benchmark-fewshot-profile.png".removeprefix("docs/") in block.group(2)
    assert (REPO / "docs" / "studies" / "benchmark-fewshot-profile.png").is_file()


# -- citations ----------------------------------------------------------------------------------------
def test_citations_are_read_and_malformed_ones_reported() -> None:
    text = ("A beats B [claim: s@paper#iid-1-shot:a>b = holds; Holm: not resolved], and C does not\n"
            "[claim: s#c-first, link 2 = reversed]. Code is not read: `[claim: X#Y = holds]`.\n"
            "[claim: s#x = maybe]\n")
    found, bad = find_citations(Path("p.md"), text)
    assert [(c.study, c.budget, c.id, c.link, c.raw, c.holm, c.line) for c in found] == [
        ("s", "paper", "iid-1-shot:a>b", None, HOLDS, NOT_RESOLVED, 1), ("s", None, "c-first", 2, REVERSED, REVERSED, 2)]
    assert len(bad) == 1 and bad[0].line == 3 and "not a citation" in bad[0].why


def test_a_citation_is_checked_against_the_claims_verdicts(tmp_path: Path) -> None:
    results = _results(tmp_path, CHAIN, CHAIN_VALUES)
    judged: list[JudgedClaim] = claims(results)
    study: Study = results.study

    def cite(cid: str, raw: str, holm: str | None = None, link: int | None = None) -> str | None:
        return check_citation(Citation(Path("p.md"), 1, "", study.name, None, cid, link, raw, holm or raw),
                              judged, study, "cpu")

    chain = "iid-1-shot:fl-proto>fl-maml>control"
    assert cite(chain, NOT_RESOLVED) is None
    assert cite(chain, HOLDS) == "states 'holds', the store gives 'not resolved'"
    link2 = next(j for j in judged if j.id == chain).pairs[1]  # fl-maml > control: d = 9, 11.5, 7.8
    assert link2.verdict == HOLDS and cite(chain, HOLDS, link2.adjusted, link=2) is None
    assert cite(chain, NOT_RESOLVED, link=2) is not None
    assert cite(chain, NOT_RESOLVED, link=3) == f"claim {chain!r} has 2 link(s), not 3"
    assert cite("nonesuch", HOLDS) == "study digits-check has no claim 'nonesuch'"


def test_study_docs_says_which_citation_a_new_verdict_contradicts(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_study import put_values

    (tmp_path / "studies").mkdir()
    (tmp_path / "docs").mkdir()
    path = write_study(tmp_path / "studies", DIGITS_STUDY, "digits.yaml")
    put_values(tmp_path / "studies" / "store", path, "cpu",
               {("fl-proto", "IID 1-shot", 0): 0.60, ("fl-proto", "IID 1-shot", 1): 0.62,
                (CONTROL, "IID 1-shot", 0): 0.50, (CONTROL, "IID 1-shot", 1): 0.51})
    page = tmp_path / "docs" / "page.md"
    page.write_text("Training helps [claim: digits-check#iid-1-shot:fl-proto>control = holds].\n")
    code, out, err = run_cli(["study", "docs", "--root", str(tmp_path)], capsys)
    assert code == 0, err
    page.write_text("Training does not help [claim: digits-check#iid-1-shot:fl-proto>control = not resolved].\n")
    code, out, err = run_cli(["study", "docs", "--root", str(tmp_path)], capsys)
    assert code == 1 and "docs/page.md:1:" in err and "the store gives 'holds'" in err


# -- the committed docs -------------------------------------------------------------------------------
def test_every_citation_in_the_docs_agrees_with_the_store() -> None:
    """Each ``[claim: ...]`` of every docs page states the verdicts the committed store gives: when new
    runs move a cited claim's verdict, this fails until the sentence is rewritten."""
    count, problems = check_pages(REPO)
    assert not problems, "\n".join(map(str, problems))
    assert count >= 40


#: A sentence that states a claim's verdict (the claims' vocabulary) ...
VERDICT = re.compile(r"\bnot resolved\b|\breversed\b|\bholds?\b")
#: ... except where "hold" means "contain" or the sentence states the rule itself, not a result.
NOT_A_VERDICT = re.compile(
    r"pages hold|participants? holds?|summary(\.json`?)? (also )?holds|data hold|store holds|hold the paper's|"
    r"holds the ranks|A whole order holds only|a claim \*\*holds\*\* only when|their claims \"not resolved\"|"
    r"\"not resolved\" verdict at this scale|intervals of the differences hold 0|hold its|holds a|holds the|"
    r"holds,? per|groups? holds?|order holds|process holds")


def _prose_sentences(text: str) -> list[str]:
    """The sentences of a page outside generated blocks, code, tables and headings."""
    text = re.sub(r"<!-- stud(?:y|ies):(\S+) begin -->.*?<!-- stud(?:y|ies):\1 end -->", "", text, flags=re.DOTALL)
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    sentences = []
    for paragraph in re.split(r"\n\s*\n", text):
        if paragraph.lstrip().startswith(("|", "#")):
            continue
        prose = " ".join(re.sub(r"`[^`]*`", "`code`", paragraph).split())
        sentences += re.split(r"(?<=[.!?])\s+(?=[A-Z*(\[])", prose)
    return sentences


def test_a_reading_that_states_a_verdict_cites_the_claim() -> None:
    """Every sentence of a study page's prose that states a verdict (holds, reversed, not resolved) cites
    the claim row that computes it; the check above then keeps the two equal."""
    uncited = [f"{page}: {sentence}" for page in READING_PAGES
               for sentence in _prose_sentences((REPO / "docs" / page).read_text())
               if VERDICT.search(NOT_A_VERDICT.sub("", sentence)) and "[claim:" not in sentence]
    assert not uncited, "cite the claim ([claim: STUDY#ID = VERDICT]):\n" + "\n".join(uncited)


def test_the_sentences_issue_39_found_wrong_are_fixed() -> None:
    pages = {name: " ".join((REPO / "docs" / name).read_text().split()) for name in READING_PAGES}
    # the untrained FL-MAML against every trained F2L: each cell cited (the combination re-chosen on
    # validation tasks is below it by the raw test in both, issue 39 item 3), no sweeping sentence
    for name in ("results.md", "f2l.md"):
        assert "is above every trained F2L" not in pages[name]
        assert "#iid-1-shot:combination>fl-maml-untrained = reversed; Holm: not resolved]" in pages[name]
        assert "#non-iid-1-shot:combination>fl-maml-untrained = reversed; Holm: not resolved]" in pages[name]
    assert "only the larger steps end above their own untrained start" not in pages["frl.md"]
    assert "gives the same picture" not in pages["adfl.md"]
    assert "FedFSL's adversarial MI-Adv is below plain FL-MAML on HuffPost" not in pages["benchmark.md"]
    assert "#huffpost-non-iid-1-shot:fedfsl-mi-adv>fedfsl-naive =" in pages["benchmark.md"]


def test_results_leads_with_the_largest_budget_that_ran() -> None:
    """In docs/results.md a study shown at several budgets shows first the one whose runs are longest
    (the mean wall time of its stored runs): the paper budget's verdicts before the cpu budget's."""
    text = (REPO / "docs" / "results.md").read_text()
    order: dict[str, list[str]] = {}
    for name, at, _view in MARKER.findall(text):
        order.setdefault(name, []).append(at[1:] if at else "")
    studies = {study.name: (study, root) for study, root in map(load_study, study_files(REPO))}
    several = {name: budgets for name, budgets in order.items() if len(budgets) > 1}
    assert several  # fedfsl-table3, f2l-table1-huffpost, frl-femnist
    for name, budgets in several.items():
        study, root = studies[name]
        seconds = []
        for budget in budgets:
            results = collect(study, root, root / "studies" / "store", budget or None)
            assert results.run_records, f"{name}@{budget} has not run"
            seconds.append(float(np.mean([r.get("wall_seconds", 0.0) for r in results.run_records])))
        assert seconds == sorted(seconds, reverse=True), f"{name}: {list(zip(budgets, seconds))}"
