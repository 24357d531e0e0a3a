"""docs/gateway.md's error table is the gateway's table: same rows, same HTTP status and
type, and every error.code the gateway can send for a status listed beside it (a page
that drifts names budget_busy for a full queue where the gateway sends queue_full).
Each documented code is also sent through from_grpc."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest

from gateway.reply.errors import _FALLBACK, SCHEDULER_UNAVAILABLE, STATUS_TABLE, from_grpc
from ortserve.status import rich_status
from ortserve.status.status_table import STATUS_OF_REASON
from tests.unit.gateway.reply.test_errors import FakeRpcError

PAGE = Path(__file__).resolve().parents[4] / "docs" / "gateway.md"
MARKER = "<!-- gateway-error-table -->"
ELSE = "anything else"
# Every ErrorInfo reason, with its one status (ortserve/status/status_table.py): the scheduler
# sends its own and relays its workers', so the gateway may see any of them.
SCHEDULER_REASONS = {str(reason): status for reason, status in STATUS_OF_REASON.items()}


def documented_rows() -> dict[tuple[str, str | None], tuple[int, str, set[str]]]:
    """(status name, reason or None) -> (HTTP status, error type, error codes) from the page."""
    text = PAGE.read_text(encoding="utf-8")
    assert MARKER in text, f"{PAGE.name} lost its {MARKER} table"
    lines = text.split(MARKER, 1)[1].strip().splitlines()
    rows = {}
    for line in lines[2:]:  # past the header and its rule
        if not line.startswith("|"):
            break
        status, http, kind, codes = (cell.strip() for cell in line.strip("|").split("|"))
        m = re.fullmatch(r"([A-Z_]+)(?: \(([A-Z_]+)\))?", status)
        key = (status, None) if status == ELSE else (m[1], m[2]) if m else (status, "?")
        rows[key] = (int(re.match(r"\d+", http)[0]), kind.strip("`"),
                     set(re.findall(r"`([a-z_]+)`", codes)))
    return rows


def code_table_rows() -> dict[tuple[str, str | None], tuple[int, str]]:
    return {(code.name, reason): answer for (code, reason), answer in STATUS_TABLE.items()}


def test_the_page_has_one_row_per_row_of_the_code_and_the_same_answers():
    documented = documented_rows()
    assert documented.pop((ELSE, None))[:2] == _FALLBACK
    assert {key: row[:2] for key, row in documented.items()} == code_table_rows()


@pytest.mark.parametrize("key", sorted(code_table_rows(), key=str), ids=str)
def test_each_row_lists_exactly_the_codes_the_gateway_sends(key):
    status, reason = key
    codes = documented_rows()[key][2]
    if reason is not None:  # a reason row: that reason
        assert codes == {reason.lower()}
        return
    # A status row: each reason the scheduler sends with that status and no row of its
    # own, and the bare status name (a status with no ErrorInfo, a deadline).
    expected = {r.lower() for r, s in SCHEDULER_REASONS.items()
                if s.name == status and (grpc.StatusCode[status], r) not in STATUS_TABLE}
    expected.add(status.lower())
    if status == "UNAVAILABLE":  # the gateway's own: no scheduler answered at all
        expected.add(SCHEDULER_UNAVAILABLE)
    assert codes == expected, f"docs/gateway.md's {status} row must list {sorted(expected)}"


def test_every_documented_code_is_what_the_gateway_answers():
    for (status, _reason), (http, kind, codes) in documented_rows().items():
        if status == ELSE:
            continue
        code = grpc.StatusCode[status]
        for listed in codes:
            details = [] if listed == status.lower() else [
                rich_status.error_info(listed.upper(), {})]
            error = from_grpc(FakeRpcError(code, "refused", details), "messages")
            assert (error.status, error.type, error.code) == (http, kind, listed)
