"""The engine on the tiny model that the engine's lifecycle tests share, one per test
module, and the chat prompt they send it."""

from __future__ import annotations

import pytest

from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine


@pytest.fixture(scope="module")
def engine(tiny_dir):
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2)) as eng:
        yield eng


@pytest.fixture(scope="module")
def prompt(engine) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode_chat([("user", "Tell me a long story.")]))
