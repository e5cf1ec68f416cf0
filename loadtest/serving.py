"""Run an ASGI app on a real loopback socket in a background thread (tests, demo, benchmarks)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import socket
import threading
import time
from typing import Any

import uvicorn

from .sim_model import SimConfig

# How long a restart waits for its port to be free again
REBIND_S = 5.0
# How long a stop waits for the calls still being answered before it leaves them to
# uvicorn's own shutdown (which waits up to timeout_graceful_shutdown, then cancels them)
QUICK_STOP_S = 0.05


class _QuickServer(uvicorn.Server):
    """uvicorn's server, stopped at once: uvicorn notices `should_exit` on a 0.1 s tick and
    then sleeps 0.1 s more before it looks at the connections, which made every stop of a
    test's server cost about 0.2 s. Here `request_exit()` wakes the loop, and a shutdown whose
    connections all close at once (idle keep-alives do) is over in a few milliseconds."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    def request_exit(self) -> None:
        """Called from another thread."""
        self.should_exit = True  # first: a main loop not begun yet sees it on its first tick
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(wake.set)

    async def main_loop(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)  # the tick, or a stop

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()  # an idle one closes now, a busy one after its answer
        for _ in range(round(QUICK_STOP_S / 0.002)):  # no event tells: uvicorn's sets
            if not (state.connections or state.tasks):
                break
            await asyncio.sleep(0.002)
        if state.connections or state.tasks:
            await super().shutdown(sockets)  # the fallback: uvicorn's waits and cancels
            return
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


class ThreadedServer:
    """`start()` binds (port 0 picks a free one) and returns once serving; `stop()` closes
    the socket, so connections are refused until `start()` binds the same port again."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, name: str = "server",
                 **config: Any) -> None:
        self.uvicorn_config = config  # more uvicorn.Config settings (the sidecar's protocol)
        self.app = app
        self.host = host
        self.port = port
        self.name = name
        self._server: _QuickServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ThreadedServer:
        sock = self._bound()
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False,
                                lifespan="auto", timeout_graceful_shutdown=1,
                                **self.uvicorn_config)
        self._server = _QuickServer(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True, name=self.name)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.005)
        return self

    def _bound(self) -> socket.socket:
        """A socket bound to the server's port. Binding the port again on a restart can
        fail for a moment: a connection of the stopped server still closing on it, or a
        client's outgoing connection that took the freed port as its own; both go soon."""
        deadline = time.monotonic() + REBIND_S
        while True:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.host, self.port))
                return sock
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRINUSE or not self.port or \
                        time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """CPU time the server's thread (its event loop, all it serves) has used so far."""
        assert self._thread is not None and self._thread.ident is not None
        return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.request_exit()
            self._thread.join(timeout=10)
        self._server = None


def add_sharing_flags(parser: argparse.ArgumentParser) -> None:
    """How the simulated GPUs share their time between calls decoding at once."""
    parser.add_argument("--batch-cost", type=float, default=0.1,
                        help="what each more sequence in a runner's batch adds to its decode "
                             "step (0.1: +10%%; 0: slots decode for free)")
    parser.add_argument("--no-share-gpu", dest="share_gpu", action="store_false",
                        help="every slot decodes alone at full speed, however many calls "
                             "and models decode on the card")


def sharing_from(args: argparse.Namespace, config: SimConfig) -> SimConfig:
    """A simulator's config with the sharing flags applied."""
    return dataclasses.replace(config, batch_cost=args.batch_cost, share_gpu=args.share_gpu)


def sharing_args(args: argparse.Namespace) -> list[str]:
    """The sharing flags as `python -m loadtest.ollama_sim` takes them."""
    return ["--batch-cost", str(args.batch_cost), *([] if args.share_gpu else ["--no-share-gpu"])]
