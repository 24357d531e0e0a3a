"""Logging set-up, called once per process from a `__main__`.

Log lines go to stderr (stdout belongs to results): JSON when stderr is not a
terminal (or when asked), coloured key=value when it is. structlog's own
lines and the standard library's (grpc, asyncio, onnxruntime's Python side)
go through the same structlog ProcessorFormatter, so with JSON on every line
is one JSON object. With JSON on, what native code writes to fd 2 (gRPC's C
core, onnxruntime) is captured and wrapped too (ortserve.process.native_stderr), and an
uncaught exception is one record with its traceback, not a page of text. A
request's lines carry request_id, lease_id and worker_id: the servicers bind
them (structlog contextvars or bound loggers).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading

import structlog

from ortserve.process.env_defaults import from_env
from ortserve.process.native_stderr import NativeStderr

_configured = False
_json = False

# What --log-level takes (any case), so a main can refuse anything else with exit 2
# naming the flag or its variable (argparse choices), before logging starts.
LEVELS = ("debug", "info", "warning", "error")


def level_name(text: str) -> str:
    """A --log-level value as given (any case) -> the lower-case level name."""
    return text.strip().lower()


def add_level_argument(parser: argparse.ArgumentParser, env_key: str, default: str) -> None:
    """--log-level, defaulting to the variable `env_key`: a level not in LEVELS (flag or
    variable) stops the program with exit 2 naming it, as every other bad flag does."""
    parser.add_argument(
        "--log-level", type=level_name, choices=LEVELS,
        default=from_env(parser, env_key, default, kind=level_name, choices=LEVELS),
        help=f"the least severe records written: {', '.join(LEVELS)} (env {env_key})")


def json_enabled() -> bool:
    """Whether every stderr line is JSON (then nothing may print plain text there)."""
    return _json


class _Handler(logging.StreamHandler):
    def handleError(self, record: logging.LogRecord) -> None:
        # The stream itself is gone (a closed pipe): there is nowhere to say so, and
        # logging's report would go to fd 2, back through native_stderr, and fail again.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handleError(record)


def _log_uncaught() -> None:
    """Uncaught exceptions (main thread and others) as one record each, with the traceback."""
    log = logging.getLogger("uncaught")

    def on_main(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt):
            return sys.__excepthook__(kind, value, tb)
        log.critical("uncaught exception", exc_info=(kind, value, tb))

    def on_thread(args):
        if args.exc_type is SystemExit:
            return
        log.critical("uncaught exception in thread %s", getattr(args.thread, "name", "?"),
                     exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    sys.excepthook = on_main
    threading.excepthook = on_thread


def configure_logging(level: str = "info", json: bool | None = None,
                      capture_native: bool = False) -> None:
    """Configure structlog and stdlib logging for this process (idempotent).

    With JSON on and `capture_native`, fd 2 is taken over (see ortserve.process.native_stderr):
    the services' mains ask for it; a library or a test in-process must not.
    """
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
    native = NativeStderr() if json and capture_native else None
    handler = _Handler(native.stream if native else sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_no)
    logging.captureWarnings(True)  # warnings.warn() lines too
    if json:
        _log_uncaught()
    if native:
        native.start(handler)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    _configured = True
