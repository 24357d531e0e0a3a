"""Fixtures shared by the engine's unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.models import prepared_model_dir


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return prepared_model_dir("tiny-llama")
