"""Raw HTTP servers on loopback sockets, for adapter and relay tests that need a real
transport (bytes exactly as written, hang-ups, slow answers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def serve(handler: Handler) -> AsyncIterator[str]:
    """`async for url in serve(handler)`: the server's URL while the body runs."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    await reader.readexactly(length)
    return head


def answering(raw: bytes, heads: list[bytes] | None = None) -> Handler:
    """A server that reads one request (keeping its head), writes `raw` and hangs up."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_request(reader)
        if heads is not None:
            heads.append(head.lower())
        writer.write(raw)
        await writer.drain()
        writer.close()

    return answer


