"""Core NATS messaging (publish, subscribe, scatter-gather) on the KV store's connection,
for what must not be written to a bucket: nothing is stored, messages reach whoever listens.

The store hands over its client each time it makes one (`attach`); subscriptions are kept
here and installed again on a new client (nats-py itself renews them across reconnects)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors

from proxy.observability.logging import get_logger

log = get_logger("kubemoot.nats")
Handler = Callable[[bytes], Awaitable[bytes | None]]  # its bytes answer a request
MAX_ANSWERS = 1000  # a gather keeps at most this many answers, however large the fleet


class NatsBus:
    def __init__(self) -> None:
        self._nc: Any = None
        self._wanted: dict[int, tuple[str, Handler]] = {}
        self._installed: dict[int, Any] = {}  # nats-py subscriptions on the current client
        self._next = 0

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def attach(self, client: Any) -> None:
        """The store's new connection: every subscription moves to it."""
        self._nc, self._installed = client, {}
        for key, (subject, handler) in list(self._wanted.items()):
            await self._install(key, subject, handler)

    async def _install(self, key: int, subject: str, handler: Handler) -> None:
        nc = self._nc

        async def deliver(msg: Any) -> None:
            try:
                answer = await handler(msg.data)
                if answer is not None and msg.reply:
                    await nc.publish(msg.reply, answer)
            except Exception as exc:  # one bad message must not end the subscription
                log.warning("nats message not handled", subject=subject,
                            error=str(exc) or type(exc).__name__)

        try:
            self._installed[key] = await nc.subscribe(subject, cb=deliver)
        except Exception as exc:  # not connected now: installed on the next client
            log.warning("nats subscribe failed", subject=subject,
                        error=str(exc) or type(exc).__name__)

    async def subscribe(self, subject: str, handler: Handler) -> Callable[[], Awaitable[None]]:
        """Deliver every message on `subject` to `handler` until the returned function is
        awaited; a handler's bytes answer a request."""
        key, self._next = self._next, self._next + 1
        self._wanted[key] = (subject, handler)
        if self._nc is not None:
            await self._install(key, subject, handler)

        async def unsubscribe() -> None:
            self._wanted.pop(key, None)
            installed = self._installed.pop(key, None)
            if installed is not None:
                with contextlib.suppress(Exception):
                    await installed.unsubscribe()

        return unsubscribe

    async def publish(self, subject: str, data: bytes) -> None:
        """Send if connected; a message nobody can receive now is dropped, not queued."""
        if self.connected:
            with contextlib.suppress(Exception):
                await self._nc.publish(subject, data)

    async def gather(self, subject: str, data: bytes, timeout_s: float, stall_s: float
                     ) -> list[bytes]:
        """Ask everyone listening on `subject` and collect their answers: until `timeout_s`
        passes, or `stall_s` after an answer with no other (the number of answerers is
        unknown, so silence after the burst ends the wait)."""
        if not self.connected:
            return []
        nc, answers = self._nc, list[bytes]()
        loop = asyncio.get_running_loop()
        try:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
        except Exception:
            return []
        try:
            await nc.publish(subject, data, reply=inbox)
            deadline = loop.time() + timeout_s
            while len(answers) < MAX_ANSWERS and (left := deadline - loop.time()) > 0:
                msg = await sub.next_msg(timeout=min(left, stall_s) if answers else left)
                answers.append(msg.data)
        except (nats.errors.TimeoutError, nats.errors.Error, OSError):
            pass  # silence, or the connection went: what arrived is the answer
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return answers
