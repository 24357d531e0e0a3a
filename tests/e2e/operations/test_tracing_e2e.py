"""One request, one trace across the gateway, the scheduler and the worker.

The test is the OTLP collector: a gRPC server implementing
opentelemetry.proto.collector.trace.v1.TraceService/Export on a free port. The three
real processes are pointed at it with the standard OTEL_* variables only; one
request through the gateway (the openai client) must come back as one trace id
whose spans come from all three services, with the admission's decision and cap.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from devtools.cluster import stop_service
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import scheduler_stub, start_cluster
from tests.e2e.gateway.test_gateway_e2e import BPT, MODEL, openai_client, start_gateway
from tests.e2e.ledger.test_queue_waiters_e2e import (
    hold_everything,
    queue_length,
    release,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SERVICES = {"ortserve-gateway", "ortserve-scheduler", "ortserve-worker"}
TIGHT_BUDGET_TOKENS = 128  # a short chat and a max_tokens of 200 do not fit: CAPPED


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it is sent, as (trace id, service.name, span)."""

    def __init__(self) -> None:
        self.spans: list[tuple[bytes, str, object]] = []
        self._lock = threading.Lock()

    def Export(self, request, context):
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append((span.trace_id, service, span))
        return trace_service_pb2.ExportTraceServiceResponse()

    def traces(self) -> dict[bytes, list[tuple[str, object]]]:
        with self._lock:
            found = defaultdict(list)
            for trace_id, service, span in self.spans:
                found[trace_id].append((service, span))
            return found


def attributes(span) -> dict[str, object]:
    out = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        out[a.key] = getattr(a.value, kind) if kind else None
    return out


def complete(spans: list[tuple[str, object]], request_id: str) -> bool:
    """The request's trace, with every service's spans in: the worker's last (prefill,
    decode) and the gateway's gRPC call (it ends once the gateway has read the stream's end)."""
    return (request_id in {attributes(s).get("ortserve.request_id") for _, s in spans}
            and {service for service, _ in spans} >= SERVICES
            and {"prefill", "decode"} <= {s.name for _, s in spans}
            and any(service == "ortserve-gateway" and s.name.endswith("Scheduler/Generate")
                    for service, s in spans))


@pytest.fixture()
def collector():
    sink = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield sink, port
    server.stop(0)


def test_one_request_is_one_trace_across_the_three_services(collector, monkeypatch,
                                                            tmp_path_factory):
    sink, port = collector
    # The processes inherit these: the standard variables, no flag.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    cluster = start_cluster(tmp_path_factory, "tracing",
                            kv_capacities=[str(TIGHT_BUDGET_TOKENS * BPT)])
    gateway = None
    try:
        # Relayed: the trace crosses the gateway, the scheduler's relay and the worker.
        gateway = start_gateway(tmp_path_factory, cluster.address, ("--no-direct-to-workers",))
        answer = openai_client(gateway).chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=200)
        assert answer.headers["x-ortserve-decision"] == "CAPPED"
        request_id = answer.headers["x-request-id"]

        deadline = time.monotonic() + 60
        ours: list[tuple[str, object]] = []
        while time.monotonic() < deadline:
            for spans in sink.traces().values():
                if complete(spans, request_id):
                    ours = spans
            if ours:
                break
            time.sleep(0.2)
        seen = {service for _, spans in sink.traces().items() for service, _ in spans}
        assert ours, (f"no trace covers {sorted(SERVICES)} for request {request_id}; services "
                      f"that sent spans: {sorted(seen)}; {len(sink.spans)} spans")
        names = {s.name for _, s in ours}
        assert {"admission", "claim", "prefill", "decode"} <= names, names
        assert any("/ortserve.v1.Worker/Generate" in n for n in names), names
        assert any("chat/completions" in n for n in names), names
        [admission] = [attributes(s) for _, s in ours if s.name == "admission"]
        assert admission["ortserve.decision"] == "capped"
        assert admission["ortserve.cap.requested_max_new_tokens"] == 200
        assert 0 < admission["ortserve.cap.admitted_max_new_tokens"] < 200
        # The decision is on the scheduler's RPC span too, with how the request ended.
        [rpc] = [attributes(s) for service, s in ours
                 if service == "ortserve-scheduler" and s.name.endswith("Scheduler/Generate")]
        assert rpc["ortserve.decision"] == "capped"
        assert rpc["ortserve.outcome"] == "finished"
        # One trace: every span of the request shares its id (gateway root included).
        assert len({s.trace_id for _, s in ours}) == 1
    finally:
        if gateway is not None:
            stop_service(gateway)
        cluster.stop()


def test_the_two_step_path_traces_its_admission_with_the_decision(collector, monkeypatch,
                                                                   tmp_path_factory):
    """The gateway's default path (Admit at the scheduler, the tokens from the worker): the
    trace has the admission span and the decision, cap, request, lease and worker on the
    scheduler's Admit span, as operations.md promises for every request (issue 52)."""
    sink, port = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    cluster = start_cluster(tmp_path_factory, "tracing-two-step",
                            kv_capacities=[str(TIGHT_BUDGET_TOKENS * BPT)])
    gateway = None
    try:
        gateway = start_gateway(tmp_path_factory, cluster.address)
        answer = openai_client(gateway).chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=200)
        assert answer.headers["x-ortserve-decision"] == "CAPPED"
        request_id = answer.headers["x-request-id"]

        def ours() -> list[tuple[str, object]]:
            for spans in sink.traces().values():
                names = {s.name for _, s in spans}
                if (request_id in {attributes(s).get("ortserve.request_id") for _, s in spans}
                        and {"admission", "prefill", "decode"} <= names
                        and any(service == "ortserve-scheduler" and s.name.endswith(
                            "Scheduler/Admit") for service, s in spans)):
                    return spans
            return []

        deadline = time.monotonic() + 60
        while not (spans := ours()) and time.monotonic() < deadline:
            time.sleep(0.2)
        names = sorted({s.name for _, trace in sink.traces().items() for _, s in trace})
        assert spans, f"no trace of request {request_id} with its admission; span names: {names}"
        assert {service for service, _ in spans} == SERVICES
        [admission] = [attributes(s) for _, s in spans if s.name == "admission"]
        assert admission["ortserve.decision"] == "capped"
        assert admission["ortserve.cap.requested_max_new_tokens"] == 200
        [rpc] = [attributes(s) for service, s in spans
                 if service == "ortserve-scheduler" and s.name.endswith("Scheduler/Admit")]
        assert rpc["ortserve.decision"] == "capped" and rpc["ortserve.request_id"] == request_id
        assert rpc["ortserve.lease_id"] and rpc["ortserve.worker_id"] and rpc["ortserve.model"]
        assert len({s.trace_id for _, s in spans}) == 1
    finally:
        if gateway is not None:
            stop_service(gateway)
        cluster.stop()


def test_a_session_turn_that_waited_in_the_queue_traces_its_wait(collector, monkeypatch,
                                                                  tmp_path_factory):
    """SessionTurn traces as Generate does (operations.md): a turn that waited in the
    admission queue has its `queue_wait` span and `ortserve.queued` on its admission."""
    sink, port = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    cluster = start_cluster(tmp_path_factory, "tracing-turn", kv_capacities=["16MiB"],
                            scheduler_args=["--max-queue-wait-s", "600"])
    try:
        stub = scheduler_stub(cluster.address)
        sid = stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=30).session_id
        held = hold_everything(cluster.address)
        events: list[types_pb2.GenerateEvent] = []

        def turn() -> None:
            events.extend(stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
                session_id=sid, request=types_pb2.GenerateRequest(
                    request_id="traced-turn", token_ids=types_pb2.TokenIds(ids=[1, 2, 3]),
                    max_new_tokens=4, min_new_tokens=4)), timeout=120))

        runner = threading.Thread(target=turn)
        try:
            runner.start()
            wait_for(lambda: queue_length(cluster.address) == 1)  # the turn waits
        finally:
            release(cluster.address, held)
        runner.join(120)
        assert [e.WhichOneof("event") for e in events][0] == "queued"
        assert events[-1].WhichOneof("event") == "finished"

        def ours() -> list[tuple[str, object]]:
            for spans in sink.traces().values():
                if any(s.name == "admission"
                       and attributes(s).get("ortserve.request_id") == "traced-turn"
                       for _, s in spans):
                    return spans
            return []

        deadline = time.monotonic() + 60
        while not (spans := ours()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert spans, f"no trace has the turn's admission; {len(sink.spans)} spans"
        [admission] = [attributes(s) for _, s in spans if s.name == "admission"]
        assert admission["ortserve.queued"] is True and admission["ortserve.decision"] == "admitted"
        waits = [attributes(s) for _, s in spans if s.name == "queue_wait"]
        assert len(waits) == 1 and waits[0]["ortserve.decision"] == "admitted", \
            sorted(s.name for _, s in spans)
        assert waits[0]["ortserve.queue_wait_s"] > 0
    finally:
        cluster.stop()
