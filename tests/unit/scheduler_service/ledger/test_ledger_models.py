"""Several models behind one ledger: a request is placed only on its model's workers."""

from __future__ import annotations

import pytest

from ortserve.status.errors import DomainError, ErrorReason, InvalidField
from scheduler_service.ledger import placement
from scheduler_service.ledger.ledger import (
    AdmissionRequest,
    Cause,
    Decision,
    Ledger,
    WorkerGeometry,
)
from scheduler_service.ledger.queue import AdmissionQueue, Ticket

BPT = 1_000
TINY, SMOL = "tiny-llama", "smollm2-135m-instruct-int4"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def geometry(worker_id: str, model: str, capacity_tokens: int = 1_000) -> WorkerGeometry:
    return WorkerGeometry(worker_id=worker_id, address=f"{worker_id}:1", model=model,
                          context_length=4_096, bytes_per_token=BPT,
                          capacity_bytes=capacity_tokens * BPT)


def two_models(tiny_tokens: int = 1_000, smol_tokens: int = 100) -> tuple[Ledger, FakeClock]:
    """worker t serves TINY, worker s serves SMOL: s has far fewer free bytes than t."""
    clock = FakeClock()
    ledger = Ledger(clock=clock, lease_ttl_s=1e9, claim_ttl_s=1e9)
    ledger.register(geometry("t", TINY, tiny_tokens))
    ledger.register(geometry("s", SMOL, smol_tokens))
    return ledger, clock


def req(name: str, model: str, prompt: int = 20, max_new: int = 30, min_new: int = 0,
        strict: bool = False) -> AdmissionRequest:
    return AdmissionRequest(name, prompt_tokens=prompt, max_new_tokens=max_new,
                            min_new_tokens=min_new, strict=strict, model=model)


def test_a_request_goes_to_its_models_worker_even_when_another_has_more_free_bytes():
    ledger, _ = two_models()
    adm = ledger.admit(req("r", SMOL))
    # The defect: placement took the worker with the most free bytes (t, the tiny model).
    assert adm.decision is Decision.ADMITTED and adm.worker.worker_id == "s"
    assert adm.worker.model == SMOL
    assert ledger.admit(req("r2", TINY)).worker.worker_id == "t"


def test_a_request_is_capped_on_its_models_worker_not_moved_to_another_model():
    ledger, _ = two_models(smol_tokens=60)
    adm = ledger.admit(req("r", SMOL, prompt=20, max_new=100, min_new=1))
    assert adm.decision is Decision.CAPPED and adm.worker.worker_id == "s"
    assert adm.max_new_tokens == 40  # 60 - 20 on s, though t could take it whole


def test_a_full_models_worker_is_busy_though_another_models_worker_is_free():
    ledger, _ = two_models(smol_tokens=60)
    assert ledger.admit(req("hold", SMOL, prompt=50, max_new=10)).decision is Decision.ADMITTED
    adm = ledger.admit(req("r", SMOL, prompt=20, max_new=30, min_new=10))
    assert adm.decision is Decision.REJECTED and adm.rejection.cause is Cause.BUDGET_BUSY
    # The numbers are the model's worker's, not the idle tiny worker's.
    assert adm.rejection.capacity_bytes == 60 * BPT and adm.rejection.available_bytes == 0


def test_no_worker_of_the_model_left_is_no_worker_naming_the_model():
    ledger, clock = two_models()
    clock.now += 2e9  # s falls silent past its lease TTL; t keeps beating
    ledger.heartbeat("t")
    ledger.expire()
    adm = ledger.admit(req("r", SMOL))
    assert adm.decision is Decision.REJECTED and adm.rejection.cause is Cause.NO_WORKER
    assert SMOL in adm.rejection.message and adm.rejection.model == SMOL


def test_an_empty_model_in_the_ledger_is_any_worker_as_in_a_one_model_pool():
    ledger, _ = two_models()
    assert ledger.admit(req("r", "")).worker.worker_id == "t"  # the most free bytes


def test_resolve_model_names_the_served_models_on_every_refusal():
    served = {TINY, SMOL}
    assert placement.resolve_model(SMOL, served) == SMOL
    assert placement.resolve_model("", {TINY}) == TINY
    assert placement.resolve_model("anything", set()) == "anything"  # no worker: NO_WORKER later
    assert placement.resolve_model("", set()) == ""
    with pytest.raises(DomainError) as err:
        placement.resolve_model("gpt-4o", served)
    assert err.value.reason is ErrorReason.MODEL_NOT_FOUND
    assert TINY in err.value.message and SMOL in err.value.message and "gpt-4o" in err.value.message
    assert err.value.metadata["served_models"] == f"{SMOL},{TINY}"
    with pytest.raises(InvalidField) as err:
        placement.resolve_model("", served)
    assert err.value.field == "model" and TINY in err.value.message and SMOL in err.value.message


def test_a_session_opens_on_a_worker_of_its_model():
    ledger, _ = two_models()
    lease = ledger.open_session_lease("s1", SMOL)
    assert lease.worker_id == "s"
    assert ledger.open_session_lease("s2", "other") is None


def test_a_queued_request_waits_only_for_its_models_workers_and_never_blocks_another_model():
    ledger, clock = two_models(tiny_tokens=100, smol_tokens=100)
    queue = AdmissionQueue(ledger, max_length=8, max_wait_s=30.0, clock=clock)
    hold = queue.submit(req("hold", TINY, prompt=80, max_new=20))
    waiting = queue.submit(req("w", TINY, prompt=50, max_new=10, min_new=10))
    assert isinstance(waiting, Ticket)
    # A SMOL request arrives behind a waiting TINY one: its own line is empty, so it is
    # decided at once on its own worker (it does not queue behind another model's head).
    other = queue.submit(req("o", SMOL, prompt=50, max_new=10, min_new=10))
    assert not isinstance(other, Ticket) and other.worker.worker_id == "s"
    assert queue.place(waiting).position == 1
    # SMOL's bytes freeing up serves nothing of TINY's line.
    assert ledger.release(other.lease.lease_id) > 0
    assert queue.pump() == [] and not waiting.done
    assert ledger.release(hold.lease.lease_id) > 0
    assert queue.pump() == [waiting] and waiting.outcome.worker.worker_id == "t"


def test_a_blocked_head_of_one_model_lets_the_other_models_line_be_served():
    ledger, clock = two_models(tiny_tokens=100, smol_tokens=100)
    queue = AdmissionQueue(ledger, max_length=8, max_wait_s=30.0, clock=clock)
    queue.submit(req("hold-t", TINY, prompt=80, max_new=20))
    hold_s = queue.submit(req("hold-s", SMOL, prompt=80, max_new=20))
    t_wait = queue.submit(req("t", TINY, prompt=50, max_new=10, min_new=10))
    s_wait = queue.submit(req("s", SMOL, prompt=50, max_new=10, min_new=10))
    assert isinstance(t_wait, Ticket) and isinstance(s_wait, Ticket)
    assert queue.place(s_wait).position == 1  # first in its own line
    assert ledger.release(hold_s.lease.lease_id) > 0
    assert queue.pump() == [s_wait] and s_wait.outcome.worker.worker_id == "s"
    assert not t_wait.done
