"""The refusals Ollama's OpenAI and Anthropic layers make from the body alone, before the call
reaches a model (middleware/openai.go:395-465, middleware/anthropic.go:731-761).

The sidecar makes them itself, in Ollama's words, before placing the call: placed, such a call
would wait for a busy GPU (or be refused `gpu-busy`), or have idle models evicted for it, only
to get the same 400 from the provider afterwards.
"""

from __future__ import annotations

import math
from typing import Any

from proxy.core.context import Version

# Go's kind for the typed fields every version of each layer binds (openai/openai.go
# ChatCompletionRequest, CompletionRequest; anthropic/anthropic.go MessagesRequest). Fields
# only newer versions have are left out: an older Ollama ignores them.
CHAT_FIELDS = ("ChatCompletionRequest", {
    "stream": "bool", "max_tokens": "int", "seed": "int", "temperature": "float64",
    "frequency_penalty": "float64", "presence_penalty": "float64", "top_p": "float64"})
COMPLETION_FIELDS = ("CompletionRequest", {
    "stream": "bool", "max_tokens": "int", "seed": "int", "temperature": "float32",
    "frequency_penalty": "float32", "presence_penalty": "float32", "top_p": "float32",
    "suffix": "string"})
MESSAGES_FIELDS = ("MessagesRequest", {
    "max_tokens": "int", "stream": "bool", "temperature": "float64", "top_p": "float64",
    "top_k": "int"})
# EmbeddingsMiddleware checks encoding_format from 0.12.7 (commit e0ead1ade)
ENCODING_FORMAT_SINCE: Version = (0, 12, 7)
ENCODING_FORMATS = ("float", "base64")


def _json_kind(value: Any) -> str:
    """How Go's UnmarshalTypeError names the JSON value it could not store."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return f"number {value!r}"


def _fits(value: Any, kind: str) -> bool:
    if value is None:  # JSON null leaves a Go field as it is
        return True
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "int":
        return number and (isinstance(value, int) or float(value).is_integer())
    return number and math.isfinite(value)


def binding_error(fields: tuple[str, dict[str, str]], body: dict[str, Any]) -> str | None:
    """encoding/json's refusal of the first typed field whose JSON value does not fit."""
    struct, kinds = fields
    for key, value in body.items():
        kind = kinds.get(key)
        if kind is not None and not _fits(value, kind):
            return (f"json: cannot unmarshal {_json_kind(value)} into Go struct field "
                    f"{struct}.{key} of type {kind}")
    return None


def chat_error(body: dict[str, Any]) -> str | None:
    """ChatMiddleware: the binding, then a chat without messages."""
    if wrong := binding_error(CHAT_FIELDS, body):
        return wrong
    messages = body.get("messages")
    if messages is None or messages == []:
        return "[] is too short - 'messages'"
    return None


def completion_error(body: dict[str, Any]) -> str | None:
    return binding_error(COMPLETION_FIELDS, body)


def embeddings_error(body: dict[str, Any], version: Version) -> str | None:
    """EmbeddingsMiddleware: an encoding other than float or base64 (any case), then no
    input or an empty list (`""` is one empty input)."""
    wanted = body.get("encoding_format")
    if version >= ENCODING_FORMAT_SINCE and wanted and isinstance(wanted, str) and \
            wanted.lower() not in ENCODING_FORMATS:
        return (f"Invalid value for 'encoding_format' = {wanted}. "
                "Supported values: ['float', 'base64'].")
    texts = body.get("input")
    if texts is None or texts == []:
        return "invalid input"
    return None


def messages_error(body: dict[str, Any]) -> str | None:
    """AnthropicMessagesMiddleware: the binding, then max_tokens, then messages. A request
    without a model is the sidecar's own (its preferred model), so that check is left out."""
    if wrong := binding_error(MESSAGES_FIELDS, body):
        return wrong
    max_tokens = body.get("max_tokens")
    if max_tokens is None or max_tokens <= 0:
        return "max_tokens is required and must be positive"
    messages = body.get("messages")
    if messages is None or messages == []:
        return "messages is required"
    return None


def layer_error(path: str, body: dict[str, Any], version: Version) -> str | None:
    """The 400 Ollama's layer for `path` answers to `body` before any model, if any."""
    if path == "/v1/chat/completions":
        return chat_error(body)
    if path == "/v1/completions":
        return completion_error(body)
    if path == "/v1/embeddings":
        return embeddings_error(body, version)
    if path == "/v1/messages":
        return messages_error(body)
    return None
