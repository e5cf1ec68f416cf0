"""VRAM tickets against both stores, and a cross-process race against a real NATS."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from loadtest.claim_race import max_overlap, run_race
from loadtest.nats_server import NatsServer
from proxy.adapters.memory_kv import MemoryStore
from proxy.adapters.nats_kv import NatsOptions, NatsStore
from proxy.core.policy import Policy
from proxy.core.types import ProviderView, Resident
from proxy.ports import PROVIDER_TICKETS, Entry, StateStore, StoreUnavailable
from proxy.service.codec import Residency, TicketSet
from proxy.service.tickets import TicketBook
from tests.integration.conftest import empty_buckets

VIEW = ProviderView("gpu", 10000, residents=(Resident("idle:8b", 4000),))  # 6000 MiB free


@pytest.fixture(params=["memory", "nats"])
async def store(request: pytest.FixtureRequest, nats_server: NatsServer
                ) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    await empty_buckets(nats_server.url)
    nats_store = NatsStore(NatsOptions(nats_server.url))
    await nats_store.start()
    yield nats_store
    await nats_store.close()


def _book(store: StateStore, ttl_s: float = 60) -> TicketBook:
    return TicketBook(store, Policy(), ttl_s=ttl_s)


async def test_claims_fit_the_budget_and_release_frees_it(store: StateStore) -> None:
    book = _book(store)
    a = book.new_ticket("a", "gpu", "m1", 4000, True, {}, "h")
    b = book.new_ticket("b", "gpu", "m2", 2000, True, {}, "h")
    c = book.new_ticket("c", "gpu", "m3", 1, True, {}, "h")
    assert (await book.claim(a, VIEW)).ok
    assert (await book.claim(b, VIEW)).ok
    refused = await book.claim(c, VIEW)
    assert not refused.ok and "exceed" in refused.reason
    await book.release(a)
    assert (await book.claim(c, VIEW)).ok


async def test_a_claim_retried_after_an_ambiguous_commit_is_not_counted_twice(
        store: StateStore) -> None:
    book = _book(store)
    t = book.new_ticket("same", "gpu", "m", 6000, True, {}, "h")
    assert (await book.claim(t, VIEW)).ok
    assert (await book.claim(t, VIEW)).ok  # already present: fine, not double-counted


async def test_two_planners_choosing_one_victim_cannot_both_spend_it(store: StateStore) -> None:
    book = _book(store)
    first = book.new_ticket("1", "gpu", "big", 10000, True, {"idle:8b": 4000}, "p1")
    second = book.new_ticket("2", "gpu", "other", 4000, True, {"idle:8b": 4000}, "p2")
    assert (await book.claim(first, VIEW)).ok
    assert not (await book.claim(second, VIEW)).ok


async def test_claim_refused_when_the_victim_picked_up_work(store: StateStore) -> None:
    book = _book(store)
    user = book.new_ticket("u", "gpu", "idle:8b", 512, False, {}, "h")
    assert (await book.claim(user, VIEW)).ok
    plan = book.new_ticket("p", "gpu", "big", 10000, True, {"idle:8b": 4000}, "h")
    result = await book.claim(plan, VIEW)
    assert not result.ok and "in-flight" in result.reason


async def test_dead_holder_stops_counting_after_the_ttl(store: StateStore) -> None:
    dead = _book(store, ttl_s=0.3)  # the holder that never releases
    assert (await dead.claim(dead.new_ticket("d", "gpu", "m", 6000, True, {}, "x"), VIEW)).ok
    live = _book(store)
    late = live.new_ticket("l", "gpu", "m2", 6000, True, {}, "y")
    assert not (await live.claim(late, VIEW)).ok
    await asyncio.sleep(0.4)
    assert (await live.claim(late, VIEW)).ok


async def test_renew_keeps_a_long_call_counted(store: StateStore) -> None:
    book = _book(store, ttl_s=0.4)
    t = book.new_ticket("r", "gpu", "m", 6000, True, {}, "h")
    assert (await book.claim(t, VIEW)).ok
    for _ in range(3):
        await asyncio.sleep(0.2)
        assert (await book.renew(t)).ok
    other = book.new_ticket("o", "gpu", "m2", 1, True, {}, "h")
    assert not (await book.claim(other, VIEW)).ok


async def test_release_records_the_model_left_resident(store: StateStore) -> None:
    book = _book(store)
    t = book.new_ticket("c", "gpu", "new:14b", 5000, True, {}, "h")
    assert (await book.claim(t, VIEW)).ok
    await book.release(t, Residency(5000, 8192, time.time()))
    # The residency entry counts at once: only 1000 MiB are left beside idle:8b and new:14b.
    probe = book.new_ticket("q", "gpu", "x", 1001, True, {}, "h")
    assert not (await book.claim(probe, VIEW)).ok
    await book.forget_residents("gpu", ("new:14b",))
    assert (await book.claim(probe, VIEW)).ok


class OutageStore(MemoryStore):
    """The embedded store with a switch that makes every server call fail."""

    down = False

    @property
    def connected(self) -> bool:
        return not self.down

    async def get(self, bucket: str, key: str) -> Entry | None:
        if self.down:
            raise StoreUnavailable("down")
        return await super().get(bucket, key)

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        if self.down:
            raise StoreUnavailable("down")
        return await super().cas(bucket, key, value, last_revision)


async def test_a_release_the_store_missed_stops_counting_here_and_is_written_later() -> None:
    store = OutageStore()
    book = _book(store)
    a = book.new_ticket("a", "gpu", "m1", 4000, True, {}, "h")
    b = book.new_ticket("b", "gpu", "m2", 1000, True, {}, "h")
    assert (await book.claim(a, VIEW)).ok and (await book.claim(b, VIEW)).ok
    store.down = True
    with pytest.raises(StoreUnavailable):
        await book.release(a)
    assert set(book.known("gpu")[0].tickets) == {"b"} and book.owes("gpu")
    assert "a" in _stored(store)  # the store itself still has it
    store.down = False
    assert (await book.settle("gpu")).ok
    assert set(_stored(store)) == {"b"} and not book.owes("gpu")


async def test_the_next_write_carries_an_owed_release() -> None:
    store = OutageStore()
    book = _book(store)
    a = book.new_ticket("a", "gpu", "m1", 6000, True, {}, "h")
    assert (await book.claim(a, VIEW)).ok
    store.down = True
    with pytest.raises(StoreUnavailable):
        await book.release(a)
    store.down = False
    c = book.new_ticket("c", "gpu", "m3", 6000, True, {}, "h")
    assert (await book.claim(c, VIEW)).ok  # room that only the owed release frees
    assert set(_stored(store)) == {"c"} and not book.owes("gpu")


def _stored(store: StateStore) -> dict[str, object]:
    entry = store.view(PROVIDER_TICKETS)["gpu"]
    return dict(TicketSet.decode("gpu", entry.value).tickets)


def test_processes_racing_for_one_small_budget_never_exceed_it(nats_server: NatsServer
                                                                ) -> None:
    import asyncio as aio

    aio.run(empty_buckets(nats_server.url))
    # 3 tickets of 1000 MiB fit a 3000 MiB budget; 4 processes x 4 tasks race for them.
    results = run_race(nats_server.url, procs=4, tasks=4, seconds=2.0, hold_ms=2.0,
                       total_mib=3000, ticket_mib=1000)
    intervals = [tuple(i) for r in results for i in r["intervals"]]
    assert len(intervals) > 0  # at least one claim won
    assert max_overlap(intervals) <= 3  # type: ignore[arg-type]
    assert sum(r["refused"] for r in results) > 0  # the budget really was contended


HOLDER = """
import asyncio, sys
from proxy.adapters.nats_kv import NatsOptions, NatsStore
from proxy.core.policy import Policy
from proxy.core.types import ProviderView
from proxy.service.tickets import TicketBook

async def main() -> None:
    store = NatsStore(NatsOptions(sys.argv[1]))
    await store.start()
    book = TicketBook(store, Policy(), ttl_s=1.0)
    ticket = book.new_ticket("held-by-a-dead-process", "gpu", "m", 6000, True, {}, "doomed")
    assert (await book.claim(ticket, ProviderView("gpu", 10000))).ok
    print("claimed", flush=True)
    await asyncio.sleep(3600)  # mid-call, until killed

asyncio.run(main())
"""


def test_a_holder_killed_mid_call_stops_counting_within_the_ttl(nats_server: NatsServer
                                                                ) -> None:
    import signal
    import subprocess
    import sys

    asyncio.run(empty_buckets(nats_server.url))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, nats_server.url],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        holder.send_signal(signal.SIGKILL)  # no finally, no release
        holder.wait(10)
    finally:
        holder.kill()

    async def claim_after_kill() -> tuple[bool, bool, float]:
        store = NatsStore(NatsOptions(nats_server.url))
        await store.start()
        book = TicketBook(store, Policy(), ttl_s=60)
        view = ProviderView("gpu", 10000)
        ticket = book.new_ticket("survivor", "gpu", "m2", 6000, True, {}, "alive")
        at_once = (await book.claim(ticket, view)).ok
        entry = await store.get(PROVIDER_TICKETS, "gpu")
        assert entry is not None
        dead = TicketSet.decode("gpu", entry.value).tickets["held-by-a-dead-process"]
        wait_s = dead.expires_at - time.time()
        await asyncio.sleep(max(0.0, wait_s) + 0.05)  # expiry is silent: sleep to it once
        later = (await book.claim(ticket, view)).ok
        await store.close()
        return at_once, later, wait_s

    at_once, later, wait_s = asyncio.run(claim_after_kill())
    assert not at_once  # the dead holder's 6000 MiB still counted right after the kill
    assert later and wait_s <= 1.0  # ... and stopped counting at its 1 s TTL
