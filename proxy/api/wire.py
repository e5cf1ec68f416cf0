"""Wire models: validate the fields the sidecar reads, pass every other field through.

Validation is strict (no coercion), so `"stream": "yes"` is a 400 that names `stream`
rather than a surprise. Unknown fields are kept and forwarded untouched.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Generic, Literal, TypeVar

import orjson
import zstandard
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from proxy.core.context import NEWEST, Version
from proxy.core.durations import DurationError, parse_duration
from proxy.core.models import (
    INVALID_MODEL_NAME,
    SOURCE_SUFFIXES_SINCE,
    is_valid_model_name,
    model_ref,
)


class BadRequest(Exception):
    """A client error the sidecar reports as 400 `bad-request`, naming the field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


# Identifiers become keys in the shared state and words in messages: bounded. Ollama's own
# model names (registry/namespace/model:tag) stay far below.
MAX_ID_LENGTH = 256
ModelName = Annotated[str, StringConstraints(max_length=MAX_ID_LENGTH)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


# Ollama's own API as Go binds it: a field left out or null is its zero value (a message
# without a role, a tool call without a function), so such a body is not the sidecar's to
# refuse; a value of another type is (here, or in Ollama's words in layers.py).
class ToolFunctionCall(_Wire):
    name: str | None = ""
    arguments: dict[str, Any] | str | None = Field(default_factory=dict)


class ToolCall(_Wire):
    function: ToolFunctionCall | None = None


class Message(_Wire):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCall | None] | None = None
    images: list[str] | None = None
    tool_name: str | None = None


# Ollama's options and the JSON type each must have (api/types.go:568-596 Options and Runner;
# v0.12.6 :390-417 has the same less draft_num_predict). Options.FromMap (api/types.go:991-1089)
# refuses any other type, and Ollama answers that 500 though it is the call's mistake; an
# option it does not know it ignores, and so does the sidecar.
OPTION_TYPES: dict[str, str] = {
    **dict.fromkeys(("num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread",
                     "draft_num_predict", "num_keep", "seed", "num_predict", "top_k",
                     "repeat_last_n"), "integer"),
    **dict.fromkeys(("top_p", "min_p", "typical_p", "temperature", "repeat_penalty",
                     "presence_penalty", "frequency_penalty"), "float32"),
    "use_mmap": "boolean",
    "stop": "array",
}


def check_options(options: object) -> None:
    """Ollama's own check of the options' types, with its words (`option "stop" must be of
    type array`): a 400 here, before any placement, where Ollama would answer 500 after it.
    JSON numbers are Go's float64, which int and float32 options both take (an int option
    drops the fraction); null is skipped."""
    if not isinstance(options, dict):
        return  # absent, or not an object: the schema's check names it
    for key, value in options.items():
        kind = OPTION_TYPES.get(key)
        if kind is None or value is None:
            continue
        if kind == "boolean":
            fits = isinstance(value, bool)
        elif kind == "array":
            fits = isinstance(value, list)
            if fits and not all(isinstance(item, str) for item in value):
                raise BadRequest(f'option "{key}" must be of an array of strings',
                                 f"options.{key}")
        else:
            fits = isinstance(value, int | float) and not isinstance(value, bool)
        if not fits:
            raise BadRequest(f'option "{key}" must be of type {kind}', f"options.{key}")


def requested_num_ctx(body: dict[str, Any]) -> int | None:
    """The context a call's options ask for, once check_options has passed them: none for
    0 or less (Ollama would run such a call at 4 tokens), an int option's fraction dropped."""
    options = body.get("options")
    num_ctx = options.get("num_ctx") if isinstance(options, dict) else None
    if not isinstance(num_ctx, int | float) or isinstance(num_ctx, bool):
        return None
    return int(num_ctx) if int(num_ctx) > 0 else None


class OllamaInference(_Wire):
    """Fields of /api/chat and /api/generate the sidecar needs to see."""

    model: ModelName | None = None
    stream: bool | None = None
    options: Any = None  # Ollama's map[string]any: check_options, layers.native_error
    keep_alive: float | int | str | None = None
    messages: list[Message] | None = None  # a null message (Go's empty one) is still refused
    tools: list[dict[str, Any] | None] | None = None
    prompt: str | None = None
    system: str | None = None
    context: list[int | None] | None = None  # /api/generate: an earlier answer's tokens
    think: bool | Literal["low", "medium", "high", "max"] | None = None
    shift: bool | None = None  # Ollama's *bool (api/types.go:117, 167)


class OllamaEmbed(_Wire):
    """/api/embed (`input`) and the legacy /api/embeddings (`prompt`)."""

    model: ModelName | None = None
    input: Any = None  # Ollama's `any`: its handler refuses what is no text (layers.py)
    prompt: str | None = None
    options: Any = None  # Ollama's map[string]any: check_options, layers.native_error
    keep_alive: float | int | str | None = None
    truncate: bool | None = None
    stream: Any = None  # ignored, as Ollama ignores it: an embedding is never streamed


# OpenAI's and Anthropic's messages and tools as Ollama's layers bind them: a message's
# `role` left out or null is Go's "" and a null tool Go's empty one (each accepted there);
# what the layers read as `any` (OpenAI's message content, Anthropic's system) is theirs to
# refuse, in their words (layers.py).
class OpenAIMessage(_Wire):
    role: str | None = None
    content: Any = None  # Ollama's `any`: text or parts, else its 400 (layers.py)
    tool_calls: list[dict[str, Any]] | None = None


class OpenAIChat(_Wire):
    model: ModelName | None = None
    messages: list[OpenAIMessage] | None = None  # none: Ollama's 400 in its words (layers.py)
    stream: bool | None = None
    tools: list[dict[str, Any] | None] | None = None


class OpenAICompletion(_Wire):
    model: ModelName | None = None
    prompt: Any = None  # a string: refused otherwise in Ollama's words (layers.py)
    suffix: Any = None  # as `prompt`
    stream: bool | None = None


class OpenAIEmbed(_Wire):
    model: ModelName | None = None
    input: Any = None  # Ollama's `any`, as on /api/embed
    stream: Any = None  # ignored, as Ollama ignores it: an embedding is never streamed


class OpenAIResponses(_Wire):
    """OpenAI's Responses API: `input` is text or a list of items (messages, tool calls and
    their outputs)."""

    model: ModelName | None = None
    input: Any = None  # text or items: refused otherwise in Ollama's words (layers.py)
    instructions: Any = None  # as `input`
    stream: bool | None = None
    tools: list[dict[str, Any] | None] | None = None


class AnthropicMessage(_Wire):
    role: str | None = None
    content: str | list[dict[str, Any]] | None  # required: Go cannot read a message without


class AnthropicMessages(_Wire):
    """Anthropic's Messages API, which Ollama serves on /v1/messages."""

    model: ModelName | None = None
    messages: list[AnthropicMessage] | None = None  # none: Ollama's 400 (layers.py)
    system: Any = None  # Ollama's `any`: text, or blocks whose text it reads; else ignored
    max_tokens: Any = None  # an int, else Ollama's 400 in its words (layers.py)
    stream: bool | None = None
    tools: list[dict[str, Any] | None] | None = None


Inference = (OllamaInference | OllamaEmbed | OpenAIChat | OpenAICompletion | OpenAIEmbed
             | OpenAIResponses | AnthropicMessages)
EMBEDDINGS = (OllamaEmbed, OpenAIEmbed)
# Every path the sidecar places, with the fields it reads there.
PLACED: dict[str, type[Inference]] = {
    "/api/chat": OllamaInference,
    "/api/generate": OllamaInference,
    "/api/embed": OllamaEmbed,
    "/api/embeddings": OllamaEmbed,
    "/v1/chat/completions": OpenAIChat,
    "/v1/completions": OpenAICompletion,
    "/v1/responses": OpenAIResponses,
    "/v1/embeddings": OpenAIEmbed,
    "/v1/messages": AnthropicMessages,
}


class PlanRequest(_Wire):
    thread: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    phase: Literal["mulling", "triage"] | None = None
    model: ModelName | None = None
    promptChars: int | None = Field(default=None, ge=0)


class PullRequest(_Wire):
    model: ModelName | None = None
    name: ModelName | None = None
    stream: bool | None = None


class ShowRequest(_Wire):
    model: ModelName | None = None
    name: ModelName | None = None


# ThinkValue.UnmarshalJSON (api/types.go:1202-1222; v0.12.6 :936-956): the levels `think`
# takes, "max" from 0.22.0
THINK_LEVELS = ("high", "medium", "low")
MAX_THINK_SINCE: Version = (0, 22, 0)
# GenerateHandler and ChatHandler refuse top_logprobs outside 0-20 from 0.12.11, once the
# body is read (server/routes.go:256-258, 2452-2454); before, the field does not exist.
TOP_LOGPROBS_CHECKED_SINCE: Version = (0, 12, 11)
MAX_TOP_LOGPROBS = 20
GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
              "\v": "\\v", '"': '\\"', "\\": "\\\\"}


# strconv.Quote's escapes of ASCII: the named ones, \xNN for the other controls
_GO_ASCII = {code: GO_ESCAPES.get(chr(code)) or f"\\x{code:02x}"
             for code in (*range(0x20), 0x7F, ord('"'), ord("\\"))}


def go_quoted(text: str) -> str:
    """Go's %q (strconv.Quote): printable characters as they are, the rest escaped."""
    if text.isascii():  # (str.translate: a value of megabytes quoted in C, not char by char)
        return '"' + text.translate(_GO_ASCII) + '"'
    out: list[str] = []
    for char in text:
        code = ord(char)
        out.append(GO_ESCAPES.get(char) or (char if char.isprintable() else
                   f"\\x{code:02x}" if code < 0x80 else
                   f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"))
    return '"' + "".join(out) + '"'


def check_think(think: object, version: Version = NEWEST) -> None:
    """Ollama's binding of `think`: a boolean or one of the version's levels, else its 400
    in its words (`invalid think value: "bogus" (must be "high", ...)`)."""
    if think is None or isinstance(think, bool):
        return
    levels = THINK_LEVELS + (("max",) if version >= MAX_THINK_SINCE else ())
    forms = "".join(f'"{level}", ' for level in levels) + "true, or false"
    if not isinstance(think, str):
        raise BadRequest(f"think must be a boolean or string ({forms})", "think")
    if think not in levels:
        raise BadRequest(f"invalid think value: {go_quoted(think)} (must be {forms})", "think")


def check_top_logprobs(body: dict[str, Any], schema: type[BaseModel],
                       version: Version = NEWEST) -> None:
    """Ollama's 400 for top_logprobs outside 0-20: the field on its own API and OpenAI's
    chat, a positive `logprobs` on OpenAI's completions (openai/openai.go:719, 830-843)."""
    if version < TOP_LOGPROBS_CHECKED_SINCE:
        return
    if schema is OpenAICompletion:
        value = body.get("logprobs")
        wrong = isinstance(value, int) and value > MAX_TOP_LOGPROBS
    elif schema in (OllamaInference, OpenAIChat):
        value = body.get("top_logprobs")
        wrong = isinstance(value, int) and not 0 <= value <= MAX_TOP_LOGPROBS
    else:
        return
    if wrong and not isinstance(value, bool):
        raise BadRequest(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}",
                         "logprobs" if schema is OpenAICompletion else "top_logprobs")


# Go's names of the types a JSON value decodes to in an `any`, as api.Duration's refusal
# prints them (reflect.TypeOf with %s)
GO_ANY_TYPES: dict[type, str] = {bool: "bool", list: "[]interface {}",
                                 dict: "map[string]interface {}"}


def check_keep_alive(keep_alive: object) -> None:
    """A string `keep_alive` is a Go duration or Ollama's 400 with Go's words: "300" and
    "-1" lack their unit (`time: missing unit in duration "300"`); only "0" may. A value
    neither number nor string (null leaves it unset) is api.Duration's `Unsupported type:
    'bool'` (api/types.go UnmarshalJSON, the same in 0.12.6)."""
    if type(keep_alive) in GO_ANY_TYPES:
        raise BadRequest(f"Unsupported type: '{GO_ANY_TYPES[type(keep_alive)]}'",
                         "keep_alive")
    if isinstance(keep_alive, str):
        try:
            parse_duration(keep_alive)
        except DurationError as exc:
            raise BadRequest(str(exc), "keep_alive") from None


# The schemas whose `keep_alive` Ollama reads: its own API's. Its OpenAI and Anthropic
# request structs have no such field (openai/openai.go:90-163, openai/responses.go:368,
# anthropic/anthropic.go:67-82), so there Ollama ignores it, and so does the sidecar.
KEEPS_ALIVE = (OllamaInference, OllamaEmbed)


def zero_keep_alive(parsed: BaseModel) -> bool:
    """`keep_alive` 0 on Ollama's own API: a number or a Go duration string such as "0",
    "0s" or "0m"."""
    if not isinstance(parsed, KEEPS_ALIVE):
        return False
    keep_alive = parsed.keep_alive
    if isinstance(keep_alive, str):
        try:
            return parse_duration(keep_alive) == 0
        except DurationError:
            return False
    # Go keeps whole nanoseconds of a number of seconds (time.Duration(t * 1e9), api/types.go
    # UnmarshalJSON): anything under one is 0
    return keep_alive is not None and 0 <= keep_alive * 1e9 < 1


def keep_alive_seconds(parsed: BaseModel) -> float | None:
    """The keep-alive a call on Ollama's own API sets for its copy, in seconds (negative:
    forever); None when it sets none, or on an API where Ollama does not read it."""
    if not isinstance(parsed, KEEPS_ALIVE) or parsed.keep_alive is None:
        return None
    keep_alive = parsed.keep_alive
    if isinstance(keep_alive, str):
        try:
            return parse_duration(keep_alive) / 1e9
        except DurationError:
            return None
    return float(keep_alive)


# Go's time.Duration holds int64 nanoseconds: a number of seconds from this many up overflows
# `time.Duration(t * 1e9)` (api/types.go UnmarshalJSON), to the most negative duration on amd64
# (the copy unloads as its calls end) and to the largest on arm64 (forever)
GO_DURATION_LIMIT_S = 2**63 / 1e9


def past_go_duration(keep_alive: object) -> bool:
    """A `keep_alive` number too large for Go's Duration: meant as "keep it loaded", and sent
    as -1 (forever), which every Ollama reads alike."""
    return isinstance(keep_alive, int | float) and not isinstance(keep_alive, bool) and \
        keep_alive >= GO_DURATION_LIMIT_S


def asks_to_unload(parsed: BaseModel) -> bool:
    """`keep_alive: 0` with nothing to run: Ollama's way to unload a model (`ollama stop`)."""
    return isinstance(parsed, OllamaInference) and not parsed.prompt and \
        not parsed.messages and zero_keep_alive(parsed)


# Deeper than any tool schema; the sidecar's own JSON encoder stops at 255.
MAX_DEPTH = 128


def nesting_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deep objects and arrays nest in `value`, counting up to `limit` + 1 (no
    recursion: a stack of what is left to look at)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else \
            item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list))
    return deepest


# Ollama's Responses layer reads a body sent with `Content-Encoding: zstd` (Codex sends
# them; middleware/openai.go ResponsesMiddleware, from 0.16.3): an 8 MiB window at most,
# and 20 MiB once decompressed (maxDecompressedBodySize, through http.MaxBytesReader).
ZSTD_WINDOW_BYTES = 8 << 20
ZSTD_BODY_BYTES = 20 << 20
ZSTD_PATHS = ("/v1/responses",)


def decompress_zstd(raw: bytes) -> bytes:
    """A zstd body decompressed as Ollama reads it, or the 400 it answers: Go's words for a
    body over the limit, klauspost/compress's for one that is no zstd frame."""
    reader = zstandard.ZstdDecompressor(max_window_size=ZSTD_WINDOW_BYTES).stream_reader(
        raw, read_across_frames=True)
    try:
        body = reader.read(ZSTD_BODY_BYTES + 1)
    except zstandard.ZstdError as exc:
        if raw[:4] != b"\x28\xb5\x2f\xfd":
            raise BadRequest("invalid input: magic number mismatch") from None
        raise BadRequest(f"failed to decompress zstd body: {exc}") from None
    if len(body) > ZSTD_BODY_BYTES:
        raise BadRequest("http: request body too large")
    return body


def parse_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip(_WHITESPACE.encode()):  # Go's decoder reads io.EOF from blanks too
        raise BadRequest("missing request body")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        body = _as_go_reads(raw)
        if body is _UNREADABLE:
            raise BadRequest(_no_value_start(raw) or _syntax_words(raw) or
                             f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if nesting_depth(body) > MAX_DEPTH:
        raise BadRequest(f"request body nests objects and arrays deeper than {MAX_DEPTH} "
                         "levels")
    return body


def parse_go_body(raw: bytes) -> dict[str, Any]:
    """A body for one of Ollama's handlers: parsed, its fields as Go binds them."""
    return as_go_binds(raw, parse_body(raw))


# Runes beyond ASCII that encoding/json folds onto an ASCII letter when it matches a key to
# a field (fold.go appendFoldedName, upper(lower(r))): long s, Kelvin sign, dotless and
# dotted I. No other rune folds onto a field name, every one of which is ASCII.
_GO_FOLDS = str.maketrans({"\u017f": "s", "\u212a": "k", "\u0131": "i", "\u0130": "i"})


def go_field_key(key: str) -> str:
    """The field name encoding/json binds `key` to: it matches names case-insensitively,
    and every top-level request field of Ollama's, OpenAI's and Anthropic's structs is
    lower case."""
    return key.lower() if key.isascii() else \
        "".join(c.lower() if c.isascii() else c for c in key.translate(_GO_FOLDS))


def as_go_binds(raw: bytes, body: dict[str, Any]) -> dict[str, Any]:
    """The body's top-level keys as Ollama's handler binds them: `Model` or `MODEL` is its
    `model`, and of keys naming one field the last in the body wins, as it does for a key
    repeated (`{"model": "a", "Model": "b"}` runs b). The sidecar then places, and sends on,
    the model Ollama runs. (Fields nested in messages or tools are left as they came.)"""
    if all(key == go_field_key(key) for key in body):
        return body  # the usual body: nothing to fold
    out: dict[str, Any] = {}
    for key in _top_level_keys(raw) or body:  # in the body's order, repeats included
        if key in body:  # (the field keeps its first place, takes its last value)
            out[go_field_key(key)] = body[key]
    for key in body:  # (none, unless the body's order could not be read)
        out.setdefault(go_field_key(key), body[key])
    return out


# The objects nested in a body that Go decodes into structs, whose keys it folds as it does
# the top level's: a shape names the fields whose values hold more of them (a list's items
# take the list's shape). Maps are left out, as Go matches their keys exactly: `options`, a
# call's `arguments`, a block's `input`, an OpenAI message's content parts (`any`),
# Anthropic's `system` and a tool result's content (`any`), a parameter schema's
# `properties`. (Every field name of these structs is lower case.)
Shape = dict[str, "Shape"]
_CALLS: Shape = {"function": {}}  # api.ToolCall, openai.ToolCall: their function a struct
# api.Tool: its api.ToolFunction, whose `parameters` is an api.ToolFunctionParameters
# (type, $defs, items, required, properties; api/types.go:487-504 at v0.30.0)
_TOOLS: Shape = {"function": {"parameters": {}}}
# openai.ChatCompletionRequest's (and CompletionRequest's) response_format (its json_schema a
# struct too, whose `schema` is raw JSON), stream_options and reasoning (openai/openai.go
# :74-95 at v0.30.0); Ollama's own requests have no such fields, and ignore them
NESTED_STRUCTS: Shape = {"messages": {"tool_calls": _CALLS}, "tools": _TOOLS,
                         "response_format": {"json_schema": {}}, "stream_options": {},
                         "reasoning": {}}
# openai.ResponsesRequest (openai/responses.go at v0.30.0): an input item is read into a
# struct by its type (unmarshalResponsesInputItem, :242-283, peeking at type and role), as
# are a message's content parts and a function output's (unmarshalResponsesContent,
# :107-140) and a reasoning item's summary; a ResponsesTool (:349-355) is one, and
# convertTool (:571-583) reads its `parameters` map into api.ToolFunctionParameters, a
# `namespace` tool's member tools alike; `text`, its `format`, and `reasoning` are structs.
_RESPONSES_TOOLS: Shape = {"parameters": {}}
_RESPONSES_TOOLS["tools"] = _RESPONSES_TOOLS
RESPONSES_NESTED_STRUCTS: Shape = {
    "input": {"content": {}, "output": {}, "summary": {}}, "tools": _RESPONSES_TOOLS,
    "text": {"format": {}}, "reasoning": {}}
# anthropic.MessagesRequest: MessageParam's content is []ContentBlock; a Tool is a struct
ANTHROPIC_NESTED_STRUCTS: Shape = {"messages": {"content": {}}, "tools": {}}


def nested_as_go_binds(body: dict[str, Any], shape: Shape = NESTED_STRUCTS) -> dict[str, Any]:
    """The body with the keys of its nested structs as Go binds them (`Role` is a message's
    `role`, the last of the keys naming a field winning), for the sidecar's sizing and
    checks; the body itself, not copied, when every such key is already lower case. (What
    is sent on stays as it came: Ollama binds it alike.)"""
    folded: dict[str, Any] = _folded(body, shape, top=True)
    return folded


def _folded(value: Any, shape: Shape, top: bool = False) -> Any:
    if isinstance(value, list):
        for index, item in enumerate(value):  # copied only from the first item to fold
            if isinstance(item, dict) and shape.keys().isdisjoint(item) and \
                    (keys := "".join(item)).isascii() and keys.islower():
                continue  # (the usual message, inline: a call each costs as much again)
            if (folded := _folded(item, shape)) is not item:
                return [*value[:index], folded,
                        *(_folded(rest, shape) for rest in value[index + 1:])]
        return value
    if not isinstance(value, dict):
        return value
    out = value if top or _bound_as_is(value) else \
        {go_field_key(key): item for key, item in value.items()}  # the last one wins
    for key, inner in shape.items():
        if (item := out.get(key)) is not None and (folded := _folded(item, inner)) is not item:
            out = {**out, key: folded} if out is value else out
            out[key] = folded
    return out


def _bound_as_is(struct: dict[str, Any]) -> bool:
    keys = "".join(struct)  # (one test of all its keys: the usual body pays next to nothing)
    return (keys.isascii() and keys.islower()) or all(key == go_field_key(key) for key in struct)


def _top_level_keys(raw: bytes) -> list[str]:
    """The top-level object's keys in the body's order, each as often as it appears; []
    if the text cannot be read so (orjson took the body: the order then is its own)."""
    objects: list[list[tuple[str, Any]]] = []
    text = raw.decode("utf-8", "replace")
    try:
        json.JSONDecoder(object_pairs_hook=objects.append).raw_decode(
            text, len(text) - len(text.lstrip(_WHITESPACE)))
    except (ValueError, RecursionError):
        return []
    # the top-level object closes last; keys as _without_surrogates leaves them
    return [_LONE_SURROGATE.sub("\ufffd", key) for key, _ in objects[-1]] if objects else []


_UNREADABLE = object()
_WHITESPACE = " \t\r\n"
_VALUE_STARTS = frozenset(b'{["-0123456789tfn')


def _syntax_words(raw: bytes) -> str | None:
    """Go's decoder's words for a first value that is no JSON (`invalid character 'o' in
    literal null (expecting 'u')`; one cut short: `unexpected EOF`, io.ErrUnexpectedEOF),
    as Ollama answers them; None when its syntax is sound (what follows it is never read)."""
    from proxy.api import gojson  # (it reads this module's quoting)

    wrong = gojson.syntax_error(raw)
    if wrong is None or "after top-level value" in wrong:
        return None
    return "unexpected EOF" if wrong == "unexpected end of JSON input" else wrong


def _no_value_start(raw: bytes) -> str | None:
    """encoding/json's words for a body whose first byte after whitespace begins no JSON
    value (a gzip-compressed body's 0x1f, a byte-order mark), as Ollama answers it."""
    start = raw.lstrip(_WHITESPACE.encode())[:1]
    if not start or start[0] in _VALUE_STARTS:
        return None
    return f"invalid character {_go_quoted_byte(start[0])} looking for beginning of value"


def _go_quoted_byte(byte: int) -> str:
    """Go's quoteChar: the byte as a rune, quoted as strconv.Quote does, in single quotes
    (a quote of either kind as it is, but `'` escaped)."""
    if byte in b"'\"":
        return "'\\''" if byte == 0x27 else "'\"'"
    return f"'{go_quoted(chr(byte))[1:-1]}'"


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _whole(text: str) -> int | float:
    """A JSON integer as orjson reads it: one beyond 64 bits is a float (the body is sent on
    with orjson, which writes no larger int)."""
    number = int(text)
    return number if -(2 ** 63) <= number < 2 ** 64 else _finite(text)


def _finite(text: str) -> float:
    """A JSON number as Go's float64 takes it: one out of its range is refused."""
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"number {text} is out of range")
    return number


def _as_go_reads(raw: bytes) -> Any:
    """A body orjson refuses, read as Ollama reads it (gin's ShouldBindJSON: one value from a
    json.Decoder): invalid UTF-8 and lone surrogates (`"\\ud83d"`, half an emoji a client cut)
    become U+FFFD, and what follows the first value is left unread. `_UNREADABLE` when Go
    would refuse it too."""
    text = raw.decode("utf-8", "replace")
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, _ = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite,
                                    parse_int=_whole).raw_decode(text, start)
    except (ValueError, RecursionError):
        return _UNREADABLE
    if nesting_depth(value) > MAX_DEPTH:
        return value  # refused for its depth (a recursive walk could overflow on it)
    return _without_surrogates(value)


def _without_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    return value


def named_model(body: dict[str, Any] | None, also_name: bool = False) -> str | None:
    """The model a request's body names, for its refusal's `model` (CONTRACT.md), when it is
    a string within the length limit; with `also_name`, Ollama's older `name` key (/api/show,
    /api/pull) when it has no `model`."""
    for key in ("model", "name") if also_name else ("model",):
        value = body.get(key) if body is not None else None
        if isinstance(value, str) and value and len(value) <= MAX_ID_LENGTH:
            return value
    return None


W = TypeVar("W", bound=BaseModel)


# The names pydantic puts in an error's location for each member of a union ("str",
# "dict[str,any]"): not fields, so the field named to the client stops before them.
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|none|(dict|list|literal|tuple)\[.*\])$")


def _field(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and _UNION_MEMBER.match(p))]
    return ".".join(parts) or "body"


def check_binding(body: dict[str, Any], schema: type[BaseModel], version: Version) -> None:
    """The fields Ollama's own API reads with a decoder of their own (api.Duration,
    api.ThinkValue), in the body's order: Go's decoder stops at the first that fails."""
    for key, value in body.items():
        if key == "keep_alive":
            check_keep_alive(value)
        elif key == "think" and schema is OllamaInference:
            check_think(value, version)


def validate(model: type[W], body: dict[str, Any], version: Version = NEWEST) -> W:
    """The body's fields the sidecar reads, checked as Ollama `version` checks them (the
    newest rules by default)."""
    return _validate(model, body, version, lambda: _validated(model, body))


def _validate(model: type[W], body: dict[str, Any], version: Version,
              fields: Callable[[], W]) -> W:
    """validate, the body's fields checked by `fields` (the same for every version)."""
    if model in (OllamaInference, OllamaEmbed):
        # Ollama reads the body (keep_alive, think) before it reads the options
        check_binding(body, model, version)
    check_top_logprobs(body, model, version)
    if model in (OllamaInference, OllamaEmbed):
        check_options(body.get("options"))
    parsed = fields()
    check_model_name(parsed, version)
    return parsed


class BodyCheck(Generic[W]):
    """The body checked as one Ollama version checks it, each version once: its words when
    the version refuses the body, None when it takes it. Placement asks it of a card whose
    version was first heard after the call's check (core/engines.py body_refusal)."""

    def __init__(self, model: type[W], body: dict[str, Any]) -> None:
        self.model, self.body = model, body
        self.taken: dict[Version, W] = {}  # the fields each version reads
        self.refused: dict[Version, BadRequest] = {}
        self._fields: list[W | BadRequest] = []  # the schema's check: no version's own
        # The checks of the path's layer that follow the binding's (api/layers.py
        # layer_error), once the call is known to run on a card; each version's words kept
        self.layer: Callable[[Version], str | None] | None = None
        self._layer_words: dict[Version, str | None] = {}

    def _checked(self) -> W:  # (a body of many messages takes a second each time)
        if not self._fields:
            try:
                self._fields.append(_validated(self.model, self.body))
            except BadRequest as exc:
                self._fields.append(exc)
        if isinstance(self._fields[0], BadRequest):
            raise self._fields[0]
        return self._fields[0]

    def __call__(self, version: Version) -> str | None:
        if version not in self.taken and version not in self.refused:
            try:
                self.taken[version] = _validate(self.model, self.body, version, self._checked)
            except BadRequest as exc:
                self.refused[version] = exc
        if version in self.refused:
            return str(self.refused[version])
        if self.layer is None:
            return None
        if version not in self._layer_words:
            self._layer_words[version] = self.layer(version)
        return self._layer_words[version]


def validate_in_fleet(model: type[W], body: dict[str, Any], versions: Sequence[Version],
                      check: BodyCheck[W] | None = None
                      ) -> tuple[W, tuple[tuple[Version, str], ...]]:
    """The body checked as each of the fleet's Ollama versions checks it (newest first): its
    fields as the newest that takes it reads them, and the versions that refuse it with
    their words (placement leaves their cards out). None takes it: the newest's refusal.
    `check`, the body's BodyCheck, keeps what each version answered."""
    check = check or BodyCheck(model, body)
    ordered = sorted(set(versions), reverse=True)
    refusals = tuple((version, words) for version in ordered
                     if (words := check(version)) is not None)
    parsed = next((check.taken[version] for version in ordered if version in check.taken),
                  None)
    if parsed is None:
        first = next((check.refused[version] for version in ordered), None)
        raise first or BadRequest("no Ollama version to check the body against")
    return parsed, refusals


# A list longer than this is validated in pieces: pydantic holds the GIL for a whole
# validation, so half a million messages in one call would stall the event loop for seconds
# even from a worker thread.
CHUNK = 2000


def _validated(model: type[W], body: dict[str, Any]) -> W:
    """`model` validated from `body`, its long lists a chunk at a time."""
    fields = model.model_fields
    long = {key: value for key, value in body.items()
            if key in fields and isinstance(value, list) and len(value) > CHUNK}
    try:
        parsed = model.model_validate({**body, **{key: [] for key in long}} if long else body)
    except ValidationError as exc:
        raise _bad_request(exc.errors()) from None
    for key, items in long.items():
        adapter = _adapter(model, key)
        checked: list[Any] = []
        for start in range(0, len(items), CHUNK):
            try:
                checked.extend(adapter.validate_python(items[start:start + CHUNK]))
            except ValidationError as exc:
                raise _bad_request([{**e, "loc": (key, *_shifted(e["loc"], start))}
                                    for e in exc.errors()]) from None
        setattr(parsed, key, checked)
    return parsed


@functools.cache
def _adapter(model: type[BaseModel], key: str) -> TypeAdapter[Any]:
    """A validator of the field `key` of `model` on its own."""
    annotation = model.model_fields[key].annotation
    assert annotation is not None  # every field of a wire model is annotated
    return TypeAdapter(annotation)


def _shifted(loc: tuple[int | str, ...], start: int) -> tuple[int | str, ...]:
    """An error's location in a chunk, as its location in the whole list."""
    at = next((i for i, part in enumerate(loc) if isinstance(part, int)), None)
    return loc if at is None else (*loc[:at], start + int(loc[at]), *loc[at + 1:])


def _bad_request(errors: Sequence[Any]) -> BadRequest:
    field = _field(errors[0]["loc"])
    # A union's field fails once per member: say every form it accepts, once.
    wanted = dict.fromkeys(e["msg"].removeprefix("Input should be ")
                           for e in errors if _field(e["loc"]) == field)
    message = errors[0]["msg"] if len(wanted) == 1 else \
        "Input should be " + " or ".join(wanted)
    return BadRequest(f"field '{field}': {message}", field)


def check_model_name(parsed: BaseModel, version: Version = NEWEST) -> None:
    """Ollama's 400 for a model name its ParseName cannot read (server/routes.go:66-75,
    model_resolver.go:36-47), its source suffix aside from 0.18; an empty name is the
    sidecar's "the model I am bound to"."""
    name = getattr(parsed, "model", None) or getattr(parsed, "name", None)
    if isinstance(name, str) and name:
        check_name(name, version)


def check_name(name: str, version: Version = NEWEST) -> None:
    """check_model_name's test of one name."""
    if version >= SOURCE_SUFFIXES_SINCE:
        try:
            name = model_ref(name).base
        except ValueError as exc:
            raise BadRequest(str(exc), "model") from None
    if not is_valid_model_name(name):
        raise BadRequest(INVALID_MODEL_NAME, "model")
