"""The refusals Ollama makes from the body alone, before the call reaches a model: its own
API's binding of typed fields and images (server/routes.go GenerateHandler, ChatHandler,
EmbedHandler: `c.ShouldBindJSON`), and what its OpenAI and Anthropic layers refuse
(middleware/openai.go:395-465, middleware/anthropic.go:731-761).

The sidecar makes them itself, in Ollama's words, before placing the call: placed, such a call
would wait for a busy GPU (or be refused `gpu-busy`), or have idle models evicted for it, only
to get the same 400 from the provider afterwards.
"""

from __future__ import annotations

import binascii
from typing import Any

import orjson

from proxy.api import gojson
from proxy.api.capabilities import (
    EFFORTS_BY_VERSION,
    RESPONSES_EFFORT_SINCE,
    reasoning_effort,
    thinking_efforts,
)
from proxy.api.wire import go_quoted
from proxy.core.context import Version

# Go's kind for the typed fields every version of each layer binds (openai/openai.go
# ChatCompletionRequest, CompletionRequest; anthropic/anthropic.go MessagesRequest). Fields
# only newer versions have are left out: an older Ollama ignores them.
CHAT_FIELDS = ("ChatCompletionRequest", {
    "stream": "bool", "max_tokens": "int", "seed": "int", "temperature": "float64",
    "frequency_penalty": "float64", "presence_penalty": "float64", "top_p": "float64",
    "reasoning_effort": "string"})
# ChatCompletionRequest's logprobs and top_logprobs, from 0.12.11 (as on Ollama's own API)
CHAT_LOGPROBS: tuple[dict[str, str], Version] = (
    {"logprobs": "bool", "top_logprobs": "int"}, (0, 12, 11))
COMPLETION_FIELDS = ("CompletionRequest", {
    "stream": "bool", "max_tokens": "int", "seed": "int", "temperature": "float32",
    "frequency_penalty": "float32", "presence_penalty": "float32", "top_p": "float32",
    "suffix": "string", "prompt": "string"})
MESSAGES_FIELDS = ("MessagesRequest", {
    "max_tokens": "int", "stream": "bool", "temperature": "float64", "top_p": "float64",
    "top_k": "int"})
# The native requests' typed fields the sidecar's own schema leaves unchecked (api/types.go
# GenerateRequest, ChatRequest, EmbedRequest), each with the version that added it: an older
# Ollama ignores a field it does not have.
NATIVE_FIELDS: dict[str, tuple[str, dict[str, tuple[str, Version]]]] = {
    "/api/generate": ("GenerateRequest", {
        "suffix": ("string", (0, 0, 0)), "template": ("string", (0, 0, 0)),
        "raw": ("bool", (0, 0, 0)), "truncate": ("bool", (0, 12, 6)),
        "logprobs": ("bool", (0, 12, 11)), "top_logprobs": ("int", (0, 12, 11))}),
    "/api/chat": ("ChatRequest", {
        "truncate": ("bool", (0, 12, 6)), "logprobs": ("bool", (0, 12, 11)),
        "top_logprobs": ("int", (0, 12, 11))}),
    "/api/embed": ("EmbedRequest", {"dimensions": ("int", (0, 11, 11))}),
    "/api/embeddings": ("EmbeddingRequest", {}),
}
RAW_REFUSAL = "raw mode does not support template, system, or context"
BASE64_ALPHABET = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
NEWLINES = b"\r\n"
# EmbeddingsMiddleware checks encoding_format from 0.12.7 (commit e0ead1ade)
ENCODING_FORMAT_SINCE: Version = (0, 12, 7)
ENCODING_FORMATS = ("float", "base64")
INVALID_INPUT_TYPE = "invalid input type"


INT64 = (-(2 ** 63), 2 ** 63 - 1)
FLOAT32_MAX = 3.4028234663852886e38


def _misfit(value: Any, kind: str) -> str | None:
    """How Go's UnmarshalTypeError names a JSON value a field of `kind` cannot store, or None
    when it fits (encoding/json literalStore): a number that is the wrong kind is "number", one
    an int cannot hold (a fraction, an exponent, too large) is "number" and its text."""
    if value is None:  # JSON null leaves a Go field as it is
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind in ("int", "float32", "float64") and number:
        if kind == "int":
            fits = isinstance(value, int) and INT64[0] <= value <= INT64[1]
        else:
            fits = kind == "float64" or abs(value) <= FLOAT32_MAX
        return None if fits else f"number {value!r}"
    if isinstance(value, bool):
        return None if kind == "bool" else "bool"
    if isinstance(value, str):
        return None if kind == "string" else "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "number"


def binding_error(fields: tuple[str, dict[str, str]], body: dict[str, Any]) -> str | None:
    """encoding/json's refusal of the first typed field whose JSON value does not fit."""
    struct, kinds = fields
    for key, value in body.items():
        kind = kinds.get(key)
        if kind is not None and (misfit := _misfit(value, kind)):
            return (f"json: cannot unmarshal {misfit} into Go struct field "
                    f"{struct}.{key} of type {kind}")
    return None


def native_error(path: str, body: dict[str, Any], version: Version) -> str | None:
    """Ollama's binding of a native call: a message's nested field of the wrong type (its
    Message.UnmarshalJSON returns the error, which stops the decoder, so it wins), then the
    first typed field or tool of the wrong type in the body's order, then the first image
    that is not base64 (api.ImageData is a []byte, which encoding/json decodes with
    base64.StdEncoding)."""
    struct, fields = NATIVE_FIELDS.get(path, ("", {}))
    kinds = {key: kind for key, (kind, since) in fields.items() if version >= since}
    if path == "/api/chat" and (wrong := messages_binding_error(body, version)):
        return wrong
    for key, value in body.items():
        if key == "options" and value is not None and not isinstance(value, dict):
            wrong = _go_misfit(struct, "options", value, "map[string]interface {}")
        elif key == "tools" and path == "/api/chat":
            wrong = tools_binding_error(value, version)
        elif key == "images" and path == "/api/generate" and isinstance(value, list):
            wrong = next((_go_misfit("GenerateRequest", "images", image, "api.ImageData")
                          for image in value if not isinstance(image, str | None)), None)
        else:
            wrong = binding_error((struct, kinds), {key: value})
        if wrong:
            return wrong
    if path in ("/api/chat", "/api/generate"):
        return image_error(body, chat=path == "/api/chat")
    if path == "/api/embed":
        return input_error(body.get("input"))
    return None


def input_error(texts: Any) -> str | None:
    """EmbedHandler's refusal of an input that is neither text nor a list of texts (token
    arrays included), before it looks for the model (server/routes.go:820-839; v0.12.6
    :627-643)."""
    fits = texts is None or isinstance(texts, str) or \
        (isinstance(texts, list) and all(isinstance(text, str) for text in texts))
    return None if fits else INVALID_INPUT_TYPE


# Ollama 0.14.0 keeps tool arguments and tool properties in insertion order
# (api/types.go ToolCallFunctionArguments, ToolPropertiesMap over wk8/go-ordered-map): a
# value that is no object there is refused by jsonparser.ObjectEach in its own words.
ORDERED_MAPS_SINCE: Version = (0, 14, 0)
NOT_AN_OBJECT = "Value looks like object, but can't find closing '}' symbol"


def _go_misfit(struct: str, path: str, value: Any, go_type: str) -> str:
    """encoding/json's UnmarshalTypeError as Go 1.24+ words it: the innermost struct, the
    field path from the request's root (no indices or keys), the Go type."""
    kind = _misfit(value, "object") or "object"
    return (f"json: cannot unmarshal {kind} into Go struct field {struct}.{path} "
            f"of type {go_type}")


def _scalar_misfit(struct: str, path: str, value: Any, kind: str) -> str | None:
    misfit = _misfit(value, kind)
    return None if misfit is None else \
        f"json: cannot unmarshal {misfit} into Go struct field {struct}.{path} of type {kind}"


def _ordered_map_error(struct: str, path: str, value: Any, go_type: str,
                       version: Version) -> str | None:
    """A field Go reads as an object (a map, or an ordered map from 0.14.0): None for an
    object or null."""
    if value is None or isinstance(value, dict):
        return None
    return NOT_AN_OBJECT if version >= ORDERED_MAPS_SINCE else \
        _go_misfit(struct, path, value, go_type)


def tools_binding_error(tools: Any, version: Version) -> str | None:
    """ChatRequest.Tools bound as Ollama binds it (api.Tool, ToolFunction,
    ToolFunctionParameters): the first field of the wrong type. A tool that is no object, or
    `tools` that is no list, the sidecar's own schema refuses first."""
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        for key, value in tool.items():
            if key == "type" and (wrong := _scalar_misfit("Tool", "tools.type", value,
                                                          "string")):
                return wrong
            if key == "function" and (wrong := _function_error(value, version)):
                return wrong
    return None


def _function_error(function: Any, version: Version) -> str | None:
    if function is None:
        return None
    if not isinstance(function, dict):
        return _go_misfit("Tool", "tools.function", function, "api.ToolFunction")
    for key, value in function.items():
        path = f"tools.function.{key}"
        if key in ("name", "description") and \
                (wrong := _scalar_misfit("ToolFunction", path, value, "string")):
            return wrong
        if key == "parameters" and value is not None:
            if not isinstance(value, dict):
                return _go_misfit("ToolFunction", path, value, "api.ToolFunctionParameters")
            if wrong := _parameters_error(value, version):
                return wrong
    return None


def _parameters_error(parameters: dict[str, Any], version: Version) -> str | None:
    struct, at = "ToolFunctionParameters", "tools.function.parameters"
    for key, value in parameters.items():
        if key == "type":
            wrong = _scalar_misfit(struct, f"{at}.type", value, "string")
        elif key == "required":
            wrong = _strings_error(struct, f"{at}.required", value)
        elif key == "properties":
            wrong = _ordered_map_error(struct, f"{at}.properties", value,
                                       "map[string]api.ToolProperty", version) or \
                next((_go_misfit(struct, f"{at}.properties", item, "api.ToolProperty")
                      for item in (value or {}).values()
                      if item is not None and not isinstance(item, dict)), None)
        else:
            wrong = None
        if wrong:
            return wrong
    return None


def _strings_error(struct: str, path: str, value: Any) -> str | None:
    """A []string field: a list of strings or null."""
    if value is None:
        return None
    if not isinstance(value, list):
        return _go_misfit(struct, path, value, "[]string")
    return next((_scalar_misfit(struct, path, item, "string") for item in value
                 if _misfit(item, "string")), None)


def messages_binding_error(body: dict[str, Any], version: Version) -> str | None:
    """A message's field the sidecar's own schema leaves unchecked, bound as Ollama binds it:
    Message.UnmarshalJSON decodes each message on its own and the outer decoder names the
    error from ChatRequest (`ChatRequest.messages.tool_calls.function.arguments`)."""
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        for key, value in message.items():
            if key == "thinking":
                wrong = _scalar_misfit("ChatRequest", "messages.thinking", value, "string")
            elif key == "tool_calls":
                wrong = _tool_calls_error(value, version)
            else:
                wrong = None
            if wrong:
                return wrong
    return None


def _tool_calls_error(calls: Any, version: Version) -> str | None:
    at = "messages.tool_calls.function"
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if function is None:
            continue
        if not isinstance(function, dict):
            return _go_misfit("ChatRequest", "messages.tool_calls.function", function,
                              "api.ToolCallFunction")
        for key, value in function.items():
            if key == "index":
                wrong = _scalar_misfit("ChatRequest", f"{at}.index", value, "int")
            elif key == "name":
                wrong = _scalar_misfit("ChatRequest", f"{at}.name", value, "string")
            elif key == "arguments":
                wrong = _ordered_map_error("ChatRequest", f"{at}.arguments", value,
                                           "api.ToolCallFunctionArguments", version)
            else:
                wrong = None
            if wrong:
                return wrong
    return None


def format_error(path: str, body: dict[str, Any]) -> str | None:
    """What Ollama answers a call with a `format` (on OpenAI's chat and Responses API, a
    json_schema's `schema`) that is neither "json" nor a JSON schema object, once its model
    is loaded (llm/server.go Completion; llm/llama_server.go from 0.30: a 500). Go quotes the
    field's bytes as sent; here they are the value written compactly. A load (no prompt,
    no messages) never gets that far."""
    if path == "/v1/chat/completions":
        runs, wanted = body.get("messages"), _openai_format(body)
    elif path == "/v1/responses":
        runs, wanted = body.get("input") or body.get("instructions"), _responses_format(body)
    elif path in ("/api/chat", "/api/generate"):
        runs = body.get("messages") if path == "/api/chat" else body.get("prompt")
        wanted = body.get("format")
    else:
        return None
    if not runs or wanted in (None, "", "json") or isinstance(wanted, dict):
        return None
    sent = orjson.dumps(wanted).decode()
    return f'invalid format: {go_quoted(sent)}; expected "json" or a valid JSON Schema object'


def image_error(body: dict[str, Any], chat: bool) -> str | None:
    """The first image of a native call that does not decode (generate's `images`, each chat
    message's `images`)."""
    lists = [m.get("images") for m in body.get("messages") or [] if isinstance(m, dict)] \
        if chat else [body.get("images")]
    for images in lists:
        for image in images if isinstance(images, list) else ():
            if isinstance(image, str) and (wrong := base64_error(image)):
                return wrong
    return None


def base64_error(text: str) -> str | None:
    """base64.StdEncoding.Decode's refusal of `text`, if any. Most images decode: checked
    whole first, the byte at fault looked for only when that fails."""
    data = text.encode()
    try:
        binascii.a2b_base64(data.replace(b"\r", b"").replace(b"\n", b""), strict_mode=True)
        return None
    except binascii.Error:
        return _go_base64_error(data)


def _go_base64_error(data: bytes) -> str | None:
    """encoding/base64 decodeQuantum: the byte offset of the bad character, of an unfinished
    quantum, or of what trails the padding."""
    si = 0

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


def raw_error(path: str, body: dict[str, Any]) -> str | None:
    """GenerateHandler's refusal of `raw` with a template, a system or an earlier call's
    context (server/routes.go:422-424), made once the model is found."""
    if path == "/api/generate" and body.get("raw") is True and (
            body.get("template") or body.get("system") or body.get("context")):
        return RAW_REFUSAL
    return None


def found_error(path: str, body: dict[str, Any]) -> str | None:
    """What Ollama refuses from the body once the model is found: `raw` with a template,
    system or context, then a `format` it cannot use."""
    return raw_error(path, body) or format_error(path, body)


def chat_error(body: dict[str, Any], version: Version) -> str | None:
    """ChatMiddleware: the binding (top-level typed fields, the tools as Ollama's own API
    binds them, response_format), then a chat without messages."""
    for key, value in body.items():  # encoding/json keeps the first error in the body
        if key == "tools":
            wrong = tools_binding_error(value, version)
        elif key == "response_format":
            wrong = response_format_error(value)
        elif key == "messages":
            wrong = openai_messages_error(value)
        elif key == "stream_options":
            wrong = stream_options_error("ChatCompletionRequest", value)
        elif key == "reasoning" and value is not None:
            wrong = _go_misfit("ChatCompletionRequest", key, value, "openai.Reasoning") \
                if not isinstance(value, dict) else \
                _scalar_misfit("Reasoning", "reasoning.effort", value.get("effort"), "string")
        elif key in CHAT_LOGPROBS[0] and version >= CHAT_LOGPROBS[1]:
            wrong = binding_error((CHAT_FIELDS[0], CHAT_LOGPROBS[0]), {key: value})
        else:
            wrong = binding_error(CHAT_FIELDS, {key: value})
        if wrong:
            return wrong
    messages = body.get("messages")
    if messages is None or messages == []:
        return "[] is too short - 'messages'"
    return next((wrong for message in messages if isinstance(message, dict) and
                 (wrong := openai_message_error(message, version))), None) or \
        effort_error("/v1/chat/completions", body, version)


INVALID_MESSAGE = "invalid message format"
INVALID_IMAGE = "invalid image input"
INVALID_ARGUMENTS = "invalid tool call arguments"
# From 0.14.2 an image given by URL gets words of its own, and an image that is no base64
# is INVALID_IMAGE (before, INVALID_MESSAGE); `input_audio` parts from 0.20.0.
IMAGE_URL_WORDS_SINCE: Version = (0, 14, 2)
IMAGE_URLS = "image URLs are not currently supported, please use base64 encoded data instead"
INPUT_AUDIO_SINCE: Version = (0, 20, 0)
IMAGE_PREFIXES = tuple(f"data:image/{kind};base64," for kind in ("jpeg", "jpg", "png", "webp"))
# Go's %T of a JSON value decoded into `any`
GO_TYPES = {bool: "bool", int: "float64", float: "float64", dict: "map[string]interface {}",
            type(None): "<nil>"}


def openai_message_error(message: dict[str, Any], version: Version) -> str | None:
    """FromChatRequest's refusal of a message: content that is neither text nor a list of
    parts (without tool calls), a part it cannot read, a tool call whose `arguments` are no
    JSON object."""
    content, calls = message.get("content"), message.get("tool_calls")
    if isinstance(content, str):
        return _arguments_error(calls, version)
    if isinstance(content, list):
        return next((wrong for part in content if (wrong := _part_error(part, version))),
                    None) or _arguments_error(calls, version)
    if calls is None:
        return f"invalid message content type: {_go_type(content)}"
    return _arguments_error(calls, version)


def _part_error(part: Any, version: Version) -> str | None:
    if not isinstance(part, dict):
        return INVALID_MESSAGE
    kind = part.get("type")
    if kind == "text":
        return None if isinstance(part.get("text"), str) else INVALID_MESSAGE
    if kind == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return _image_url_error(url, version) if isinstance(url, str) else INVALID_MESSAGE
    if kind == "input_audio" and version >= INPUT_AUDIO_SINCE:
        audio = part.get("input_audio")
        if not isinstance(audio, dict):
            return "invalid input_audio format"
        data = audio.get("data")
        if not isinstance(data, str):
            return "invalid input_audio format: missing data"
        wrong = base64_error(data)
        return f"invalid input_audio base64 data: {wrong}" if wrong else None
    return INVALID_MESSAGE


def _image_url_error(url: str, version: Version) -> str | None:
    """decodeImageURL: a data URI of a JPEG, PNG or WebP image (or none named) in base64."""
    newer = version >= IMAGE_URL_WORDS_SINCE
    if newer and url.startswith(("http://", "https://")):
        return IMAGE_URLS
    prefix = next((p for p in ("data:;base64,", *IMAGE_PREFIXES) if url.startswith(p)), None)
    if prefix is None:
        return INVALID_IMAGE
    if base64_error(url[len(prefix):]) is None:
        return None
    return INVALID_IMAGE if newer else INVALID_MESSAGE


def _arguments_error(calls: Any, version: Version) -> str | None:
    """FromCompletionToolCall: each call's `arguments` a JSON object as text (null too before
    0.14, into a plain map)."""
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        try:
            parsed = orjson.loads(arguments or "")
        except orjson.JSONDecodeError:
            return INVALID_ARGUMENTS
        if not isinstance(parsed, dict) and (parsed is not None or
                                             version >= ORDERED_MAPS_SINCE):
            return INVALID_ARGUMENTS
    return None


# thinkFromReasoningEffort's words from 0.32.11, each effort quoted as %q; before, chat's
# quoted the effort in single quotes and the Responses API's as %q, each naming its levels
SHARED_EFFORT_WORDS_SINCE: Version = EFFORTS_BY_VERSION[-1][0]


def effort_error(path: str, body: dict[str, Any], version: Version) -> str | None:
    """FromChatRequest's and FromResponsesRequest's refusal of a reasoning effort the
    version does not take (the Responses API reads none before 0.22)."""
    effort = reasoning_effort(path, body)
    if path == "/v1/responses" and version < RESPONSES_EFFORT_SINCE:
        return None
    if not isinstance(effort, str) or not effort or effort == "none" or \
            effort in thinking_efforts(version):
        return None
    if version >= SHARED_EFFORT_WORDS_SINCE:
        return (f"invalid reasoning value: {go_quoted(effort)} (must be \"minimal\", \"low\", "
                '"medium", "high", "xhigh", "ultra", "max", or "none")')
    levels = "".join(f'"{level}", ' for level in ("high", "medium", "low", "max")
                     if level in thinking_efforts(version))
    quoted = go_quoted(effort) if path == "/v1/responses" else f"'{effort}'"
    return f'invalid reasoning value: {quoted} (must be {levels}or "none")'


def response_format_error(wanted: Any) -> str | None:
    """openai.ResponseFormat bound: an object whose `type` is a string."""
    if wanted is None:
        return None
    if not isinstance(wanted, dict):
        return _go_misfit("ChatCompletionRequest", "response_format", wanted,
                          "openai.ResponseFormat")
    schema = wanted.get("json_schema")
    return _scalar_misfit("ResponseFormat", "response_format.type", wanted.get("type"),
                          "string") or (None if schema is None or isinstance(schema, dict) else
                                        _go_misfit("ResponseFormat", "response_format.json_schema",
                                                   schema, "openai.JsonSchema"))


# openai.ToolCall's function is an anonymous struct: Go names it by its fields, and an
# error inside it by no struct name at all
OPENAI_TOOL_FUNCTION = ('struct { Name string "json:\\"name\\""; '
                        'Arguments string "json:\\"arguments\\"" }')


def openai_messages_error(messages: Any) -> str | None:
    """openai.Message's typed fields the sidecar's own schema leaves unchecked: `reasoning`,
    `name`, `tool_call_id`, and each tool call's `id`, `index`, `type` and `function` (whose
    `arguments` is a JSON string on this API)."""
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        for key, value in message.items():
            if key in ("reasoning", "name", "tool_call_id"):
                wrong = _scalar_misfit("Message", f"messages.{key}", value, "string")
            elif key == "tool_calls":
                wrong = _openai_tool_calls_error(value)
            else:
                wrong = None
            if wrong:
                return wrong
    return None


def _openai_tool_calls_error(calls: Any) -> str | None:
    at = "messages.tool_calls"
    for call in calls if isinstance(calls, list) else ():
        for key, value in call.items() if isinstance(call, dict) else ():
            if key in ("id", "type", "index"):
                wrong = _scalar_misfit("ToolCall", f"{at}.{key}", value,
                                       "int" if key == "index" else "string")
            elif key == "function" and value is not None and not isinstance(value, dict):
                wrong = _go_misfit("ToolCall", f"{at}.function", value, OPENAI_TOOL_FUNCTION)
            elif key == "function" and isinstance(value, dict):
                wrong = next((_scalar_misfit("", f"{at}.function.{name}", value[name],
                                             "string")
                              for name in value if name in ("name", "arguments") and
                              _misfit(value[name], "string")), None)
            else:
                wrong = None
            if wrong:
                return wrong
    return None


def _openai_format(body: dict[str, Any]) -> Any:
    """The `format` Ollama's OpenAI layer makes of `response_format` (openai/openai.go
    FromChatRequest): "json" for json_object, a json_schema's `schema` as it is."""
    wanted = body.get("response_format")
    kind = wanted.get("type") if isinstance(wanted, dict) else None
    kind = kind.strip().lower() if isinstance(kind, str) else ""
    if kind == "json_object":
        return "json"
    schema = wanted.get("json_schema") if kind == "json_schema" and \
        isinstance(wanted, dict) else None
    return schema.get("schema") if isinstance(schema, dict) else None


def _responses_format(body: dict[str, Any]) -> Any:
    """The `format` Ollama's Responses layer makes of `text.format`: a json_schema's
    `schema` as it is (openai/responses.go FromResponsesRequest)."""
    text = body.get("text")
    wanted = text.get("format") if isinstance(text, dict) else None
    return wanted.get("schema") if isinstance(wanted, dict) and \
        wanted.get("type") == "json_schema" else None


def stream_options_error(struct: str, options: Any) -> str | None:
    """openai.StreamOptions bound: an object whose `include_usage` is a boolean."""
    if options is None:
        return None
    if not isinstance(options, dict):
        return _go_misfit(struct, "stream_options", options, "openai.StreamOptions")
    return _scalar_misfit("StreamOptions", "stream_options.include_usage",
                          options.get("include_usage"), "bool")


# CompletionRequest's `logprobs`, an int, from 0.12.11 (commit 59241c5be)
COMPLETION_LOGPROBS: tuple[dict[str, str], Version] = ({"logprobs": "int"}, (0, 12, 11))


def completion_error(body: dict[str, Any], version: Version) -> str | None:
    """CompletionsMiddleware's binding: its typed fields (a prompt is one string, no list
    of prompts or tokens), stream_options; then FromCompleteRequest's refusal of a `stop`
    list with an item that is no string."""
    kinds = {**COMPLETION_FIELDS[1],
             **(COMPLETION_LOGPROBS[0] if version >= COMPLETION_LOGPROBS[1] else {})}
    for key, value in body.items():
        if wrong := binding_error((COMPLETION_FIELDS[0], kinds), {key: value}) or (
                stream_options_error("CompletionRequest", value)
                if key == "stream_options" else None):
            return wrong
    stop = body.get("stop")
    odd = next((item for item in stop if not isinstance(item, str)), "") \
        if isinstance(stop, list) else ""
    return None if isinstance(odd, str) else \
        f"invalid type for 'stop' field: {_go_type(odd)}"


def _go_type(value: Any) -> str:
    """Go's %T of a JSON value decoded into `any`."""
    return "[]interface {}" if isinstance(value, list) else \
        GO_TYPES.get(type(value), "float64")


# openai.EmbedRequest's typed fields, each with the version that added it
EMBED_FIELDS: dict[str, tuple[str, Version]] = {
    "dimensions": ("int", (0, 11, 11)), "encoding_format": ("string", ENCODING_FORMAT_SINCE)}


def embeddings_error(body: dict[str, Any], version: Version) -> str | None:
    """EmbeddingsMiddleware: the binding (the version's typed fields), an encoding other
    than float or base64 (any case), then no input or an empty list (`""` is one empty
    input)."""
    kinds = {key: kind for key, (kind, since) in EMBED_FIELDS.items() if version >= since}
    if wrong := binding_error(("EmbedRequest", kinds), body):
        return wrong
    wanted = body.get("encoding_format")
    if version >= ENCODING_FORMAT_SINCE and wanted and isinstance(wanted, str) and \
            wanted.lower() not in ENCODING_FORMATS:
        return (f"Invalid value for 'encoding_format' = {wanted}. "
                "Supported values: ['float', 'base64'].")
    texts = body.get("input")
    if texts is None or texts == []:
        return "invalid input"
    return input_error(texts)


# anthropic/anthropic.go (0.14.0 on): MessagesRequest's nested structs, by field, each with
# its Go type and its fields' kinds
ANTHROPIC_STRUCTS: dict[str, tuple[str, str, dict[str, str]]] = {
    "tool_choice": ("ToolChoice", "anthropic.ToolChoice", {
        "type": "string", "name": "string", "disable_parallel_tool_use": "bool"}),
    "thinking": ("ThinkingConfig", "anthropic.ThinkingConfig", {
        "type": "string", "budget_tokens": "int"}),
    "metadata": ("Metadata", "anthropic.Metadata", {"user_id": "string"}),
}
ANTHROPIC_TOOL = {"type": "string", "name": "string", "description": "string"}


def _fields_error(struct: str, at: str, value: dict[str, Any], kinds: dict[str, str]
                  ) -> str | None:
    """The first of a Go struct's scalar fields whose JSON value does not fit."""
    return next((wrong for key, item in value.items() if key in kinds and
                 (wrong := _scalar_misfit(struct, f"{at}.{key}", item, kinds[key]))), None)


# MessagesRequest's output_config (its effort a thinking level), from 0.23.4
OUTPUT_CONFIG: tuple[tuple[str, str, dict[str, str]], Version] = (
    ("OutputConfig", "anthropic.OutputConfig", {"effort": "string"}), (0, 23, 4))


def anthropic_field_error(key: str, value: Any, version: Version) -> str | None:
    """MessagesRequest's nested fields bound: stop_sequences, tools, tool_choice, thinking,
    metadata, output_config (from 0.23.4)."""
    if value is None:
        return None
    if key == "output_config" and version >= OUTPUT_CONFIG[1]:
        struct, go_type, kinds = OUTPUT_CONFIG[0]
        return _go_misfit("MessagesRequest", key, value, go_type) \
            if not isinstance(value, dict) else _fields_error(struct, key, value, kinds)
    if key == "stop_sequences":
        return _strings_error("MessagesRequest", key, value)
    if key == "tools":
        return next((wrong for tool in value if isinstance(tool, dict) and
                     (wrong := _fields_error("Tool", "tools", tool, ANTHROPIC_TOOL))), None) \
            if isinstance(value, list) else None
    if key in ANTHROPIC_STRUCTS:
        struct, go_type, kinds = ANTHROPIC_STRUCTS[key]
        if not isinstance(value, dict):
            return _go_misfit("MessagesRequest", key, value, go_type)
        return _fields_error(struct, key, value, kinds)
    return None


def messages_error(body: dict[str, Any], version: Version) -> str | None:
    """AnthropicMessagesMiddleware: the binding, then max_tokens, then messages, then what
    FromMessagesRequest cannot convert. A request without a model is the sidecar's own (its
    preferred model), so that check is left out."""
    for key, value in body.items():  # encoding/json keeps the first error in the body
        if wrong := binding_error(MESSAGES_FIELDS, {key: value}) or \
                anthropic_field_error(key, value, version):
            return wrong
    max_tokens = body.get("max_tokens")
    if max_tokens is None or max_tokens <= 0:
        return "max_tokens is required and must be positive"
    messages = body.get("messages")
    if messages is None or messages == []:
        return "messages is required"
    return next((wrong for message in messages if isinstance(message, dict) and
                 (wrong := anthropic_message_error(message, version))), None)


# anthropic.go convertMessage reads the images in a tool's result from 0.23.4 (commit
# 6bdb73073); an older one leaves them out
TOOL_RESULT_IMAGES_SINCE: Version = (0, 23, 4)


def anthropic_message_error(message: dict[str, Any], version: Version) -> str | None:
    """FromMessagesRequest's refusal of a message's blocks: an image that is no base64
    source, a tool_use without its id or name."""
    blocks = message.get("content")
    for block in blocks if isinstance(blocks, list) else ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "image":
            source = block.get("source")
            # (a source that is no object is Go's binding error, left to Ollama to word)
            wrong = "invalid image source" if source is None else \
                _image_source_error(source) if isinstance(source, dict) else None
        elif kind == "tool_use":
            wrong = next((f"tool_use block missing required '{key}' field"
                          for key in ("id", "name") if _tool_use_lacks(block.get(key), version)),
                         None)
        elif kind == "tool_result" and version >= TOOL_RESULT_IMAGES_SINCE:
            wrong = _tool_result_error(block.get("content"))
        else:
            wrong = None
        if wrong:
            return wrong
    return None


# From 0.19.0 convertMessage reads the bound block (an empty id or name refused); before, the
# raw map (`blockMap["id"].(string)`: one absent or not text refused, an empty one taken)
TOOL_USE_EMPTY_REFUSED_SINCE: Version = (0, 19, 0)


def _tool_use_lacks(value: Any, version: Version) -> bool:
    if version >= TOOL_USE_EMPTY_REFUSED_SINCE:
        return not value  # (one of another type is Go's binding error, left to Ollama)
    return not isinstance(value, str)


def _image_source_error(source: dict[str, Any]) -> str | None:
    """resolveImageSource: a base64 source whose data decodes."""
    kind, data = source.get("type"), source.get("data")
    if kind != "base64":
        return (f"invalid image source type: {kind if isinstance(kind, str) else ''}. "
                "Only base64 images are supported.")
    wrong = base64_error(data) if isinstance(data, str) else None
    return f"invalid base64 image data: {wrong}" if wrong else None


def _tool_result_error(content: Any) -> str | None:
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict) and block.get("type") == "image":
            source = block.get("source")
            if not isinstance(source, dict):
                return "invalid tool_result image source"
            if wrong := _image_source_error(source):
                return wrong
    return None


# openai/responses.go ResponsesRequest's scalar fields, as on every version with the API
RESPONSES_FIELDS = ("ResponsesRequest", {
    "model": "string", "background": "bool", "instructions": "string",
    "max_output_tokens": "int", "temperature": "float64", "top_p": "float64",
    "truncation": "string", "stream": "bool"})
REASONING_FIELDS = {"effort": "string", "generate_summary": "string", "summary": "string"}
# The input items and content parts each version reads (unmarshalResponsesInputItem,
# unmarshalResponsesContent): input_file parts and function outputs that are lists from
# 0.20.4 (commit f86a969f2), web_search_call items from 0.32.10 (commit b6b1b258c).
ITEM_TYPES: tuple[tuple[Version, tuple[str, ...]], ...] = (
    ((0, 0, 0), ("message", "function_call", "function_call_output", "reasoning")),
    ((0, 32, 10), ("web_search_call",)))
CONTENT_TYPES: tuple[tuple[Version, tuple[str, ...]], ...] = (
    ((0, 0, 0), ("input_text", "input_image", "output_text")),
    ((0, 20, 4), ("input_file",)))
OUTPUT_LISTS_SINCE: Version = (0, 20, 4)
# From 0.20.5 (commit 612f0a17d) an unknown item type is quoted, a missing one named
ITEM_WORDS_SINCE: Version = (0, 20, 5)
# Go's names of the anonymous structs these layers first read an item's type into
ITEM_PEEK = 'struct { Type string "json:\\"type\\""; Role string "json:\\"role\\"" }'
CONTENT_PEEK = 'struct { Type string "json:\\"type\\"" }'
RAW_LIST = "[]json.RawMessage"


def _since(table: tuple[tuple[Version, tuple[str, ...]], ...], version: Version
           ) -> frozenset[str]:
    return frozenset(kind for since, kinds in table if version >= since for kind in kinds)


def _go_value_misfit(value: Any, go_type: str) -> str:
    """encoding/json's UnmarshalTypeError outside any struct field."""
    kind = _misfit(value, "object") or "object"
    return f"json: cannot unmarshal {kind} into Go value of type {go_type}"


def responses_error(body: dict[str, Any], version: Version) -> str | None:
    """ResponsesMiddleware's binding: `input` first (ResponsesInput.UnmarshalJSON returns its
    error, which stops Go's decoder, so it wins over a mistyped field before it), then the
    first scalar field of the wrong type, then a reasoning effort the version does not take
    (FromResponsesRequest)."""
    if "input" in body and (wrong := responses_input_error(body["input"], version)):
        return wrong
    for key, value in body.items():
        if key == "reasoning" and value is not None:
            wrong = _go_misfit("ResponsesRequest", key, value, "openai.ResponsesReasoning") \
                if not isinstance(value, dict) else \
                _fields_error("ResponsesReasoning", "reasoning", value, REASONING_FIELDS)
        elif key == "tools":
            wrong = _responses_tools_error("ResponsesRequest", key, value, version)
        elif key == "text":
            wrong = _responses_text_error(value)
        elif key == "include":
            wrong = _strings_error("ResponsesRequest", key, value)
        else:
            wrong = binding_error(RESPONSES_FIELDS, {key: value})
        if wrong:
            return wrong
    given = body.get("input")
    for item in given if isinstance(given, list) else ():
        if isinstance(item, dict) and (wrong := _item_conversion_error(item, version)):
            return wrong
    return effort_error("/v1/responses", body, version)


# openai.ResponsesTool's scalar fields; a `namespace` tool's member tools from 0.32.7
RESPONSES_TOOL_FIELDS = {"type": "string", "name": "string", "description": "string",
                         "strict": "bool"}
NAMESPACE_TOOLS_SINCE: Version = (0, 32, 7)
TEXT_FORMAT_FIELDS = {"type": "string", "name": "string", "strict": "bool"}


def _responses_tools_error(struct: str, at: str, tools: Any, version: Version) -> str | None:
    """A []openai.ResponsesTool bound: a list of objects, each field of its type, Go naming
    the path from the request's root (`ResponsesTool.tools.parameters`)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        return _go_misfit(struct, at, tools, "[]openai.ResponsesTool")
    for tool in tools:
        if tool is None:
            continue
        if not isinstance(tool, dict):
            return _go_misfit(struct, at, tool, "openai.ResponsesTool")
        for key, value in tool.items():
            if key in RESPONSES_TOOL_FIELDS:
                wrong = _scalar_misfit("ResponsesTool", f"{at}.{key}", value,
                                       RESPONSES_TOOL_FIELDS[key])
            elif key == "parameters":
                wrong = None if value is None or isinstance(value, dict) else \
                    _go_misfit("ResponsesTool", f"{at}.{key}", value, "map[string]interface {}")
            elif key == "tools" and version >= NAMESPACE_TOOLS_SINCE:
                wrong = _responses_tools_error("ResponsesTool", f"{at}.tools", value, version)
            else:
                wrong = None
            if wrong:
                return wrong
    return None


def _responses_text_error(text: Any) -> str | None:
    """ResponsesRequest.text bound: an object whose `format` is an object of typed fields."""
    if text is None:
        return None
    if not isinstance(text, dict):
        return _go_misfit("ResponsesRequest", "text", text, "openai.ResponsesText")
    wanted = text.get("format")
    if wanted is None:
        return None
    if not isinstance(wanted, dict):
        return _go_misfit("ResponsesText", "text.format", wanted, "openai.ResponsesTextFormat")
    return _fields_error("ResponsesTextFormat", "text.format", wanted, TEXT_FORMAT_FIELDS)


FILE_INPUTS = "file inputs are not currently supported"


def _item_conversion_error(item: dict[str, Any], version: Version) -> str | None:
    """FromResponsesRequest's refusal of an item: a function call whose `arguments` Go
    cannot read, a part convertResponsesContent cannot (an image URL decodeImageURL cannot
    read, a file)."""
    kind = item.get("type") or ("message" if item.get("role") else "")
    if kind == "function_call":
        return function_arguments_error(item.get("arguments"), version)
    parts = item.get("content") if kind == "message" else \
        item.get("output") if kind == "function_call_output" else None
    for part in parts if isinstance(parts, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_file":
            return FILE_INPUTS
        url = part.get("image_url") if kind == "input_image" and isinstance(part, dict) \
            else None
        if isinstance(url, str) and url and (wrong := _image_url_error(url, version)):
            return wrong
    return None


ARGUMENTS_TYPE = "api.ToolCallFunctionArguments"


def function_arguments_error(arguments: Any, version: Version) -> str | None:
    """json.Unmarshal of a function call's `arguments` ("" is skipped) into
    api.ToolCallFunctionArguments (openai/responses.go FromResponsesRequest): Go's syntax
    check first, then the type's own reading: a plain map before 0.14 (null taken), an
    ordered map from 0.14, which jsonparser refuses anything but an object in its words."""
    if not isinstance(arguments, str) or not arguments:
        return None
    data = arguments.encode("utf-8", "replace")
    wrong = gojson.syntax_error(data)
    if wrong is None:  # valid JSON: its first byte says what it is
        kind = gojson.kind(data)
        if kind == "object" or (kind == "null" and version < ORDERED_MAPS_SINCE):
            return None
        wrong = NOT_AN_OBJECT if version >= ORDERED_MAPS_SINCE else \
            f"json: cannot unmarshal {kind} into Go value of type {ARGUMENTS_TYPE}"
    return f"failed to parse function call arguments: {wrong}"


def responses_input_error(given: Any, version: Version) -> str | None:
    """ResponsesInput.UnmarshalJSON: text, or a list of items each of a type the version
    reads, in its words (`input[0]: unknown input item type: "bogus"`)."""
    if given is None or isinstance(given, str):
        return None
    if not isinstance(given, list):
        return f"input must be a string or array: {_go_value_misfit(given, RAW_LIST)}"
    for index, item in enumerate(given):
        if wrong := _input_item_error(item, version):
            return f"input[{index}]: {wrong}"
    return None


def _input_item_error(item: Any, version: Version) -> str | None:
    if item is None:
        item = {}
    if not isinstance(item, dict):
        return _go_value_misfit(item, ITEM_PEEK)
    kind, role = item.get("type"), item.get("role")
    for key, value in (("type", kind), ("role", role)):
        if _misfit(value, "string"):
            return _peeked_misfit(value, key)
    kind = kind or ("message" if role else "")
    if kind not in _since(ITEM_TYPES, version):
        if version < ITEM_WORDS_SINCE:
            return f"unknown input item type: {item.get('type') or ''}"
        return "input item missing required 'type' field" if not kind else \
            f"unknown input item type: {go_quoted(kind)}"
    if kind == "function_call":  # ResponsesFunctionCall: every field a string
        return next((_scalar_misfit("ResponsesFunctionCall", key, value, "string")
                     for key, value in item.items() if key in FUNCTION_CALL_FIELDS and
                     _misfit(value, "string")), None)
    if kind == "message" and "content" in item:
        return _content_error(item["content"], "content", version)
    if kind == "function_call_output" and "output" in item:
        output = item["output"]
        if version < OUTPUT_LISTS_SINCE:
            return _scalar_misfit("ResponsesFunctionCallOutput", "output", output, "string")
        return _content_error(output, "output", version)
    return None


FUNCTION_CALL_FIELDS = frozenset(("id", "type", "call_id", "name", "arguments"))


def _peeked_misfit(value: Any, key: str) -> str:
    """A peeked field of the wrong type: Go names the anonymous struct's field, and no
    struct."""
    kind = _misfit(value, "string") or "object"
    return f"json: cannot unmarshal {kind} into Go struct field .{key} of type string"


def _content_error(content: Any, name: str, version: Version) -> str | None:
    """A message's `content` (or a function's `output`): text, or a list of parts each of a
    type the version reads."""
    if content is None or isinstance(content, str):
        return None
    if not isinstance(content, list):
        return (f"{name} must be a string or array: "
                f"{_go_value_misfit(content, RAW_LIST)}")
    for index, part in enumerate(content):
        if part is None:
            part = {}
        if not isinstance(part, dict):
            return f"{name}[{index}]: {_go_value_misfit(part, CONTENT_PEEK)}"
        kind = part.get("type")
        if _misfit(kind, "string"):
            return f"{name}[{index}]: {_peeked_misfit(kind, 'type')}"
        if kind not in _since(CONTENT_TYPES, version):
            return f"{name}[{index}]: unknown content type: {kind or ''}"
    return None


def layer_error(path: str, body: dict[str, Any], version: Version) -> str | None:
    """The 400 Ollama answers to `body` on `path` from the body alone, if any."""
    if path in NATIVE_FIELDS:
        return native_error(path, body, version)
    if path == "/v1/chat/completions":
        return chat_error(body, version)
    if path == "/v1/completions":
        return completion_error(body, version)
    if path == "/v1/embeddings":
        return embeddings_error(body, version)
    if path == "/v1/messages":
        return messages_error(body, version)
    if path == "/v1/responses":
        return responses_error(body, version)
    return None
