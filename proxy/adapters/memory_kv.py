"""The embedded store: in-process buckets with the same semantics as the NATS adapter."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from proxy.ports import (
    BUCKETS,
    SYSTEM_CLOCK,
    BucketSpec,
    CasConflict,
    ChangeCounter,
    Clock,
    Entry,
)


class MemoryStore:
    """Revisions per bucket, compare-and-set, bucket max-age expiry, change notification."""

    def __init__(self, buckets: tuple[BucketSpec, ...] = BUCKETS,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock  # entries age on its monotonic time
        self._ttl = {b.name: b.ttl_s or math.inf for b in buckets}  # 0: never
        self._entries: dict[str, dict[str, Entry]] = {b.name: {} for b in buckets}
        self._views = {name: MappingProxyType(entries) for name, entries in self._entries.items()}
        self._written_at: dict[str, dict[str, float]] = {b.name: {} for b in buckets}
        # Expiry scans run only once the oldest entry may have aged out: view() is on every
        # placement's path and must not cost a pass over the bucket.
        self._next_expiry = {b.name: math.inf for b in buckets}
        self._revision = 0
        self._versions = {b.name: 0 for b in buckets}
        self._specs = {b.name: b for b in buckets}
        self.changes = ChangeCounter()

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def replayed(self, timeout_s: float) -> bool:
        return True  # the view is the store

    @property
    def connected(self) -> bool:
        return True

    @property
    def generation(self) -> int:
        return 0  # never rebuilt

    def _expire(self, bucket: str) -> None:
        now = self.clock.monotonic()
        if now < self._next_expiry[bucket]:
            return
        written_at, ttl = self._written_at[bucket], self._ttl[bucket]
        for key in [k for k, at in written_at.items() if now - at > ttl]:
            del written_at[key]
            del self._entries[bucket][key]
            self._versions[bucket] += 1
        self._next_expiry[bucket] = min(written_at.values(), default=math.inf) + ttl

    def view(self, bucket: str) -> Mapping[str, Entry]:
        self._expire(bucket)
        return self._views[bucket]

    def version(self, bucket: str) -> int:
        self._expire(bucket)
        return self._versions[bucket]

    async def get(self, bucket: str, key: str) -> Entry | None:
        return self.view(bucket).get(key)

    def _write(self, bucket: str, key: str, value: bytes) -> int:
        self._revision += 1
        now = self.clock.monotonic()
        rewrite = key in self._entries[bucket]
        self._entries[bucket][key] = Entry(key, value, self._revision)
        self._written_at[bucket][key] = now
        self._next_expiry[bucket] = min(self._next_expiry[bucket], now + self._ttl[bucket])
        self._versions[bucket] += 1
        if self._specs[bucket].wakes(key, rewrite):
            self.changes.bump()
        return self._revision

    async def put(self, bucket: str, key: str, value: bytes) -> int:
        return self._write(bucket, key, value)

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        current = self.view(bucket).get(key)
        current_revision = current.revision if current else 0
        if current_revision != last_revision:
            raise CasConflict(f"{bucket}/{key}: at {current_revision}, not {last_revision}")
        return self._write(bucket, key, value)

    async def delete(self, bucket: str, key: str) -> None:
        self._written_at[bucket].pop(key, None)
        if self._entries[bucket].pop(key, None) is not None:
            self._versions[bucket] += 1
            self.changes.bump()
