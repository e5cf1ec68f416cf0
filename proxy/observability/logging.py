"""Structured JSON logs (structlog): one line per call, secrets never logged."""

from __future__ import annotations

import logging
import sys

import orjson
import structlog

# asyncio (and uvloop, under its name) says this for every TLS connection nats-py closes:
# nats-py's protocol answers end of file with True, which only a plain socket heeds.
HARMLESS_ASYNCIO = ("returning true from eof_received() has no effect when using ssl",)


class _DropHarmless(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in HARMLESS_ASYNCIO


def drop_harmless_asyncio_lines() -> None:
    """Filter HARMLESS_ASYNCIO out of asyncio's log (idempotent; also for the commands that
    configure no logging, where Python's last-resort handler would print it)."""
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _DropHarmless) for f in asyncio_log.filters):
        asyncio_log.addFilter(_DropHarmless())


def configure_logging(level: str = "info") -> None:
    numeric = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(stream=sys.stderr, level=numeric, format="%(message)s")
    # httpx logs every request at INFO: one line per call is ours to write, not theirs;
    # asyncio's debug lines (the selector it picked) say nothing about the sidecar.
    for noisy in ("httpx", "httpcore", "asyncio"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    drop_harmless_asyncio_lines()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=orjson.dumps),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.BytesLoggerFactory(file=sys.stderr.buffer),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger
