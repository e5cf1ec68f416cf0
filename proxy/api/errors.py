"""Errors in Ollama's shape, plus the machine-readable `reason` CONTRACT.md names."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from proxy.service.routing import Refusal

JSON = "application/json; charset=utf-8"


def error_response(status: int, reason: str, message: str, model: str | None = None,
                   retry_after_s: int | None = None) -> Response:
    body: dict[str, str] = {"error": message, "reason": reason}
    if model:
        body["model"] = model
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return Response(orjson.dumps(body), status_code=status, media_type=JSON, headers=headers)


def refusal_response(refusal: Refusal) -> Response:
    return error_response(refusal.status, refusal.reason, refusal.message, refusal.model,
                          refusal.retry_after_s)


def stream_error_line(message: str) -> bytes:
    """The final NDJSON line of a stream that failed after it started (as Ollama does)."""
    return orjson.dumps({"error": message, "reason": "upstream-failed"}) + b"\n"
