"""MkDocs hooks of the site (mkdocs.yml ``hooks``): the pages stay as they read on GitHub; only how
they render changes.

- A claim citation (``[claim: STUDY#ID = holds]``, fedfew.study.citations) renders as a small labelled
  span, not as Markdown link syntax: two citations side by side would otherwise read as a reference
  link (``[text][label]``) and fail the strict build.
"""

from __future__ import annotations

import html
import re
from typing import Any

from fedfew.study.citations import CITATION, _without_code


def render_citations(markdown: str) -> str:
    """``markdown`` with every citation outside code replaced by a ``<span class="claim">``."""
    prose = _without_code(markdown)
    pieces, last = [], 0
    for match in CITATION.finditer(prose):
        text = markdown[match.start():match.end()]
        verdict = match["holm"] or match["raw"]
        pieces += [markdown[last:match.start()],
                   f'<span class="claim claim-{verdict.replace(" ", "-")}" '
                   f'title="checked against the store by tests/study/test_citations.py">{html.escape(text[1:-1])}</span>']
        last = match.end()
    return "".join(pieces) + markdown[last:]


#: A Sphinx role before the inline code mkdocstrings renders it as.
ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):(?=<code>)")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return render_citations(markdown)


def on_page_content(html_text: str, page: Any, **kwargs: Any) -> str:
    if not page.file.src_uri.startswith("reference/"):
        return html_text
    return ROLE.sub("", html_text)


__all__ = ["on_page_content", "on_page_markdown", "render_citations"]
