"""The README and docs/ hold together: every relative link lands, every tested
block is where its test reads it, and the README stays a newcomer's page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devtools.compose_cluster import DOCUMENTED_IN

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 400  # the two commands, the picture, the calls, the links

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The page without its fenced code blocks (a link inside one is an example)."""
    return _FENCE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a link may name on `page`: its headings' slugs (with GitHub's -1,
    -2 for repeats) and explicit <a id="..."> targets."""
    text = _prose(page.read_text(encoding="utf-8"))
    found: set[str] = set(re.findall(r'<a id="([^"]+)"', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def relative_links(page: Path) -> list[str]:
    return [t for t in _LINK.findall(_prose(page.read_text(encoding="utf-8")))
            if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_lands_on_a_file_and_an_anchor(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading or anchor #{anchor} in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    orphans = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"


def test_the_readme_stays_a_newcomers_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md is {lines} lines (at most {README_MAX_LINES}): move reference material "
        "into docs/ and link it")
    for needed in ("make run", "make test"):
        assert needed in (ROOT / "README.md").read_text(encoding="utf-8"), needed


# Each block that a test runs verbatim, and the page that test reads it from.
TESTED_BLOCKS = {
    "grpcurl-examples": "README.md",  # tests/e2e/paths/test_interop_e2e.py
    "grpcurl-secure-examples": "docs/operations/security.md",  # tests/e2e/operations/test_security_e2e.py
    "session-grpcurl-examples": "docs/features/sessions.md",  # tests/e2e/ledger/test_sessions_e2e.py
    **DOCUMENTED_IN,  # the compose blocks: devtools/compose_test.py, tests/unit/repo/test_dockerfile.py
}


@pytest.mark.parametrize(("marker", "page"), sorted(TESTED_BLOCKS.items()))
def test_each_tested_block_is_on_the_page_its_test_reads(marker, page):
    text = (ROOT / page).read_text(encoding="utf-8")
    assert re.search(rf"<!-- {marker} -->\s*```(?:bash|sh)?\n", text), (
        f"{page} lost its {marker} block")


def test_the_echo_limits_the_errors_page_states_are_the_codes():
    from ortserve.rules import request_rules
    from ortserve.status import errors
    text = " ".join((ROOT / "docs" / "errors.md").read_text(encoding="utf-8").split())
    assert f"to {errors.ECHO_LIMIT} characters in a message" in text
    assert f"to {errors.METADATA_ECHO_LIMIT} in ErrorInfo metadata" in text
    # The reason metadata echoes more: an id a request may carry comes back whole.
    longest_id = max(request_rules.MAX_LEASE_ID_CHARS, request_rules.MAX_WORKER_ID_CHARS)
    assert longest_id <= errors.METADATA_ECHO_LIMIT


def test_no_page_shows_a_deprecated_worker_flag():
    for page in PAGES:
        for old in ("--kv-budget", "ORTSERVE_WORKER_KV_BUDGET"):
            assert old not in page.read_text(encoding="utf-8"), f"{page.name} shows {old}"
