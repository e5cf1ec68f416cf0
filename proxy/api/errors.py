"""Errors in Ollama's shape, plus the machine-readable `reason` CONTRACT.md names."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from proxy.service.routing import Refusal

JSON = "application/json; charset=utf-8"


def error_response(status: int, reason: str, message: str, model: str | None = None,
                   retry_after_s: int | None = None, openai: bool = False) -> Response:
    body: dict[str, object] = {"error": message, "reason": reason}
    if openai:  # OpenAI clients read error.message; the contract's reason stays top-level
        kind = "server_error" if status >= 500 else \
            "not_found_error" if status == 404 else "invalid_request_error"
        body["error"] = {"message": message, "type": kind, "code": reason}
    if model:
        body["model"] = model
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return Response(orjson.dumps(body), status_code=status, media_type=JSON, headers=headers)


def refusal_response(refusal: Refusal, openai: bool = False) -> Response:
    return error_response(refusal.status, refusal.reason, refusal.message, refusal.model,
                          refusal.retry_after_s, openai)


def stream_error_line(message: str, sse: bool = False) -> bytes:
    """The final line of a stream that failed after it started: NDJSON as Ollama does, or
    a server-sent event for OpenAI streams."""
    if sse:
        payload = {"error": {"message": message, "type": "server_error",
                             "code": "upstream-failed"}, "reason": "upstream-failed"}
        return b"data: " + orjson.dumps(payload) + b"\n\n"
    return orjson.dumps({"error": message, "reason": "upstream-failed"}) + b"\n"
