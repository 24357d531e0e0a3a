"""LoRA adapters in the ledger: listed per worker, placement only where one is loaded, an
unserved one NOT_FOUND before anything is reserved, and capacity moving by its bytes."""

from __future__ import annotations

import pytest

from ortserve.status.errors import DomainError, ErrorReason
from ortserve.v1 import scheduler_pb2, types_pb2
from scheduler_service import convert
from scheduler_service.ledger import placement
from scheduler_service.ledger.ledger import (
    AdmissionRequest,
    Cause,
    Decision,
    Ledger,
    WorkerGeometry,
)

BPT = 1_000
BASE = "tiny-llama-lora"


def geometry(worker_id: str, capacity_tokens: int, adapters=(), model: str = BASE) -> WorkerGeometry:
    return WorkerGeometry(worker_id=worker_id, address=f"{worker_id}:1", model=model,
                          context_length=4_096, bytes_per_token=BPT,
                          capacity_bytes=capacity_tokens * BPT, adapters=tuple(adapters))


def ledger_with(*geometries: WorkerGeometry) -> Ledger:
    ledger = Ledger(lease_ttl_s=1e9, claim_ttl_s=1e9)
    for g in geometries:
        ledger.register(g)
    return ledger


def req(name: str, adapter: str = "", prompt: int = 20, max_new: int = 30) -> AdmissionRequest:
    return AdmissionRequest(name, prompt_tokens=prompt, max_new_tokens=max_new, model=BASE,
                            adapter=adapter)


def test_a_request_naming_an_adapter_goes_to_the_worker_that_has_it_loaded():
    # b has far more free bytes; only a serves adapter "fr".
    ledger = ledger_with(geometry("a", 200, [("fr", 5_000)]), geometry("b", 2_000))
    assert ledger.admit(req("r", "fr")).worker.worker_id == "a"
    assert ledger.admit(req("base")).worker.worker_id == "b"  # the base: anywhere


def test_a_request_for_an_adapter_whose_workers_are_all_draining_waits_no_worker():
    ledger = ledger_with(geometry("a", 200, [("fr", 5_000)]), geometry("b", 2_000))
    ledger.heartbeat("a", draining=True)
    adm = ledger.admit(req("r", "fr"))
    assert adm.decision is Decision.REJECTED and adm.rejection.cause is Cause.NO_WORKER


def test_an_adapter_no_worker_serves_is_not_found_listing_the_served_per_model():
    ledger = ledger_with(geometry("a", 200, [("fr", 5_000), ("de", 5_000)]),
                         geometry("s", 200, [("legal", 1)], model="smol"))
    with pytest.raises(DomainError) as error:
        placement.resolve_adapter("es", BASE, ledger.snapshot())
    e = error.value
    assert e.reason is ErrorReason.MODEL_NOT_FOUND and e.field == "adapter"
    assert "'tiny-llama-lora': 'de', 'fr'" in e.message and "'smol': 'legal'" in e.message
    assert e.metadata["served_adapters"] == "de,fr"
    placement.resolve_adapter("fr", BASE, ledger.snapshot())  # served: no error
    placement.resolve_adapter("", BASE, ledger.snapshot())  # the base


def test_loading_takes_the_adapters_bytes_out_of_capacity_and_unloading_returns_them():
    ledger = ledger_with(geometry("a", 200))
    before = ledger.snapshot()[0].geometry.capacity_bytes
    g = ledger.resize_for_adapter("a", "fr", 32_768, loaded=True)
    assert g.capacity_bytes == before - 32_768 and g.adapters == (("fr", 32_768),)
    assert ledger.admit(req("r", "fr")).worker.worker_id == "a"
    g = ledger.resize_for_adapter("a", "fr", 32_768, loaded=False)
    assert g.capacity_bytes == before and g.adapters == ()


def test_a_load_the_leases_leave_no_room_for_is_refused_with_the_numbers_and_changes_nothing():
    ledger = ledger_with(geometry("a", 200))
    adm = ledger.admit(req("r", prompt=100, max_new=80))  # 180 of 200 tokens held
    assert adm.decision is Decision.ADMITTED
    with pytest.raises(DomainError) as error:
        ledger.resize_for_adapter("a", "fr", 30 * BPT, loaded=True)
    assert error.value.reason is ErrorReason.ADAPTER_NO_ROOM
    assert error.value.metadata["reserved_bytes"] == 180 * BPT
    assert error.value.metadata["capacity_bytes"] == 200 * BPT
    (w,) = ledger.snapshot()
    assert w.geometry.capacity_bytes == 200 * BPT and w.geometry.adapters == ()
    ledger.release(adm.lease.lease_id)
    assert ledger.resize_for_adapter("a", "fr", 30 * BPT, loaded=True).capacity_bytes == 170 * BPT


def test_the_budget_lists_each_workers_adapters_and_each_models():
    pb = scheduler_pb2.RegisterWorkerRequest(
        worker_id="a", address="a:1", model=BASE, context_length=4_096, bytes_per_token=BPT,
        capacity_bytes=200 * BPT, adapters=[types_pb2.LoraAdapter(name="fr", held_bytes=7),
                                            types_pb2.LoraAdapter(name="de", held_bytes=9)])
    ledger = ledger_with(convert.geometry_from_pb(pb), geometry("b", 100, [("es", 3)]))
    budget = convert.budget_to_pb(ledger.snapshot(), False, 0.0)
    assert [(a.name, a.held_bytes) for a in budget.workers[0].adapters] == [("de", 9), ("fr", 7)]
    assert list(budget.models[0].adapters) == ["de", "es", "fr"]


def test_a_session_naming_an_adapter_opens_on_a_worker_that_has_it():
    ledger = ledger_with(geometry("a", 200, [("fr", 5_000)]), geometry("b", 2_000))
    assert ledger.open_session_lease("s", BASE, adapter="fr").worker_id == "a"
    assert ledger.open_session_lease("t", BASE).worker_id == "b"  # the base: most free bytes
    assert ledger.open_session_lease("u", BASE, adapter="es") is None
