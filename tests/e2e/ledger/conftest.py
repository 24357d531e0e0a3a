"""The ledger's e2e tests read the ledger: each starts on a drained one (no lease held,
nothing queued), whatever the test before it left to be released."""

from __future__ import annotations

import pytest

from devtools.cluster import LocalCluster
from tests.e2e.conftest import wait_drained


@pytest.fixture(autouse=True)
def ledger_drained(request):
    """Before each test: every cluster it is given (a shared module cluster above all)
    has drained."""
    for name in request.fixturenames:
        if name in ("request", "ledger_drained"):
            continue
        try:
            value = request.getfixturevalue(name)
        except pytest.FixtureLookupError:
            continue
        if isinstance(value, LocalCluster) and value.services:
            wait_drained(value)
