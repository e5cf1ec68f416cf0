"""The embedded store: in-process buckets with the same semantics as the NATS adapter."""

from __future__ import annotations

import time
from collections.abc import Mapping

from proxy.ports import BUCKETS, BucketSpec, CasConflict, ChangeCounter, Entry


class MemoryStore:
    """Revisions per bucket, compare-and-set, bucket max-age expiry, change notification."""

    def __init__(self, buckets: tuple[BucketSpec, ...] = BUCKETS) -> None:
        self._ttl = {b.name: b.ttl_s for b in buckets}
        self._data: dict[str, dict[str, tuple[Entry, float]]] = {b.name: {} for b in buckets}
        self._revision = 0
        self.changes = ChangeCounter()

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @property
    def connected(self) -> bool:
        return True

    def _live(self, bucket: str) -> dict[str, tuple[Entry, float]]:
        entries = self._data[bucket]
        now = time.monotonic()
        for key in [k for k, (_, written) in entries.items() if now - written > self._ttl[bucket]]:
            del entries[key]
        return entries

    def view(self, bucket: str) -> Mapping[str, Entry]:
        return {k: e for k, (e, _) in self._live(bucket).items()}

    async def get(self, bucket: str, key: str) -> Entry | None:
        found = self._live(bucket).get(key)
        return found[0] if found else None

    def _write(self, bucket: str, key: str, value: bytes) -> int:
        self._revision += 1
        self._data[bucket][key] = (Entry(key, value, self._revision), time.monotonic())
        self.changes.bump()
        return self._revision

    async def put(self, bucket: str, key: str, value: bytes) -> int:
        return self._write(bucket, key, value)

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        current = self._live(bucket).get(key)
        current_revision = current[0].revision if current else 0
        if current_revision != last_revision:
            raise CasConflict(f"{bucket}/{key}: at {current_revision}, not {last_revision}")
        return self._write(bucket, key, value)

    async def delete(self, bucket: str, key: str) -> None:
        if self._data[bucket].pop(key, None) is not None:
            self.changes.bump()
