"""Inputs Ollama refuses that the other checks do not cover, with its exact words: an image
that is not base64 (Go's encoding/json decodes api.ImageData, a []byte, with
base64.StdEncoding: 400 at binding), a `think` value api.ThinkValue does not take (400 at
binding, api/types.go:1202-1222), top_logprobs outside 0-20 (from 0.12.11,
server/routes.go:256-258, 2452-2454), `raw` with a system, template or context
(server/routes.go:422-424), a `format` neither "json" nor a schema object (refused by the
runner, llm/llama_server.go:1584-1595, 2308-2326: a 500 after the load), and the OpenAI
layer's binding and conversion refusals (middleware/openai.go:360-373, 395-423, 446-465,
1169-1177; openai/openai.go:531-546, 738-768) and the Anthropic layer's
(middleware/anthropic.go:736-756).
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from . import sim_gojson
from .sim_checks import go_quote
from .sim_engine import version_tuple

BASE64_ALPHABET = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
NEWLINES = b"\r\n"
RAW_REFUSAL = "raw mode does not support template, system, or context"
# The reasoning efforts each version takes (openai/openai.go thinkFromReasoningEffort):
# max from 0.22.0, minimal, xhigh and ultra from 0.32.11; the Responses API reads none
# before 0.22.0 (openai/responses.go)
EFFORTS = ("", "none", "minimal", "low", "medium", "high", "max", "xhigh", "ultra")
MAX_EFFORT_SINCE, MORE_EFFORTS_SINCE = (0, 22, 0), (0, 32, 11)
RESPONSES_EFFORT_SINCE = (0, 22, 0)
IMAGE_PREFIXES = ("data:;base64,", "data:image/jpeg;base64,", "data:image/jpg;base64,",
                  "data:image/png;base64,", "data:image/webp;base64,")
ENCODING_FORMATS = ("float", "base64")
# The OpenAI request structs' typed fields (openai/openai.go:106-125 ChatCompletionRequest,
# 149-163 CompletionRequest): Go's kind for each
CHAT_FIELDS = ("ChatCompletionRequest", {
    "temperature": "float64", "frequency_penalty": "float64", "presence_penalty": "float64",
    "top_p": "float64", "max_tokens": "int", "seed": "int", "stream": "bool",
    "reasoning_effort": "string", "top_logprobs": "int"})
COMPLETION_FIELDS = ("CompletionRequest", {
    "temperature": "float32", "frequency_penalty": "float32", "presence_penalty": "float32",
    "top_p": "float32", "max_tokens": "int", "seed": "int", "stream": "bool",
    "suffix": "string", "prompt": "string"})

# api.ShowRequest's typed fields (api/types.go:722-734), bound by ShowHandler
# (server/routes.go:1300-1310)
SHOW_FIELDS = ("ShowRequest", {"model": "string", "system": "string", "template": "string",
                               "verbose": "bool", "name": "string"})

# The native requests' typed fields (api/types.go:62-180 GenerateRequest and ChatRequest,
# 599-640 EmbedRequest and EmbeddingRequest), bound by each handler's ShouldBindJSON
# (server/routes.go:248, 798, 1044, 2444); logprobs and top_logprobs from 0.12.11
OPTIONS_KIND = "map[string]interface {}"
GENERATE_FIELDS = ("GenerateRequest", {
    "model": "string", "prompt": "string", "suffix": "string", "system": "string",
    "template": "string", "stream": "bool", "raw": "bool", "truncate": "bool",
    "shift": "bool", "options": OPTIONS_KIND, "logprobs": "bool", "top_logprobs": "int"})
CHAT_REQUEST_FIELDS = ("ChatRequest", {
    "model": "string", "messages": "[]api.Message", "stream": "bool", "truncate": "bool",
    "shift": "bool", "options": OPTIONS_KIND, "logprobs": "bool", "top_logprobs": "int"})
EMBED_REQUEST_FIELDS = ("EmbedRequest", {"model": "string", "truncate": "bool",
                                         "dimensions": "int", "options": OPTIONS_KIND})
EMBEDDING_FIELDS = ("EmbeddingRequest", {"model": "string", "prompt": "string",
                                         "options": OPTIONS_KIND})
LOGPROBS_SINCE = (0, 12, 11)
# Typed fields a version has not got yet, which it ignores as any unknown key (api/types.go:
# GenerateRequest's and ChatRequest's truncate and shift from 0.12.4, EmbedRequest's
# dimensions from 0.11.11; its truncate is older than /api/embed)
FIELDS_SINCE = {"logprobs": LOGPROBS_SINCE, "top_logprobs": LOGPROBS_SINCE,
                "shift": (0, 12, 4), "truncate": (0, 12, 4), "dimensions": (0, 11, 11)}

MESSAGES_FIELDS = ("MessagesRequest", {
    "max_tokens": "int", "stream": "bool", "temperature": "float64", "top_p": "float64",
    "top_k": "int"})


def base64_error(text: str) -> str | None:
    """base64.StdEncoding.Decode's refusal of `text` (encoding/base64 decodeQuantum: the byte
    offset of the bad character, of an unfinished quantum, or of what trails the padding)."""
    data, si = text.encode(), 0

    def corrupt(at: int) -> str:
        return f"illegal base64 data at input byte {at}"

    while True:
        j = 0
        while j < 4:
            if si == len(data):
                return None if j == 0 else corrupt(si - j)
            byte = data[si]
            si += 1
            if byte in BASE64_ALPHABET:
                j += 1
                continue
            if byte in NEWLINES:
                continue
            if byte != ord("=") or j < 2:
                return corrupt(si - 1)
            if j == 2:  # a second "=" must follow
                while si < len(data) and data[si] in NEWLINES:
                    si += 1
                if si == len(data):
                    return corrupt(len(data))
                if data[si] != ord("="):
                    return corrupt(si - 1)
                si += 1
            while si < len(data) and data[si] in NEWLINES:
                si += 1
            return corrupt(si) if si < len(data) else None


def native_image_error(body: dict[str, Any], chat: bool) -> str | None:
    """The first image of a native call that does not decode (generate's `images`, each chat
    message's `images`)."""
    lists = [m.get("images") for m in body.get("messages") or [] if isinstance(m, dict)] \
        if chat else [body.get("images")]
    for images in lists:
        for image in images if isinstance(images, list) else ():
            if isinstance(image, str) and (wrong := base64_error(image)):
                return wrong
    return None


def think_error(think: Any, version: str) -> str | None:
    """api.ThinkValue.UnmarshalJSON: a bool or a level; "max" from 0.22.0 (v0.12.6
    api/types.go:936-956 has none)."""
    if think is None or isinstance(think, bool):
        return None
    levels = ("high", "medium", "low", "max") if version_tuple(version) >= (0, 22, 0) else \
        ("high", "medium", "low")
    forms = "".join(f'"{level}", ' for level in levels) + "true, or false"
    if not isinstance(think, str):
        return f"think must be a boolean or string ({forms})"
    return None if think in levels else f"invalid think value: {go_quote(think)} (must be {forms})"


def top_logprobs_error(body: dict[str, Any], version: str) -> str | None:
    """GenerateHandler's and ChatHandler's range check, once the body is bound."""
    value = body.get("top_logprobs")
    if version_tuple(version) < (0, 12, 11) or isinstance(value, bool) or \
            not isinstance(value, int) or 0 <= value <= 20:
        return None
    return "top_logprobs must be between 0 and 20"


def raw_refusal(body: dict[str, Any]) -> str | None:
    """routes.go:422-424: `raw` leaves the template out, so it cannot take one or a system
    or the context of an earlier call."""
    if body.get("raw") is True and (body.get("template") or body.get("system")
                                    or body.get("context")):
        return RAW_REFUSAL
    return None


def format_error(fmt: Any) -> str | None:
    """The runner's refusal of `format`: none for JSON null, "", "json" or an object; Go's
    %q of the raw JSON otherwise (Ollama keeps the client's bytes; these are re-encoded)."""
    if fmt is None or fmt in ("", "json") or isinstance(fmt, dict):
        return None
    raw = orjson.dumps(fmt).decode()
    return f'invalid format: {go_quote(raw)}; expected "json" or a valid JSON Schema object'


def _misfit(value: Any, kind: str) -> str | None:
    """How Go's UnmarshalTypeError names a JSON value a field of `kind` cannot store, or None
    when it fits (encoding/json literalStore): a number of the wrong kind is "number", one an
    int cannot hold (a fraction, an exponent, out of int64) "number" and its text."""
    if value is None:  # JSON null leaves a Go field as it is
        return None
    if kind.startswith(("map[", "[]")):  # a map takes an object, a slice an array
        fits = isinstance(value, dict) if kind.startswith("map[") else isinstance(value, list)
        return None if fits else _json_kind(value)
    if isinstance(value, bool):
        return None if kind == "bool" else "bool"
    if isinstance(value, str):
        return None if kind == "string" else "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    if kind == "int":
        fits = isinstance(value, int) and -(2 ** 63) <= value < 2 ** 63
    elif kind in ("float32", "float64"):
        fits = math.isfinite(value) and (kind == "float64" or abs(value) <= 3.4028234663852886e38)
    else:
        return "number"
    return None if fits else f"number {value!r}"


def _json_kind(value: Any) -> str:
    """The JSON kind UnmarshalTypeError names."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "number"


def logprobs_asked(body: dict[str, Any], version: str) -> int | None:
    """How many alternatives a native call's logprobs take, None when it asks none (or
    the version has none: before 0.12.11 the field is unknown)."""
    if body.get("logprobs") is not True or version_tuple(version) < LOGPROBS_SINCE:
        return None
    top = body.get("top_logprobs")
    return top if isinstance(top, int) and not isinstance(top, bool) else 0


def native_binding_error(fields: tuple[str, dict[str, str]], body: dict[str, Any],
                         version: str) -> str | None:
    """binding_error for a native request, without the fields `version` has not got."""
    struct, kinds = fields
    at = version_tuple(version)
    kinds = {key: kind for key, kind in kinds.items()
             if (struct, key) == ("EmbedRequest", "truncate")
             or at >= FIELDS_SINCE.get(key, (0, 0, 0))}
    return binding_error((struct, kinds), body)


def binding_error(fields: tuple[str, dict[str, str]], body: dict[str, Any]) -> str | None:
    """encoding/json's refusal of the first typed field whose JSON value does not fit."""
    struct, kinds = fields
    for key, value in body.items():
        kind = kinds.get(key)
        if kind is not None and (misfit := _misfit(value, kind)):
            return (f"json: cannot unmarshal {misfit} into Go struct field "
                    f"{struct}.{key} of type {kind}")
    return None


def efforts(version: str) -> tuple[str, ...]:
    """The efforts `version` takes, "" and "none" among them."""
    at = version_tuple(version)
    if at >= MORE_EFFORTS_SINCE:
        return EFFORTS
    return ("", "none", "low", "medium", "high") + (("max",) if at >= MAX_EFFORT_SINCE else ())


def effort_error(effort: Any, version: str, responses: bool = False) -> str | None:
    """thinkFromReasoningEffort (openai/openai.go:531-546); before 0.32.11 each API's own
    check, chat's quoting the effort in single quotes."""
    if effort is None or effort in efforts(version):
        return None
    if version_tuple(version) >= MORE_EFFORTS_SINCE:
        return (f"invalid reasoning value: {go_quote(str(effort))} (must be \"minimal\", "
                "\"low\", \"medium\", \"high\", \"xhigh\", \"ultra\", \"max\", or \"none\")")
    named = "".join(f'"{e}", ' for e in ("high", "medium", "low", "max") if e in efforts(version))
    quoted = go_quote(str(effort)) if responses else f"'{effort}'"
    return f'invalid reasoning value: {quoted} (must be {named}or "none")'


def image_url_error(content: Any) -> str | None:
    """decodeImageURL for each `image_url` part (openai/openai.go:580-594, 738-768)."""
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict) or part.get("type") != "image_url":
            continue
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str):
            return "invalid message format"
        if url.startswith(("http://", "https://")):
            return ("image URLs are not currently supported, please use base64 encoded data "
                    "instead")
        prefix = next((p for p in IMAGE_PREFIXES if url.startswith(p)), None)
        if prefix is None or base64_error(url[len(prefix):]):
            return "invalid image input"
    return None


GO_KINDS = {bool: "bool", dict: "map[string]interface {}", type(None): "<nil>"}


def message_error(message: dict[str, Any]) -> str | None:
    """FromChatRequest (openai/openai.go:559-631): content that is no text or list of parts
    without tool calls, a part that is no text, image or audio, a tool call's arguments that
    are no JSON object."""
    content, calls = message.get("content"), message.get("tool_calls")
    if isinstance(content, list):
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "image_url", "input_audio") or \
                    (kind == "text" and not isinstance(part.get("text"), str)):
                return "invalid message format"
    elif not isinstance(content, str) and calls is None:
        return f"invalid message content type: {GO_KINDS.get(type(content), 'float64')}"
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        try:
            parsed = orjson.loads(arguments or "")
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            return "invalid tool call arguments"
    return None


def openai_chat_error(body: dict[str, Any], version: str) -> str | None:
    """ChatMiddleware's 400s before the call is made: binding, then FromChatRequest."""
    if wrong := binding_error(CHAT_FIELDS, body):
        return wrong
    if not body.get("messages"):
        return "[] is too short - 'messages'"
    for message in body.get("messages") or []:
        if isinstance(message, dict) and (wrong := message_error(message) or
                                          image_url_error(message.get("content"))):
            return wrong
    reasoning = body.get("reasoning")
    return effort_error(reasoning.get("effort") if isinstance(reasoning, dict)
                        else body.get("reasoning_effort"), version)


def anthropic_error(body: dict[str, Any], version: str) -> str | None:
    """AnthropicMessagesMiddleware's 400s (middleware/anthropic.go:736-756): binding, then a
    model, a positive max_tokens and messages, in that order."""
    if wrong := binding_error(MESSAGES_FIELDS, body):
        return wrong
    if not body.get("model"):
        return "model is required"
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int | float) or max_tokens <= 0:
        return "max_tokens is required and must be positive"
    if not body.get("messages"):
        return "messages is required"
    for message in body["messages"]:
        blocks = message.get("content") if isinstance(message, dict) else None
        for block in blocks if isinstance(blocks, list) else ():
            if wrong := anthropic_block_error(block, version):
                return wrong
    return None


def anthropic_block_error(block: Any, version: str) -> str | None:
    """anthropic.go convertMessage: an image that is no base64 source, a tool_use without id
    or name, an image in a tool's result likewise (read from 0.23.4)."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "image":
        source = block.get("source")
        return "invalid image source" if source is None else image_source_error(source)
    if kind == "tool_use":  # (before 0.19.0 read from the map: an empty one taken)
        newer = version_tuple(version) >= (0, 19, 0)
        return next((f"tool_use block missing required '{key}' field"
                     for key in ("id", "name") if (not block.get(key) if newer else
                                                   not isinstance(block.get(key), str))),
                    None)
    if kind == "tool_result" and version_tuple(version) >= (0, 23, 4):
        for inner in block.get("content") if isinstance(block.get("content"), list) else ():
            if isinstance(inner, dict) and inner.get("type") == "image":
                source = inner.get("source")
                if not isinstance(source, dict):
                    return "invalid tool_result image source"
                if wrong := image_source_error(source):
                    return wrong
    return None


def image_source_error(source: Any) -> str | None:
    source = source if isinstance(source, dict) else {}
    if source.get("type") != "base64":
        return (f"invalid image source type: {source.get('type') or ''}. "
                "Only base64 images are supported.")
    wrong = base64_error(str(source.get("data") or ""))
    return f"invalid base64 image data: {wrong}" if wrong else None


def openai_completion_error(body: dict[str, Any], version: str) -> str | None:
    """CompletionsMiddleware: the binding (`logprobs` an int from 0.12.11), then
    FromCompleteRequest's `stop` list of strings (openai/openai.go:790-803)."""
    fields = COMPLETION_FIELDS if version_tuple(version) < (0, 12, 11) else \
        (COMPLETION_FIELDS[0], {**COMPLETION_FIELDS[1], "logprobs": "int"})
    if wrong := binding_error(fields, body):
        return wrong
    stop = body.get("stop")
    for item in stop if isinstance(stop, list) else ():
        if not isinstance(item, str):
            kind = "[]interface {}" if isinstance(item, list) else \
                GO_KINDS.get(type(item), "float64")
            return f"invalid type for 'stop' field: {kind}"
    return None


# What each version reads of a Responses `input` (openai/responses.go
# unmarshalResponsesInputItem, unmarshalResponsesContent): web_search_call items from
# 0.32.10, input_file parts and lists as a function's output from 0.20.4; from 0.20.5 an
# unknown item type is quoted and a missing one named.
ITEMS = ("message", "function_call", "function_call_output", "reasoning")
PARTS = ("input_text", "input_image", "output_text")


def responses_error(body: dict[str, Any], version: str) -> str | None:
    """ResponsesMiddleware's 400s: `input` (its own decoder's error stops the binding), a
    mistyped `instructions`, then FromResponsesRequest's reasoning effort (from 0.22.0)."""
    at = version_tuple(version)
    given = body.get("input")
    if given is not None and not isinstance(given, str):
        if not isinstance(given, list):
            return ("input must be a string or array: json: cannot unmarshal "
                    f"{_json_kind(given)} into Go value of type []json.RawMessage")
        for index, item in enumerate(given):
            if wrong := _item_error(item if item is not None else {}, at):
                return f"input[{index}]: {wrong}"
    for key, value in body.items():  # the binding: the first field of the wrong type
        if wrong := _responses_field_error(key, value, at):
            return wrong
    for item in given if isinstance(given, list) else ():
        if isinstance(item, dict) and (wrong := _item_parts_error(item) or
                                       _function_call_error(item, at)):
            return wrong
    reasoning = body.get("reasoning")
    if at < RESPONSES_EFFORT_SINCE or not isinstance(reasoning, dict):
        return None
    return effort_error(reasoning.get("effort"), version, responses=True)


TOOL_KINDS = {"type": "string", "name": "string", "description": "string", "strict": "bool"}
FORMAT_KINDS = {"type": "string", "name": "string", "strict": "bool"}


def _responses_field_error(key: str, value: Any, at: tuple[int, int, int]) -> str | None:
    """ResponsesRequest's `instructions`, `include`, `text` and `tools` bound (Go names a
    nested field by its path from the root: ResponsesTool.tools.parameters)."""
    if value is None:
        return None
    if key == "instructions":
        return _typed("ResponsesRequest", key, value, "string") \
            if _misfit(value, "string") else None
    if key == "include":
        return _typed("ResponsesRequest", key, value, "[]string") if not isinstance(
            value, list) else next((_typed("ResponsesRequest", key, v, "string")
                                    for v in value if v is not None and
                                    not isinstance(v, str)), None)
    if key == "text":
        if not isinstance(value, dict):
            return _typed("ResponsesRequest", key, value, "openai.ResponsesText")
        wanted = value.get("format")
        if wanted is not None and not isinstance(wanted, dict):
            return _typed("ResponsesText", "text.format", wanted, "openai.ResponsesTextFormat")
        return next((_typed("ResponsesTextFormat", f"text.format.{k}", v, FORMAT_KINDS[k])
                     for k, v in (wanted or {}).items()
                     if k in FORMAT_KINDS and _misfit(v, FORMAT_KINDS[k])), None)
    return _tools_error("ResponsesRequest", "tools", value, at) if key == "tools" else None


def _tools_error(struct: str, path: str, tools: Any, at: tuple[int, int, int]) -> str | None:
    if not isinstance(tools, list):
        return _typed(struct, path, tools, "[]openai.ResponsesTool")
    for tool in tools:
        if tool is not None and not isinstance(tool, dict):
            return _typed(struct, path, tool, "openai.ResponsesTool")
        for key, value in (tool or {}).items():
            wrong = _typed("ResponsesTool", f"{path}.{key}", value, TOOL_KINDS[key]) \
                if key in TOOL_KINDS and _misfit(value, TOOL_KINDS[key]) else \
                _typed("ResponsesTool", f"{path}.{key}", value, "map[string]interface {}") \
                if key == "parameters" and not isinstance(value, dict | None) else \
                _tools_error("ResponsesTool", f"{path}.tools", value, at) \
                if key == "tools" and value is not None and at >= (0, 32, 7) else None
            if wrong:
                return wrong
    return None


def _typed(struct: str, path: str, value: Any, go_type: str) -> str:
    kind = _misfit(value, go_type) if go_type in ("string", "bool") else _json_kind(value)
    return f"json: cannot unmarshal {kind} into Go struct field {struct}.{path} of type {go_type}"


def _item_parts_error(item: dict[str, Any]) -> str | None:
    """convertResponsesContent (openai/responses.go:729-755): a file, an image URL that
    decodeImageURL cannot read."""
    kind = item.get("type") or ("message" if item.get("role") else "")
    parts = item.get("content") if kind == "message" else item.get("output")
    for part in parts if isinstance(parts, list) and kind in (
            "message", "function_call_output") else ():
        if not isinstance(part, dict):
            continue
        if part.get("type") == "input_file":
            return "file inputs are not currently supported"
        url = part.get("image_url") if part.get("type") == "input_image" else None
        if isinstance(url, str) and url and (wrong := image_url_error(
                [{"type": "image_url", "image_url": url}])):
            return wrong
    return None


# From 0.14 tool arguments are an ordered map, which jsonparser.ObjectEach reads: anything
# but an object is refused in its words (api/types.go ToolCallFunctionArguments.UnmarshalJSON)
ORDERED_ARGUMENTS_SINCE = (0, 14, 0)


def _function_call_error(item: dict[str, Any], at: tuple[int, int, int]) -> str | None:
    """FromResponsesRequest (openai/responses.go): json.Unmarshal of a function call's
    `arguments` ("" skipped) into api.ToolCallFunctionArguments, its error wrapped."""
    arguments = item.get("arguments") if item.get("type") == "function_call" else None
    if not isinstance(arguments, str) or not arguments:
        return None
    data = arguments.encode("utf-8", "replace")
    wrong = sim_gojson.syntax_error(data)
    if wrong is None:
        kind = sim_gojson.kind(data)
        if kind == "object" or (kind == "null" and at < ORDERED_ARGUMENTS_SINCE):
            return None
        wrong = "Value looks like object, but can't find closing '}' symbol" \
            if at >= ORDERED_ARGUMENTS_SINCE else \
            f"json: cannot unmarshal {kind} into Go value of type api.ToolCallFunctionArguments"
    return f"failed to parse function call arguments: {wrong}"


def _item_error(item: Any, at: tuple[int, int, int]) -> str | None:
    if not isinstance(item, dict):
        return (f"json: cannot unmarshal {_json_kind(item)} into Go value of type struct "
                '{ Type string "json:\\"type\\""; Role string "json:\\"role\\"" }')
    kind = item.get("type") or ("message" if item.get("role") else "")
    known = ITEMS + (("web_search_call",) if at >= (0, 32, 10) else ())
    if kind not in known:
        if at < (0, 20, 5):
            return f"unknown input item type: {item.get('type') or ''}"
        return f"unknown input item type: {go_quote(kind)}" if kind else \
            "input item missing required 'type' field"
    if kind == "function_call":  # ResponsesFunctionCall: every field a string
        return next((_typed("ResponsesFunctionCall", key, value, "string") for key, value in
                     item.items() if key in ("id", "type", "call_id", "name", "arguments") and
                     _misfit(value, "string")), None)
    if kind == "message":
        return _parts_error(item.get("content"), "content", at)
    if kind == "function_call_output":
        output = item.get("output")
        if at < (0, 20, 4):
            return None if output is None or isinstance(output, str) else (
                f"json: cannot unmarshal {_json_kind(output)} into Go struct field "
                "ResponsesFunctionCallOutput.output of type string")
        return _parts_error(output, "output", at)
    return None


def _parts_error(parts: Any, name: str, at: tuple[int, int, int]) -> str | None:
    if parts is None or isinstance(parts, str):
        return None
    if not isinstance(parts, list):
        return (f"{name} must be a string or array: json: cannot unmarshal "
                f"{_json_kind(parts)} into Go value of type []json.RawMessage")
    known = PARTS + (("input_file",) if at >= (0, 20, 4) else ())
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, dict | None) and (kind or "") not in known:
            return f"{name}[{index}]: unknown content type: {kind or ''}"
    return None


# openai.EmbedRequest (openai/openai.go): `dimensions` from 0.11.11, `encoding_format` from
# 0.12.7, which EmbeddingsMiddleware checks then too
ENCODING_FORMAT_SINCE = (0, 12, 7)
OPENAI_EMBED_FIELDS = {"dimensions": ("int", (0, 11, 11)),
                       "encoding_format": ("string", ENCODING_FORMAT_SINCE)}


def embed_binding_error(body: dict[str, Any], version: str) -> str | None:
    """EmbeddingsMiddleware's ShouldBindJSON: the version's typed fields."""
    at = version_tuple(version)
    return binding_error(("EmbedRequest", {key: kind for key, (kind, since) in
                                           OPENAI_EMBED_FIELDS.items() if at >= since}),
                         body)


def encoding_format_error(body: dict[str, Any]) -> str | None:
    """EmbeddingsMiddleware (middleware/openai.go:405-410): "float" or "base64", any case."""
    wanted = body.get("encoding_format")
    if not wanted or not isinstance(wanted, str) or wanted.lower() in ENCODING_FORMATS:
        return None
    return (f"Invalid value for 'encoding_format' = {wanted}. "
            "Supported values: ['float', 'base64'].")
