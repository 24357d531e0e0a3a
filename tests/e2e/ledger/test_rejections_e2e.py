"""Refusals through real processes: a scheduler and one worker on the tiny model.

Context-window refusals carry the Rejection and are counted; a refusal names the
field the caller set; a WAIT_FULL waiter reports the whole reservation it waits for.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import grpc
import pytest
from google.rpc import error_details_pb2
from prometheus_client.parser import text_string_to_metric_families

from devtools.cluster import LocalCluster
from ortserve.rules import kv_math
from ortserve.status import rich_status
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import grpcurl, scheduler_stub
from tests.models import prepared_model_dir

CTX = 2_048  # the tiny model's context window
KV = 1 << 20  # 2,048 tokens at 512 B/token: one whole window


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cluster = LocalCluster(model_dir=prepared_model_dir("tiny-llama"),
                           log_dir=tmp_path_factory.mktemp("logs-rejections"),
                           kv_capacities=[str(KV)],
                           scheduler_args=["--metrics-port", "0", "--claim-ttl-s", "600"]).start()
    yield cluster
    cluster.stop()


def log_events(cluster, event: str) -> list[dict]:
    lines = cluster.services[0].log_path.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    return [r for r in records if r.get("event") == event]


def admissions(cluster) -> dict[tuple[str, str], float]:
    """ortserve_scheduler_admissions_total by (decision, cause), scraped and parsed."""
    [serving] = log_events(cluster, "metrics serving")  # --metrics-port 0: the port it chose
    text = urllib.request.urlopen(f"http://{serving['address']}/metrics", timeout=5).read().decode()
    return {(s.labels["decision"], s.labels["cause"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "ortserve_scheduler_admissions_total"}


def moved(before: dict, after: dict) -> dict:
    return {key: after[key] - before.get(key, 0.0) for key in after
            if after[key] != before.get(key, 0.0)}


def hi(**kw) -> types_pb2.GenerateRequest:
    return types_pb2.GenerateRequest(text="Hi", **kw)


def test_a_context_window_refusal_carries_the_rejection_and_is_counted(tiny):
    stub = scheduler_stub(tiny.address)
    before = admissions(tiny)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(hi(max_new_tokens=CTX), timeout=60))
    error = err.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = rich_status.details_of(error)
    rejection = rich_status.unpack(details, types_pb2.Rejection)
    assert rejection is not None, f"no Rejection in {details}"
    assert rejection.cause == types_pb2.CONTEXT_LENGTH_EXCEEDED
    assert rejection.context_length == CTX and rejection.requested_max_new_tokens == CTX
    assert rejection.message in error.details() and rejection.remedy in error.details()
    assert rich_status.unpack(details, error_details_pb2.ErrorInfo).reason == "CONTEXT_LENGTH_EXCEEDED"
    bad = rich_status.unpack(details, error_details_pb2.BadRequest)
    assert [v.field for v in bad.field_violations] == ["max_new_tokens"]
    # Admit answers it as a decision, not an error (docs/errors.md); a dry run too.
    adm = stub.Admit(scheduler_pb2.AdmitRequest(request=hi(max_new_tokens=CTX)), timeout=60)
    assert adm.decision == types_pb2.REJECTED and not adm.lease_id
    assert adm.rejection.cause == types_pb2.CONTEXT_LENGTH_EXCEEDED
    assert adm.rejection.prompt_tokens == rejection.prompt_tokens
    dry = stub.Admit(scheduler_pb2.AdmitRequest(request=hi(max_new_tokens=CTX), dry_run=True),
                     timeout=60)
    assert dry.decision == types_pb2.REJECTED and dry.dry_run
    # Every decision is counted, this cause included; dry runs are not.
    assert moved(before, admissions(tiny)) == {("rejected", "context_length_exceeded"): 2}
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    assert budget.total_reserved_bytes == 0


def test_min_new_tokens_beyond_the_window_names_min_new_tokens_not_max(tiny):
    # The report's own call, through grpcurl: max_new_tokens is never set.
    body = json.dumps({"text": "Hi", "min_new_tokens": CTX + 5})
    run = subprocess.run([grpcurl(), "-plaintext", "-max-time", "60", "-d", body, tiny.address,
                          "ortserve.v1.Scheduler/Generate"], capture_output=True, text=True,
                         timeout=90)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "InvalidArgument" in out, out
    assert "max_new_tokens" not in out.split("Details:")[0], out  # the message
    assert f"min_new_tokens {CTX + 5:,} need" in out
    assert f"lower min_new_tokens to at most {CTX - 1:,}" in out
    assert '"field":"min_new_tokens"' in out.replace(" ", "")
    assert "ortserve.v1.Rejection" in out and f'"min_new_tokens":{CTX + 5}' in out.replace(" ", "")


def test_wait_full_reports_the_whole_reservation_it_waits_for(tiny):
    stub = scheduler_stub(tiny.address)
    [worker] = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).workers
    assert worker.capacity_bytes == KV and worker.context_length == CTX
    # One prompt token, max_new_tokens unset: the whole window, every byte held.
    held = stub.Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
        token_ids=types_pb2.TokenIds(ids=[1]))), timeout=60)
    assert held.decision == types_pb2.ADMITTED and held.reserved_bytes == KV
    prompt, max_new = [1, 2, 3, 4], 200  # whole: 4 blocks of 64 tokens; floor: 1
    whole = kv_math.bytes_for(len(prompt) + max_new, worker.bytes_per_token, worker.block_tokens)
    floor = kv_math.bytes_for(len(prompt) + 1, worker.bytes_per_token, worker.block_tokens)
    assert floor < whole < KV  # not even the floor fits now; the whole fits an idle worker
    call = stub.Generate(types_pb2.GenerateRequest(
        request_id="wait-full", token_ids=types_pb2.TokenIds(ids=prompt), max_new_tokens=max_new,
        min_new_tokens=1, cap_policy=types_pb2.CAP_POLICY_WAIT_FULL), timeout=120)
    try:
        first = next(call)
        assert first.WhichOneof("event") == "queued"
        assert first.queued.needed_bytes == whole
        budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
        assert (budget.queue_length, budget.queue_waiting_bytes) == (1, whole)
        deadline = time.monotonic() + 30
        while not [r for r in log_events(tiny, "queued") if r.get("request_id") == "wait-full"]:
            assert time.monotonic() < deadline, "no 'queued' log line"
            time.sleep(0.1)
        [line] = [r for r in log_events(tiny, "queued") if r.get("request_id") == "wait-full"]
        assert line["needed_bytes"] == whole and line["mode"] == "wait_full"
    finally:
        released = stub.Release(scheduler_pb2.ReleaseRequest(
            lease_id=held.lease_id, lease_secret=held.lease_secret), timeout=5)
    assert released.released
    events = list(call)
    admission = next(e.admission for e in events if e.WhichOneof("event") == "admission")
    assert admission.decision == types_pb2.ADMITTED and admission.max_new_tokens == max_new
    assert admission.reserved_bytes == whole  # what it said it waited for
    assert events[-1].WhichOneof("event") == "finished"
