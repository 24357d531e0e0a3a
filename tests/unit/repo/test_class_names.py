"""One class per name in the tree (generated code under ortserve/v1 and tests aside): two
classes of one name make a reader, a traceback and a grep guess which is meant.

KNOWN holds the pairs that were here when this test came (issue 53), each to be renamed
by its own work; it may only shrink: a name in it that is no longer defined twice fails.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# name -> where it is defined (relative paths), as found when this test came.
KNOWN = {
    # The client's typed view of the proto message beside the ledger's domain type.
    "Admission": {"clients/python/ortserve_client/types.py", "scheduler_service/ledger/types.py"},
    "BudgetCap": {"ortserve/rpc/message_views.py", "scheduler_service/ledger/types.py"},
}


def skipped(parts: tuple[str, ...]) -> bool:
    return (parts[0] == "tests" or parts[:2] == ("ortserve", "v1")
            or any(p.startswith(".") or p in ("node_modules", "__pycache__") for p in parts))


def classes_by_name(root: Path = ROOT) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if skipped(rel.parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].add(rel.as_posix())
    return found


def test_no_two_classes_share_a_name():
    twice = {name: where for name, where in classes_by_name().items() if len(where) > 1}
    new = {name: sorted(where) for name, where in twice.items() if KNOWN.get(name) != where}
    assert new == {}, "rename so each name says what it holds (or, for a pair in KNOWN, "\
                      "update KNOWN: it may only shrink)"


def test_known_pairs_still_exist():
    """A pair renamed away leaves KNOWN with it."""
    found = classes_by_name()
    gone = sorted(name for name in KNOWN if len(found.get(name, ())) < 2)
    assert gone == []


def test_the_scan_sees_a_pair_and_skips_tests_and_generated_code(tmp_path):
    for rel in ("a/one.py", "b/two.py", "tests/t.py", "ortserve/v1/x_pb2.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("class Twice:\n    class Inner: ...\n")
    found = classes_by_name(tmp_path)
    assert found["Twice"] == {"a/one.py", "b/two.py"}
