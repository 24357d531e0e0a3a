"""docs/api.md is generated from the protos' comments and kept up to date."""

from __future__ import annotations

from pathlib import Path

from devtools import api_docs

ROOT = Path(__file__).resolve().parents[3]


def test_docs_api_md_is_what_the_protos_generate(tmp_path):
    out = tmp_path / "api.md"
    assert api_docs.main(["--out", str(out)]) == 0
    committed = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert out.read_text(encoding="utf-8") == committed, (
        "docs/api.md is stale: run `make api-docs` and commit it")


def test_the_proto_comments_reach_the_reference():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert "### message `BudgetCap`" in text
    # BudgetCap's own comment, and one of its fields' (a table row).
    assert "How and why max_new_tokens was reduced." in text
    assert "| `admitted_max_new_tokens` | `uint32` |  | 2 | The ceiling that was admitted " \
        "and reserved. |" in text
    # Every service, RPC kind and label the protos use is rendered.
    for name in ("service `Scheduler`", "service `SchedulerInternal`", "service `Worker`",
                 "enum `CapPolicy`", "-> stream [`GenerateEvent`]", "| optional |",
                 "| repeated |", "oneof `prompt`"):
        assert name in text, name
    assert api_docs.render() == text  # deterministic: the same text twice
