"""Prompt sizing: characters counted from the request, tokens from a learned ratio.

Counted, in every dialect the sidecar places (Ollama's, OpenAI's chat, completions and
Responses, Anthropic's messages): the prompt, suffix, system text and instructions; every
message's or input item's text, also inside content parts and blocks; thinking; tool calls'
names and arguments and tool results; each tool's name, description and parameter schema.
Images are not counted. The chars-per-token ratio starts at 3.5 and follows the engine's own
counts (SPEC-ADDENDUM §3).

A conversation the sidecar has sent before is sized as the design doc's tool loop sizes it:
the engine's own count for the previous call plus an estimate of what was appended since. The
engine's count covers what characters miss (dense text such as code, JSON or CJK, images,
the chat template); the estimate never goes below the ratio's, because some Ollama versions
count only the tokens a call did not find in the prompt cache.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

DEFAULT_CHARS_PER_TOKEN = 3.5
RATIO_ALPHA = 0.3
RATIO_MIN, RATIO_MAX = 1.0, 8.0
# Keys of a message, content part, block or input item whose value is prompt text (or
# holds more of it); anything else (ids, roles, types, image data) is not.
TEXT_KEYS = frozenset((
    "content", "text", "thinking", "output", "summary", "refusal", "name", "tool_calls",
    "function",
    "encrypted_content",  # Ollama keeps a Responses reasoning item's thinking here
))
# Keys whose object value is data the model reads as JSON (tool arguments).
DATA_KEYS = frozenset(("input", "arguments"))
BODY_KEYS = ("prompt", "suffix", "system", "instructions", "input", "messages")
# The list a conversation grows by (chat, Anthropic's messages; a Responses `input`), and the
# rest of the prompt that two calls of one conversation share.
CONVERSATION_KEYS = ("messages", "input")
SHARED_KEYS = ("system", "instructions", "tools")


def _json_len(value: Any) -> int:
    return len(orjson.dumps(value).decode())


def _text_len(value: Any) -> int:
    """Characters of prompt text in a string, a list of parts, or one part or message."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_len(v) for v in value)
    if isinstance(value, dict):
        total = 0
        for key, item in value.items():
            if key in TEXT_KEYS:
                total += _text_len(item)
            elif key in DATA_KEYS:
                total += _json_len(item) if isinstance(item, dict) else _text_len(item)
        return total
    return _json_len(value)


def _tool_spec_len(tool: Any) -> int:
    if not isinstance(tool, dict):
        return 0
    nested = tool.get("function")
    function: dict[str, Any] = nested if isinstance(nested, dict) else tool
    schema = function.get("parameters", function.get("input_schema"))
    return (_text_len(function.get("name")) + _text_len(function.get("description"))
            + (_json_len(schema) if schema is not None else 0))


def prompt_chars(body: dict[str, Any]) -> int:
    """Characters of everything in a generation request that ends up in the prompt."""
    total = sum(_text_len(body.get(key)) for key in BODY_KEYS)
    return total + sum(_tool_spec_len(tool) for tool in body.get("tools") or [])


def longest_input_chars(body: dict[str, Any]) -> int:
    """An embedding request's inputs are embedded one by one: the longest must fit."""
    inputs = body.get("input", body.get("prompt"))
    if isinstance(inputs, list):
        return max((_text_len(i) for i in inputs), default=0)
    return _text_len(inputs)


def tokens_from_chars(chars: int, chars_per_token: float) -> int:
    return math.ceil(chars / chars_per_token) if chars > 0 else 0


@dataclass(frozen=True)
class TokenRatio:
    """The learned chars-per-token ratio; `observe` returns the next state."""

    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN
    samples: int = 0

    def observe(self, chars: int, prompt_eval_count: int | None) -> TokenRatio:
        if not prompt_eval_count or prompt_eval_count <= 0 or chars <= 0:
            return self
        sample = chars / prompt_eval_count
        if not RATIO_MIN <= sample <= RATIO_MAX:
            return self  # a truncated prompt or a template-heavy one; not a ratio to learn
        if self.samples == 0:
            return TokenRatio(sample, 1)
        blended = RATIO_ALPHA * sample + (1 - RATIO_ALPHA) * self.chars_per_token
        return TokenRatio(blended, self.samples + 1)

    def tokens(self, chars: int) -> int:
        return tokens_from_chars(chars, self.chars_per_token)


def conversation_digests(body: dict[str, Any]) -> tuple[int, ...]:
    """One digest per prefix of the request's conversation, each also covering the rest of
    the prompt (system text, instructions, tools): two calls share a digest exactly when they
    share that prefix and that rest. Empty for a request that is not a conversation."""
    items = next((v for k in CONVERSATION_KEYS
                  if isinstance(v := body.get(k), list) and v), None)
    if items is None:
        return ()
    digest = hash(orjson.dumps([body.get(key) for key in SHARED_KEYS]))
    digests = []
    for item in items:
        digest = hash((digest, orjson.dumps(item)))
        digests.append(digest)
    return tuple(digests)


@dataclass(frozen=True, slots=True)
class Anchor:
    """A prompt the engine has counted: its characters as the sidecar counts them, and its
    tokens as the engine reported them."""

    chars: int
    tokens: int


class ConversationMemory:
    """The engine's counts of the prompts this sidecar sent, by conversation digest; the
    least recently used are forgotten beyond `size`."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._anchors: OrderedDict[int, Anchor] = OrderedDict()

    def record(self, digests: Sequence[int], anchor: Anchor) -> None:
        if not digests or anchor.tokens <= 0:
            return
        self._anchors[digests[-1]] = anchor
        self._anchors.move_to_end(digests[-1])
        if len(self._anchors) > self.size:
            self._anchors.popitem(last=False)

    def longest_known(self, digests: Sequence[int]) -> Anchor | None:
        """The count of the longest prefix of this conversation the engine has counted."""
        for digest in reversed(digests):
            anchor = self._anchors.get(digest)
            if anchor is not None:
                self._anchors.move_to_end(digest)
                return anchor
        return None


def estimate_tokens(chars: int, ratio: TokenRatio, anchor: Anchor | None) -> int:
    """Tokens of a prompt of `chars` characters: the ratio's estimate, raised to the engine's
    count of its known prefix plus the ratio's estimate of the rest when that is more."""
    by_ratio = ratio.tokens(chars)
    if anchor is None or chars < anchor.chars:
        return by_ratio
    return max(by_ratio, anchor.tokens + ratio.tokens(chars - anchor.chars))
