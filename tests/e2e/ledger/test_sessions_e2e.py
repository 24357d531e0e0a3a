"""Multi-turn sessions through real processes on the default model.

A scheduler and one CPU worker each; turns go through Scheduler.SessionTurn as
any gRPC client would send them. Greedy chat turns: the default model answers
a chat question with a short sentence, then EOS.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time

import grpc
import pytest

from ortserve.v1 import scheduler_pb2, types_pb2, worker_pb2
from tests.e2e.conftest import (
    BIN,
    ROOT,
    grpcurl,
    kill_and_restart_scheduler,
    reserved_bytes,
    scheduler_stub,
    start_cluster,
    worker_held_bytes,
    worker_stub,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

Q1 = "What is the capital of France? Answer in one sentence."
Q2 = "And what is the capital of Italy?"


def chat(*turns: tuple[str, str]) -> types_pb2.ChatMessages:
    return types_pb2.ChatMessages(messages=[types_pb2.ChatMessage(role=r, content=c)
                                            for r, c in turns])


def session_turn(stub, session_id: str, question: str, **fields):
    events = list(stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
        session_id=session_id,
        request=types_pb2.GenerateRequest(chat=chat(("user", question)), **fields)), timeout=120))
    assert events[0].WhichOneof("event") == "admission"
    assert events[-1].WhichOneof("event") == "finished"
    ids = [t for e in events if e.WhichOneof("event") == "chunk" for t in e.chunk.token_ids]
    text = "".join(e.chunk.text for e in events if e.WhichOneof("event") == "chunk")
    return events[0].admission, events[-1].finished, ids, text


def generate(stub, messages: types_pb2.ChatMessages, **fields):
    events = list(stub.Generate(types_pb2.GenerateRequest(chat=messages, **fields), timeout=120))
    ids = [t for e in events if e.WhichOneof("event") == "chunk" for t in e.chunk.token_ids]
    return events[0].admission, events[-1].finished, ids


def get(stub, session_id: str) -> types_pb2.SessionInfo:
    return stub.GetSession(scheduler_pb2.SessionRequest(session_id=session_id), timeout=10)


def open_session(stub) -> types_pb2.SessionInfo:
    return stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=30)


@pytest.fixture(scope="module")
def roomy(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, "sessions", kv_capacities=["512MiB"])
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """16 MiB of KV: 352 tokens of the default model (46,080 bytes/token, 16-token blocks)."""
    cluster = start_cluster(tmp_path_factory, "sessions-tight", kv_capacities=["16MiB"],
                            scheduler_args=["--session-ttl-s", "8", "--heartbeat-interval-s",
                                            "0.5", "--lease-ttl-s", "3"])
    yield cluster
    cluster.stop()


def test_turn_two_reuses_the_kept_kv_and_equals_a_fresh_run(roomy):
    stub = scheduler_stub(roomy.address)
    opened = open_session(stub)
    assert opened.worker_id == "worker-0" and opened.state == types_pb2.SESSION_EMPTY
    _, f1, ids1, text1 = session_turn(stub, opened.session_id, Q1, max_new_tokens=48)
    assert f1.usage.reused_prompt_tokens == 0 and ids1
    held = f1.session.held_tokens
    assert held == f1.usage.prompt_tokens + f1.usage.generated_tokens - 1
    # The lease shrank to what is held before Finished went out: the ledger and the worker agree.
    assert f1.session.state == types_pb2.SESSION_RESIDENT
    assert f1.session.reserved_bytes == f1.session.held_bytes == reserved_bytes(roomy.address)
    # The worker's Info lists what the idle session holds, under its lease (rule 8 per lease).
    info = worker_stub(roomy.worker_services[0].address).Info(worker_pb2.InfoRequest(), timeout=5)
    assert [(h.lease_id, h.session_id, h.held_bytes) for h in info.held_leases] == [
        (f1.session.lease_id, opened.session_id, f1.session.held_bytes)]
    _, f2, ids2, _ = session_turn(stub, opened.session_id, Q2, max_new_tokens=48)
    # Turn 2 prefilled only what it added: everything up to the reply's end was reused.
    assert f2.usage.reused_prompt_tokens >= f1.usage.prompt_tokens
    assert f2.usage.reused_prompt_tokens <= held
    _, fresh, fresh_ids = generate(stub, chat(("user", Q1), ("assistant", text1), ("user", Q2)),
                                   max_new_tokens=48)
    assert fresh.usage.prompt_tokens == f2.usage.prompt_tokens
    assert ids2 == fresh_ids
    assert get(stub, opened.session_id).turns == 2
    closed = stub.CloseSession(scheduler_pb2.SessionRequest(session_id=opened.session_id),
                               timeout=30)
    assert closed.closed and closed.freed_bytes == f2.session.reserved_bytes > 0
    assert reserved_bytes(roomy.address) == 0
    assert worker_held_bytes(roomy.worker_services[0].address) == 0
    with pytest.raises(grpc.RpcError) as info:
        get(stub, opened.session_id)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_swapped_out_session_continues_with_identical_tokens(roomy):
    stub = scheduler_stub(roomy.address)
    sid = open_session(stub).session_id
    _, f1, _, text1 = session_turn(stub, sid, Q1, max_new_tokens=48)
    swapped = stub.SwapOutSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
    assert swapped.state == types_pb2.SESSION_SWAPPED and swapped.held_bytes == 0
    assert swapped.held_tokens == f1.session.held_tokens and swapped.swapped_bytes > 0
    assert swapped.reserved_bytes == 0 == reserved_bytes(roomy.address)
    # The host tier, apart from the KV capacity: the swapped copy's bytes, exactly.
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    assert budget.total_host_bytes == budget.workers[0].host_bytes == swapped.swapped_bytes
    _, f2, ids2, _ = session_turn(stub, sid, Q2, max_new_tokens=48)
    assert f2.usage.reused_prompt_tokens >= f1.usage.prompt_tokens
    assert f2.session.state == types_pb2.SESSION_RESIDENT
    _, _, fresh_ids = generate(stub, chat(("user", Q1), ("assistant", text1), ("user", Q2)),
                               max_new_tokens=48)
    assert ids2 == fresh_ids
    stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
    assert reserved_bytes(roomy.address) == 0


def test_concurrent_turn_and_context_overflow_are_errors_with_numbers(roomy):
    stub = scheduler_stub(roomy.address)
    sid = open_session(stub).session_id
    first = stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
        session_id=sid, request=types_pb2.GenerateRequest(chat=chat(("user", Q1)),
                                                          max_new_tokens=64, min_new_tokens=64)))
    next(first)  # its Admission: the turn is in flight
    with pytest.raises(grpc.RpcError) as info:
        session_turn(stub, sid, Q2)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "one at a time" in info.value.details()
    list(first)
    before = reserved_bytes(roomy.address)
    too_long = "word " * 9000
    with pytest.raises(grpc.RpcError) as info:
        session_turn(stub, sid, too_long, max_new_tokens=16)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "context window of 8,192 tokens" in info.value.details()
    assert "of earlier turns" in info.value.details()
    assert reserved_bytes(roomy.address) == before  # nothing grew, nothing was written
    assert get(stub, sid).state == types_pb2.SESSION_RESIDENT
    stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)


def test_ortserve_chat_scripted_reuses_the_history_and_reports_it(roomy, tmp_path):
    script = tmp_path / "turns.txt"
    script.write_text(f"{Q1}\n\n{Q2}\n")
    done = subprocess.run([str(BIN / "ortserve"), "--address", roomy.address, "--timeout", "120",
                           "chat", "--script", str(script), "--max-new-tokens", "40", "--stats"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    replies = done.stdout.splitlines()
    assert len(replies) == 2 and all(replies), done.stdout  # stdout: the replies only
    reused = [int(n) for n in re.findall(r"reused_prompt_tokens=(\d+)", done.stderr)]
    assert len(reused) == 2 and reused[0] == 0 and reused[1] > 0, done.stderr
    assert "session_state=resident" in done.stderr and "closed" in done.stderr
    assert reserved_bytes(roomy.address) == 0  # the CLI closed its session


def test_the_docs_grpcurl_session_commands_work_through_reflection(roomy):
    text = (ROOT / "docs" / "features" / "sessions.md").read_text()
    block = re.search(r"<!-- session-grpcurl-examples -->\s*```bash\n(.*?)```", text, re.S)
    commands = [line for line in block.group(1).splitlines() if line.startswith("grpcurl ")]
    assert len(commands) == 5
    outputs, session_id = [], ""
    for command in commands:
        command = command.replace("localhost:50051", roomy.address).replace("SESSION", session_id)
        argv = shlex.split(command)
        argv[0] = grpcurl()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (command, done.stderr)
        outputs.append(done.stdout)
        session_id = session_id or json.loads(done.stdout)["session_id"]
    second_turn = [json.loads(part) for part in re.split(r"(?<=})\n(?={)", outputs[2].strip())]
    assert int(second_turn[-1]["finished"]["usage"]["reused_prompt_tokens"]) > 0
    assert json.loads(outputs[3])["state"] == "SESSION_RESIDENT"
    assert reserved_bytes(roomy.address) == 0


def test_budget_cap_survives_swap_out_and_swap_in(tight):
    stub = scheduler_stub(tight.address)
    sid = open_session(stub).session_id
    adm1, f1, _, _ = session_turn(stub, sid, Q1, max_new_tokens=2000)
    assert adm1.decision == types_pb2.CAPPED and adm1.budget_cap.requested_max_new_tokens == 2000
    assert f1.budget_cap == adm1.budget_cap and f1.session.last_budget_cap == adm1.budget_cap
    swapped = stub.SwapOutSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
    assert swapped.state == types_pb2.SESSION_SWAPPED
    assert swapped.last_budget_cap == adm1.budget_cap  # the seed's bug: cleared on swap
    assert get(stub, sid).last_budget_cap == adm1.budget_cap
    adm2, f2, _, _ = session_turn(stub, sid, Q2, max_new_tokens=2000)  # swaps in
    # The ceiling in effect is the one reported, everywhere.
    assert adm2.decision == types_pb2.CAPPED
    assert f2.budget_cap == adm2.budget_cap
    assert f2.usage.max_new_tokens == adm2.budget_cap.admitted_max_new_tokens
    assert f2.usage.reused_prompt_tokens > 0
    after = get(stub, sid)
    assert after.state == types_pb2.SESSION_RESIDENT and after.last_budget_cap == adm2.budget_cap
    stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
    assert reserved_bytes(tight.address) == 0


def test_idle_session_is_reclaimed_under_pressure_and_its_next_turn_works(tight):
    stub = scheduler_stub(tight.address)
    sid = open_session(stub).session_id
    _, f1, _, _ = session_turn(stub, sid, Q1, max_new_tokens=48)
    held_bytes = f1.session.reserved_bytes
    assert held_bytes > 0
    # Whole only if the idle session's bytes come back: the scheduler swaps it out first.
    capacity = 16 * 2**20
    budget_tokens = capacity // 46_080 // 16 * 16
    adm, _, _ = generate(stub, chat(("user", Q2)), max_new_tokens=budget_tokens - 64)
    assert adm.decision == types_pb2.ADMITTED, adm
    assert get(stub, sid).state == types_pb2.SESSION_SWAPPED
    _, f2, ids2, _ = session_turn(stub, sid, "Thanks. Say it again.", max_new_tokens=32)
    assert ids2 and f2.usage.reused_prompt_tokens >= f1.usage.prompt_tokens
    stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
    assert reserved_bytes(tight.address) == 0


def test_idle_session_expires_after_the_ttl_and_releases(tight):
    stub = scheduler_stub(tight.address)
    sid = open_session(stub).session_id
    session_turn(stub, sid, Q1, max_new_tokens=16)
    assert reserved_bytes(tight.address) > 0
    deadline = time.monotonic() + 30
    while reserved_bytes(tight.address) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert reserved_bytes(tight.address) == 0
    assert worker_held_bytes(tight.worker_services[0].address) == 0
    with pytest.raises(grpc.RpcError) as info:
        get(stub, sid)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_session_whose_worker_died_answers_clearly_and_holds_nothing(tight):
    stub = scheduler_stub(tight.address)
    sid = open_session(stub).session_id
    session_turn(stub, sid, Q1, max_new_tokens=16)
    worker = tight.worker_services[0]
    worker.process.kill()
    worker.process.wait(10)
    deadline = time.monotonic() + 30
    while reserved_bytes(tight.address) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert reserved_bytes(tight.address) == 0
    with pytest.raises(grpc.RpcError) as info:
        session_turn(stub, sid, Q2)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "its KV is gone and the ledger holds nothing for it" in info.value.details()


def test_a_cancelled_turn_keeps_what_it_computed_and_the_ledger_matches(roomy):
    stub = scheduler_stub(roomy.address)
    sid = open_session(stub).session_id
    call = stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
        session_id=sid, request=types_pb2.GenerateRequest(
            chat=chat(("user", Q1)), max_new_tokens=400, min_new_tokens=400)), timeout=120)
    chunks = 0
    for event in call:
        chunks += event.WhichOneof("event") == "chunk"
        if chunks == 5:
            break
    call.cancel()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = get(stub, sid)
        if not info.turn_in_flight and info.state == types_pb2.SESSION_RESIDENT:
            break
        time.sleep(0.1)
    # The worker kept the computed tokens and shrank the lease to exactly them.
    assert info.state == types_pb2.SESSION_RESIDENT and info.held_tokens > 5
    assert info.reserved_bytes == info.held_bytes == reserved_bytes(roomy.address)
    assert info.turns == 0  # the scheduler's conversation did not take the cancelled reply
    _, f2, ids2, text2 = session_turn(stub, sid, Q1, max_new_tokens=32)
    assert f2.usage.reused_prompt_tokens > 0  # the same prompt again: its KV was kept
    _, _, fresh_ids = generate(stub, chat(("user", Q1)), max_new_tokens=32)
    assert ids2 == fresh_ids
    stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
    assert reserved_bytes(roomy.address) == 0


def test_turn_two_ttft_with_reuse_beats_resending_a_1000_token_history(roomy):
    from bench.features.session_ttft import measure

    result = measure(roomy.address, history_tokens=1000, repeats=1)
    assert result["reused_prompt_tokens"][0] >= 950  # ~1,000 history tokens were not prefilled
    assert result["turn2_prompt_tokens"] - result["reused_prompt_tokens"][0] < 60
    # Prefilling ~30 tokens instead of ~1,030: far more than 2x even on a loaded machine.
    assert result["ratio_fresh_over_reuse"] > 2, result
    assert reserved_bytes(roomy.address) == 0


def test_a_retried_close_answers_closed_false_and_frees_nothing(roomy):
    stub = scheduler_stub(roomy.address)
    sid = open_session(stub).session_id
    session_turn(stub, sid, Q1, max_new_tokens=8)
    first = stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
    assert first.closed and first.freed_bytes > 0
    again = stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
    assert (again.closed, again.freed_bytes) == (False, 0)  # a lost reply's retry: no error
    assert reserved_bytes(roomy.address) == 0
    with pytest.raises(grpc.RpcError) as info:  # an id never opened is still NOT_FOUND
        stub.CloseSession(scheduler_pb2.SessionRequest(session_id="never-opened"), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_session_continues_after_a_scheduler_restart_on_the_kv_its_worker_kept(
        tmp_path_factory):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = start_cluster(tmp_path_factory, "sessions-restart", scheduler_port=port,
                            scheduler_args=["--heartbeat-interval-s", "0.5"])
    try:
        stub = scheduler_stub(cluster.address)
        sid = open_session(stub).session_id
        _, f1, _, text1 = session_turn(stub, sid, Q1, max_new_tokens=48)
        worker = cluster.worker_services[0].address
        held = worker_held_bytes(worker)
        assert held > 0 and reserved_bytes(cluster.address) == f1.session.reserved_bytes == held
        kill_and_restart_scheduler(cluster, port)
        stub = scheduler_stub(cluster.address)
        # The worker registered its session with its lease: the same bytes in the new ledger.
        budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(include_leases=True), timeout=5)
        assert budget.total_reserved_bytes == held == worker_held_bytes(worker)
        assert [lease.lease_id for lease in budget.workers[0].leases] == [f1.session.lease_id]
        info = get(stub, sid)
        assert info.turns == 1 and info.state == types_pb2.SESSION_RESIDENT
        _, f2, ids2, _ = session_turn(stub, sid, Q2, max_new_tokens=48)
        assert f2.usage.reused_prompt_tokens >= f1.usage.prompt_tokens  # the kept KV, reused
        _, _, fresh_ids = generate(stub, chat(("user", Q1), ("assistant", text1), ("user", Q2)),
                                   max_new_tokens=48)
        assert ids2 == fresh_ids  # the conversation the worker kept is the scheduler's
        closed = stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
        assert closed.closed
        assert reserved_bytes(cluster.address) == 0 == worker_held_bytes(worker)
    finally:
        cluster.stop()
