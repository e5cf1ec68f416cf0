"""Ollama's OpenAI layer for the simulator: requests translated to the native handlers and
answers translated back, as Ollama's own middleware does (`openai/openai.go`), so the OpenAI
paths share the native scheduler, context and faults."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterable
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

CHAT = "/v1/chat/completions"
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


def error(message: str, status: int) -> Response:
    kind = ERROR_TYPES.get(status, "api_error")
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def native_request(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """The /api/chat or /api/generate body Ollama builds from an OpenAI request."""
    options: dict[str, Any] = {}
    if isinstance(body.get("max_tokens"), int):
        options["num_predict"] = body["max_tokens"]
    native: dict[str, Any] = {"model": body.get("model"), "stream": True, "options": options}
    if chat:
        native["messages"] = [{**m, "content": _text(m.get("content"))}
                              for m in body.get("messages") or [] if isinstance(m, dict)]
        if body.get("tools"):
            native["tools"] = body["tools"]
    else:
        native["prompt"] = _text(body.get("prompt"))
        if body.get("suffix"):
            native["suffix"] = body["suffix"]
    return native


def _usage(final: dict[str, Any]) -> dict[str, int]:
    prompt, completion = final.get("prompt_eval_count", 0), final.get("eval_count", 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class _Shape:
    """The OpenAI objects of one answer: chat completion or text completion."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.ident = f"{'chatcmpl' if chat else 'cmpl'}-{int(time.time() * 1000) % 100000}"
        self.created = int(time.time())
        self.model = model

    def _object(self, obj: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.ident, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "fp_ollama", "choices": [choice]}

    def chunk(self, text: str, finish: str | None) -> dict[str, Any]:
        if self.chat:
            delta = {"role": "assistant", "content": text} if finish is None else {}
            return self._object("chat.completion.chunk",
                                {"index": 0, "delta": delta, "finish_reason": finish})
        return self._object("text_completion",
                            {"index": 0, "text": text, "finish_reason": finish})

    def whole(self, text: str, final: dict[str, Any]) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": text}}
            out = self._object("chat.completion", choice)
        else:
            out = self._object("text_completion",
                               {"index": 0, "text": text, "finish_reason": "stop"})
        return {**out, "usage": _usage(final)}


def _piece(data: dict[str, Any], chat: bool) -> str:
    return str(data["message"]["content"] if chat else data.get("response", ""))


async def answer(native: Response, body: dict[str, Any], chat: bool) -> Response:
    """The native answer in OpenAI's shape: SSE chunks when streaming, else one object."""
    if native.status_code >= 400:
        message = orjson.loads(bytes(native.body)).get("error", "error")
        return error(str(message), native.status_code)
    shape = _Shape(chat, str(body.get("model")))
    if not isinstance(native, StreamingResponse):  # a load-only call: nothing generated
        return Response(orjson.dumps(shape.whole("", {})), media_type="application/json")
    lines: AsyncIterable[Any] = native.body_iterator
    if body.get("stream"):
        options = body.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return StreamingResponse(_events(lines, shape, usage), media_type="text/event-stream")
    text, final = [], {}
    try:
        async for line in lines:
            data = orjson.loads(line)
            text.append(_piece(data, chat))
            final = data
    finally:
        await _close(lines)
    return Response(orjson.dumps(shape.whole("".join(text), final)),
                    media_type="application/json")


async def _events(lines: AsyncIterable[Any], shape: _Shape, usage: bool
                  ) -> AsyncGenerator[bytes, None]:
    try:
        async for line in lines:
            data = orjson.loads(line)
            if not data.get("done"):
                chunk = shape.chunk(_piece(data, shape.chat), None)
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
                continue
            yield b"data: " + orjson.dumps(shape.chunk("", "stop")) + b"\n\n"
            if usage:  # a last chunk with no choices, as OpenAI's include_usage asks
                last = {**shape.chunk("", None), "choices": [], "usage": _usage(data)}
                yield b"data: " + orjson.dumps(last) + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        await _close(lines)


async def _close(lines: AsyncIterable[Any]) -> None:
    """End the native generator now (frees its slot) when the client left early."""
    close = getattr(lines, "aclose", None)
    if close is not None:
        await close()


def embeddings(native: dict[str, Any], model: str) -> dict[str, Any]:
    """/api/embed's answer as OpenAI's embedding list."""
    tokens = int(native.get("prompt_eval_count") or 0)
    data = [{"object": "embedding", "embedding": vector, "index": i}
            for i, vector in enumerate(native.get("embeddings") or [])]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
