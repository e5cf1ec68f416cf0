"""A loopback server restarted on its port waits a moment for the port to be free."""

from __future__ import annotations

import socket
import threading

import httpx

from loadtest.serving import ThreadedServer


async def app(scope: dict, receive: object, send: object) -> None:  # a bare ASGI app
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


def test_a_restart_binds_its_port_once_whatever_held_it_lets_go() -> None:
    """Another socket on the port when the server starts again (a connection of the stopped
    server still closing, a client's outgoing connection that took the freed port): the
    start waits for it rather than failing."""
    server = ThreadedServer(app).start()
    server.stop()
    holder = socket.socket()
    holder.bind(("127.0.0.1", server.port))
    holder.listen()
    threading.Timer(0.3, holder.close).start()
    server.start()
    try:
        assert httpx.get(server.url).text == "ok"
    finally:
        server.stop()
