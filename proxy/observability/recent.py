"""This sidecar's last calls and refusals, for the status page: a bounded ring in memory,
written where the call's log line is written. An append and a counter on the call path, no
I/O; watchers are woken only when there are any."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

RECENT = 50  # entries kept of each kind


@dataclass(frozen=True, slots=True)
class CallRecord:
    at: float  # wall-clock seconds
    model: str
    provider: str
    placement: str  # warm, cold, evict, ...
    evicted: tuple[str, ...]
    waited_ms: int
    seconds: float
    ok: bool
    error: str | None
    seq: int = 0  # this ring's count of entries when it was added: new entries, in order


@dataclass(frozen=True, slots=True)
class RefusalRecord:
    at: float
    model: str | None
    reason: str
    message: str
    seq: int = 0


class Moves:
    """A version that waiters can block on; the event exists only while someone waits."""

    def __init__(self) -> None:
        self.version = 0
        self._moved: asyncio.Event | None = None

    def bump(self) -> None:
        self.version += 1
        moved, self._moved = self._moved, None
        if moved is not None:
            moved.set()

    async def wait_past(self, seen: int) -> None:
        """Return once the version moved past `seen`."""
        while self.version == seen:
            if self._moved is None:
                self._moved = asyncio.Event()
            await self._moved.wait()


class RecentCalls(Moves):
    def __init__(self, size: int = RECENT) -> None:
        super().__init__()
        self.calls: deque[CallRecord] = deque(maxlen=size)
        self.refusals: deque[RefusalRecord] = deque(maxlen=size)

    def add_call(self, model: str, provider: str, placement: str, evicted: tuple[str, ...],
                 waited_ms: int, seconds: float, ok: bool, error: str | None) -> None:
        self.calls.append(CallRecord(time.time(), model, provider, placement, evicted,
                                     waited_ms, seconds, ok, error, self.version + 1))
        self.bump()

    def add_refusal(self, model: str | None, reason: str, message: str) -> None:
        self.refusals.append(RefusalRecord(time.time(), model, reason, message,
                                           self.version + 1))
        self.bump()

    def since(self, seen: int) -> tuple[list[CallRecord], list[RefusalRecord]]:
        """The entries added after the version `seen` (those the ring still holds)."""
        return [c for c in self.calls if c.seq > seen], \
            [r for r in self.refusals if r.seq > seen]
