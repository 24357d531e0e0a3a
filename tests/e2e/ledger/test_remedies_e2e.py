"""Every remedy the scheduler and the gateway give is followed, and the request is then
admitted: advice that does not work when followed is worse than none.

Real processes on the default model (SmolLM2-135M, 46,080 B/token: the sizes its remedies
name fall between two tenths of a MiB, where a size rounded to the nearest one is short).
Each refused request is sent again as its remedy says: with the size it names given to a
restarted worker's --kv-capacity, with the max_new_tokens it names, or with the prompt
shortened to the length it names.
"""

from __future__ import annotations

import re
import time

import grpc
import openai
import pytest

from devtools.cluster import stop_service, wait_serving
from ortserve.status import rich_status
from ortserve.status.units import parse_bytes
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import scheduler_stub, start_cluster
from tests.e2e.gateway.test_gateway_e2e import MODEL, openai_client, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CTX = 8_192  # the model's context window
PROMPT = [504] * 198  # 198 prompt tokens + 5 new: 208 tokens of KV, 9,584,640 bytes
_SIZE = re.compile(r"--kv-capacity to at least ([0-9.]+ ?[KMGT]?i?B)")


def remedy_size(text: str) -> str:
    """The size a remedy names, as a --kv-capacity value ('9.2 MiB' -> '9.2MiB')."""
    found = _SIZE.search(text)
    assert found, f"no --kv-capacity size in {text!r}"
    return found[1].replace(" ", "")


def restart_worker(cluster, kv_capacity: str) -> None:
    """The cluster's one worker again, with the KV capacity a remedy named."""
    for worker in cluster.worker_services:
        stop_service(worker)
        cluster.services.remove(worker)
    cluster.wait_registered(0)
    cluster.kv_capacities = [kv_capacity]
    wait_serving(cluster.start_worker(0), "ortserve.v1.Worker")
    budget = scheduler_stub(cluster.address).GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=10)
    while len(budget.workers) != 1:  # the old worker's entry leaves at its goodbye
        time.sleep(0.1)
        budget = scheduler_stub(cluster.address).GetBudget(scheduler_pb2.GetBudgetRequest(),
                                                           timeout=10)
    assert budget.workers[0].capacity_bytes == parse_bytes(kv_capacity)


def request(n_prompt: int = len(PROMPT), **kw) -> types_pb2.GenerateRequest:
    return types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=[504] * n_prompt), **kw)


def admit(cluster, req: types_pb2.GenerateRequest) -> types_pb2.Admission:
    return scheduler_stub(cluster.address).Admit(
        scheduler_pb2.AdmitRequest(request=req, dry_run=True), timeout=60)


def generate(cluster, req: types_pb2.GenerateRequest) -> list[types_pb2.GenerateEvent]:
    return list(scheduler_stub(cluster.address).Generate(req, timeout=120))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Every restart_worker starts worker-0 again under the same id, which the scheduler
    # frees lease_ttl_s after the stopped one's last heartbeat (a worker does not say
    # goodbye): at the defaults (2 s heartbeats, 10 s) each of the six restarts waited ~10 s
    # for it; 0.5 s heartbeats and 3 s (as test_sessions_e2e) still allow 6 late beats.
    cluster = start_cluster(tmp_path_factory, "remedies", kv_capacities=["8MiB"],
                            scheduler_args=["--heartbeat-interval-s", "0.5", "--lease-ttl-s", "3"])
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gateway(cluster, tmp_path_factory):
    service = start_gateway(tmp_path_factory, cluster.address)
    yield service
    stop_service(service)


def test_the_capacity_remedy_when_followed_admits_the_request(cluster):
    req = request(max_new_tokens=5, min_new_tokens=5)
    with pytest.raises(grpc.RpcError) as err:
        generate(cluster, req)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    rejection = rich_status.unpack(rich_status.details_of(err.value), types_pb2.Rejection)
    assert rejection.cause == types_pb2.EXCEEDS_CAPACITY
    size = remedy_size(rejection.remedy)
    assert parse_bytes(size) >= rejection.needed_bytes  # 9,584,640: 9.1MiB is 42,599 short
    restart_worker(cluster, size)
    events = generate(cluster, req)
    assert events[0].admission.decision == types_pb2.ADMITTED
    assert events[-1].finished.usage.prompt_tokens == len(PROMPT)


def test_the_cap_remedies_when_followed_admit_the_full_ceiling(cluster):
    restart_worker(cluster, "9.2MiB")  # holds 208 tokens: the prompt + 10
    asked = request(max_new_tokens=40)
    capped = admit(cluster, asked)
    assert capped.decision == types_pb2.CAPPED
    cap = capped.budget_cap
    fitting = int(re.search(r"ask for max_new_tokens <= ([0-9,]+)", cap.reason)[1].replace(",", ""))
    # Either remedy works: the smaller ceiling it names on this worker, ...
    smaller = admit(cluster, request(max_new_tokens=fitting))
    assert smaller.decision == types_pb2.ADMITTED and smaller.max_new_tokens == fitting
    # ... or the asked one on a worker with the capacity it names.
    size = remedy_size(cap.reason)
    assert parse_bytes(size) >= cap.requested_bytes  # 11,059,200: 10.5MiB is 48,844 short
    restart_worker(cluster, size)
    events = generate(cluster, asked)
    assert events[0].admission.decision == types_pb2.ADMITTED, events[0].admission.budget_cap.reason
    assert events[0].admission.max_new_tokens == 40


def test_the_context_window_remedies_when_followed_pass_the_window(cluster):
    too_many = admit(cluster, request(max_new_tokens=CTX))
    assert too_many.rejection.cause == types_pb2.CONTEXT_LENGTH_EXCEEDED
    lower = int(re.search(r"lower max_new_tokens to ([0-9,]+)", too_many.rejection.remedy)[1]
                .replace(",", ""))
    followed = admit(cluster, request(max_new_tokens=lower))
    # The window fits now; this worker's capacity caps the ceiling (and says so).
    assert followed.decision == types_pb2.CAPPED
    long_prompt = admit(cluster, request(CTX + 8))
    assert long_prompt.rejection.cause == types_pb2.CONTEXT_LENGTH_EXCEEDED
    shorter = int(re.search(r"shorten the prompt to at most ([0-9,]+) tokens",
                            long_prompt.rejection.remedy)[1].replace(",", ""))
    followed = admit(cluster, request(shorter))
    # Within the window; a prompt this long is beyond this worker's whole capacity.
    assert followed.rejection.cause == types_pb2.EXCEEDS_CAPACITY


def test_the_gateways_remedies_when_followed_are_answered(cluster, gateway):
    client = openai_client(gateway)
    restart_worker(cluster, "8MiB")
    # Capacity: the prompt and one new token are beyond the worker's whole capacity.
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5)
    assert err.value.body["ortserve"]["reason"] == "EXCEEDS_CAPACITY"
    restart_worker(cluster, remedy_size(err.value.message))
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5)
    assert answer.usage.prompt_tokens == len(PROMPT)
    assert answer.model_extra["ortserve"]["budget_cap"] is None
    # Context window: the max_tokens it names passes the window (capped by this worker).
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=CTX)
    assert err.value.body["ortserve"]["reason"] == "CONTEXT_LENGTH_EXCEEDED"
    lower = int(re.search(r"lower max_tokens to ([0-9,]+)", err.value.message)[1]
                .replace(",", ""))
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=lower)
    assert answer.model_extra["ortserve"]["budget_cap"]["requested_max_new_tokens"] == lower
    # Cap: each of its two remedies gives the request without a cap.
    capped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40)
    reason = capped.model_extra["ortserve"]["budget_cap"]["reason"]
    fitting = int(re.search(r"ask for max_tokens <= ([0-9,]+)", reason)[1].replace(",", ""))
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=fitting)
    assert answer.model_extra["ortserve"]["budget_cap"] is None
    restart_worker(cluster, remedy_size(reason))
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40)
    assert answer.model_extra["ortserve"]["budget_cap"] is None
