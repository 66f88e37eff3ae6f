"""CITATION.cff is valid Citation File Format 1.2.0 (against the format's own JSON schema,
tests/cff/schema-1.2.0.json, and by the rules GitHub's "Cite this repository" reads), its version and licence are pyproject.toml's, and its five
references are docs/cite.md's papers, with the titles the papers' own texts give."""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CFF = yaml.safe_load((REPO / "CITATION.cff").read_text())
CITE = (REPO / "docs" / "cite.md").read_text()
PAPERS = Path(os.environ.get("FEDFEW_SHARED_DATA", REPO.parent / "shared" / "data")).parent / "papers"
#: CFF 1.2.0's reference types (schema.json, definitions.reference.type.enum), the ones used here.
REFERENCE_TYPES = {"article", "conference-paper", "book", "report", "software", "thesis", "generic"}
PERSON_KEYS = {"family-names", "given-names", "name-particle", "name-suffix", "affiliation", "email", "orcid",
               "website", "alias", "address", "city", "country", "fax", "post-code", "region", "tel"}
ENTITY_KEYS = {"name", "address", "city", "country", "email", "website", "orcid", "alias", "date-start",
               "date-end", "location", "region", "tel", "fax", "post-code"}


def test_citation_cff_validates_against_the_cff_1_2_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="the docs extra (nbformat requires jsonschema)")
    schema = json.loads((REPO / "tests" / "cff" / "schema-1.2.0.json").read_text())
    # As CFF tools read the file: YAML's dates and numbers as the strings the schema describes.
    document = json.loads(json.dumps(CFF, default=str))
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(document), key=lambda e: list(e.path))
    assert not errors, [(list(e.path), e.message[:200]) for e in errors[:5]]
    broken = json.loads(json.dumps({**document, "authors": [{"nickname": "x"}]}))
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken)), "the schema check catches a bad author"


def check_authors(authors: object, where: str) -> None:
    assert isinstance(authors, list) and authors, f"{where}: authors must be a non-empty list"
    for author in authors:
        assert isinstance(author, dict), where
        keys = set(author)
        person = "family-names" in keys or "given-names" in keys
        assert (keys <= PERSON_KEYS) if person else ("name" in keys and keys <= ENTITY_KEYS), (where, author)
        assert all(isinstance(v, str) and v.strip() for v in author.values()), (where, author)


def test_citation_cff_has_the_required_fields_of_cff_1_2() -> None:
    assert CFF["cff-version"] == "1.2.0"
    for key in ("message", "title", "authors"):  # required by the schema
        assert isinstance(CFF.get(key), str | list) and CFF[key], key
    check_authors(CFF["authors"], "authors")
    assert CFF["type"] in ("software", "dataset")
    allowed = {"abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi", "identifiers",
               "keywords", "license", "license-url", "message", "preferred-citation", "references", "repository",
               "repository-artifact", "repository-code", "title", "type", "url", "version"}
    assert set(CFF) <= allowed, set(CFF) - allowed  # the schema allows no other top-level key
    if "date-released" in CFF:
        assert isinstance(CFF["date-released"], datetime.date)


def test_version_and_licence_are_pyprojects() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()  # (tomllib is Python 3.11's; fedfew runs on 3.10)
    project = pyproject[pyproject.index("[project]"):]
    version = re.search(r'^version = "([^"]+)"$', project, flags=re.M)
    licence = re.search(r'^license = "([^"]+)"$', project, flags=re.M)
    assert version and licence
    assert str(CFF["version"]) == version.group(1) and CFF["license"] == licence.group(1)


def test_references_are_the_five_papers_of_the_cite_page() -> None:
    references = CFF["references"]
    assert len(references) == 5
    for ref in references:
        assert ref["type"] in REFERENCE_TYPES and isinstance(ref["title"], str)
        check_authors(ref["authors"], ref["title"])
        assert isinstance(ref["year"], int) and 2019 <= ref["year"] <= 2023
        if "doi" in ref:
            assert re.fullmatch(r"10\.\d{4,9}/\S+", str(ref["doi"])), ref["doi"]
            assert str(ref["doi"]) in CITE
        assert ref["title"] in CITE, ref["title"]
    headings = re.findall(r"^### (\w+):", CITE, flags=re.M)
    assert headings == ["FedFSL", "F2L", "FML", "FRL", "AdFL"]
    assert [ref["notes"].split(":")[0] for ref in references] == headings


def _flat(text: str) -> str:
    return " ".join(re.sub(r"[*_<>]", "", text).split())


@pytest.mark.skipif(not PAPERS.is_dir(), reason="the papers' texts are in ../shared/papers on the project's machines")
def test_titles_and_quoted_references_are_the_papers_own() -> None:
    texts = [_flat(p.read_text()) for p in sorted(PAPERS.glob("00*.txt"))]
    assert len(texts) == 5
    for ref, text in zip(CFF["references"], texts):  # the papers' files are in the cite page's order
        assert ref["title"].lower() in text.lower(), ref["title"]
    # The reference lines the cite page quotes as printed are in the papers' texts, word for word.
    for quoted in re.findall(r"^> (.+)$", CITE, flags=re.M):
        assert any(_flat(quoted) in text for text in texts), quoted
