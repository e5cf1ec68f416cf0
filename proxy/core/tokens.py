"""Prompt sizing: characters counted from the request, tokens from a learned ratio.

Counted: the prompt, suffix and system text, every message's text, tool-call names and
arguments, tool results (tool-role messages are messages), and each tool's name,
description and parameter schema. The
chars-per-token ratio starts at 3.5 and follows the engine's own counts (SPEC-ADDENDUM §3).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

DEFAULT_CHARS_PER_TOKEN = 3.5
RATIO_ALPHA = 0.3
RATIO_MIN, RATIO_MAX = 1.0, 8.0


def _text_len(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):  # OpenAI content parts
        return sum(_text_len(p.get("text") if isinstance(p, dict) else p) for p in value)
    return len(json.dumps(value, separators=(",", ":")))


def _tool_call_len(call: Any) -> int:
    if not isinstance(call, dict):
        return 0
    function = call.get("function") or {}
    if not isinstance(function, dict):
        return 0
    return _text_len(function.get("name")) + _text_len(function.get("arguments"))


def _tool_spec_len(tool: Any) -> int:
    if not isinstance(tool, dict):
        return 0
    nested = tool.get("function")
    function: dict[str, Any] = nested if isinstance(nested, dict) else tool
    return (_text_len(function.get("name")) + _text_len(function.get("description"))
            + _text_len(function.get("parameters")))


def prompt_chars(body: dict[str, Any]) -> int:
    """Characters of everything in an Ollama or OpenAI request that ends up in the prompt.

    Embedding inputs are embedded one by one, so the longest one is what must fit.
    """
    inputs = body.get("input")
    if isinstance(inputs, list):
        return max((_text_len(i) for i in inputs), default=0)
    total = (_text_len(body.get("prompt")) + _text_len(body.get("suffix"))
             + _text_len(body.get("system")) + _text_len(inputs))
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        total += _text_len(message.get("content"))
        for call in message.get("tool_calls") or []:
            total += _tool_call_len(call)
    for tool in body.get("tools") or []:
        total += _tool_spec_len(tool)
    return total


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
