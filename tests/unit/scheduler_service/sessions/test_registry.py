"""The session registry's memory of ended sessions (a retried close)."""

from __future__ import annotations

import pytest

from ortserve.status.errors import DomainError, ErrorReason
from scheduler_service.sessions import registry as registry_module
from scheduler_service.sessions.registry import Session, SessionRegistry


def session(i: int | str) -> Session:
    return Session(session_id=f"s{i}", worker_id="w1", address="w1:1", lease_id=f"l{i}")


def test_a_closed_session_is_remembered_as_ended_and_a_never_opened_one_is_not():
    registry = SessionRegistry()
    registry.add(session(1))
    assert not registry.ended("s1")
    registry.remove("s1")
    assert registry.ended("s1")  # a retried close answers closed=false
    assert not registry.ended("never-opened")  # NOT_FOUND: a typo stays loud
    with pytest.raises(DomainError) as caught:
        registry.get("s1")
    assert caught.value.reason == ErrorReason.SESSION_NOT_FOUND


def test_a_session_lost_with_its_worker_has_ended_too():
    registry = SessionRegistry()
    registry.add(session(2))
    registry.mark_lost(session(2), "died")
    assert registry.ended("s2")


def test_the_memory_of_closed_ids_is_bounded_oldest_first(monkeypatch):
    monkeypatch.setattr(registry_module, "CLOSED_KEPT", 3)
    registry = SessionRegistry()
    for i in range(5):
        registry.add(session(i))
        registry.remove(f"s{i}")
    assert [registry.ended(f"s{i}") for i in range(5)] == [False, False, True, True, True]
