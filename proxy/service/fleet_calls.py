"""Every sidecar's last calls on the status page, in NATS mode, without writing a call
anywhere: a sidecar with a page open asks the others for their rings (scatter-gather on
`kubemoot.recent`), then hears each new call as it ends (`kubemoot.calls`), pushed only by
sidecars that heard a page announce itself (`kubemoot.watching`) in the last WATCHED_S.

Unwatched, a sidecar publishes nothing and its call path does what it does without this
module: an append to its ring. Each message holds at most one ring (RECENT of each kind),
with the texts cut short; prompts and credentials are never in a record."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.observability.logging import get_logger
from proxy.observability.recent import RECENT, CallRecord, Moves, RecentCalls, RefusalRecord
from proxy.ports import Clock

log = get_logger("kubemoot.fleet_calls")
RECENT_SUBJECT = "kubemoot.recent"  # a request: every sidecar answers with its ring
WATCHING_SUBJECT = "kubemoot.watching"  # a page is open somewhere: push new calls
CALLS_SUBJECT = "kubemoot.calls"  # new calls and refusals, while a page is open
ANNOUNCE_S = 5.0  # a watching sidecar says so this often
WATCHED_S = 15.0  # pushes stop this long after the last word from a page (three announcements)
GATHER_S = 1.0  # the longest a gather waits for answers
STALL_S = 0.2  # and how long it waits after the last answer for another
MAX_TEXT = 300  # characters of an error or refusal message sent
# Sidecars whose newest version is remembered, the least recently heard forgotten first:
# every restart is a new instance, and a page open for weeks hears them all. One forgotten
# and heard again asks for a gather, which is harmless.
HEARD_KEPT = 1024
Handler = Callable[[bytes], Awaitable[bytes | None]]


class Bus(Protocol):
    """Messaging beside the state store (`proxy/adapters/nats_bus.py`)."""

    async def subscribe(self, subject: str, handler: Handler) -> Callable[[], Awaitable[None]]:
        ...

    async def publish(self, subject: str, data: bytes) -> None: ...

    async def gather(self, subject: str, data: bytes, timeout_s: float, stall_s: float
                     ) -> list[bytes]: ...


@dataclass(frozen=True, slots=True)
class Batch:
    """Some of one sidecar's records: its whole ring (`after` None) or those added after
    version `after`, up to `version`."""

    instance: str  # one sidecar process (names can repeat: a default agent name is a host)
    sidecar: str  # namespace/agent, as shown
    after: int | None
    version: int
    calls: tuple[CallRecord, ...]
    refusals: tuple[RefusalRecord, ...]


def _cut(text: str | None) -> str | None:
    return None if text is None else text[:MAX_TEXT]


def encode(batch: Batch) -> bytes:
    return orjson.dumps({
        "instance": batch.instance, "sidecar": batch.sidecar, "after": batch.after,
        "version": batch.version,
        "calls": [{"at": c.at, "model": c.model, "provider": c.provider,
                   "placement": c.placement, "evicted": list(c.evicted),
                   "waitedMs": c.waited_ms, "seconds": c.seconds, "ok": c.ok,
                   "error": _cut(c.error), "seq": c.seq} for c in batch.calls],
        "refusals": [{"at": r.at, "model": r.model, "reason": r.reason,
                      "message": _cut(r.message), "seq": r.seq} for r in batch.refusals]})


def decode(data: bytes) -> Batch:
    """A batch from the wire; raises ValueError, KeyError or TypeError on anything else."""
    raw: dict[str, Any] = orjson.loads(data)
    after = raw["after"]
    calls = tuple(CallRecord(float(c["at"]), str(c["model"]), str(c["provider"]),
                             str(c["placement"]), tuple(map(str, c["evicted"])),
                             int(c["waitedMs"]), float(c["seconds"]), bool(c["ok"]),
                             _cut(None if c["error"] is None else str(c["error"])),
                             int(c["seq"])) for c in raw["calls"][:RECENT])
    refusals = tuple(RefusalRecord(float(r["at"]), None if r["model"] is None else
                                   str(r["model"]), str(r["reason"]),
                                   _cut(str(r["message"])) or "", int(r["seq"]))
                     for r in raw["refusals"][:RECENT])
    return Batch(str(raw["instance"]), str(raw["sidecar"]),
                 None if after is None else int(after), int(raw["version"]), calls, refusals)


class FleetCalls(Moves):
    """The other sidecars' records a page has heard: the newest RECENT of each kind across
    them all, each once (a record is one sidecar's `seq`)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[tuple[str, int], tuple[str, CallRecord]] = {}
        self.refusals: dict[tuple[str, int], tuple[str, RefusalRecord]] = {}
        self.heard: dict[str, tuple[str, int]] = {}  # instance: its name, newest version

    def merge(self, batch: Batch) -> bool:
        """Take a batch in; True if records came before it that were never heard (a push
        from a sidecar not heard since its ring moved on): the caller should gather."""
        _, last = self.heard.pop(batch.instance, (batch.sidecar, 0))
        missed = batch.after is not None and batch.after > last
        self.heard[batch.instance] = (batch.sidecar, max(last, batch.version))
        while len(self.heard) > HEARD_KEPT:
            del self.heard[next(iter(self.heard))]
        for call in batch.calls:
            self.calls[batch.instance, call.seq] = (batch.sidecar, call)
        for refusal in batch.refusals:
            self.refusals[batch.instance, refusal.seq] = (batch.sidecar, refusal)
        _keep_newest(self.calls)
        _keep_newest(self.refusals)
        self.bump()
        return missed

    def clear(self) -> None:
        self.calls.clear()
        self.refusals.clear()
        self.heard.clear()


def _keep_newest(records: dict[tuple[str, int], tuple[str, Any]]) -> None:
    if len(records) > RECENT:
        oldest = sorted(records, key=lambda key: records[key][1].at)[:len(records) - RECENT]
        for key in oldest:
            del records[key]


class CallExchange:
    """Both sides of the exchange for one sidecar: it answers and pushes for pages open
    elsewhere, and gathers and hears for a page open here."""

    def __init__(self, bus: Bus, recent: RecentCalls, sidecar: str, clock: Clock) -> None:
        self.bus = bus
        self.recent = recent
        self.sidecar = sidecar
        self.clock = clock
        self.instance = secrets.token_hex(6)
        self.others = FleetCalls()
        self._hello = orjson.dumps({"instance": self.instance, "sidecar": sidecar})
        self._watched_until = 0.0  # monotonic: pushes go out until then
        self._pushing: asyncio.Task[None] | None = None
        self._watchers = 0  # pages open here
        self._watching: asyncio.Task[None] | None = None
        self._gathering: asyncio.Task[None] | None = None
        self._unsubscribe: list[Callable[[], Awaitable[None]]] = []

    async def start(self) -> None:
        self._unsubscribe = [await self.bus.subscribe(RECENT_SUBJECT, self._answer),
                             await self.bus.subscribe(WATCHING_SUBJECT, self._noted)]

    async def close(self) -> None:
        for task in (self._pushing, self._watching, self._gathering):
            if task is not None:
                task.cancel()
        for unsubscribe in self._unsubscribe:
            await unsubscribe()

    # -- for pages open elsewhere --------------------------------------------------------
    def _from_elsewhere(self, data: bytes) -> bool:
        try:
            return bool(orjson.loads(data).get("instance") != self.instance)
        except (orjson.JSONDecodeError, AttributeError):
            return False

    async def _answer(self, data: bytes) -> bytes | None:
        """The whole ring; and the asker watches, so later records follow by push."""
        if not self._from_elsewhere(data):
            return None
        self._watched()
        recent = self.recent
        return encode(Batch(self.instance, self.sidecar, None, recent.version,
                            tuple(recent.calls), tuple(recent.refusals)))

    async def _noted(self, data: bytes) -> None:
        if self._from_elsewhere(data):
            self._watched()

    def _watched(self) -> None:
        self._watched_until = self.clock.monotonic() + WATCHED_S
        if self._pushing is None:  # from now on: what the ring held is in the answer
            self._pushing = asyncio.create_task(self._push(self.recent.version))

    async def _push(self, sent: int) -> None:
        """Each new record as it comes, while a page watches; then stop."""
        try:
            while (left := self._watched_until - self.clock.monotonic()) > 0:
                try:
                    await asyncio.wait_for(self.recent.wait_past(sent), left)
                except TimeoutError:
                    continue  # an announcement may have come meanwhile
                calls, refusals = self.recent.since(sent)
                version = self.recent.version
                await self.bus.publish(CALLS_SUBJECT, encode(Batch(
                    self.instance, self.sidecar, sent, version, tuple(calls),
                    tuple(refusals))))
                sent = version
        finally:
            self._pushing = None

    # -- for a page open here ------------------------------------------------------------
    def watch(self) -> FleetCalls:
        """A page opened here: gather the fleet's records, and keep hearing new ones."""
        self._watchers += 1
        if self._watching is None:
            self._watching = asyncio.create_task(self._watch())
        return self.others

    def unwatch(self) -> None:
        self._watchers -= 1
        if self._watchers == 0:
            for task in (self._watching, self._gathering):
                if task is not None:
                    task.cancel()
            self._watching = self._gathering = None
            self.others.clear()

    async def _watch(self) -> None:
        unsubscribe = await self.bus.subscribe(CALLS_SUBJECT, self._heard)
        try:
            await self._gather()  # the request is the first announcement
            while True:
                await asyncio.sleep(ANNOUNCE_S)
                await self.bus.publish(WATCHING_SUBJECT, self._hello)
        finally:
            await unsubscribe()

    async def _gather(self) -> None:
        for data in await self.bus.gather(RECENT_SUBJECT, self._hello, GATHER_S, STALL_S):
            self._take(data)

    async def _heard(self, data: bytes) -> None:
        if self._take(data) and self._gathering is None:
            self._gathering = asyncio.create_task(self._gather_missed())

    async def _gather_missed(self) -> None:
        try:
            await self._gather()
        finally:
            self._gathering = None

    def _take(self, data: bytes) -> bool:
        try:
            batch = decode(data)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("recent calls not understood", error=str(exc))
            return False
        return batch.instance != self.instance and self.others.merge(batch)
