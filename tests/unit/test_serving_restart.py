"""A loopback server restarted on its port waits a moment for the port to be free."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

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


def test_a_stop_with_no_call_in_flight_is_over_at_once() -> None:
    """uvicorn's own shutdown sleeps 0.1 s however idle the server: a test suite that stops
    hundreds of servers paid it on every one. The best of three stops beats that floor."""
    server = ThreadedServer(app).start()
    took = []
    try:
        for _ in range(3):
            assert httpx.get(server.url).text == "ok"  # a keep-alive connection to close
            began = time.perf_counter()
            server.stop()
            took.append(time.perf_counter() - began)
            server.start()
    finally:
        server.stop()
    assert min(took) < 0.1, took


entered = threading.Event()


async def slow_app(scope: dict, receive: object, send: object) -> None:
    if scope["type"] != "http":
        return
    entered.set()
    await asyncio.sleep(0.3)
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"late"})  # type: ignore[operator]


def test_a_stop_lets_a_call_in_flight_finish_its_answer() -> None:
    """The quick stop leaves a call still being answered to uvicorn's graceful shutdown."""
    server = ThreadedServer(slow_app).start()
    answers: list[str] = []
    caller = threading.Thread(target=lambda: answers.append(httpx.get(server.url).text))
    caller.start()
    assert entered.wait(timeout=5)
    server.stop()
    caller.join(timeout=5)
    assert answers == ["late"]
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url)
