"""What the simulated model says, decided from the request alone so a demo is repeatable:
a call of one offered tool while no tool result has come back, JSON that matches `format`
("json" or a JSON schema), plain words otherwise, and a thought first when the model thinks.

An answer has a length of its own: plain words run to the simulator's `answer_tokens`, or to
what the call asks with the sim-only option `sim_answer_tokens` (a top-level field on the
OpenAI and Anthropic paths), which a real Ollama ignores (Options.FromMap skips unknown keys,
api/types.go:1004-1009). `num_predict` (max_tokens) only caps it, thinking included: a capped
answer ends with done_reason "length" (llm/llama_server.go:1714-1716), and eval_count, the
tokens predicted, never exceeds the cap.

The pieces come out as Ollama streams them (server/routes.go ChatHandler): thinking chunks
before the content, and a tool call whole in one chunk with an id and its index.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import orjson

WORDS = ("the", "answer", "is", "forty", "two", "and", "that", "settles", "it", "for", "now")
THOUGHT = ("first", "I", "look", "at", "what", "is", "asked", "and", "then", "I", "answer")
ANSWER_TOKENS = "sim_answer_tokens"  # the sim-only option: the answer's own length
CHARS_PER_PIECE = 4  # a streamed piece of JSON text stands for one token
MAX_SCHEMA_DEPTH = 32  # bounds `$ref` cycles and hostile nesting
MAX_SCHEMA_NODES = 2000  # and what they may fan out to
TEXT = "forty two"
STRING_FORMATS = {"date-time": "2026-01-01T00:00:00Z", "date": "2026-01-01",
                  "time": "00:00:00Z", "email": "agent@example.com",
                  "uri": "https://example.com/", "uuid": "00000000-0000-4000-8000-000000000042"}


@dataclass(frozen=True)
class Piece:
    """One streamed chunk: `kind` is the message field it fills ("thinking", "content" or
    "tool_calls"), `tokens` what it costs to generate."""

    kind: str
    value: Any
    tokens: int = 1


# Logprobs: from 0.12.11, each chunk carries its tokens' (server/logprob.go toAPILogprobs:
# token, its UTF-8 bytes, logprob, and with top_logprobs that many alternatives, the chosen
# first); a whole answer gathers them (server/routes.go:2391-2427)
ALTERNATIVES = ("a", "the", "an", "this", "it", "so", "and", "or", "but", "if", "of", "to",
                "in", "on", "at", "by", "for", "with", "as", "from")


def _token_logprob(token: str, logprob: float) -> dict[str, Any]:
    entry: dict[str, Any] = {"token": token, "logprob": logprob}
    if token:  # `bytes` is omitempty
        entry["bytes"] = list(token.encode())
    return entry


def piece_logprobs(piece: Piece, top: int) -> list[dict[str, Any]]:
    """One entry per token of `piece` (its text split evenly), each with `top`
    alternatives when asked, decided by the text alone."""
    text = piece.value if isinstance(piece.value, str) else orjson.dumps(piece.value).decode()
    count = max(1, piece.tokens)
    step = math.ceil(len(text) / count) if text else 0
    entries = []
    for i in range(count):
        token = text[i * step:(i + 1) * step]
        logprob = -round(0.01 + (len(token) * 37 + i) % 23 / 10, 4)
        entry = {**_token_logprob(token, logprob)}
        if top > 0:
            entry["top_logprobs"] = [_token_logprob(token, logprob)] + [
                _token_logprob(alt, round(logprob - 1 - j, 4))
                for j, alt in enumerate(ALTERNATIVES[:top - 1])]
        entries.append(entry)
    return entries


@dataclass
class Reply:
    pieces: list[Piece] = field(default_factory=list)
    done_reason: str = "stop"

    @property
    def tokens(self) -> int:
        return sum(p.tokens for p in self.pieces)


def _positive(value: Any) -> int | None:
    """A count from JSON (any number; Go truncates a float), when above 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return int(value) if value >= 1 else None


def answer_tokens(options: dict[str, Any], default: int) -> int:
    """The answer's own length in words: the call's `sim_answer_tokens`, else `default`."""
    return _positive(options.get(ANSWER_TOKENS)) or default


def answer_options(tokens: int) -> dict[str, int]:
    """Options for an answer of `tokens` words: its own length, and the cap there."""
    return {"num_predict": tokens, ANSWER_TOKENS: tokens}


def answer_cap(options: dict[str, Any]) -> int | None:
    """num_predict as a cap; none for -1 (no limit), -2 and unset."""
    return _positive(options.get("num_predict"))


def reply_for(body: dict[str, Any], chat: bool, n_tokens: int, cap: int | None,
              thinking: bool) -> Reply:
    """The answer to a native /api/chat (`chat`) or /api/generate body: a thought first when
    the model thinks, then `n_tokens` words of free text, or JSON or a tool call ending on
    their own; cut at `cap` tokens (a tool call not yet whole is never sent)."""
    thought = [Piece("thinking", w + " ") for w in THOUGHT] if thinking else []
    tool = _tool_to_call(body) if chat else None
    wanted = body.get("format")
    if tool is not None:
        call = _tool_call(tool, body)
        arguments = orjson.dumps(call["function"]["arguments"])
        said = [Piece("tool_calls", [call], max(1, math.ceil(len(arguments) / CHARS_PER_PIECE)))]
    elif wanted == "json" or isinstance(wanted, dict):
        value = {"answer": " ".join(WORDS[:5])} if wanted == "json" else instance_of(wanted)
        text = orjson.dumps(value).decode()
        said = [Piece("content", text[i:i + CHARS_PER_PIECE])
                for i in range(0, len(text), CHARS_PER_PIECE)]
    else:
        said = [Piece("content", WORDS[i % len(WORDS)] + ("" if i == n_tokens - 1 else " "))
                for i in range(n_tokens)]
    return _capped([*thought, *said], cap)


def stopped_at(reply: Reply, tokens: int) -> Reply:
    """The answer cut at `tokens` tokens, ending done_reason "length" (the end of a context
    the engine does not shift)."""
    return _capped(reply.pieces, tokens) if reply.tokens > tokens else reply


def _capped(pieces: list[Piece], cap: int | None) -> Reply:
    if cap is None or sum(p.tokens for p in pieces) <= cap:
        return Reply(pieces)
    kept: list[Piece] = []
    spent = 0
    for piece in pieces:
        if spent + piece.tokens > cap:
            break
        kept.append(piece)
        spent += piece.tokens
    return Reply(kept, "length")


def _tool_to_call(body: dict[str, Any]) -> dict[str, Any] | None:
    """The offered tool to call: the one the last user message names, else the first; none
    once a tool's result follows the last user message (then the model answers)."""
    tools: list[dict[str, Any]] = [t["function"] for t in body.get("tools") or []
             if isinstance(t, dict) and isinstance(t.get("function"), dict)
             and isinstance(t["function"].get("name"), str) and t["function"]["name"]]
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    if not tools or not messages:
        return None
    asked = ""
    for message in reversed(messages):
        if message.get("role") == "tool":
            return None
        if message.get("role") == "user":
            asked = str(message.get("content") or "").lower()
            break
    named = [t for t in tools if t["name"].lower().replace("_", " ") in asked
             or t["name"].lower() in asked]
    return (named or tools)[0]


def _tool_call(tool: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """Ollama's wire shape (api/types.go:221-230, ToolCall and ToolCallFunction): an id, the
    call's index, arguments an object."""
    seed = orjson.dumps([tool["name"], len(body.get("messages") or [])])
    ident = "call_" + hashlib.sha256(seed).hexdigest()[:8]
    parameters = tool.get("parameters")
    arguments = instance_of(parameters) if isinstance(parameters, dict) else {}
    return {"id": ident, "function": {"index": 0, "name": tool["name"],
                                      "arguments": arguments if isinstance(arguments, dict)
                                      else {}}}


# -- a value valid for a JSON schema ---------------------------------------------------------
def instance_of(schema: Any) -> Any:
    """A small deterministic value that `schema` accepts: every property filled, one item per
    array (or minItems), numbers 42 moved into range, strings "forty two" or their format's
    example. Never raises on a malformed schema, and stops at a budget of nodes (a `$ref`
    cycle or hostile input must not run away)."""
    return _Instance(schema).of(schema, 0)


class _Instance:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.budget = MAX_SCHEMA_NODES

    def of(self, schema: Any, depth: int) -> Any:
        self.budget -= 1
        if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH or self.budget < 0:
            return TEXT
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self.of(self._resolve(ref), depth + 1)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][0]
        for key in ("anyOf", "oneOf"):
            given = schema.get(key)
            options = [o for o in given if isinstance(o, dict)] if isinstance(given, list) else []
            if options:
                chosen = next((o for o in options if o.get("type") != "null"), options[0])
                return self.of(chosen, depth + 1)
        if isinstance(schema.get("allOf"), list) and schema["allOf"]:
            parts = [self.of(s, depth + 1) for s in schema["allOf"]]
            if all(isinstance(p, dict) for p in parts):
                return {k: v for p in parts for k, v in p.items()}
            return parts[0]
        kind = _type_of(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind in ("integer", "number"):
            return _number(schema, kind == "integer")
        if kind == "boolean":
            return True
        return None if kind == "null" else _string(schema)

    def _resolve(self, ref: str) -> Any:
        """A local `#/...` JSON pointer into the root schema; anything else, nothing."""
        if not ref.startswith("#"):
            return None
        node = self.root
        for part in ref[1:].split("/"):
            if not part:
                continue
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        out = {str(name): self.of(sub, depth + 1) for name, sub in properties.items()}
        required = schema.get("required")
        extra = schema.get("additionalProperties")
        for name in required if isinstance(required, list) else []:
            if isinstance(name, str) and name not in out:
                out[name] = self.of(extra if isinstance(extra, dict) else {}, depth + 1)
        return out

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        items = [self.of(s, depth + 1) for s in prefix] if isinstance(prefix, list) else []
        least, most = _count(schema, "minItems"), _count(schema, "maxItems")
        wanted = min(1 if least is None else least, 64)
        if len(items) < wanted:
            items += [self.of(schema.get("items", {}), depth + 1)] * (wanted - len(items))
        return items if most is None else items[:most]


def _type_of(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if isinstance(kind, str):
        return kind
    if "properties" in schema:
        return "object"
    return "array" if "items" in schema else "string"


def _count(schema: dict[str, Any], key: str) -> int | None:
    value = schema.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def _bound(schema: dict[str, Any], key: str) -> float | None:
    value = schema.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    bound = float(value)
    return bound if math.isfinite(bound) else None


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    value = 42.0
    low, high = _bound(schema, "minimum"), _bound(schema, "maximum")
    above, below = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    step = 1.0 if integer else 0.5
    if low is not None and value < low:
        value = math.ceil(low) if integer else low
    if above is not None and value <= above:
        value = math.floor(above) + 1 if integer else above + step
    if high is not None and value > high:
        value = math.floor(high) if integer else high
    if below is not None and value >= below:
        value = math.ceil(below) - 1 if integer else below - step
    multiple = _bound(schema, "multipleOf")
    if multiple and multiple > 0 and math.isfinite(value / multiple):
        value = math.ceil(value / multiple) * multiple
    return int(value) if integer else float(value)


def _string(schema: dict[str, Any]) -> str:
    wanted = schema.get("format")
    text = STRING_FORMATS.get(wanted, TEXT) if isinstance(wanted, str) else TEXT
    least, most = _count(schema, "minLength"), _count(schema, "maxLength")
    if least is not None and len(text) < least:
        text += "!" * min(least - len(text), 4096)
    return text if most is None else text[:most]
