"""The ports the shell depends on. Adapters implement them; services see only these."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

PROVIDER_STATE = "kubemoot_provider_state"
PROVIDER_TICKETS = "kubemoot_provider_tickets"
MODEL_DEMAND = "kubemoot_model_demand"


@dataclass(frozen=True, slots=True)
class BucketSpec:
    name: str
    ttl_s: float  # every entry ages out this long after its last write (garbage collection)
    history: int = 1


BUCKETS = (
    BucketSpec(PROVIDER_STATE, ttl_s=3600.0),
    BucketSpec(PROVIDER_TICKETS, ttl_s=6 * 3600.0),
    BucketSpec(MODEL_DEMAND, ttl_s=6 * 3600.0),
)


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    value: bytes
    revision: int


class CasConflict(Exception):
    """The key moved on since the revision the writer read."""


class StoreUnavailable(Exception):
    """The shared store cannot be reached right now."""


class StateStore(Protocol):
    """Key-value buckets with revisions, compare-and-set, expiry and change notification.

    `view()` is a local mirror kept fresh by one long-lived watch per bucket; `get` and
    `cas` go to the authoritative store. `changes` counts every write seen by the watch.
    """

    changes: ChangeCounter

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    @property
    def connected(self) -> bool: ...

    def view(self, bucket: str) -> Mapping[str, Entry]: ...

    def version(self, bucket: str) -> int:
        """Moves whenever the bucket's view changes: an equal version means an equal view."""
        ...

    async def get(self, bucket: str, key: str) -> Entry | None: ...

    async def put(self, bucket: str, key: str, value: bytes) -> int: ...

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        """Write only if the key is still at `last_revision` (0: the key must be absent)."""
        ...

    async def delete(self, bucket: str, key: str) -> None: ...


class ChangeCounter:
    """A counter waiters block on: every observed change to state or tickets advances it."""

    def __init__(self) -> None:
        self.value = 0
        self._event = asyncio.Event()

    def bump(self) -> None:
        self.value += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait_past(self, seen: int, timeout_s: float) -> bool:
        """Block until the counter moves past `seen` or `timeout_s` passes; True if it moved."""
        if self.value != seen:
            return True
        try:
            await asyncio.wait_for(self._event.wait(), timeout=max(0.0, timeout_s))
        except TimeoutError:
            return self.value != seen
        return True
