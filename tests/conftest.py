"""Fixtures every test tree shares (unit, service, e2e, model): defined once here, so that
pytest finds them under any folder of tests/ and no tree keeps its own copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.models import prepared_model_dir


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    """The prepared tiny-llama folder (`make tiny-model`), or skip saying how to prepare it."""
    return prepared_model_dir("tiny-llama")
