"""The other dialects Ollama speaks, for the simulator: OpenAI's chat, completions,
Responses and embeddings, and Anthropic's messages. Each request is translated to the native
chat or generate call and the answer back, as Ollama's own middleware does
(`openai/openai.go`, `openai/responses.go`, `anthropic/anthropic.go`), so slots, context,
truncation and faults apply to them exactly as to native calls."""

from __future__ import annotations

import base64
import secrets
import struct
import time
from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from starlette.responses import Response, StreamingResponse

from . import sim_bindings
from .sim_engine import version_tuple
from .sim_model import CURRENT_VERSION
from .sim_output import ANSWER_TOKENS

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
RESPONSES, MESSAGES = "/v1/responses", "/v1/messages"
# Paths an older Ollama has no route for: the Responses API from 0.13.3, Anthropic's
# messages from 0.14.0 (openai/responses.go, anthropic/anthropic.go added)
SERVED_SINCE = {RESPONSES: (0, 13, 3), MESSAGES: (0, 14, 0)}
CHAT_PATHS = (CHAT, RESPONSES, MESSAGES)  # served by the native chat; completions by generate
RELAX_THINKING = "relax_thinking"  # a native body's mark: think is dropped, not refused
CLIENT_GONE = 499  # what the native handlers answer a caller that left (ollama_sim.py)
EFFORT_TO_THINK: dict[Any, Any] = {"none": False, "minimal": "low", "low": "low",
                                   "medium": "medium", "high": "high", "max": "max",
                                   "xhigh": "max", "ultra": "max"}
OPENAI_ERRORS = {400: "invalid_request_error", 404: "not_found_error"}
# anthropic.go NewError: the type by status, and a request id of 12 random bytes in hex
ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 429: "rate_limit_error",
                    503: "overloaded_error", 529: "overloaded_error"}


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def error(path: str, message: str, status: int) -> Response:
    if path == MESSAGES:
        kind = ANTHROPIC_ERRORS.get(status, "api_error")
        return _json({"type": "error", "error": {"type": kind, "message": message},
                      "request_id": f"req_{secrets.token_hex(12)}"}, status)
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
def request_error(path: str, body: dict[str, Any], version: str) -> str | None:
    """The OpenAI layer's 400 for a request it cannot bind or convert, before any model."""
    if path == CHAT:
        return sim_bindings.openai_chat_error(body, version)
    if path == COMPLETIONS:
        return sim_bindings.openai_completion_error(body, version)
    if path == RESPONSES:
        return sim_bindings.responses_error(body, version)
    if path == MESSAGES:
        return sim_bindings.anthropic_error(body, version)
    return None


def native_request(path: str, body: dict[str, Any], version: str) -> dict[str, Any]:
    """The /api/chat or /api/generate body Ollama builds from the dialect's request."""
    native: dict[str, Any] = {"model": body.get("model"), "stream": True}
    predict = body.get({RESPONSES: "max_output_tokens", MESSAGES: "max_tokens"}.get(
        path, "max_tokens"))
    native["options"] = {"num_predict": predict} if isinstance(predict, int) else {}
    if ANSWER_TOKENS in body:  # the sim-only length, a top-level field on these paths
        native["options"][ANSWER_TOKENS] = body[ANSWER_TOKENS]
    if path == COMPLETIONS:
        native["prompt"] = _text(body.get("prompt"))
        if body.get("suffix"):
            native["suffix"] = body["suffix"]
        logprobs = body.get("logprobs")  # its top_logprobs when positive (openai.go:830-843)
        if isinstance(logprobs, int) and not isinstance(logprobs, bool) and logprobs > 0:
            native["logprobs"], native["top_logprobs"] = True, logprobs
        return native
    if path == RESPONSES:
        native["messages"], tools = _responses_messages(body, version), \
            _responses_offered(body.get("tools") or [], version)
        native.update(_responses_format_and_think(body, version))
    elif path == MESSAGES:
        native["messages"], tools = _anthropic_messages(body, version), [
            _tool(t.get("name"), t.get("description"), t.get("input_schema"))
            for t in body.get("tools") or [] if isinstance(t, dict)]
        native.update(_anthropic_think(body))
    else:
        native["messages"] = [{**m, "content": _text(m.get("content"))}
                              for m in body.get("messages") or [] if isinstance(m, dict)]
        tools = body.get("tools") or []
        if body.get("logprobs") is True:  # openai/openai.go:718-719
            native["logprobs"] = True
        if "top_logprobs" in body:
            native["top_logprobs"] = body["top_logprobs"]
        native.update(_openai_format_and_think(body))
    if tools:  # `tool_choice` is not read: Ollama offers the model every tool regardless
        native["tools"] = tools
    return native


def _openai_format_and_think(body: dict[str, Any]) -> dict[str, Any]:
    """openai.go FromChatRequest: `response_format` json_object is format "json", a
    json_schema's schema the format; a reasoning effort is a think level ("none" is off)."""
    out: dict[str, Any] = {}
    wanted = body.get("response_format")
    if isinstance(wanted, dict):
        kind = str(wanted.get("type") or "").strip().lower()
        schema = wanted.get("json_schema")
        if kind == "json_object":
            out["format"] = "json"
        elif kind == "json_schema" and isinstance(schema, dict) and "schema" in schema:
            out["format"] = schema["schema"]
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else \
        body.get("reasoning_effort")
    if effort in EFFORT_TO_THINK:
        out["think"] = EFFORT_TO_THINK[effort]
    return out


def _responses_format_and_think(body: dict[str, Any], version: str) -> dict[str, Any]:
    """responses.go:575, 602-612 FromResponsesRequest: `text.format` json_schema's schema is the
    format (no "json" mode on this API); `reasoning.effort` a think level as on chat, from
    0.22.0 (an older Ollama ignores it)."""
    read = version_tuple(version) >= sim_bindings.RESPONSES_EFFORT_SINCE
    out = _openai_format_and_think({"reasoning": body.get("reasoning") if read else None})
    text = body.get("text")
    wanted = text.get("format") if isinstance(text, dict) else None
    if isinstance(wanted, dict) and wanted.get("type") == "json_schema" and \
            wanted.get("schema") is not None:
        out["format"] = wanted["schema"]
    return out


# From 0.32.7 a `namespace` tool is its member functions, each named `namespace.name`
# (openai/responses.go convertTools); before, it is one function with no parameters.
NAMESPACES_SINCE = (0, 32, 7)


# From 0.32.10 a `web_search` tool is offered as Ollama's own function, which replaces a
# declared function of that name (openai/responses.go WebSearchFunctionTool)
WEB_SEARCH_SINCE = (0, 32, 10)
WEB_SEARCH = {"type": "function", "function": {
    "name": "web_search", "description": "Search the web for current information.",
    "parameters": {"type": "object", "required": ["query"], "properties": {
        "query": {"type": "string", "description": "The search query."}}}}}


def _responses_offered(given: list[Any], version: str) -> list[dict[str, Any]]:
    searches = version_tuple(version) >= WEB_SEARCH_SINCE and any(
        isinstance(t, dict) and t.get("type") == "web_search" for t in given)
    offered: list[dict[str, Any]] = []
    for declared in given:
        if searches and isinstance(declared, dict) and declared.get("type") == "web_search":
            offered.append(WEB_SEARCH)
            continue
        offered += [tool for tool in _responses_tools(declared, version)
                    if not searches or tool["function"]["name"] != "web_search"]
    return offered


def _responses_tools(tool: Any, version: str, prefix: str = "") -> list[dict[str, Any]]:
    if not isinstance(tool, dict):
        return [_tool("", None, None)] if tool is None else []
    members = tool.get("tools")
    if tool.get("type") == "namespace" and isinstance(members, list) and \
            version_tuple(version) >= NAMESPACES_SINCE:
        name = tool.get("name")
        inner = f"{prefix}{name}." if isinstance(name, str) and name else prefix
        return [t for member in members for t in _responses_tools(member, version, inner)]
    name = tool.get("name")
    return [_tool(f"{prefix}{name}" if prefix and isinstance(name, str) else name,
                  tool.get("description"), tool.get("parameters"))]


def _anthropic_think(body: dict[str, Any]) -> dict[str, Any]:
    """anthropic.go:381-401 FromMessagesRequest: `thinking` enabled or disabled, else
    `output_config.effort` as a level. Behind this layer a model that cannot think is not
    refused (middleware/anthropic.go:763, server/routes.go:2621-2626): RELAX_THINKING."""
    thinking, config = body.get("thinking"), body.get("output_config")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    effort = str(config.get("effort") or "").strip().lower() if isinstance(config, dict) \
        else ""
    effort = "high" if effort == "xhigh" else effort
    if kind in ("enabled", "disabled"):
        return {"think": kind == "enabled", RELAX_THINKING: True}
    if effort in ("low", "medium", "high", "max"):
        return {"think": effort, RELAX_THINKING: True}
    return {}


def _call(name: Any, arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        arguments = orjson.loads(arguments or "{}")
    return {"function": {"name": name, "arguments": arguments}}


# openai/responses.go FromResponsesRequest: a function call joins the assistant message
# before it from 0.13.4, an assistant reply the call it answers from 0.32.10
CALLS_JOIN_SINCE, REPLIES_JOIN_SINCE = (0, 13, 4), (0, 32, 10)


def _responses_messages(body: dict[str, Any], version: str) -> list[dict[str, Any]]:
    """FromResponsesRequest's walk: a reasoning item's text is the thinking of the next
    assistant message or function call (a later reasoning item first replaces it)."""
    at = version_tuple(version)
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    given = body.get("input")
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    items = given or []
    pending = ""
    for index, item in enumerate(items):
        kind = item.get("type") or "message"
        last = messages[-1] if messages else {}
        if kind == "reasoning":
            pending = str(item.get("encrypted_content") or "")
        elif kind == "message":
            message = {"role": item.get("role"), "content": _text(item.get("content"))}
            if message["role"] == "assistant" and pending:
                message["thinking"], pending = pending, ""
            after = items[index + 1] if index + 1 < len(items) else {}
            answered = after.get("call_id") if after.get("type") == "function_call_output" \
                else None
            if at >= REPLIES_JOIN_SINCE and message["role"] == "assistant" and answered and \
                    last.get("role") == "assistant" and \
                    any(call.get("id") == answered for call in last.get("tool_calls") or []):
                last["content"] += ("\n" if last["content"] and message["content"] else "") + \
                    message["content"]
                if message.get("thinking"):
                    last["thinking"] = message["thinking"]
                continue
            messages.append(message)
        elif kind == "function_call":
            call = {"id": item.get("call_id"),
                    **_call(item.get("name"), item.get("arguments"))}
            if at >= CALLS_JOIN_SINCE and last.get("role") == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                last = {"role": "assistant", "content": "", "tool_calls": [call]}
                messages.append(last)
            if pending:
                last["thinking"], pending = pending, ""
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": _text(item.get("output"))})
    if pending:
        messages.append({"role": "assistant", "content": "", "thinking": pending})
    return messages


# anthropic.go convertMessage reads a web search's blocks from 0.16.2 (commit 5f5ef2013)
WEB_SEARCH_BLOCKS_SINCE = (0, 16, 2)


def _search_result_text(content: Any) -> str:
    """formatWebSearchToolResultContent: `- title: url` a result, an error's code."""
    if isinstance(content, str):
        return content
    items = content if isinstance(content, list) else [content]
    lines = []
    for item in items:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "web_search_tool_result_error":
            code = item.get("error_code")
            return f"web_search_tool_result_error: {code}" if code else \
                "web_search_tool_result_error"
        if kind == "web_search_result":
            lines.append(f"- {item.get('title') or ''}: {item.get('url') or ''}\n")
    return "".join(lines) if isinstance(content, list) or lines else \
        orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()


def _anthropic_messages(body: dict[str, Any], version: str) -> list[dict[str, Any]]:
    searches = version_tuple(version) >= WEB_SEARCH_BLOCKS_SINCE
    system = _text(body.get("system"))
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in body.get("messages") or []:
        blocks = message.get("content")
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        text, calls, thinking = "", [], ""
        for block in blocks or []:
            kind = block.get("type")
            if kind == "text":
                text += str(block.get("text") or "")
            elif kind == "thinking" and block.get("thinking") is not None:
                thinking = str(block["thinking"])  # the last block's (convertMessage)
            elif kind == "tool_use" or (kind == "server_tool_use" and searches):
                calls.append(_call(block.get("name"), block.get("input") or {}))
            elif kind == "web_search_tool_result" and searches:
                messages.append({"role": "tool",
                                 "content": _search_result_text(block.get("content"))})
            elif kind == "tool_result":
                messages.append({"role": "tool", "content": _text(block.get("content"))})
        if text or calls or thinking:
            messages.append({"role": message.get("role"), "content": text,
                             **({"tool_calls": calls} if calls else {}),
                             **({"thinking": thinking} if thinking else {})})
    return messages


# -- answers --------------------------------------------------------------------------------
class Translation(Protocol):
    """How one dialect tells a native answer: as a stream of events, or whole."""

    def opening(self) -> list[bytes]: ...
    def piece(self, said: Said) -> list[bytes]: ...
    def closing(self, final: dict[str, Any]) -> list[bytes]: ...
    def whole(self, said: Said, final: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class Said:
    """What a native chunk (or a whole answer) says: text, thinking and tool calls."""

    content: str = ""
    thinking: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # its tokens' (0.12.11+)

    def add(self, other: Said) -> None:
        self.content += other.content
        self.thinking += other.thinking
        self.tool_calls += other.tool_calls
        self.logprobs += other.logprobs


def _openai_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """openai.go ToToolCalls: arguments as a JSON string, the index beside the id."""
    out = []
    for call in calls:
        function = call.get("function") or {}
        out.append({"id": call.get("id", ""), "index": function.get("index", 0),
                    "type": "function",
                    "function": {"name": function.get("name", ""),
                                 "arguments": orjson.dumps(function.get("arguments")).decode()}})
    return out


def _ident(prefix: str) -> str:
    return f"{prefix}{int(time.time() * 1000) % 100000}"


class OpenAIChat:
    """Chat completions (`chat.completion.chunk`) or text completions (`text_completion`)."""

    def __init__(self, body: dict[str, Any], chat: bool, role_once: bool = True) -> None:
        self.chat, self.model = chat, str(body.get("model"))
        self.role_once, self.role_said = role_once, False
        self.ident, self.created = _ident("chatcmpl-" if chat else "cmpl-"), int(time.time())
        options = body.get("stream_options")
        self.usage = isinstance(options, dict) and bool(options.get("include_usage"))
        # A tool call went out: the finish reason is "tool_calls" (openai/openai.go:288, 375).
        self.called = False

    def _object(self, obj: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.ident, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "fp_ollama", "choices": [choice]}

    def _chunk(self, said: Said, finish: str | None) -> dict[str, Any]:
        if self.chat:
            # From 0.32.6 the finish is a chunk of its own, its delta empty (openai.go
            # FinishChunk); before, the done answer's own message (v0.12.6 openai.go:295)
            delta = self._message(said) if finish is None or not self.role_once else {}
            if delta and self.role_once and self.role_said:
                delta.pop("role")
            self.role_said = self.role_said or bool(delta)
            return self._object("chat.completion.chunk", _with_logprobs(
                {"index": 0, "delta": delta, "finish_reason": finish}, said))
        return self._object("text_completion", _with_logprobs(
            {"index": 0, "text": said.content, "finish_reason": finish}, said))

    @staticmethod
    def _message(said: Said) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": said.content}
        if said.thinking:
            message["reasoning"] = said.thinking
        if said.tool_calls:
            message["tool_calls"] = _openai_calls(said.tool_calls)
        return message

    def _finish(self, final: dict[str, Any]) -> str:
        """openai.go: Ollama's done_reason, "stop" turned "tool_calls" after a call."""
        reason = str(final.get("done_reason") or "stop")
        return "tool_calls" if reason == "stop" and self.called else reason

    def opening(self) -> list[bytes]:
        return []

    def piece(self, said: Said) -> list[bytes]:
        self.called = self.called or bool(said.tool_calls)
        return [_event(self._chunk(said, None))]

    def closing(self, final: dict[str, Any]) -> list[bytes]:
        events = [_event(self._chunk(Said(), self._finish(final)))]
        if self.usage:  # a last chunk with no choices, as OpenAI's include_usage asks
            events.append(_event({**self._chunk(Said(), None), "choices": [],
                                  "usage": _openai_usage(final)}))
        return [*events, b"data: [DONE]\n\n"]

    def whole(self, said: Said, final: dict[str, Any]) -> dict[str, Any]:
        self.called = bool(said.tool_calls)
        if self.chat:
            out = self._object("chat.completion", _with_logprobs({
                "index": 0, "finish_reason": self._finish(final),
                "message": self._message(said)}, said))
        else:
            out = self._object("text_completion", _with_logprobs({
                "index": 0, "text": said.content, "finish_reason": self._finish(final)}, said))
        return {**out, "usage": _openai_usage(final)}


def _with_logprobs(choice: dict[str, Any], said: Said) -> dict[str, Any]:
    """openai.go ToChatCompletion, toChunk, ToCompletion: the tokens' logprobs as the
    choice's `logprobs.content`, when the answer had any (omitempty)."""
    return {**choice, "logprobs": {"content": said.logprobs}} if said.logprobs else choice


def _openai_usage(final: dict[str, Any]) -> dict[str, int]:
    prompt, completion = final.get("prompt_eval_count", 0), final.get("eval_count", 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class OpenAIResponses:
    """The Responses API as Ollama's converter tells it (openai/responses.go): a reasoning
    item for thinking (:1238-1308), a function_call item per tool call (:1316-1366) and then
    no text, else a message item opened at the first text (:1485-1534); `response.created`
    and `response.in_progress` first, `response.completed` with every item last
    (:1557-1624). Whole, `ToResponse` (:898-1021): reasoning, then the calls or the message."""

    def __init__(self, body: dict[str, Any], full: bool = True) -> None:
        self.request, self.model, self.sequence = body, str(body.get("model")), 0
        self.full = full  # the answer's shape from 0.14.2 (RESPONSE_FIELDS_SINCE)
        self.ident = _ident("resp_")
        self.item = f"msg_{self.ident.removeprefix('resp_')}"
        self.index = 0  # output index of the item being told
        self.done: list[dict[str, Any]] = []  # items told whole, in output order
        self.thinking: str | None = None  # a reasoning item is open
        self.reasoning_id = ""
        self.text: str | None = None  # a message item is open
        self.called = False

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        self.sequence += 1
        return _event({"type": kind, "sequence_number": self.sequence - 1, **data}, kind)

    def _output_text(self, text: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text}
        return {**part, "annotations": [], "logprobs": []} if self.full else part

    def _logprobs(self) -> dict[str, Any]:
        """A text event's empty `logprobs`, from 0.14.2."""
        return {"logprobs": []} if self.full else {}

    def _message(self, status: str, text: str | None) -> dict[str, Any]:
        return {"id": self.item, "type": "message", "status": status, "role": "assistant",
                "content": [] if text is None else [self._output_text(text)]}

    @staticmethod
    def _reasoning(ident: str, thinking: str) -> dict[str, Any]:
        return {"id": ident, "type": "reasoning",
                "summary": [{"type": "summary_text", "text": thinking}],
                "encrypted_content": thinking}  # Ollama's: the plain text

    @staticmethod
    def _function_call(ident: str, call: dict[str, Any], status: str, arguments: str
                       ) -> dict[str, Any]:
        return {"id": ident, "type": "function_call", "status": status,
                "call_id": call["id"], "name": call["function"]["name"],
                "arguments": arguments}

    def _response(self, status: str, output: list[dict[str, Any]],
                  final: dict[str, Any] | None, whole: bool = False) -> dict[str, Any]:
        """The response object: from 0.14.2 (commit 38eac40d5) every field of OpenAI's,
        the request's echoed (v0.24.0 openai/responses.go ToResponse :753-876, the stream's
        buildResponseObject :978-1080); before, ToResponse's id, object, created_at, status,
        model, output and usage, and a stream's id, object, status, output and, at its end,
        usage (v0.14.1 :519-527, :721-737, :1000-1011)."""
        usage = None if final is None else self._usage(final)
        if not self.full:
            kept = {"id": self.ident, "object": "response", "created_at": int(time.time()),
                    "status": status, "model": self.model} if whole else \
                {"id": self.ident, "object": "response", "status": status}
            return {**kept, "output": output, **({"usage": usage} if usage else {})}
        body = self.request
        text = body.get("text")
        wanted = text.get("format") if isinstance(text, dict) else None
        reasoning = body.get("reasoning")
        reasoning = {k: reasoning[k] for k in ("effort", "summary") if reasoning.get(k)} \
            if isinstance(reasoning, dict) else {}
        top_p, temperature, truncation, most = (body.get(k) for k in (
            "top_p", "temperature", "truncation", "max_output_tokens"))
        return {"id": self.ident, "object": "response", "created_at": int(time.time()),
                "completed_at": int(time.time()) if whole else None, "status": status,
                "incomplete_details": None, "model": self.model,
                "previous_response_id": None,
                "instructions": body.get("instructions") or None, "output": output,
                "error": None, "tools": body.get("tools") or [], "tool_choice": "auto",
                "truncation": truncation if isinstance(truncation, str) else "disabled",
                "parallel_tool_calls": True,
                "text": {"format": wanted if isinstance(wanted, dict) else {"type": "text"}},
                "top_p": _number(top_p, 1.0), "presence_penalty": 0,
                "frequency_penalty": 0, "top_logprobs": 0,
                "temperature": _number(temperature, 1.0), "reasoning": reasoning or None,
                "usage": usage, "max_output_tokens": most if isinstance(most, int) else None,
                "max_tool_calls": None, "store": False,
                "background": body.get("background") is True, "service_tier": "default",
                "metadata": {}, "safety_identifier": None, "prompt_cache_key": None}

    def _usage(self, final: dict[str, Any]) -> dict[str, Any]:
        prompt, output_tokens = final.get("prompt_eval_count", 0), final.get("eval_count", 0)
        usage: dict[str, Any] = {"input_tokens": prompt, "output_tokens": output_tokens,
                                 "total_tokens": prompt + output_tokens}
        if self.full:  # (their counts not wired through yet: zero)
            usage.update(input_tokens_details={"cached_tokens": 0},
                         output_tokens_details={"reasoning_tokens": 0})
        return usage

    def opening(self) -> list[bytes]:
        return [self._event("response.created",
                            {"response": self._response("in_progress", [], None)}),
                self._event("response.in_progress",
                            {"response": self._response("in_progress", [], None)})]

    def piece(self, said: Said) -> list[bytes]:
        events = []
        if said.thinking:
            events += self._think(said.thinking)
        if said.tool_calls:
            events += [*self._end_reasoning(), *self._calls(said.tool_calls)]
            self.called = True
        elif said.content and not self.called:
            events += [*self._end_reasoning(), *self._say(said.content)]
        return events

    def _think(self, thinking: str) -> list[bytes]:
        events = []
        if self.thinking is None:
            self.thinking, self.reasoning_id = "", _ident("rs_")
            events.append(self._event("response.output_item.added", {
                "output_index": self.index,
                "item": {"id": self.reasoning_id, "type": "reasoning", "summary": []}}))
        self.thinking += thinking
        return [*events, self._event("response.reasoning_summary_text.delta", {
            "item_id": self.reasoning_id, "output_index": self.index, "summary_index": 0,
            "delta": thinking})]

    def _end_reasoning(self) -> list[bytes]:
        if self.thinking is None:
            return []
        item = self._reasoning(self.reasoning_id, self.thinking)
        where = {"output_index": self.index}
        events = [self._event("response.reasoning_summary_text.done", {
                      "item_id": self.reasoning_id, **where, "summary_index": 0,
                      "text": self.thinking}),
                  self._event("response.output_item.done", {**where, "item": item})]
        self.done.append(item)
        self.thinking, self.index = None, self.index + 1
        return events

    def _calls(self, calls: list[dict[str, Any]]) -> list[bytes]:
        events = []
        for call in _openai_calls(calls):
            ident, arguments = _ident(f"fc_{self.index}_"), call["function"]["arguments"]
            item = self._function_call(ident, call, "completed", arguments)
            where = {"output_index": self.index}
            events += [
                self._event("response.output_item.added", {
                    **where, "item": self._function_call(ident, call, "in_progress", "")}),
                self._event("response.function_call_arguments.delta",
                            {"item_id": ident, **where, "delta": arguments}),
                self._event("response.function_call_arguments.done",
                            {"item_id": ident, **where, "arguments": arguments}),
                self._event("response.output_item.done", {**where, "item": item})]
            self.done.append(item)
            self.index += 1
        return events

    def _say(self, content: str) -> list[bytes]:
        where = {"item_id": self.item, "output_index": self.index, "content_index": 0}
        events = []
        if self.text is None:
            self.text = ""
            events += [self._event("response.output_item.added", {
                           "output_index": self.index,
                           "item": self._message("in_progress", None)}),
                       self._event("response.content_part.added",
                                   {**where, "part": self._output_text("")})]
        self.text += content
        return [*events, self._event("response.output_text.delta",
                                     {**where, "delta": content, **self._logprobs()})]

    def closing(self, final: dict[str, Any]) -> list[bytes]:
        events = [*self.piece(_said(final)), *self._end_reasoning()]
        output = list(self.done)
        if self.text is not None:
            where = {"item_id": self.item, "output_index": self.index, "content_index": 0}
            message = self._message("completed", self.text)
            events += [self._event("response.output_text.done",
                                   {**where, "text": self.text, **self._logprobs()}),
                       self._event("response.content_part.done",
                                   {**where, "part": self._output_text(self.text)}),
                       self._event("response.output_item.done",
                                   {"output_index": self.index, "item": message})]
            output.append(message)
        response = self._response("completed", output, final)
        if self.full:  # (processCompletion sets it, v0.24.0 :1375-1376)
            response["completed_at"] = int(time.time())
        return [*events, self._event("response.completed", {"response": response})]

    def whole(self, said: Said, final: dict[str, Any]) -> dict[str, Any]:
        output = []
        if said.thinking:
            output.append(self._reasoning(f"rs_{self.ident}", said.thinking))
        if said.tool_calls:
            output += [self._function_call(f"fc_{self.ident}_{i}", call, "completed",
                                           call["function"]["arguments"])
                       for i, call in enumerate(_openai_calls(said.tool_calls))]
        else:
            output.append(self._message("completed", said.content))
        return self._response("completed", output, final, whole=True)


def _number(value: Any, default: float) -> float:
    """A request's number echoed (derefFloat64), its default when not given."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) \
        else default


def _stop_reason(done_reason: Any, called: bool) -> str | None:
    """anthropic.go:699-714 mapStopReason: tool_use after a call, else Ollama's reason."""
    if called:
        return "tool_use"
    if done_reason == "stop":
        return "end_turn"
    if done_reason == "length":
        return "max_tokens"
    return "stop_sequence" if done_reason else None


class AnthropicMessages:
    """Anthropic's messages as Ollama's StreamConverter tells them (anthropic/anthropic.go
    :749-981): `message_start`, a `thinking` block, a `text` block, a `tool_use` block per
    call (its input as one `input_json_delta`), each opened and stopped in turn, then
    `message_delta` with the stop reason and counts and `message_stop`. Whole,
    ToMessagesResponse (:656-697): thinking, text, then tool_use blocks."""

    def __init__(self, body: dict[str, Any], estimates: bool = True) -> None:
        self.model, self.ident = str(body.get("model")), _ident("msg_")
        # message_start's input_tokens: the request's estimate from 0.15.5, 0 before
        self.estimate = estimate_input_tokens(body) if estimates else 0
        self.index = 0  # the content block being told
        self.open: str | None = None  # its kind while open: "thinking" or "text"
        self.thought = False  # a thinking block was told whole
        self.called = False

    def _message(self, content: list[dict[str, Any]], stop: str | None,
                 final: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.ident, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": final.get("prompt_eval_count", 0),
                          "output_tokens": final.get("eval_count", 0)}}

    def _block_event(self, kind: str, **data: Any) -> bytes:
        return _event({"type": kind, "index": self.index, **data}, kind)

    def _stop_block(self) -> list[bytes]:
        if self.open is None:
            return []
        self.thought = self.thought or self.open == "thinking"
        event, self.open = self._block_event("content_block_stop"), None
        self.index += 1
        return [event]

    def _delta(self, kind: str, text: str) -> list[bytes]:
        events = []
        if self.open != kind:
            events = self._stop_block()
            self.open = kind
            events.append(self._block_event("content_block_start",
                                            content_block={"type": kind, kind: ""}))
        field = "thinking" if kind == "thinking" else "text"
        return [*events, self._block_event("content_block_delta", delta={
            "type": f"{field}_delta", field: text})]

    def opening(self) -> list[bytes]:
        start = self._message([], None, {"prompt_eval_count": self.estimate})
        return [_event({"type": "message_start", "message": start}, "message_start")]

    def piece(self, said: Said) -> list[bytes]:
        events = []
        if said.thinking and not self.thought:
            events += self._delta("thinking", said.thinking)
        if said.content:
            events += self._delta("text", said.content)
        for call in said.tool_calls:
            function = call.get("function") or {}
            events += [*self._stop_block(),
                       self._block_event("content_block_start", content_block={
                           "type": "tool_use", "id": call.get("id", ""),
                           "name": function.get("name", ""), "input": {}}),
                       self._block_event("content_block_delta", delta={
                           "type": "input_json_delta",
                           "partial_json": orjson.dumps(function.get("arguments") or {}
                                                        ).decode()}),
                       self._block_event("content_block_stop")]
            self.index += 1
            self.called = True
        return events

    def closing(self, final: dict[str, Any]) -> list[bytes]:
        usage = self._message([], None, final)["usage"]
        stop = _stop_reason(final.get("done_reason"), self.called)
        return [*self.piece(_said(final)), *self._stop_block(),
                _event({"type": "message_delta", "delta": {"stop_reason": stop},
                        "usage": usage}, "message_delta"),
                _event({"type": "message_stop"}, "message_stop")]

    def whole(self, said: Said, final: dict[str, Any]) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if said.thinking:
            content.append({"type": "thinking", "thinking": said.thinking})
        if said.content:
            content.append({"type": "text", "text": said.content})
        content += [{"type": "tool_use", "id": call.get("id", ""),
                     "name": (call.get("function") or {}).get("name", ""),
                     "input": (call.get("function") or {}).get("arguments") or {}}
                    for call in said.tool_calls]
        stop = _stop_reason(final.get("done_reason") or "stop", bool(said.tool_calls))
        return self._message(content, stop, final)


# From 0.15.5 a streamed message_start counts the request's estimated tokens (ee25219ed)
ESTIMATE_SINCE = (0, 15, 5)


def _go_len(value: Any) -> int:
    """The bytes of Go's json.Marshal of a decoded value: compact, `<`, `>`, `&` and
    U+2028/9 written as 6-byte \\u escapes."""
    text = orjson.dumps(value).decode()
    return len(text.encode()) + 5 * sum(text.count(c) for c in "<>&\u2028\u2029") - \
        2 * sum(text.count(c) for c in "\u2028\u2029")


def _block_len(block: Any) -> int:
    """anthropic.go countContentBlock: text and thinking, and a tool_use or tool_result
    block whole as Go marshals its ContentBlock (fields in struct order, empty ones out)."""
    if not isinstance(block, dict):
        return 0
    total = sum(len(str(block[k]).encode()) for k in ("text", "thinking")
                if isinstance(block.get(k), str))
    if block.get("type") in ("tool_use", "tool_result"):
        kept = {k: block[k] for k in ("type", "text", "citations", "source", "id", "name",
                                      "input", "tool_use_id", "content", "is_error",
                                      "thinking", "signature") if block.get(k)}
        total += _go_len(kept)
    return total


def _content_len(content: Any) -> int:
    """anthropic.go countAnyContent: a string's bytes, blocks each, else its JSON."""
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content.encode())
    if isinstance(content, list):
        return sum(_block_len(block) for block in content)
    return _go_len(content)


def estimate_input_tokens(body: dict[str, Any]) -> int:
    """anthropic.go:1076-1120 EstimateInputTokens: the system, each message's role and
    content, each tool's name, description and schema, in bytes over 4 (1 at least when
    there is a message or a system)."""
    messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
    total = _content_len(body.get("system"))
    for message in messages:
        content = message.get("content")
        total += len(str(message.get("role") or "").encode()) + _content_len(
            [{"type": "text", "text": content}] if isinstance(content, str) else content)
    for tool in body.get("tools") or ():
        if isinstance(tool, dict):
            total += sum(len(str(tool.get(k) or "").encode()) for k in ("name", "description"))
            # a json.RawMessage: the bytes as sent, compact as the SDKs send them
            total += len(orjson.dumps(tool["input_schema"])) if "input_schema" in tool else 0
    tokens = total // 4
    return 1 if tokens == 0 and (messages or body.get("system") is not None) else tokens


# From 0.14.2 a Responses answer has every field of OpenAI's, its content parts annotations
# and logprobs, its usage their details (commit 38eac40d5)
RESPONSE_FIELDS_SINCE = (0, 14, 2)
# From 0.32.6 a streamed chat names the role in its first chunk only (commit 8edecb5c6)
ROLE_ONCE_SINCE = (0, 32, 6)


def translation_for(path: str, body: dict[str, Any], version: str = CURRENT_VERSION
                    ) -> Translation:
    if path == RESPONSES:
        return OpenAIResponses(body, version_tuple(version) >= RESPONSE_FIELDS_SINCE)
    if path == MESSAGES:
        return AnthropicMessages(body, version_tuple(version) >= ESTIMATE_SINCE)
    return OpenAIChat(body, chat=path == CHAT,
                      role_once=version_tuple(version) >= ROLE_ONCE_SINCE)


def _said(data: dict[str, Any]) -> Said:
    message = data.get("message")
    said = message if isinstance(message, dict) else data
    return Said(str(said.get("content" if said is message else "response", "")),
                str(said.get("thinking", "")), list(said.get("tool_calls", ())),
                list(data.get("logprobs") or ()))


async def answer(path: str, native: Response, body: dict[str, Any],
                 version: str = CURRENT_VERSION) -> Response:
    """The native answer in the dialect's shape: events when streaming, else one object."""
    if native.status_code == CLIENT_GONE:
        return native  # the caller left during the load or the answer: nobody reads it
    if native.status_code >= 400:
        return translated_error(path, native)
    shape = translation_for(path, body, version)
    if not isinstance(native, StreamingResponse):  # a load-only call: nothing generated
        return _json(shape.whole(Said(), {}))
    lines: AsyncIterable[Any] = native.body_iterator
    if body.get("stream"):
        return StreamingResponse(_events(lines, shape), media_type="text/event-stream")
    said, final = Said(), {}
    try:
        async for line in lines:
            data = orjson.loads(line)
            if "error" in data:  # the native answer failed: a JSON 500 (routes.go:2406-2418)
                return error(path, str(data["error"]), 500)
            said.add(_said(data))
            final = data
    finally:
        await _close(lines)
    return _json(shape.whole(said, final))


async def _events(lines: AsyncIterable[Any], shape: Translation) -> AsyncGenerator[bytes, None]:
    opened = False
    try:
        async for line in lines:
            data = orjson.loads(line)
            if "error" in data:
                # The middlewares read the error line as an empty chunk and the stream ends
                # without its close (middleware/openai.go:80-170, anthropic.go:53-77)
                for event in shape.piece(Said()):
                    yield event
                return
            # as Ollama: the opening events go with the first chunk, numbered first
            # (a Responses stream's sequence_number)
            opening = [] if opened else shape.opening()
            opened = True
            events = [*opening, *(shape.closing(data) if data.get("done")
                                  else shape.piece(_said(data)))]
            for event in events:
                yield event
    finally:
        await _close(lines)


async def _close(lines: AsyncIterable[Any]) -> None:
    """End the native generator now (frees its slot) when the client left early."""
    close = getattr(lines, "aclose", None)
    if close is not None:
        await close()


def embeddings(native: dict[str, Any], model: str, encoding: Any = None) -> dict[str, Any]:
    """/api/embed's answer as OpenAI's embedding list; with `encoding_format` "base64" each
    vector is its little-endian float32s in base64 (openai/openai.go:472-511)."""
    tokens = int(native.get("prompt_eval_count") or 0)
    packed = isinstance(encoding, str) and encoding.lower() == "base64"
    data = [{"object": "embedding",
             "embedding": base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
             if packed else vector, "index": i}
            for i, vector in enumerate(native.get("embeddings") or [])]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
