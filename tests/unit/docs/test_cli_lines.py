"""What the docs say the CLI prints, it prints on the path they name."""

from __future__ import annotations

import re
from pathlib import Path

from ortserve_client import cli

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks; a table row is a block of its own."""
    blocks = []
    for block in re.split(r"\n\s*\n", text):
        blocks.extend(block.splitlines() if block.lstrip().startswith("|") else [block])
    return blocks


def test_the_queued_line_is_shown_only_with_the_relayed_path_it_comes_on():
    # Issue 52 item 11: the default (two-step) path waits inside one unary Admit, which has
    # no Queued events, so it prints no QUEUED line; architecture.md and troubleshooting.md
    # showed it as what the CLI prints.
    showing = [(page.relative_to(ROOT), block) for page in PAGES
               for block in _paragraphs(page.read_text(encoding="utf-8"))
               if "QUEUED for KV budget" in block]
    assert showing, "no page shows the QUEUED line: this test reads nothing"
    unqualified = [str(page) for page, block in showing if "--no-direct" not in block]
    assert not unqualified, f"the QUEUED line shown without its path (--no-direct): {unqualified}"
    assert "--no-direct" in cli.__doc__ and "queue_wait_ms" in cli.__doc__
