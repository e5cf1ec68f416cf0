"""Errors in the caller's dialect (Ollama's, OpenAI's or Anthropic's shape), plus the
machine-readable `reason` of docs/interface.md, always at the top level."""

from __future__ import annotations

import re
import secrets
from typing import Any, Literal

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from proxy.service.routing import Refusal, RefusalReason

JSON = "application/json; charset=utf-8"
Dialect = Literal["ollama", "openai", "anthropic"]
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                   429: "rate_limit_error", 503: "overloaded_error"}


def dialect_of(path: str) -> Dialect:
    """Ollama's own paths speak Ollama; `/v1/messages` is Anthropic's; other `/v1` OpenAI's."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    return "openai" if path.startswith("/v1/") else "ollama"


def openai_error(status: int, message: str) -> dict[str, object]:
    """Ollama's OpenAI error object (openai/openai.go:225-237 NewError): its type by status,
    `param` and `code` null (the sidecar's reason is at the body's top level)."""
    kind = "invalid_request_error" if status == 400 else \
        "not_found_error" if status == 404 else "api_error"
    return {"message": message, "type": kind, "param": None, "code": None}


def error_body(status: int, reason: str, message: str, dialect: Dialect = "ollama"
               ) -> dict[str, object]:
    if dialect == "openai":  # OpenAI clients read error.message; the shape is Ollama's
        return {"error": openai_error(status, message), "reason": reason}
    if dialect == "anthropic":  # Anthropic clients read error.type and error.message
        kind = ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else
                                   "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}, "reason": reason}
    return {"error": message, "reason": reason}


def request_id(dialect: Dialect) -> dict[str, str]:
    """Anthropic's error answer names a request (`req_` and 12 random bytes in hex, as
    Ollama's anthropic.go NewError writes it); a stream's error event does not."""
    return {"request_id": f"req_{secrets.token_hex(12)}"} if dialect == "anthropic" else {}


def error_response(status: int, reason: str, message: str, model: str | None = None,
                   retry_after_s: int | None = None, dialect: Dialect = "ollama") -> Response:
    body = {**error_body(status, reason, message, dialect), **request_id(dialect)}
    if model:
        body["model"] = model
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else {}
    if status == 408:  # a body cut half-way leaves the connection unusable: closed after
        headers["Connection"] = "close"
    return Response(orjson.dumps(body), status_code=status, media_type=JSON, headers=headers)


# 499: the client closed its connection (nginx's code); nobody reads the answer.
REFUSAL_STATUS: dict[RefusalReason, int] = {
    "bad-request": 400, "model-not-found": 404, "prompt-too-large": 413, "client-gone": 499,
    "gpu-busy": 503, "model-too-large": 507, "not-found": 404}


# A provider's own 4xx keeps its status and message; its reason by status (docs/interface.md).
PROVIDER_REASONS = {400: "bad-request", 404: "model-not-found", 413: "request-too-large"}


def provider_refusal(status: int, message: str, model: str, dialect: Dialect = "ollama",
                     upstream: bytes = b"", reason: str | None = None) -> bytes:
    """The body of a provider's refusal (a 4xx before its answer began) in the caller's
    dialect, as the sidecar's own refusals are: Ollama's message, a `reason` and the model.
    On the OpenAI and Anthropic paths the engine's own error object (its type, Anthropic's
    request_id) is kept as Ollama's layers wrote it; on Ollama's own, any field beside its
    `error` too (a cloud call's 401 `signin_url`, which Ollama's clients show to sign in).
    The reason is by status unless given."""
    reason = reason or PROVIDER_REASONS.get(status, "provider-refused")
    body = {**error_body(status, reason, message, dialect), **request_id(dialect)}
    theirs = _object(upstream)
    if dialect != "ollama":
        if theirs is not None and isinstance(theirs.get("error"), dict):
            body = {**theirs, "reason": reason}
    elif theirs is not None:
        body = {**{k: v for k, v in theirs.items() if k != "error"}, **body}
    return orjson.dumps({**body, "model": model})


def _object(data: bytes) -> dict[str, object] | None:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def refusal_response(refusal: Refusal, dialect: Dialect = "ollama") -> Response:
    return error_response(refusal.status or REFUSAL_STATUS[refusal.reason], refusal.reason,
                          refusal.message, refusal.model, refusal.retry_after_s, dialect)


def stream_error_line(message: str, dialect: Dialect = "ollama") -> bytes:
    """The final line of a stream that failed after it started: NDJSON as Ollama does, or
    a server-sent event (`event: error` as Anthropic's clients expect)."""
    body = orjson.dumps(error_body(502, "upstream-failed", message, dialect))
    if dialect == "ollama":
        return body + b"\n"
    return (b"event: error\n" if dialect == "anthropic" else b"") + b"data: " + body + b"\n\n"


SEQUENCE = re.compile(rb'"sequence_number":\s*(\d+)')


def responses_failed_event(message: str, head: bytes, tail: bytes) -> bytes:
    """The end of a Responses stream that failed after it started, in that API's own form:
    a `response.failed` event, numbered after the last event sent, for the response its
    `response.created` opened (as Ollama's layer words one, openai/responses.go
    ResponseFailed, middleware/openai.go writeWebSearchError). It also carries OpenAI's
    `error` object, which the openai clients raise on, and the sidecar's reason."""
    numbers = SEQUENCE.findall(tail)
    opened = _first_event(head).get("response")
    opened = opened if isinstance(opened, dict) else {}
    failed = {"type": "response.failed",
              "sequence_number": int(numbers[-1]) + 1 if numbers else 0,
              "response": {"id": opened.get("id", ""), "object": "response",
                           "status": "failed", "model": opened.get("model", ""),
                           "output": [], "error": {"code": "api_error", "message": message}},
              **error_body(502, "upstream-failed", message, "openai")}
    return b"event: response.failed\ndata: " + orjson.dumps(failed) + b"\n\n"


def _first_event(head: bytes) -> dict[str, Any]:
    """The first server-sent event's data, when it is whole in `head`."""
    for line in head.split(b"\n"):
        if line.startswith(b"data:"):
            try:
                data = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}


REASONS = {400: "bad-request", 404: "not-found", 405: "method-not-allowed",
           413: "request-too-large"}


def install_error_shapes(app: Starlette) -> None:
    """The web framework's own answers in the sidecar's shape: a wrong method (405, with
    Allow), any other HTTP error it raises, and a fault (500). No redirect is made either:
    one built from the client's Host header could point anywhere."""
    app.router.redirect_slashes = False

    async def framework_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        reason = REASONS.get(exc.status_code, "bad-request")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"{request.method} is not allowed on {request.url.path}; use {allowed}"
        response = error_response(exc.status_code, reason, message,
                                  dialect=dialect_of(request.url.path))
        response.headers.update({k: v for k, v in (exc.headers or {}).items()})
        return response

    async def fault(request: Request, exc: Exception) -> Response:
        return error_response(500, "internal-error", "the sidecar failed on this request; "
                              "its log has the details", dialect=dialect_of(request.url.path))

    app.add_exception_handler(HTTPException, framework_error)
    app.add_exception_handler(Exception, fault)
