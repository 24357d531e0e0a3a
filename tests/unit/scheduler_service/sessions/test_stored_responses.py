"""The scheduler's stored responses (pure): heads, claims, and forgetting by count and time.
(Moved with the store from the gateway, whose process memory held them.)"""

from __future__ import annotations

from scheduler_service.sessions.stored_responses import Record, StoredResponses


def _record(response_id: str, session: str = "s1", ttl_s: float = 3_600.0) -> Record:
    return Record(response_id, session, b"{}", ttl_s)


def test_only_a_sessions_latest_response_continues_it_one_turn_at_a_time():
    store = StoredResponses()
    store.put(_record("r1"))
    assert store.claim("r1") == "s1"
    assert store.claim("r1") == ""  # busy: a second follow-up opens its own session
    assert store.turn_ended("s1", kept=True) == []
    store.put(_record("r2"))
    assert store.claim("r1") == ""  # r1 is no longer the head: a fork
    assert store.claim("r2") == "s1"
    assert store.turn_ended("s1", kept=False) == ["s1"]  # cut short: closed, no head
    assert store.claim("r2") == ""
    assert store.claim("nothing") == ""


def test_forgetting_a_head_closes_its_session_by_count_and_by_time():
    now = [0.0]
    store = StoredResponses(clock=lambda: now[0])
    assert store.put(_record("a", "s1", ttl_s=10), max_responses=2) == []
    assert store.put(_record("b", "s2", ttl_s=10)) == []
    assert store.put(_record("c", "", ttl_s=10)) == ["s1"]  # a pushed out by count
    now[0] = 11.0
    assert store.expire() == ["s2"] and len(store) == 0
    assert store.get("b") is None


def test_deleting_a_head_closes_its_session_and_an_older_one_does_not():
    store = StoredResponses()
    store.put(_record("r1"))
    store.put(_record("r2"))
    assert store.delete("r1") == (True, [])
    assert store.delete("r2") == (True, ["s1"])
    assert store.delete("r2") == (False, [])


def test_another_tenants_record_is_absent_to_read_delete_continue_or_overwrite():
    store = StoredResponses()
    mine = Record("r1", "s1", b"{}", 3_600.0, tenant="acme")
    assert store.put(mine) == []
    assert store.get("r1", "other") is None and store.get("r1") is None
    assert store.claim("r1", "other") == ""
    assert store.delete("r1", "other") == (False, [])
    assert store.put(Record("r1", "s9", b"{}", 3_600.0, tenant="other")) is None
    assert store.turn_ended("s1", kept=False, tenant="other") == []
    assert store.get("r1", "acme") is mine
    assert store.claim("r1", "acme") == "s1"
    assert store.turn_ended("s1", kept=False, tenant="acme") == ["s1"]
    assert store.delete("r1", "acme") == (True, [])
