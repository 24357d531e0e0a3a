"""GenerateRequest.preferred_worker_id: among the workers that take a request whole, the
preferred one wins after a free batch row and before the rest; it never changes a decision."""

from __future__ import annotations

from scheduler_service.ledger.ledger import AdmissionRequest, Decision, Ledger, WorkerGeometry

BPT = 1_000


def ledger_with(**capacity_tokens: int) -> Ledger:
    ledger = Ledger(lease_ttl_s=1e9, claim_ttl_s=1e9)
    for worker_id, tokens in capacity_tokens.items():
        ledger.register(WorkerGeometry(worker_id=worker_id, address=f"{worker_id}:1", model="m",
                                       context_length=4_096, bytes_per_token=BPT,
                                       capacity_bytes=tokens * BPT))
    return ledger


def req(name: str, prefer: str = "", tokens: int = 100) -> AdmissionRequest:
    return AdmissionRequest(name, prompt_tokens=tokens // 2, max_new_tokens=tokens // 2,
                            model="m", preferred_worker=prefer)


def test_the_preferred_worker_wins_over_more_free_bytes_while_it_fits_whole():
    ledger = ledger_with(big=1_000, small=300)
    assert ledger.admit(req("plain")).worker.worker_id == "big"
    assert ledger.admit(req("hinted", prefer="small")).worker.worker_id == "small"
    # small has 200 tokens left: a 250-token request does not fit it whole, so it goes
    # where it does, ADMITTED as without the hint (never CAPPED to stay there).
    admission = ledger.admit(req("large", prefer="small", tokens=250))
    assert (admission.decision, admission.worker.worker_id) == (Decision.ADMITTED, "big")


def test_an_unknown_preference_is_no_preference():
    ledger = ledger_with(big=1_000, small=300)
    assert ledger.admit(req("r", prefer="gone")).worker.worker_id == "big"


def test_a_session_opens_on_the_preferred_worker_and_an_unknown_one_is_no_preference():
    ledger = ledger_with(big=1_000, small=300)
    assert ledger.open_session_lease("plain", "m").worker_id == "big"
    assert ledger.open_session_lease("hinted", "m", preferred_worker="small").worker_id == "small"
    assert ledger.open_session_lease("gone", "m", preferred_worker="gone").worker_id == "big"

