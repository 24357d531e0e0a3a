"""OpenTelemetry tracing for the three services: set up once from __main__, off by default.

On with `--otlp-traces-endpoint URL` (vLLM's flag; env ORTSERVE_<SERVICE>_OTLP_TRACES_ENDPOINT)
or the standard variables: OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
or OTEL_TRACES_EXPORTER (otlp or console; none: off). OTEL_SDK_DISABLED=true wins
over all of them. The SDK reads the rest itself (OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*, OTEL_EXPORTER_OTLP_HEADERS, ..._INSECURE,
..._CERTIFICATE, OTEL_TRACES_SAMPLER).

When on, grpc.aio servers and channels made afterwards carry W3C trace context
in their metadata (opentelemetry-instrumentation-grpc's interceptors, ahead of
ours), so one request is one trace from the gateway (FastAPI instrumentation)
through the scheduler to the worker. Heartbeats, health checks and reflection
are left out: they would be a trace every two seconds.

When off, nothing is imported beyond the API and every helper below returns at
once: a request costs a few attribute checks, a token nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

_enabled = False
_tracer = None

FLAG = "--otlp-traces-endpoint"
# Periodic or probing RPCs: a trace of their own each time, and nothing to follow.
# Worker.Relay carries many requests for its whole life: each of them is traced instead
# (trace_context() on the caller's side, span_from() on the worker's).
UNTRACED_METHODS = ("Heartbeat", "Relay")
UNTRACED_SERVICE_PREFIXES = ("grpc.health.v1.", "grpc.reflection.")


def add_argument(parser: argparse.ArgumentParser, env_prefix: str) -> None:
    parser.add_argument(
        FLAG, default=os.environ.get(env_prefix + "OTLP_TRACES_ENDPOINT", ""),
        help="export OpenTelemetry traces over OTLP/gRPC to this collector, e.g. "
             "http://otel-collector:4317 (http: plaintext, https: TLS); also on with the "
             f"standard OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER (env "
             f"{env_prefix}OTLP_TRACES_ENDPOINT); off when none is set (docs/operations/operations.md)")


def wanted(endpoint: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether tracing is asked for: the flag, or the standard OTEL_* variables."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if endpoint:
        return True
    exporter = environ.get("OTEL_TRACES_EXPORTER")
    if exporter is not None:
        return exporter.strip().lower() not in ("", "none")
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def _exporters(endpoint: str, environ: Mapping[str, str]) -> list:
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    exporters = []
    for name in names:
        if name in ("", "none"):
            continue
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            # None: the SDK's own reading of OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT.
            exporters.append(OTLPSpanExporter(endpoint=endpoint or None))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            # stderr: stdout carries the start-up line and nothing else (ortserve.process.banner);
            # one JSON object a line, so JSON logs stay one record a line.
            exporters.append(ConsoleSpanExporter(
                out=sys.stderr, formatter=lambda span: span.to_json(indent=None) + "\n"))
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER names {name!r}: ortserve exports traces "
                             "with otlp (OTLP over gRPC) or console; set one of them, or none")
    return exporters


def _grpc_filter():
    from opentelemetry.instrumentation.grpc import filters

    return filters.negate(filters.any_of(
        *(filters.method_name(m) for m in UNTRACED_METHODS),
        *(filters.service_prefix(p) for p in UNTRACED_SERVICE_PREFIXES)))


def setup(service_name: str, endpoint: str = "", environ: Mapping[str, str] = os.environ) -> bool:
    """Start tracing for this process when asked for (see the module docstring); returns
    whether it did. Call once, before any grpc.aio server or channel is made."""
    global _enabled, _tracer
    if _enabled or not wanted(endpoint, environ):
        return _enabled
    from opentelemetry import trace
    from opentelemetry.instrumentation.grpc import (
        GrpcAioInstrumentorClient,
        GrpcAioInstrumentorServer,
    )
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = _exporters(endpoint, environ)
    resource = Resource.create({SERVICE_NAME: environ.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)  # flushes at exit (shutdown_on_exit)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    GrpcAioInstrumentorServer(filter_=_grpc_filter()).instrument(tracer_provider=provider)
    GrpcAioInstrumentorClient(filter_=_grpc_filter()).instrument(tracer_provider=provider)
    _tracer = trace.get_tracer("ortserve")
    _enabled = True
    return True


def enabled() -> bool:
    return _enabled


def instrument_fastapi(app) -> None:
    """The gateway's HTTP server spans (the root of a request's trace), when on."""
    if not _enabled:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    # NOTE: no span per ASGI send/receive: a streamed answer sends one message per token.
    FastAPIInstrumentor.instrument_app(app, excluded_urls="health,metrics",
                                       exclude_spans=["receive", "send"])


# -- spans -----------------------------------------------------------------------------


def _clean(attributes: Mapping[str, object]) -> dict:
    """OpenTelemetry attribute values: str, bool, int, float; None dropped."""
    return {f"ortserve.{k}" if "." not in k else k: v for k, v in attributes.items()
            if v is not None}


def annotate(**attributes: object) -> None:
    """Set attributes on the current span (the RPC's server span in a handler)."""
    if not _enabled:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(_clean(attributes))


@contextmanager
def span(name: str, **attributes: object) -> Iterator[None]:
    """A child span of the current one around a block, current inside it (so calls
    made in the block are its children). For plain coroutines, not async generators:
    a context attached across a yield may be detached in another."""
    if not _enabled:
        yield
        return
    with _tracer.start_as_current_span(name, attributes=_clean(attributes)):
        yield


def trace_context() -> dict[str, str]:
    """The current span's W3C trace context as a mapping ({} when off): what a request
    carries where the call's metadata cannot (RelayRequest.trace_context)."""
    if not _enabled:
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextmanager
def span_from(carrier: Mapping[str, str], name: str) -> Iterator[None]:
    """A server span named `name` in the trace `carrier` names (trace_context()'s), current
    inside the block: the worker's side of one request on a Relay call."""
    if not _enabled:
        yield
        return
    from opentelemetry import propagate, trace

    with _tracer.start_as_current_span(name, context=propagate.extract(dict(carrier)),
                                       kind=trace.SpanKind.SERVER):
        yield


def wall_ns(perf_s: float) -> int:
    """A time.perf_counter() reading as wall-clock nanoseconds (span times)."""
    return time.time_ns() - int((time.perf_counter() - perf_s) * 1e9)


def record(name: str, start_ns: int, end_ns: int, **attributes: object) -> None:
    """A finished child span of the current one, with explicit times: for what was timed
    elsewhere (the worker's engine thread, a wait in an async generator)."""
    if not _enabled:
        return
    _tracer.start_span(name, start_time=start_ns, attributes=_clean(attributes)).end(
        end_time=max(end_ns, start_ns))


def setup_or_exit(program: str, endpoint: str) -> None:
    """__main__'s call: setup() for `program` (its service.name), a refused setting one
    line and exit 2 (as a bad flag is), and one log line saying tracing is on."""
    try:
        on = setup(program, endpoint)
    except ValueError as error:
        print(f"{program}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    if on:
        import structlog

        structlog.get_logger(program).info(
            "tracing on", exporter=os.environ.get("OTEL_TRACES_EXPORTER", "otlp"),
            endpoint=endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "the SDK's default")
