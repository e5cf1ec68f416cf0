"""The simulator's Anthropic layer, as Ollama's anthropic/anthropic.go counts a request."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from starlette.responses import Response

from loadtest.sim_dialects import (
    CHAT,
    CLIENT_GONE,
    MESSAGES,
    RESPONSES,
    answer,
    error,
    estimate_input_tokens,
)


def test_tool_blocks_count_as_go_marshals_them() -> None:
    # countContentBlock marshals a tool_use or tool_result block whole: compact, empty
    # fields left out, `&` and `<` as 6-byte \u escapes (60 + 5 and 57 + 5 bytes)
    body = {"messages": [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"q": "a&b"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "x<y"}]}]}
    assert estimate_input_tokens(body) == (9 + 65 + 4 + 62) // 4


def test_an_empty_request_counts_one_token_only_with_a_message_or_a_system() -> None:
    assert estimate_input_tokens({"messages": [{"role": "", "content": ""}]}) == 1
    assert estimate_input_tokens({"system": ""}) == 1
    assert estimate_input_tokens({"messages": []}) == 0


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (429, "rate_limit_error"), (500, "api_error"),
    (503, "overloaded_error"), (529, "overloaded_error")])
def test_an_anthropic_error_is_typed_by_its_status_as_new_error_does(status: int, kind: str
                                                                     ) -> None:
    body = orjson.loads(bytes(error(MESSAGES, "no", status).body))
    assert (body["type"], body["error"], body["request_id"][:4]) == (
        "error", {"type": kind, "message": "no"}, "req_")


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES])
def test_a_caller_gone_before_its_answer_is_no_error_of_the_simulator(path: str) -> None:
    # the native handler's 499 has no body: reading it as an error raised in the ASGI app
    gone = Response(status_code=CLIENT_GONE)
    assert asyncio.run(answer(path, gone, {"model": "m", "stream": True})) is gone
