"""The other dialects Ollama speaks, for the simulator: OpenAI's chat, completions,
Responses and embeddings, and Anthropic's messages. Each request is translated to the native
chat or generate call and the answer back, as Ollama's own middleware does
(`openai/openai.go`, `openai/responses.go`, `anthropic/anthropic.go`), so slots, context,
truncation and faults apply to them exactly as to native calls."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterable
from typing import Any, Protocol

import orjson
from starlette.responses import Response, StreamingResponse

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
RESPONSES, MESSAGES = "/v1/responses", "/v1/messages"
CHAT_PATHS = (CHAT, RESPONSES, MESSAGES)  # served by the native chat; completions by generate
OPENAI_ERRORS = {400: "invalid_request_error", 404: "not_found_error"}
ANTHROPIC_ERRORS = {400: "invalid_request_error", 404: "not_found_error",
                    503: "overloaded_error"}


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def error(path: str, message: str, status: int) -> Response:
    if path == MESSAGES:
        kind = ANTHROPIC_ERRORS.get(status, "api_error")
        return _json({"type": "error", "error": {"type": kind, "message": message}}, status)
    kind = OPENAI_ERRORS.get(status, "api_error")
    return _json({"error": {"message": message, "type": kind, "param": None, "code": None}},
                 status)


def translated_error(path: str, native: Response) -> Response:
    """A native error answer (`{"error": "..."}`) in the dialect's error shape."""
    message = orjson.loads(bytes(native.body)).get("error", "error")
    return error(path, str(message), native.status_code)


def _event(data: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def _text(content: Any) -> str:
    """Text of a string or of content parts and blocks (images are left out)."""
    if isinstance(content, list):
        return "".join(_text(p.get("text") if isinstance(p, dict) else p) for p in content)
    return "" if content is None else str(content)


def _tool(name: Any, description: Any, parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": parameters}}


# -- requests -------------------------------------------------------------------------------
def native_request(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The /api/chat or /api/generate body Ollama builds from the dialect's request."""
    native: dict[str, Any] = {"model": body.get("model"), "stream": True}
    predict = body.get({RESPONSES: "max_output_tokens", MESSAGES: "max_tokens"}.get(
        path, "max_tokens"))
    native["options"] = {"num_predict": predict} if isinstance(predict, int) else {}
    if path == COMPLETIONS:
        native["prompt"] = _text(body.get("prompt"))
        if body.get("suffix"):
            native["suffix"] = body["suffix"]
        return native
    if path == RESPONSES:
        native["messages"], tools = _responses_messages(body), [
            _tool(t.get("name"), t.get("description"), t.get("parameters"))
            for t in body.get("tools") or []]
    elif path == MESSAGES:
        native["messages"], tools = _anthropic_messages(body), [
            _tool(t.get("name"), t.get("description"), t.get("input_schema"))
            for t in body.get("tools") or []]
    else:
        native["messages"] = [{**m, "content": _text(m.get("content"))}
                              for m in body.get("messages") or [] if isinstance(m, dict)]
        tools = body.get("tools") or []
    if tools:
        native["tools"] = tools
    return native


def _call(name: Any, arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        arguments = orjson.loads(arguments or "{}")
    return {"function": {"name": name, "arguments": arguments}}


def _responses_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    given = body.get("input")
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    for item in given or []:
        kind = item.get("type") or "message"
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _text(item.get("content"))})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": "",
                             "tool_calls": [_call(item.get("name"), item.get("arguments"))]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": _text(item.get("output"))})
    return messages


def _anthropic_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    system = _text(body.get("system"))
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in body.get("messages") or []:
        blocks = message.get("content")
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        text, calls = "", []
        for block in blocks or []:
            kind = block.get("type")
            if kind == "text":
                text += str(block.get("text") or "")
            elif kind == "tool_use":
                calls.append(_call(block.get("name"), block.get("input") or {}))
            elif kind == "tool_result":
                messages.append({"role": "tool", "content": _text(block.get("content"))})
        if text or calls:
            messages.append({"role": message.get("role"), "content": text,
                             **({"tool_calls": calls} if calls else {})})
    return messages


# -- answers --------------------------------------------------------------------------------
class Translation(Protocol):
    """How one dialect tells a native answer: as a stream of events, or whole."""

    def opening(self) -> list[bytes]: ...
    def piece(self, text: str) -> list[bytes]: ...
    def closing(self, final: dict[str, Any]) -> list[bytes]: ...
    def whole(self, text: str, final: dict[str, Any]) -> dict[str, Any]: ...


def _ident(prefix: str) -> str:
    return f"{prefix}{int(time.time() * 1000) % 100000}"


class OpenAIChat:
    """Chat completions (`chat.completion.chunk`) or text completions (`text_completion`)."""

    def __init__(self, body: dict[str, Any], chat: bool) -> None:
        self.chat, self.model = chat, str(body.get("model"))
        self.ident, self.created = _ident("chatcmpl-" if chat else "cmpl-"), int(time.time())
        options = body.get("stream_options")
        self.usage = isinstance(options, dict) and bool(options.get("include_usage"))

    def _object(self, obj: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.ident, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "fp_ollama", "choices": [choice]}

    def _chunk(self, text: str, finish: str | None) -> dict[str, Any]:
        if self.chat:
            delta = {"role": "assistant", "content": text} if finish is None else {}
            return self._object("chat.completion.chunk",
                                {"index": 0, "delta": delta, "finish_reason": finish})
        return self._object("text_completion", {"index": 0, "text": text,
                                                "finish_reason": finish})

    def opening(self) -> list[bytes]:
        return []

    def piece(self, text: str) -> list[bytes]:
        return [_event(self._chunk(text, None))]

    def closing(self, final: dict[str, Any]) -> list[bytes]:
        events = [_event(self._chunk("", "stop"))]
        if self.usage:  # a last chunk with no choices, as OpenAI's include_usage asks
            events.append(_event({**self._chunk("", None), "choices": [],
                                  "usage": _openai_usage(final)}))
        return [*events, b"data: [DONE]\n\n"]

    def whole(self, text: str, final: dict[str, Any]) -> dict[str, Any]:
        if self.chat:
            out = self._object("chat.completion", {
                "index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": text}})
        else:
            out = self._object("text_completion",
                               {"index": 0, "text": text, "finish_reason": "stop"})
        return {**out, "usage": _openai_usage(final)}


def _openai_usage(final: dict[str, Any]) -> dict[str, int]:
    prompt, completion = final.get("prompt_eval_count", 0), final.get("eval_count", 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class OpenAIResponses:
    """The Responses API: `response.*` events, the last one carrying the whole response."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.model, self.sequence = str(body.get("model")), 0
        self.ident, self.item = _ident("resp_"), _ident("msg_")
        self.text = ""

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        self.sequence += 1
        return _event({"type": kind, "sequence_number": self.sequence - 1, **data}, kind)

    def _message(self, status: str) -> dict[str, Any]:
        return {"id": self.item, "type": "message", "status": status, "role": "assistant",
                "content": [self._part()] if status == "completed" else []}

    def _part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": []}

    def _response(self, status: str, final: dict[str, Any] | None) -> dict[str, Any]:
        usage = None
        if final is not None:
            prompt, output = final.get("prompt_eval_count", 0), final.get("eval_count", 0)
            usage = {"input_tokens": prompt, "output_tokens": output,
                     "total_tokens": prompt + output,
                     "input_tokens_details": {"cached_tokens": 0},
                     "output_tokens_details": {"reasoning_tokens": 0}}
        return {"id": self.ident, "object": "response", "created_at": int(time.time()),
                "status": status, "model": self.model, "error": None,
                "incomplete_details": None, "instructions": None, "metadata": {},
                "output": [self._message("completed")] if final is not None else [],
                "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto",
                "tools": [], "top_p": 1.0, "usage": usage}

    def opening(self) -> list[bytes]:
        where = {"item_id": self.item, "output_index": 0, "content_index": 0}
        return [self._event("response.created", {"response": self._response("in_progress",
                                                                             None)}),
                self._event("response.output_item.added",
                            {"output_index": 0, "item": self._message("in_progress")}),
                self._event("response.content_part.added", {**where, "part": self._part()})]

    def piece(self, text: str) -> list[bytes]:
        self.text += text
        return [self._event("response.output_text.delta", {
            "item_id": self.item, "output_index": 0, "content_index": 0, "delta": text})]

    def closing(self, final: dict[str, Any]) -> list[bytes]:
        where = {"item_id": self.item, "output_index": 0, "content_index": 0}
        return [self._event("response.output_text.done", {**where, "text": self.text}),
                self._event("response.content_part.done", {**where, "part": self._part()}),
                self._event("response.output_item.done",
                            {"output_index": 0, "item": self._message("completed")}),
                self._event("response.completed",
                            {"response": self._response("completed", final)})]

    def whole(self, text: str, final: dict[str, Any]) -> dict[str, Any]:
        self.text = text
        return self._response("completed", final)


class AnthropicMessages:
    """Anthropic's messages: `message_start`, text block events, `message_delta` with the
    counts, then `message_stop`."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.model, self.ident = str(body.get("model")), _ident("msg_")

    def _message(self, content: list[dict[str, Any]], stop: str | None,
                 final: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.ident, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": final.get("prompt_eval_count", 0),
                          "output_tokens": final.get("eval_count", 0)}}

    def opening(self) -> list[bytes]:
        return [_event({"type": "message_start", "message": self._message([], None, {})},
                       "message_start"),
                _event({"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": ""}}, "content_block_start")]

    def piece(self, text: str) -> list[bytes]:
        return [_event({"type": "content_block_delta", "index": 0,
                        "delta": {"type": "text_delta", "text": text}}, "content_block_delta")]

    def closing(self, final: dict[str, Any]) -> list[bytes]:
        usage = self._message([], None, final)["usage"]
        return [_event({"type": "content_block_stop", "index": 0}, "content_block_stop"),
                _event({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                        "usage": usage}, "message_delta"),
                _event({"type": "message_stop"}, "message_stop")]

    def whole(self, text: str, final: dict[str, Any]) -> dict[str, Any]:
        return self._message([{"type": "text", "text": text}], "end_turn", final)


def translation_for(path: str, body: dict[str, Any]) -> Translation:
    if path == RESPONSES:
        return OpenAIResponses(body)
    if path == MESSAGES:
        return AnthropicMessages(body)
    return OpenAIChat(body, chat=path == CHAT)


def _piece(data: dict[str, Any]) -> str:
    message = data.get("message")
    return str(message["content"] if isinstance(message, dict) else data.get("response", ""))


async def answer(path: str, native: Response, body: dict[str, Any]) -> Response:
    """The native answer in the dialect's shape: events when streaming, else one object."""
    if native.status_code >= 400:
        return translated_error(path, native)
    shape = translation_for(path, body)
    if not isinstance(native, StreamingResponse):  # a load-only call: nothing generated
        return _json(shape.whole("", {}))
    lines: AsyncIterable[Any] = native.body_iterator
    if body.get("stream"):
        return StreamingResponse(_events(lines, shape), media_type="text/event-stream")
    text, final = [], {}
    try:
        async for line in lines:
            data = orjson.loads(line)
            text.append(_piece(data))
            final = data
    finally:
        await _close(lines)
    return _json(shape.whole("".join(text), final))


async def _events(lines: AsyncIterable[Any], shape: Translation) -> AsyncGenerator[bytes, None]:
    opened = False
    try:
        async for line in lines:
            data = orjson.loads(line)
            events = shape.closing(data) if data.get("done") else shape.piece(_piece(data))
            if not opened:  # as Ollama: the opening events go with the first chunk
                opened, events = True, [*shape.opening(), *events]
            for event in events:
                yield event
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
