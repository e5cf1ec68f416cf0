"""encoding/json's syntax check (scanner.go checkValid), with its words: what Ollama answers
when a JSON text inside a field (a Responses function call's `arguments`) does not parse.
json.Unmarshal runs it before decoding anything, so its error is the first one Go gives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import orjson

from proxy.api import wire
from proxy.api.wire import go_quoted

SPACE = frozenset(b" \t\r\n")
HEX = frozenset(b"0123456789abcdefABCDEF")
DIGITS = frozenset(b"0123456789")
MAX_DEPTH = 10000  # scanner.go maxNestingDepth
# parseState: what the scanner is inside
OBJECT_KEY, OBJECT_VALUE, ARRAY_VALUE = range(3)
# The letters a literal's rest must be, each with the state that reads it
LITERALS = {ord("t"): "true", ord("f"): "false", ord("n"): "null"}


def quote_char(byte: int) -> str:
    """scanner.go quoteChar: the byte as a rune, quoted as strconv.Quote does, in single
    quotes (a quote of either kind as it is, but `'` escaped)."""
    if byte in b"'\"":
        return "'\\''" if byte == 0x27 else "'\"'"
    return f"'{go_quoted(chr(byte))[1:-1]}'"


Step = Callable[[int], bool]


class _Scanner:
    """scanner.go's state machine: `step` reads one byte and says whether it was refused,
    `error` then holds Go's words."""

    def __init__(self) -> None:
        self.stack: list[int] = []
        self.error: str | None = None
        self.end_top = False
        self.step: Step = self.begin_value

    def fail(self, byte: int, context: str) -> bool:
        self.error = f"invalid character {quote_char(byte)} {context}"
        return True

    def push(self, byte: int, state: int) -> bool:
        self.stack.append(state)
        return len(self.stack) > MAX_DEPTH and self.fail(byte, "exceeded max depth")

    def pop(self) -> None:
        self.stack.pop()
        self.end_top = not self.stack
        self.step = self.end_top_step if self.end_top else self.end_value

    def begin_value(self, byte: int) -> bool:
        if byte in SPACE:
            return False
        if byte == ord("{"):
            self.step = self.begin_string_or_empty
            return self.push(byte, OBJECT_KEY)
        if byte == ord("["):
            self.step = self.begin_value_or_empty
            return self.push(byte, ARRAY_VALUE)
        if byte == ord('"'):
            self.step = self.in_string
        elif byte == ord("-"):
            self.step = self.negative
        elif byte == ord("0"):
            self.step = self.zero
        elif byte in DIGITS:
            self.step = self.whole
        elif byte in LITERALS:
            self.step = self.literal(LITERALS[byte], 1)
        else:
            return self.fail(byte, "looking for beginning of value")
        return False

    def begin_value_or_empty(self, byte: int) -> bool:
        if byte in SPACE:
            return False
        return self.end_value(byte) if byte == ord("]") else self.begin_value(byte)

    def begin_string_or_empty(self, byte: int) -> bool:
        if byte in SPACE:
            return False
        if byte == ord("}"):
            self.stack[-1] = OBJECT_VALUE
            return self.end_value(byte)
        return self.begin_string(byte)

    def begin_string(self, byte: int) -> bool:
        if byte in SPACE:
            return False
        if byte != ord('"'):
            return self.fail(byte, "looking for beginning of object key string")
        self.step = self.in_string
        return False

    def end_value(self, byte: int) -> bool:
        if not self.stack:
            self.step, self.end_top = self.end_top_step, True
            return self.end_top_step(byte)
        if byte in SPACE:
            self.step = self.end_value
            return False
        state = self.stack[-1]
        if state == OBJECT_KEY:
            if byte != ord(":"):
                return self.fail(byte, "after object key")
            self.stack[-1], self.step = OBJECT_VALUE, self.begin_value
        elif state == OBJECT_VALUE:
            if byte == ord(","):
                self.stack[-1], self.step = OBJECT_KEY, self.begin_string
            elif byte == ord("}"):
                self.pop()
            else:
                return self.fail(byte, "after object key:value pair")
        elif byte == ord(","):
            self.step = self.begin_value
        elif byte == ord("]"):
            self.pop()
        else:
            return self.fail(byte, "after array element")
        return False

    def end_top_step(self, byte: int) -> bool:
        return False if byte in SPACE else self.fail(byte, "after top-level value")

    def in_string(self, byte: int) -> bool:
        if byte == ord('"'):
            self.step = self.end_value
        elif byte == ord("\\"):
            self.step = self.in_escape
        elif byte < 0x20:
            return self.fail(byte, "in string literal")
        return False

    def in_escape(self, byte: int) -> bool:
        if byte in b'bfnrt\\/"':
            self.step = self.in_string
        elif byte == ord("u"):
            self.step = self.hex_digit(4)
        else:
            return self.fail(byte, "in string escape code")
        return False

    def hex_digit(self, left: int) -> Step:
        def step(byte: int) -> bool:
            if byte not in HEX:
                return self.fail(byte, "in \\u hexadecimal character escape")
            self.step = self.in_string if left == 1 else self.hex_digit(left - 1)
            return False
        return step

    def negative(self, byte: int) -> bool:
        if byte == ord("0"):
            self.step = self.zero
        elif byte in DIGITS:
            self.step = self.whole
        else:
            return self.fail(byte, "in numeric literal")
        return False

    def whole(self, byte: int) -> bool:
        return False if byte in DIGITS else self.zero(byte)

    def zero(self, byte: int) -> bool:
        if byte == ord("."):
            self.step = self.dot
            return False
        return self.exponent_mark(byte)

    def exponent_mark(self, byte: int) -> bool:
        if byte in b"eE":
            self.step = self.exponent
            return False
        return self.end_value(byte)

    def dot(self, byte: int) -> bool:
        if byte not in DIGITS:
            return self.fail(byte, "after decimal point in numeric literal")
        self.step = self.fraction
        return False

    def fraction(self, byte: int) -> bool:
        return False if byte in DIGITS else self.exponent_mark(byte)

    def exponent(self, byte: int) -> bool:
        if byte in b"+-":
            self.step = self.exponent_sign
            return False
        return self.exponent_sign(byte)

    def exponent_sign(self, byte: int) -> bool:
        if byte not in DIGITS:
            return self.fail(byte, "in exponent of numeric literal")
        self.step = self.exponent_digits
        return False

    def exponent_digits(self, byte: int) -> bool:
        return False if byte in DIGITS else self.end_value(byte)

    def literal(self, word: str, at: int) -> Step:
        def step(byte: int) -> bool:
            if byte != ord(word[at]):
                return self.fail(byte, f"in literal {word} (expecting {quote_char(ord(word[at]))})")
            self.step = self.end_value if at + 1 == len(word) else self.literal(word, at + 1)
            return False
        return step


def syntax_error(data: bytes) -> str | None:
    """Go's words for `data` that is no JSON text, or None when it is one (checkValid, then
    eof: a text cut short is `unexpected end of JSON input`)."""
    with contextlib.suppress(orjson.JSONDecodeError):  # the usual case, 100 times faster:
        orjson.loads(data)  # a text orjson reads (RFC 8259 only) Go's scanner reads too
        return None
    scanner = _Scanner()
    for byte in data:
        if scanner.step(byte):
            return scanner.error
    if scanner.end_top:
        return None
    if scanner.step(ord(" ")):
        return scanner.error
    return None if scanner.end_top else "unexpected end of JSON input"


KINDS = {ord("{"): "object", ord("["): "array", ord('"'): "string", ord("t"): "bool",
         ord("f"): "bool", ord("n"): "null"}


def kind(data: bytes) -> str:
    """What a valid JSON text is, as Go's UnmarshalTypeError names it ("number" for any)."""
    first = data.lstrip(b" \t\r\n")[:1]
    return KINDS.get(first[0], "number") if first else "number"


def first_value(data: bytes) -> int | str:
    """How json.Decoder.Decode reads `data` (gin's ShouldBindJSON): the end of its first
    JSON value, bytes after it never read (stream.go readValue: scanEnd, a container's at
    its closing byte, a scalar's at the byte after), or Go's words for a text it refuses:
    a syntax error, "unexpected EOF" for one cut short, "EOF" for nothing but whitespace."""
    scanner = _Scanner()
    for at, byte in enumerate(data):
        inside = bool(scanner.stack)
        refused = scanner.step(byte)
        if scanner.end_top:  # (a scalar's next byte is read, never judged)
            return at + 1 if inside else at
        if refused:
            return scanner.error or ""
    if not data.strip(bytes(SPACE)):
        return "EOF"
    scanner.step(ord(" "))  # readValue's EOF: a scalar ends there
    return len(data) if scanner.end_top else "unexpected EOF"


# The struct each of Ollama's routes binds a body to, named when the body is another JSON
# kind (server/routes.go, middleware/openai.go, middleware/anthropic.go `var req ...`)
GO_REQUEST_TYPES = {
    "/api/generate": "api.GenerateRequest", "/api/chat": "api.ChatRequest",
    "/api/show": "api.ShowRequest", "/api/embed": "api.EmbedRequest",
    "/api/embeddings": "api.EmbeddingRequest",
    "/v1/chat/completions": "openai.ChatCompletionRequest",
    "/v1/completions": "openai.CompletionRequest", "/v1/embeddings": "openai.EmbedRequest",
    "/v1/responses": "openai.ResponsesRequest", "/v1/messages": "anthropic.MessagesRequest",
    "/v1/messages/count_tokens": "anthropic.MessagesRequest"}  # (the sidecar's, read so)
# Go's words are found byte by byte (~0.3 s a MiB): a larger body it refuses keeps the
# sidecar's own words, which a caller of a body that size reads as well
GO_WORDS_BYTES = 1 << 20


def go_decoded(raw: bytes, path: str) -> dict[str, Any] | str | None:
    """What Ollama's handler at `path` makes of a body the sidecar cannot take as an object:
    Go's words for its refusal ("missing request body" for no value in Ollama's own
    handlers, "EOF" in the OpenAI and Anthropic layers: v0.12.6 server/routes.go:170-172,
    middleware/openai.go:310-313), an empty body for `null` (the struct left empty), or
    None when Go reads an object from it (the sidecar's own refusal stands)."""
    end = first_value(raw)
    if end == "EOF":
        return "missing request body" if path.startswith("/api/") else "EOF"
    if isinstance(end, str):
        return end
    found = kind(raw[:end])
    if found == "object":
        return None
    if found == "null":
        return {}
    return (f"json: cannot unmarshal {found} into Go value of type "
            f"{GO_REQUEST_TYPES.get(path, 'api.Request')}")


def parse_request_body(raw: bytes, path: str) -> dict[str, Any]:
    """wire.parse_go_body, a body it refuses refused as Ollama's handler at `path` does."""
    try:
        return wire.parse_go_body(raw)
    except wire.BadRequest:
        read = go_decoded(raw, path) if len(raw) <= GO_WORDS_BYTES else None
        if read is None:
            raise
    if isinstance(read, str):
        raise wire.BadRequest(read)
    return read
