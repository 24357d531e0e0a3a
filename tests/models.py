"""Where the tests find prepared model folders (`make model`, `make tiny-model`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.cluster import model_cache


def prepared_model_dir(name: str) -> Path:
    """The folder of a prepared model, or skip the test saying how to prepare it."""
    path = model_cache().expanduser() / "models" / name
    if not (path / "ortserve-model.json").is_file():
        pytest.skip(f"model folder {path} is not prepared (no ortserve-model.json): "
                    "run `make tiny-model` (or `make model`) first")
    return path
