"""The engine takes the decode path's bytes (bucket buffers, captured graphs) off the KV
capacity before anything is admitted, and refuses a capacity that cannot hold them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from worker_service.core.errors import InvalidWorkerField
from worker_service.engine.engine import Engine
from worker_service.runtime.decode_step import StepStats
from worker_service.runtime.kv_pool import HostBudget, KVPool


class _Layout:
    block_tokens = 1

    def bytes_for(self, max_tokens: int) -> int:
        return max_tokens


class _Engine:
    """What Engine._charge_decode_path reads of its engine: the runner's stats, the pool."""

    def __init__(self, capacity: int, stats: StepStats) -> None:
        self.runner = SimpleNamespace(step_stats=stats)
        self.kv = KVPool(_Layout(), capacity, HostBudget(0))
        self.closed: list[bool] = []

    @property
    def capacity_bytes(self) -> int:
        return self.kv.capacity_bytes

    def close(self) -> None:
        self.closed.append(True)


def _engine(capacity: int, stats: StepStats) -> _Engine:
    return _Engine(capacity, stats)


def test_the_measured_graph_bytes_and_buffers_come_off_the_capacity():
    stats = StepStats(graph_bytes=4_096, capture_bytes=1_000_000)
    fake = _engine(10_000_000, stats)
    Engine._charge_decode_path(fake)
    assert (fake.decode_buffer_bytes, fake.decode_graph_bytes) == (4_096, 1_000_000)
    assert fake.kv.capacity_bytes == 10_000_000 - 1_004_096 and not fake.closed


def test_a_capacity_that_cannot_hold_the_decode_path_is_refused_naming_both_figures():
    fake = _engine(1_000_000, StepStats(graph_bytes=4_096, capture_bytes=2_000_000))
    with pytest.raises(InvalidWorkerField, match=r"--kv-capacity") as error:
        Engine._charge_decode_path(fake)
    message = str(error.value)
    assert "2,004,096 bytes" in message and "1,000,000 bytes" in message
    assert "--cuda-graphs off" in message and fake.closed == [True]
    assert fake.kv.capacity_bytes == 1_000_000  # nothing taken


def test_a_runner_without_buckets_charges_nothing():
    fake = _engine(1_000, StepStats())
    fake.runner = SimpleNamespace()
    Engine._charge_decode_path(fake)
    assert fake.decode_buffer_bytes == fake.decode_graph_bytes == 0
    assert fake.kv.capacity_bytes == 1_000
