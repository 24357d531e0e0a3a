"""A request's own numbers: in its response body when asked (vLLM's per-request metrics),
and in the OpenTelemetry GenAI semantic-convention histograms at the gateway.

The body's `metrics` object takes vLLM's field names (its --enable-per-request-metrics):
the gateway's --per-request-metrics turns it on for every answer, the request header
X-Ortserve-Request-Metrics: true for one. The numbers are the worker's and the
scheduler's own (Finished.timings, Admission.queue_wait_ms), so they say where the time
went; the histograms are measured at the gateway, from the HTTP request's arrival, as a
client sees the server.

The histograms are gen_ai.server.time_to_first_token, gen_ai.server.time_per_output_token
and gen_ai.server.request.duration (semantic conventions v1.41, status development), with
the conventions' explicit bucket boundaries, under the names OpenTelemetry's Prometheus
exporter writes for them (dots to underscores, the unit "s" as _seconds). They are
prometheus-client histograms on the gateway's one registry, beside
ortserve_gateway_request_duration_seconds, rather than an OpenTelemetry meter with its
own exporter: one /metrics, no second pipeline, the same exposition.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram

from ortserve.v1 import types_pb2

REQUEST_HEADER = "x-ortserve-request-metrics"
_YES = {"1", "true", "yes"}

# The conventions' ExplicitBucketBoundaries, seconds.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BUCKETS_S = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                      20.48, 40.96, 81.92)
# gen_ai.operation.name for each route kind (the conventions' well-known values).
# The Responses and Messages APIs are chat by the conventions' words (a conversation in,
# a message out).
OPERATION = {"chat": "chat", "completion": "text_completion", "responses": "chat",
             "messages": "chat"}
_LABELS = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model",
           "gen_ai_response_model"]
PROVIDER = "ortserve"


def asked(server_default: bool, header_value: str | None) -> bool:
    """The body carries `metrics` when the gateway says so for all, or the request asks."""
    return server_default or (header_value or "").strip().lower() in _YES


def body_metrics(admission: types_pb2.Admission, finished: types_pb2.Finished) -> dict:
    """vLLM's per-request fields from one choice's Admission and Finished. queue_time_ms:
    the scheduler's admission queue and the worker's wait before prefill; the rest from
    prefill's start, as vLLM counts from when a request is scheduled."""
    t = finished.timings
    tokens = finished.usage.generated_tokens
    return {"time_to_first_token_ms": round(t.ttft_ms - t.queue_ms, 3),
            "generation_time_ms": round(t.decode_ms, 3),
            "queue_time_ms": round(admission.queue_wait_ms + t.queue_ms, 3),
            "mean_itl_ms": round(t.decode_ms / (tokens - 1), 3) if tokens > 1 else None,
            "tokens_per_second": round(t.decode_tokens_per_s, 3) if tokens > 1 else None}


class GenAiHistograms:
    """The three gen_ai.server.* histograms on the gateway's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ttft_seconds = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "gen_ai.server.time_to_first_token: from the request's arrival at the gateway to "
            "its first token, successful responses", _LABELS, buckets=TTFT_BUCKETS_S,
            registry=registry)
        self.tpot_seconds = Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "gen_ai.server.time_per_output_token: (last token - first token) / (tokens - 1) "
            "at the gateway, successful responses of two tokens or more", _LABELS,
            buckets=TPOT_BUCKETS_S, registry=registry)
        self.duration_seconds = Histogram(
            "gen_ai_server_request_duration_seconds",
            "gen_ai.server.request.duration: from the request's arrival at the gateway to its "
            "last token", _LABELS + ["error_type"], buckets=DURATION_BUCKETS_S,
            registry=registry)



class RequestClock:
    """One request's times at the gateway: started at its arrival, told of each choice's
    first token and end (apis/chat/stream.py); observes the histograms once per choice."""

    def __init__(self, histograms: GenAiHistograms | None, operation: str,
                 request_model: str) -> None:
        self._histograms = histograms
        self._labels = [operation, PROVIDER, request_model]
        self.started_s = time.perf_counter()
        self._first_s: dict[int, float] = {}

    def token(self, index: int) -> None:
        """A chunk with tokens arrived for choice `index`: only the first one is timed."""
        if index not in self._first_s:
            self._first_s[index] = time.perf_counter()

    def finished(self, index: int, response_model: str, finished: types_pb2.Finished) -> None:
        if self._histograms is None:
            return
        now_s = time.perf_counter()
        labels = [*self._labels, response_model]
        first_s = self._first_s.get(index)
        tokens = finished.usage.generated_tokens
        if first_s is not None:
            self._histograms.ttft_seconds.labels(*labels).observe(first_s - self.started_s)
            if tokens > 1:
                self._histograms.tpot_seconds.labels(*labels).observe(
                    (now_s - first_s) / (tokens - 1))
        self._histograms.duration_seconds.labels(*labels, "").observe(now_s - self.started_s)

    def failed(self, response_model: str, error_type: str) -> None:
        """A request that ended in an error after it started: its duration, with error.type."""
        if self._histograms is not None:
            self._histograms.duration_seconds.labels(*self._labels, response_model,
                                                     error_type).observe(
                time.perf_counter() - self.started_s)


@dataclass(frozen=True)
class Reporting:
    """What the gateway reports per request: `metrics` in bodies for every request
    (--per-request-metrics) or only for those that ask, and the histograms."""

    per_request_metrics: bool
    histograms: GenAiHistograms | None

    def clock(self, kind: str, request_model: str) -> RequestClock:
        return RequestClock(self.histograms, OPERATION[kind], request_model)

    def asks(self, headers: Mapping[str, str]) -> bool:
        """Whether this request's answer carries `metrics` (its header, or the flag)."""
        return asked(self.per_request_metrics, headers.get(REQUEST_HEADER))


NOT_REPORTED = Reporting(False, None)  # metrics only when asked, no histograms
