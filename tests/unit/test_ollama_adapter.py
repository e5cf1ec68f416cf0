"""The Ollama adapter's real transport against raw loopback sockets: what each failure says."""

from __future__ import annotations

import asyncio
import socket

import pytest

from proxy.adapters.ollama import OllamaClient
from proxy.ports import Timeouts, UpstreamError
from tests.unit.raw_server import answering, read_request, serve


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_refused_connection_is_named_as_such_not_as_a_timeout() -> None:
    client = OllamaClient(f"http://127.0.0.1:{_closed_port()}", Timeouts(1, 1, 1))
    with pytest.raises(UpstreamError) as caught:
        await client.open("/api/chat", b"{}")
    await client.close()
    assert caught.value.before_first_byte
    assert "timed out" not in str(caught.value)
    assert "Connect" in str(caught.value)


async def test_no_answer_within_the_longest_call_limit_is_a_timeout() -> None:
    """The relay bounds each call (tests/unit/test_relay.py); the transport's own read limit
    is the outer one, the longer of the first-byte and the complete-answer limits."""
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async for url in serve(stall):
        client = OllamaClient(url, Timeouts(connect_s=1, first_byte_s=0.1, chunk_s=1,
                                            answer_s=0.2))
        with pytest.raises(UpstreamError, match="timed out"):
            await client.open("/api/chat", b"{}")
        await client.close()


async def test_a_body_cut_short_fails_after_the_first_byte() -> None:
    cut = answering(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"
                     b"transfer-encoding: chunked\r\n\r\n6\r\n{\"a\":1\r\n")
    async for url in serve(cut):
        client = OllamaClient(url, Timeouts(1, 1, 1))
        response = await client.open("/api/chat", b"{}")
        assert response.status_code == 200
        assert response.content_type == "application/x-ndjson"
        received = b""
        with pytest.raises(UpstreamError) as caught:
            async for chunk in response.chunks():
                received += chunk
        await response.aclose()
        await client.close()
        assert received == b'{"a":1'
        assert not caught.value.before_first_byte


async def test_a_hang_up_before_answering_is_tried_once_more() -> None:
    connections = 0
    ok = answering(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")

    async def closes_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        if connections == 1:  # as a server closing an idle kept-alive connection does
            await read_request(reader)
            writer.close()
            return
        await ok(reader, writer)

    async for url in serve(closes_first):
        client = OllamaClient(url, Timeouts(1, 1, 1))
        response = await client.open("/api/chat", b"{}")
        assert response.status_code == 200 and await response.read() == b"{}"
        await client.close()
    assert connections == 2

    async def always_hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                              ) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.close()

    connections = 0
    async for url in serve(always_hangs_up):
        client = OllamaClient(url, Timeouts(1, 1, 1))
        with pytest.raises(UpstreamError) as caught:
            await client.open("/api/chat", b"{}")
        await client.close()
    assert connections == 2 and "disconnected" in str(caught.value).lower()


async def test_calls_ask_for_an_uncompressed_answer() -> None:
    heads: list[bytes] = []
    answer = answering(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: 2\r\n\r\n{}", heads)
    async for url in serve(answer):
        client = OllamaClient(url, Timeouts(1, 1, 1))
        response = await client.open("/api/chat", b"{}")
        assert await response.read() == b"{}"
        await client.close()
    assert b"accept-encoding: identity" in heads[0]


async def test_an_answer_cut_off_mid_body_is_named_without_library_internals() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"
                     b"content-length: 100\r\n\r\n{\"done\":false}\n")
        await writer.drain()
        writer.close()

    async for url in serve(cut):
        client = OllamaClient(url, Timeouts(1, 1, 1))
        answer = await client.open("/api/chat", b"{}")
        with pytest.raises(UpstreamError) as caught:
            async for _ in answer.chunks():
                pass
        await client.close()
    assert str(caught.value) == "the connection closed before the answer was complete"
