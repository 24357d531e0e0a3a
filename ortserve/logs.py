"""Logging set-up, called once per process from a `__main__`.

Log lines go to stderr (stdout belongs to results): JSON when stderr is not a
terminal (or when asked), coloured key=value when it is. structlog's own
lines and the standard library's (grpc, asyncio, onnxruntime's Python side)
go through the same structlog ProcessorFormatter, so with JSON on every line
is one JSON object. A request's lines carry request_id, lease_id and
worker_id: the servicers bind them (structlog contextvars or bound loggers).
"""

from __future__ import annotations

import logging
import sys

import structlog

_configured = False
_json = False


def json_enabled() -> bool:
    """Whether every stderr line is JSON (then nothing may print plain text there)."""
    return _json


def configure_logging(level: str = "info", json: bool | None = None) -> None:
    """Configure structlog and stdlib logging for this process (idempotent)."""
    global _configured, _json
    if _configured:
        return
    if json is None:
        json = not sys.stderr.isatty()
    _json = json
    level_no = logging.getLevelName(level.upper())
    if not isinstance(level_no, int):
        raise ValueError(f"unknown log level {level!r}: use debug, info, warning or error")
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    formatter = structlog.stdlib.ProcessorFormatter(
        # Records from the standard library get the same fields as structlog's own.
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_no)
    logging.captureWarnings(True)  # warnings.warn() lines too
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    _configured = True
