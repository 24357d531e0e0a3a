"""The rendered overlay each manifest test runs against, once per overlay."""

from __future__ import annotations

import pytest

from tests.unit.deploy.k8s.manifests import OVERLAYS, render


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request) -> tuple[str, list[dict]]:
    return request.param, render(request.param)
