"""structlog set-up, called once per process from a `__main__`.

Log lines go to stderr (stdout belongs to results): JSON when stderr is not a
terminal, coloured key=value when it is.
"""

from __future__ import annotations

import logging
import sys

import structlog

_configured = False


def configure_logging(level: str = "info", json: bool | None = None) -> None:
    """Configure structlog and stdlib logging for this process (idempotent)."""
    global _configured
    if _configured:
        return
    if json is None:
        json = not sys.stderr.isatty()
    level_no = logging.getLevelName(level.upper())
    if not isinstance(level_no, int):
        raise ValueError(f"unknown log level {level!r}: use debug, info, warning or error")
    logging.basicConfig(stream=sys.stderr, level=level_no, format="%(message)s")
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    _configured = True
