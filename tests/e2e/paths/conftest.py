"""The paths' e2e tests share one roomy cluster for the whole run (each test gets it drained)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import drained_roomy

roomy = pytest.fixture(drained_roomy, name="roomy")
