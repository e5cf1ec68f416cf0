"""The fleet soak reads each dialect's failures the way the `ollama` client reports them: an
error event that ends a stream already answered 200 is -1 (tolerated through an outage),
whichever client met it."""

from __future__ import annotations

import json

import anthropic
import pytest

from loadtest.fleet_soak import Failed, anthropic_turn
from tests.unit.raw_server import answering, serve


def _event(name: str, data: dict[str, object]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


# What the sidecar streams when a GPU fails mid-answer over /v1/messages: 200, a start,
# then Anthropic's error event.
FAILED_MID_STREAM = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    + _event("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "qwen3:8b",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 0}}})
    + _event("error", {"type": "error", "error": {
        "type": "api_error", "message": "provider gpu-a failed mid-stream"}}))


async def test_an_anthropic_stream_ended_by_an_error_event_is_minus_one() -> None:
    async for url in serve(answering(FAILED_MID_STREAM)):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="-", max_retries=0)
        with pytest.raises(Failed) as failed:
            await anthropic_turn(client, "qwen3:8b", "hi", True, False, 8, {})
        await client.close()
        assert failed.value.status == -1
