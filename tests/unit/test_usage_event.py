"""The usage event the sidecar asks Ollama for on a streamed OpenAI chat its agent did not ask
for, and drops from what the agent sees (proxy/api/relay.py, UsageEventFilter)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.api.relay import UsageEventFilter, usage_added

CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,' \
        b'"delta":{"content":"\\"choices\\":[] hi"}}]}\n\n'
FINISH = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,' \
         b'"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = b'data: {"id":"c","object":"chat.completion.chunk","choices":[],' \
        b'"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(("path", "body", "added"), [
    ("/v1/chat/completions", {"stream": True}, True),
    ("/v1/chat/completions", {"stream": True, "stream_options": {}}, True),
    ("/v1/chat/completions", {"stream": True, "stream_options": {"include_usage": False}}, True),
    ("/v1/chat/completions", {"stream": True, "stream_options": {"include_usage": True}}, False),
    # null is Go's false: no usage event for the agent, so the sidecar asks for it
    ("/v1/chat/completions", {"stream": True, "stream_options": {"include_usage": None}}, True),
    ("/v1/chat/completions", {"stream": True, "stream_options": None}, True),
    ("/v1/chat/completions", {"stream": True, "stream_options": "yes"}, False),  # Ollama's 400
    ("/v1/chat/completions", {}, False),  # not streamed: the answer has its usage
    # Go binds the key without case, the last naming the field winning (openai/openai.go)
    ("/v1/chat/completions", {"stream": True, "stream_options": {"Include_Usage": True}}, False),
    ("/v1/chat/completions", {"stream": True, "stream_options": {"INCLUDE_USAGE": True}}, False),
    ("/v1/chat/completions", {"stream": True,
                              "stream_options": {"include_usage": True, "Include_Usage": False}},
     True),
    ("/v1/completions", {"stream": True}, False),  # a usage in every chunk there
    ("/api/chat", {"stream": True}, False),
])
def test_the_usage_event_is_asked_for_only_where_the_agent_would_not_see_it(
        path: str, body: dict[str, Any], added: bool) -> None:
    assert usage_added(path, body) is added


@given(st.lists(st.integers(min_value=0, max_value=len(CHUNK * 3 + FINISH + USAGE + DONE)),
                max_size=12))
def test_the_usage_event_is_dropped_wherever_the_chunks_split_the_stream(
        cuts: list[int]) -> None:
    stream = CHUNK * 3 + FINISH + USAGE + DONE
    bounds = sorted({0, *cuts, len(stream)})
    usage = UsageEventFilter()
    out = b"".join(usage.feed(stream[a:b]) for a, b in itertools.pairwise(bounds))
    assert out + usage.flush() == CHUNK * 3 + FINISH + DONE


def test_a_stream_without_the_event_passes_at_once_and_unchanged() -> None:
    usage = UsageEventFilter()
    assert usage.feed(CHUNK) == CHUNK  # a whole event: not held back
    assert usage.feed(CHUNK[:10]) == b"" and usage.feed(CHUNK[10:]) == CHUNK
    assert usage.feed(b"data: {\"x\": 1}") == b"" and usage.flush() == b"data: {\"x\": 1}"
    assert orjson.loads(USAGE[6:])["choices"] == []  # the mark is Ollama's compact JSON


def test_an_event_too_long_to_be_the_usage_event_is_not_held_back() -> None:
    usage = UsageEventFilter()
    long = b'data: {"id":"c","choices":[{"delta":{"content":"' + b"x" * 70_000
    assert usage.feed(long) == long and usage.pending == b""
    assert usage.feed(b'"}}]}\n\n' + USAGE + DONE) == b'"}}]}\n\n' + DONE
