"""The HTTP protocol the sidecar's listeners run: uvicorn's (httptools), with limits on how
long a request's head may take and how large it may be (as Go's net/http has). uvicorn
closes a connection idle between requests (its keep-alive timeout) but waits forever for the
head of one: a client that connects and sends nothing, or half a request line, would hold a
connection (and a file descriptor) for good."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from proxy.api.status import EVENTS_PATH

HEAD_TIMEOUT_S = 10.0  # from connecting (or a request's first byte) to its last header
# Go's net/http (Ollama's server) reads at most http.DefaultMaxHeaderBytes of a request's
# head, plus 4096 bytes of slack (server.go initialReadLimitSize), and answers anything longer
# with this, as plain text, then closes: a client sending an endless head would otherwise
# hold its whole head in the sidecar's memory for as long as HEAD_TIMEOUT_S lets it.
MAX_HEAD_BYTES = (1 << 20) + 4096
REFUSED_CLOSE_DELAY_S = 0.5  # Go's rstAvoidanceDelay: the answer is read before the reset
HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                  b"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
                  b"431 Request Header Fields Too Large")
# An idle connection between requests. Ollama's server closes none (server/routes.go:2009:
# an http.Server without IdleTimeout), and agents' pools keep theirs 5 s (httpx) to 90 s
# (Go): a server that closes first races the agent's next request on that connection, which
# the clients do not retry.
KEEP_ALIVE_TIMEOUT_S = 300


class HeadTimeoutProtocol(HttpToolsProtocol):
    """Closes a connection whose request head does not arrive within HEAD_TIMEOUT_S."""

    head_timer: asyncio.TimerHandle | None = None
    head_bytes: int | None = 0  # None while a request's body is read
    running: RequestResponseCycle | None = None  # in flight while a pipelined one waits
    refusal: Callable[[], None] | None = None  # a bad request's answer, after those ahead

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.head_bytes == -1:  # refused: what still comes is dropped
            return
        if self.head_bytes is not None:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self._head_too_large()
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self.head_bytes = None
        running = self.cycle
        super().on_headers_complete()
        if len(self.pipeline) == 1 and running is not None and not running.response_complete:
            # A request sent before the one in flight has its answer (pipelining): uvicorn
            # stops reading until that answer ends, so a client that leaves goes unseen
            # (the call waits, loads and generates for nobody). One such request is read
            # ahead, its head and body, to keep reading; a second stops reading as before.
            self.running = running
            self.flow.resume_reading()

    def on_response_complete(self) -> None:
        # the next pipelined request starts now (uvicorn takes the pipeline's right end)
        starts = self.pipeline[-1][0] if self.pipeline else None
        super().on_response_complete()
        self.running = starts if self.pipeline else None
        if self.head_timer is not None and not self._answers_pending():
            self._arm()  # a head read ahead has its time from the last answer on, as in Go
        if self.refusal is not None and not self._answers_pending():
            refuse, self.refusal = self.refusal, None
            if not self.transport.is_closing():  # the answer closed it (Connection: close)
                refuse()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.head_bytes = 0  # what follows is the next request's head

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        # uvicorn tells only the newest request (a pipelined one, not yet begun): the one in
        # flight is told too, or it is answered for nobody
        running = self.running
        if running is not None and not running.response_complete:
            running.disconnected = True
            running.message_event.set()
        super().connection_lost(exc)
        # uvicorn stops the idle timer only on a clean close: after a reset its handle kept
        # the connection (protocol, request, headers) alive for KEEP_ALIVE_TIMEOUT_S
        self._unset_keepalive_if_required()

    def shutdown(self) -> None:
        """A server shutting down waits for responses to finish; an event stream never does,
        so it is closed (the browser reconnects to whichever sidecar comes up)."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and \
                cycle.scope.get("path") == EVENTS_PATH:
            self.transport.close()
            return
        super().shutdown()

    def _arm(self) -> None:
        self._disarm()
        self.head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_too_slow)

    def _disarm(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def send_400_response(self, msg: str) -> None:
        # a request read ahead (pipelined) that cannot be parsed: refused after those ahead
        if not self._defer(lambda: super(HeadTimeoutProtocol, self).send_400_response(msg)):
            super().send_400_response(msg)

    def _answers_pending(self) -> bool:
        """Whether a request read before this point still awaits its answer (answers go
        out in order, so the last one read is the last to be answered)."""
        return self.cycle is not None and not self.cycle.response_complete

    def _defer(self, refuse: Callable[[], None]) -> bool:
        """Holds a refusal of a request read ahead until the requests before it are answered
        (as Go's net/http and stock uvicorn do): sent at once it closed the connection
        under the call in flight. What still comes is read (a client leaving is seen) and
        dropped. A request cut in its body is refused at once: it will never be answered."""
        if self.head_bytes is None or not self._answers_pending():
            return False
        self._disarm()
        self.head_bytes = -1
        self.refusal = refuse
        return True

    def _head_too_large(self) -> None:
        if not self._defer(self._refuse_head):
            self._refuse_head()

    def _refuse_head(self) -> None:
        """Go's answer, then its closeWriteAndWait: the write side shut, the rest of the
        head read and dropped for a moment, so the client reads the 431 rather than a
        reset."""
        self._disarm()
        self.head_bytes = -1
        if self.transport.is_closing():
            return
        self.transport.write(HEAD_TOO_LARGE)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(REFUSED_CLOSE_DELAY_S, self.transport.close)

    def _head_too_slow(self) -> None:
        self.head_timer = None
        if self._answers_pending():  # a head read ahead: closing would cut the calls before it
            self._arm()
            return
        if not self.transport.is_closing():
            self.transport.close()


def listener(app: ASGIApp, host: str, port: int,
             lifespan: Literal["on", "off"]) -> uvicorn.Server:
    """One of the sidecar's listeners: these timeouts, no access log, no proxy headers (agents
    in the pod call it directly)."""
    return uvicorn.Server(uvicorn.Config(
        app, host=host, port=port, lifespan=lifespan, log_level="warning", access_log=False,
        proxy_headers=False, http=HeadTimeoutProtocol, timeout_keep_alive=KEEP_ALIVE_TIMEOUT_S))
