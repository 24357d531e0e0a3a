"""A blocking client over a gRPC channel to the scheduler."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ortserve.rpc import keepalive
from ortserve.rpc.tls import secure_or_insecure_channel
from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2, worker_pb2_grpc

from .direct import DirectCall
from .errors import RETRYABLE, GenerationFailed, OrtserveError, from_rpc_error
from .request import build_request
from .types import (
    Admission,
    BudgetCap,
    ConstraintResult,
    GenerateResult,
    Queued,
    TextChunk,
    TokenLogprob,
    sampling_dict,
    timings_from_pb,
    usage_from_pb,
)

DEFAULT_ADDRESS = "127.0.0.1:50051"
WORKER_CONNECT_S = 2.0  # the default path: a worker not connected by then is relayed to
RECHECK_S = 60.0  # a worker found unreachable is tried again after this long
log = logging.getLogger("ortserve_client")
_JITTER = random.Random()


@dataclass(frozen=True)
class Retry:
    """Opt-in retry of a refused admission (BUDGET_BUSY, NO_WORKER, QUEUE_FULL, QUEUE_TIMEOUT).

    Only before the Admission arrives (nothing was generated, nothing is held).
    Each wait is the server's RetryInfo delay or the exponential backoff
    `base_s * 2**attempt` (jittered, at most `max_s`), whichever is longer, and
    never past the client's own deadline.
    """

    attempts: int = 3  # retries after the first try
    base_s: float = 0.5
    max_s: float = 30.0

    def delay_s(self, attempt: int, error: OrtserveError, rng: random.Random | None = None) -> float:
        backoff = min(self.max_s, self.base_s * 2 ** attempt) * (rng or _JITTER).uniform(0.5, 1.0)
        return max(error.retry_delay_s(), backoff)


class GenerationStream:
    """Iterate for TextChunks. `.admission` (and `.budget_cap`) are set before the
    first chunk is yielded; `.result` once the stream has ended; `.queued` is the
    last Queued event while the request waited for budget."""

    def __init__(self, start: Callable[[float | None], object], on_admission=None, on_queued=None,
                 retry: Retry | None = None, timeout_s: float | None = None,
                 on_retry=None, live: set | None = None) -> None:
        self._start = start  # timeout_s -> a started call
        self._deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        self._call = start(timeout_s)
        self._on_admission = on_admission  # called with the Admission, before any chunk
        self._on_queued = on_queued  # called with each Queued event, before the Admission
        self._on_retry = on_retry  # called with (error, delay_s) before a retry
        self._retry = retry
        self._live = live  # the client's running streams (Client.cancel_streams), while iterated
        self.retries = 0
        self._cancelled = False
        self.queued: Queued | None = None
        self.admission: Admission | None = None
        self.result: GenerateResult | None = None
        self._text: list[str] = []
        self._ids: list[int] = []
        self._logprobs: list[TokenLogprob] = []

    @property
    def budget_cap(self) -> BudgetCap | None:
        return self.admission.budget_cap if self.admission else None

    def cancel(self) -> None:
        self._cancelled = True  # no retry starts after it
        self._call.cancel()

    def __iter__(self) -> Iterator[TextChunk]:
        if self._live is not None:
            self._live.add(self)
        try:
            yield from self._iterate()
        finally:
            if self._live is not None:
                self._live.discard(self)

    def _iterate(self) -> Iterator[TextChunk]:
        while True:
            try:
                yield from self._events()
                break
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                delay = None if self._cancelled else self._retry_delay(error)
                if delay is None:
                    raise error from None
                if self._on_retry is not None:
                    self._on_retry(error, delay)
                time.sleep(delay)
                if self._cancelled:
                    raise error from None
                self.retries += 1
                remaining = self._deadline - time.monotonic() if self._deadline is not None else None
                self._call = self._start(remaining)
        if self.result is None:
            raise GenerationFailed(grpc.StatusCode.UNKNOWN, "the stream ended without a Finished event")

    def _retry_delay(self, error: OrtserveError) -> float | None:
        """Seconds to wait before retrying, or None: do not retry."""
        if (self._retry is None or self.admission is not None or not isinstance(error, RETRYABLE)
                or self.retries >= self._retry.attempts):
            return None
        delay = self._retry.delay_s(self.retries, error)
        if self._deadline is not None and time.monotonic() + delay >= self._deadline:
            return None
        return delay

    def _events(self) -> Iterator[TextChunk]:
        for event in self._call:
            kind = event.WhichOneof("event")
            if kind == "queued":
                self.queued = Queued.from_pb(event.queued)
                if self._on_queued is not None:
                    self._on_queued(self.queued)
            elif kind == "admission":
                self.admission = Admission.from_pb(event.admission)
                if self._on_admission is not None:
                    self._on_admission(self.admission)
            elif kind == "chunk":
                logprobs = tuple(TokenLogprob.from_pb(lp) for lp in event.chunk.logprobs)
                self._text.append(event.chunk.text)
                self._ids.extend(event.chunk.token_ids)
                self._logprobs.extend(logprobs)
                yield TextChunk(event.chunk.text, tuple(event.chunk.token_ids), logprobs)
            elif kind == "finished":
                self.result = self._result(event.finished)

    def _result(self, f: types_pb2.Finished) -> GenerateResult:
        if self.admission is None:
            raise GenerationFailed(grpc.StatusCode.UNKNOWN, "Finished arrived before an Admission")
        return GenerateResult(
            text="".join(self._text), token_ids=tuple(self._ids),
            finish_reason=types_pb2.FinishReason.Name(f.finish_reason),
            stop_sequence=f.stop_sequence,
            budget_cap=BudgetCap.from_pb(f.budget_cap) if f.HasField("budget_cap") else None,
            usage=usage_from_pb(f.usage), timings=timings_from_pb(f.timings),
            admission=self.admission, worker_id=f.worker_id,
            execution_provider=f.execution_provider, sampling=sampling_dict(f.sampling),
            queued=self.queued, logprobs=tuple(self._logprobs),
            constraint=ConstraintResult.from_pb(f.constraint) if f.HasField("constraint") else None,
            speculation={"mode": f.speculation.mode,
                         "proposed_tokens": f.speculation.proposed_tokens,
                         "accepted_tokens": f.speculation.accepted_tokens},
        )


class Client:
    """`retry`: opt-in retry of refused admissions (see Retry); None: none.

    `cacert`: a PEM file of the CA the scheduler's certificate chains to (TLS;
    `tls=True` with no cacert trusts the system roots); None: plaintext.
    `api_key`: sent as `authorization: Bearer <key>` on every call to the scheduler.
    `direct`: the token path. None (the default): the two-step path (Admit, then the
    worker streams to this client; ortserve_client/direct.py: the scheduler relays no
    token) to every worker this client reaches within `worker_connect_s` (checked once
    per address, again after a minute), the scheduler's relay to the others (said once
    in a warning of the `ortserve_client` logger); relayed throughout when the
    scheduler's channel is TLS and no `worker_tls` is given (a TLS cluster's workers
    take mutual TLS only). True: the two-step path only (an unreachable worker is an
    error). False: relayed. Where workers serve TLS (mutual), give
    `worker_tls=(ca, cert, key)`: PEM files of the cluster's CA and a certificate it signed.
    `keepalive_s`: while a call runs, ping the connection this often; a peer that does not
    answer within as long (a host gone, a process stopped) fails the call UNAVAILABLE
    instead of leaving it to its deadline (ortserve/rpc/keepalive.py); 0: off, else >= 1.
    """

    def __init__(self, address: str = DEFAULT_ADDRESS, timeout_s: float | None = None,
                 retry: Retry | None = None, *, cacert: str | None = None, tls: bool = False,
                 api_key: str | None = None, direct: bool | None = None,
                 worker_tls: tuple[str, str, str] | None = None,
                 keepalive_s: float = keepalive.DEFAULT_INTERVAL_S,
                 worker_connect_s: float = WORKER_CONNECT_S) -> None:
        self.address = address
        self._options = keepalive.channel_options(keepalive_s)  # raises on a bad interval
        self.timeout_s = timeout_s
        self.retry = retry
        if direct is None and (cacert or tls) and worker_tls is None:
            direct = False  # no certificate for the workers' mutual TLS: relayed
        self.direct = direct is not False
        self._relay_if_unreachable = self._reachable if direct is None else None
        self._worker_connect_s = worker_connect_s
        self._unreachable: dict[str, float] = {}  # address -> monotonic time found so
        self._reached: set[str] = set()  # addresses this client has connected to
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
        roots = Path(cacert).read_bytes() if cacert else None
        self._channel = secure_or_insecure_channel(
            address, grpc.ssl_channel_credentials(roots) if cacert or tls else None,
            aio=False, options=self._options)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._worker_credentials = None
        if worker_tls is not None:
            ca, cert, key = (Path(p).read_bytes() for p in worker_tls)
            self._worker_credentials = grpc.ssl_channel_credentials(ca, key, cert)
        self._workers: dict[str, tuple[grpc.Channel, worker_pb2_grpc.WorkerStub]] = {}
        self._workers_lock = threading.Lock()
        self.live_streams: set[GenerationStream] = set()  # those being iterated now

    def cancel_streams(self) -> threading.Thread | None:
        """Cancel every stream being iterated now, from a thread of its own (a cancel may
        give a lease back: a call, which must not run inside a signal handler); that thread,
        or None when no stream runs. Their iterations end with GenerationFailed CANCELLED.
        Join the thread before closing the client: a cancel cut off mid-way holds a call's
        lock, and the interpreter's last garbage collection then waits on it forever."""
        streams = list(self.live_streams)
        if not streams:
            return None

        def cancel() -> None:
            for stream in streams:
                stream.cancel()

        thread = threading.Thread(target=cancel, name="ortserve-cancel", daemon=True)
        thread.start()
        return thread

    def _worker_stub(self, address: str) -> worker_pb2_grpc.WorkerStub:
        """One channel per worker address, kept for the client's life (the direct path)."""
        with self._workers_lock:  # streams on several threads may ask for it at once
            return self._worker_stub_locked(address)

    def _worker_stub_locked(self, address: str) -> worker_pb2_grpc.WorkerStub:
        if address not in self._workers:
            channel = secure_or_insecure_channel(address, self._worker_credentials, aio=False,
                                                 options=self._options)
            self._workers[address] = (channel, worker_pb2_grpc.WorkerStub(channel))
        return self._workers[address][1]

    def _reachable(self, address: str) -> bool:
        """Whether this client connects to the worker at `address` (within worker_connect_s;
        once it has, later failures are the requests' own; an unreachable one is asked
        again after RECHECK_S)."""
        if address in self._reached:
            return True
        found = self._unreachable.get(address)
        if found is not None and time.monotonic() - found < RECHECK_S:
            return False
        self._worker_stub(address)
        health = health_pb2_grpc.HealthStub(self._workers[address][0])
        try:
            # NOTE: an RPC that waits for the connection, not channel_ready_future: that one
            # leaves a polling thread behind, which raises once the channel is closed.
            health.Check(health_pb2.HealthCheckRequest(), timeout=self._worker_connect_s,
                         wait_for_ready=True)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                self._unreachable.pop(address, None)
                self._reached.add(address)
                return True  # it answered: reachable, whatever it said
            if found is None:
                log.warning("worker %s is not reachable from this client (no connection in "
                            "%g s): its requests are relayed by the scheduler; pass "
                            "direct=False to relay from the start, or let the client reach "
                            "the workers' advertised addresses", address, self._worker_connect_s)
            self._unreachable[address] = time.monotonic()
            return False
        self._unreachable.pop(address, None)
        self._reached.add(address)
        return True

    def close(self) -> None:
        for channel, _ in self._workers.values():
            channel.close()
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stream(self, prompt=None, *, on_admission=None, on_queued=None, on_retry=None,
               **kw) -> GenerationStream:
        """Start a generation; see build_request for the arguments. `on_admission(adm)`
        runs when the Admission arrives, before the first chunk; `on_queued(q)` on each
        Queued event while the request waits for budget; `on_retry(error, delay_s)`
        before each retry (with `retry` set)."""
        request = build_request(prompt, **kw)
        if self.direct:
            def start(timeout_s):
                return DirectCall(self._stub, self._worker_stub, request, timeout_s, self._metadata,
                                  self._relay_if_unreachable)
        else:
            def start(timeout_s):
                return self._stub.Generate(request, timeout=timeout_s, metadata=self._metadata)
        return GenerationStream(start, on_admission, on_queued, self.retry, self.timeout_s, on_retry,
                                live=self.live_streams)

    def generate(self, prompt=None, **kw) -> GenerateResult:
        stream = self.stream(prompt, **kw)
        for _ in stream:
            pass
        return stream.result

    def admit(self, prompt=None, *, dry_run: bool = True, max_queue_wait_ms: int = 0,
              **kw) -> Admission:
        """An admission decision; with max_queue_wait_ms (and not dry_run) it may wait for budget."""
        try:
            pb = self._stub.Admit(scheduler_pb2.AdmitRequest(request=build_request(prompt, **kw),
                                                             dry_run=dry_run,
                                                             max_queue_wait_ms=max_queue_wait_ms),
                                  timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return Admission.from_pb(pb)

    def release(self, admission: Admission) -> int:
        """Give back an Admit's lease (the Admission carries the secret that proves it is ours)."""
        try:
            return self._stub.Release(scheduler_pb2.ReleaseRequest(
                lease_id=admission.lease_id, lease_secret=admission.lease_secret),
                timeout=self.timeout_s, metadata=self._metadata).freed_bytes
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def load_adapter(self, name: str, path: str, worker_id: str = "") -> types_pb2.AdapterChange:
        """Load a LoRA adapter (an .onnx_adapter file on the worker) as `name` on worker
        `worker_id` ("": the one registered worker); an admin key's call (docs/features/lora.md).
        Its bytes come out of the worker's KV capacity: AdapterChange.capacity_bytes."""
        return self._admin(self._stub.LoadAdapter, types_pb2.LoadAdapterRequest(
            worker_id=worker_id, name=name, path=path))

    def unload_adapter(self, name: str, worker_id: str = "") -> types_pb2.AdapterChange:
        """Unload an idle LoRA adapter; its bytes return to the worker's KV capacity."""
        return self._admin(self._stub.UnloadAdapter, types_pb2.UnloadAdapterRequest(
            worker_id=worker_id, name=name))

    def _admin(self, call, request):
        try:
            return call(request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def budget(self, include_leases: bool = False) -> scheduler_pb2.Budget:
        try:
            return self._stub.GetBudget(scheduler_pb2.GetBudgetRequest(include_leases=include_leases),
                                        timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
