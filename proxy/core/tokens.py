"""Prompt sizing: characters counted from the request, tokens from a learned ratio.

Counted, in every dialect the sidecar places (Ollama's, OpenAI's chat, completions and
Responses, Anthropic's messages): the prompt, suffix, system text and instructions; every
message's or input item's text, also inside content parts and blocks; thinking; tool calls'
names and arguments and tool results; each tool's name, description and parameter schema.
Images count 768 tokens each, as Ollama counts them when it fits a chat into the context.
Tokens are a fixed part per prompt plus characters at a ratio, both fitted to the engine's
own counts (core/token_ratio.py, docs/rules.md); the ratio starts at 3.5. Dense characters,
digits and everything outside ASCII, are counted apart, at a learned number of tokens each
(1 until taught): most tokenizers spend a token on each digit (Qwen,
Gemma, Mistral, Phi; Llama 3 one per three) and about one on each CJK character, so one ratio
for all would size such a prompt at a quarter of what the engine counts after prose had
taught ~4 characters per token.

A conversation the sidecar has sent before is sized from the engine's count (docs/rules.md):
the engine's own count for the previous call plus an estimate of what was appended since. The
engine's count covers what characters miss (a model's own image cost, the chat template, text
its tokenizer splits finely); the estimate never goes below the ratio's, because some Ollama
versions count only the tokens a call did not find in the prompt cache.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.context import NEWEST, Version
from proxy.core.token_ratio import TokenRatio

# Keys of a message, content part, block or input item whose value is prompt text (or
# holds more of it); anything else (ids, roles, types, image data) is not.
# (A Responses reasoning item's `summary` is not: Ollama reads its thinking from
# `encrypted_content` alone, and writes the same text to both in its answers, which an agent
# sends back whole.)
TEXT_KEYS = frozenset((
    "content", "text", "thinking", "output", "refusal", "name", "tool_calls", "function",
    "encrypted_content",  # Ollama keeps a Responses reasoning item's thinking here
    "reasoning",  # an OpenAI chat message's thinking (openai.Message.Reasoning)
))
# Keys whose object value is data the model reads as JSON (tool arguments).
DATA_KEYS = frozenset(("input", "arguments"))
BODY_KEYS = ("prompt", "suffix", "system", "instructions", "input", "messages")
# The list a conversation grows by (chat, Anthropic's messages; a Responses `input`), and the
# rest of the prompt that two calls of one conversation share.
CONVERSATION_KEYS = ("messages", "input")
SHARED_KEYS = ("system", "instructions", "tools")


# Images: Ollama's `images` lists, OpenAI's and Anthropic's image parts and blocks. Ollama
# counts each as 768 tokens when it fits a chat into the context.
IMAGE_KEY = "images"
IMAGE_TYPES = frozenset(("image_url", "input_image", "image"))
IMAGE_TOKENS = 768


class _Prompt:
    """What a request puts in the prompt: its texts, and how many images."""

    __slots__ = ("images", "texts")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.images = 0

    def size(self, pieces: int = 0) -> PromptSize:
        return PromptSize(sum(map(len, self.texts)), sum(map(dense_chars, self.texts)),
                          self.images, pieces)


@dataclass(frozen=True, slots=True)
class PromptSize:
    chars: int = 0
    dense: int = 0  # of `chars`, digits and characters outside ASCII
    images: int = 0
    pieces: int = 0  # messages or input items, and a system text, prompt or instructions

    @property
    def image_tokens(self) -> int:
        return self.images * IMAGE_TOKENS


def _texts(value: Any, out: _Prompt) -> None:
    """Collect the prompt text (and images) in a string, a list of parts, or one part or
    message."""
    if value is None:
        return
    if isinstance(value, str):
        out.texts.append(value)
    elif isinstance(value, list):
        for item in value:
            _texts(item, out)
    elif isinstance(value, dict):
        kind = value.get("type")
        # (a Responses image given by file_id alone Ollama skips: it has no image_url)
        if isinstance(kind, str) and kind in IMAGE_TYPES and \
                (kind != "input_image" or value.get("image_url")):
            out.images += 1
        for key, item in value.items():
            if key in TEXT_KEYS:
                _texts(item, out)
            elif key in DATA_KEYS and isinstance(item, dict):
                _json_text(item, out)
            elif key in DATA_KEYS:
                _texts(item, out)
            elif key == IMAGE_KEY and isinstance(item, list):
                out.images += len(item)
    else:
        _json_text(value, out)


def _json_text(value: Any, out: _Prompt) -> None:
    out.texts.append(orjson.dumps(value).decode())


def _tool_spec_texts(tool: Any, out: _Prompt, namespace: str = "") -> None:
    """A tool's name, description and parameter schema. A Responses `namespace` tool is
    its member functions, each named `namespace.name` (openai/responses.go convertTools,
    from Ollama 0.32.7; an older one offers the namespace alone, so this counts more)."""
    if not isinstance(tool, dict):
        return
    members = tool.get("tools")
    if tool.get("type") == "namespace" and isinstance(members, list):
        name = tool.get("name")
        for member in members:
            _tool_spec_texts(member, out, f"{namespace}{name}." if isinstance(name, str)
                             and name else namespace)
        return
    if namespace:
        out.texts.append(namespace)
    nested = tool.get("function")
    function: dict[str, Any] = nested if isinstance(nested, dict) else tool
    _texts(function.get("name"), out)
    _texts(function.get("description"), out)
    schema = function.get("parameters", function.get("input_schema"))
    if schema is not None:
        _json_text(schema, out)


DIGITS = "0123456789"


def dense_chars(text: str) -> int:
    """Digits and characters outside ASCII: tokenizers seldom merge them as they merge
    letters."""
    digits = sum(map(text.count, DIGITS))
    return digits if text.isascii() else \
        digits + len(text) - len(text.encode("ascii", "ignore"))


# The Responses layer joins a function call to the assistant message before it from 0.13.4
# (commit 9b2035d19), and an assistant message to the call it answers from 0.32.10 (commit
# b6b1b258c): a message's thinking then replaces the one it had.
CALLS_JOIN_SINCE: Version = (0, 13, 4)
REPLIES_JOIN_SINCE: Version = (0, 32, 10)


def as_ollama_reads(body: dict[str, Any], version: Version = NEWEST) -> dict[str, Any]:
    """The body as Ollama's layers put it in the prompt, where that differs from its text:
    a message keeps one thinking text, its last thinking block's (anthropic/anthropic.go
    convertMessage), and a web search's result blocks are their titles and URLs (from
    0.16.2; before, they and the server's tool calls are left out); a Responses reasoning
    item gives its text to the next assistant message or function call unless another
    reasoning item comes first (openai/responses.go FromResponsesRequest)."""
    messages = body.get("messages")
    if isinstance(messages, list) and any(_thinking_blocks(m) > 1 or _searched(m)
                                          for m in messages):
        body = {**body, "messages": [_web_search_as_read(_last_thinking_only(m), version)
                                     for m in messages]}
    given = body.get("input")
    if isinstance(given, list) and sum(_kind(item) == "reasoning" for item in given) > 1:
        kept = _kept_reasoning(given, version, bool(body.get("instructions")))
        body = {**body, "input": [
            {**item, "encrypted_content": None} if _kind(item) == "reasoning" and
            index not in kept else item for index, item in enumerate(given)]}
    return body


def _kind(item: Any) -> str:
    """A Responses input item's type (a message may give only its role)."""
    if not isinstance(item, dict):
        return ""
    kind = item.get("type")
    return kind if isinstance(kind, str) and kind else "message" if item.get("role") else ""


def _thinking_blocks(message: Any) -> int:
    blocks = message.get("content") if isinstance(message, dict) else None
    return sum(isinstance(block, dict) and block.get("type") == "thinking" and
               block.get("thinking") is not None
               for block in blocks) if isinstance(blocks, list) else 0


# anthropic.go convertMessage reads server_tool_use and web_search_tool_result blocks from
# 0.16.2 (commit 5f5ef2013)
WEB_SEARCH_BLOCKS_SINCE: Version = (0, 16, 2)
SEARCH_BLOCKS = ("server_tool_use", "web_search_tool_result")


def _searched(message: Any) -> bool:
    blocks = message.get("content") if isinstance(message, dict) else None
    return isinstance(blocks, list) and any(
        isinstance(block, dict) and block.get("type") in SEARCH_BLOCKS for block in blocks)


def _web_search_as_read(message: Any, version: Version) -> Any:
    """An Anthropic message's web search blocks as Ollama reads them: a result is the text
    formatWebSearchToolResultContent makes of it (its titles and URLs, no page content);
    before 0.16.2 neither block is read."""
    if not _searched(message):
        return message
    read = version >= WEB_SEARCH_BLOCKS_SINCE
    blocks = [{"type": "text", "text": _search_result_text(block.get("content"))}
              if read and block.get("type") == "web_search_tool_result" else block
              for block in message["content"] if read or not isinstance(block, dict) or
              block.get("type") not in SEARCH_BLOCKS]
    return {**message, "content": blocks}


def _search_result_text(content: Any) -> str:
    """formatWebSearchToolResultContent: a line `- title: url` per result, an error's code,
    any other value as JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict) and content.get("type") == "web_search_tool_result_error":
        return _search_error(content)
    if not isinstance(content, list):
        return orjson.dumps(content).decode() if not isinstance(content, dict) else \
            orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()
    lines = []
    for item in content:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "web_search_tool_result_error":
            return _search_error(item)
        if kind == "web_search_result":
            title, url = item.get("title"), item.get("url")
            lines.append(f"- {title if isinstance(title, str) else ''}: "
                         f"{url if isinstance(url, str) else ''}\n")
    return "".join(lines)


def _search_error(error: dict[str, Any]) -> str:
    code = error.get("error_code")
    return f"web_search_tool_result_error: {code}" if isinstance(code, str) and code else \
        "web_search_tool_result_error"


def _last_thinking_only(message: Any) -> Any:
    """An Anthropic message whose thinking blocks but the last (with text) say nothing."""
    if _thinking_blocks(message) < 2:
        return message
    blocks = message["content"]
    last = max(i for i, block in enumerate(blocks) if isinstance(block, dict) and
               block.get("type") == "thinking" and block.get("thinking") is not None)
    return {**message, "content": [
        {**block, "thinking": None} if i != last and isinstance(block, dict) and
        block.get("type") == "thinking" else block for i, block in enumerate(blocks)]}


def _kept_reasoning(items: list[Any], version: Version, instructed: bool) -> set[int]:
    """The reasoning items whose text reaches a message, FromResponsesRequest's walk
    replayed: each message as [role, the reasoning item its thinking is from, its calls]."""
    messages: list[tuple[str, list[int | None], set[Any]]] = \
        [("system", [None], set())] if instructed else []
    pending: int | None = None
    for index, item in enumerate(items):
        kind = _kind(item)
        if kind == "reasoning":
            pending = index if item.get("encrypted_content") else None
        elif kind == "message":
            role, thinking = item.get("role"), None
            if role == "assistant" and pending is not None:
                thinking, pending = pending, None
            answered = items[index + 1].get("call_id") if index + 1 < len(items) and \
                _kind(items[index + 1]) == "function_call_output" else None
            last = messages[-1] if messages else None
            if version >= REPLIES_JOIN_SINCE and role == "assistant" and answered and \
                    last is not None and last[0] == "assistant" and answered in last[2]:
                if thinking is not None:
                    last[1][0] = thinking
                continue
            messages.append((str(role), [thinking], set()))
        elif kind == "function_call":
            last = messages[-1] if messages else None
            if version >= CALLS_JOIN_SINCE and last is not None and last[0] == "assistant":
                last[2].add(item.get("call_id"))
                if pending is not None:
                    last[1][0] = pending
            else:
                messages.append(("assistant", [pending], {item.get("call_id")}))
            pending = None
        elif kind == "function_call_output":
            messages.append(("tool", [None], set()))
    kept = {thinking[0] for _, thinking, _ in messages}
    return {index for index in (*kept, pending) if index is not None}


def prompt_size(body: dict[str, Any], version: Version = NEWEST) -> PromptSize:
    """Everything in a generation request that ends up in the prompt, for the providers'
    Ollama `version`."""
    body = as_ollama_reads(body, version)
    prompt = _Prompt()
    for key in BODY_KEYS:
        _texts(body.get(key), prompt)
    images = body.get(IMAGE_KEY)  # /api/generate's
    if isinstance(images, list):
        prompt.images += len(images)
    tools = body.get("tools")
    for tool in offered_tools(body, version) if isinstance(tools, list) else ():
        _tool_spec_texts(tool, prompt)  # (tools that are no list Ollama ignores)
    return prompt.size(_pieces(body))


# From 0.32.10 the Responses layer offers the model its own function for a `web_search`
# tool, and drops a declared function of that name (openai/responses.go
# WebSearchFunctionTool, FromResponsesRequest; commit b6b1b258c)
WEB_SEARCH_SINCE: Version = (0, 32, 10)
WEB_SEARCH_FUNCTION = {"type": "function", "function": {
    "name": "web_search", "description": "Search the web for current information.",
    "parameters": {"type": "object", "required": ["query"], "properties": {
        "query": {"type": "string", "description": "The search query."}}}}}


def offered_tools(body: dict[str, Any], version: Version) -> list[Any]:
    """The tools the model is offered: a Responses body's `web_search` as Ollama's
    function for it, from 0.32.10."""
    tools: list[Any] = body["tools"]
    searches = version >= WEB_SEARCH_SINCE and isinstance(body.get("input"), str | list) and \
        any(isinstance(tool, dict) and tool.get("type") == "web_search" for tool in tools)
    if not searches:
        return tools
    return [WEB_SEARCH_FUNCTION if tool.get("type") == "web_search" else tool
            for tool in tools if isinstance(tool, dict) and
            (tool.get("type") in ("web_search", "namespace") or tool.get("name") != "web_search")]


def _pieces(body: dict[str, Any]) -> int:
    pieces = 0
    for key in BODY_KEYS:
        value = body.get(key)
        if isinstance(value, list):
            pieces += len(value)
        elif value:
            pieces += 1
    return pieces


def longest_input_size(body: dict[str, Any]) -> PromptSize:
    """An embedding request's inputs are embedded one by one: the longest must fit."""
    inputs = body.get("input", body.get("prompt"))
    sizes = []
    for item in inputs if isinstance(inputs, list) else [inputs]:
        prompt = _Prompt()
        _texts(item, prompt)
        sizes.append(prompt.size())
    return max(sizes, key=lambda size: size.chars, default=PromptSize())


def conversation_items(body: dict[str, Any]) -> list[Any] | None:
    """The request's messages (or the Responses API's input items), when it has any."""
    return next((v for k in CONVERSATION_KEYS if isinstance(v := body.get(k), list) and v),
                None)


def conversation_digests(body: dict[str, Any]) -> tuple[int, ...]:
    """One digest per prefix of the request's conversation, each also covering the rest of
    the prompt (system text, instructions, tools): two calls share a digest exactly when they
    share that prefix and that rest. Empty for a request that is not a conversation."""
    items = conversation_items(body)
    if items is None:
        return ()
    digest = _stable_digest(orjson.dumps([body.get(key) or None for key in SHARED_KEYS],
                                         option=orjson.OPT_SORT_KEYS))
    digests = []
    for item in items:
        digest = _stable_digest(digest.to_bytes(8, "big", signed=True) + _canonical(item))
        digests.append(digest)
    return tuple(digests)


def answers_tool_result(body: dict[str, Any]) -> bool:
    """Whether the call offers tools and its conversation ends with a tool's result (Ollama's
    and OpenAI's `tool` message, Anthropic's `tool_result` block, the Responses API's
    `function_call_output` item): an agent's loop, whose answer without a tool call is its
    last. A chat turn (the user spoke last) is not: the user may go on."""
    if not body.get("tools"):
        return False
    items = conversation_items(body)
    last = items[-1] if items else None
    if not isinstance(last, dict):
        return False
    if last.get("role") == "tool" or last.get("type") == "function_call_output":
        return True
    content = last.get("content")
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content)


def _canonical(item: Any) -> bytes:
    """An item as its content: keys sorted, empty fields dropped (clients differ in sending
    `"images": null` or nothing, and a field's order says nothing of the prompt)."""
    if isinstance(item, dict):
        item = {k: v for k, v in item.items() if v is not None and v != "" and v != [] and
                v != {}}
    return orjson.dumps(item, option=orjson.OPT_SORT_KEYS)


def _stable_digest(data: bytes) -> int:
    """The same in every process (Python's hash of bytes is not), so sidecars can share
    which copy holds a conversation (core/conversations.py)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


@dataclass(frozen=True, slots=True)
class Anchor:
    """A prompt the engine has counted: its size as the sidecar counts it, and its tokens
    (text and template) as the engine reported them."""

    size: PromptSize
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


def estimate_tokens(size: PromptSize, ratio: TokenRatio, anchor: Anchor | None,
                    templated: bool = True) -> int:
    """Tokens of a prompt's text and template (`templated`: an embedding input has none): the
    ratio's estimate, raised to the engine's count of its known prefix plus the ratio's
    estimate of the rest when that is more."""
    by_ratio = ratio.prompt_tokens(size.chars, size.dense) if templated else \
        ratio.tokens(size.chars, size.dense)
    if anchor is None or size.chars < anchor.size.chars:
        return by_ratio
    known = anchor.size
    added = size.chars - known.chars
    rest = ratio.tokens(added, max(0, min(size.dense - known.dense, added)),
                        max(0, size.pieces - known.pieces))
    return max(by_ratio, anchor.tokens + rest)
