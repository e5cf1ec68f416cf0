"""VRAM tickets against both stores, and a cross-process race against a real NATS."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest

from loadtest.claim_race import max_overlap, run_race
from loadtest.nats_server import NatsServer
from proxy.adapters.memory_kv import MemoryStore
from proxy.adapters.nats_kv import NatsOptions, NatsStore
from proxy.core.policy import Policy
from proxy.core.sizing import RUNNER_OVERHEAD_MIB
from proxy.core.tickets import Residency, TicketSet, merge_recorded, merge_residency
from proxy.core.types import ProviderView, Resident
from proxy.ports import PROVIDER_TICKETS, CasConflict, Entry, StateStore, StoreUnavailable
from proxy.service.codec import decode_ticket_set, encode_ticket_set
from proxy.service.tickets import RELEASE_DELAY_S, TicketBook
from tests.integration.conftest import empty_buckets

# 10000 usable, 6000 free; OLLAMA_MAX_LOADED_MODELS set high: memory is the limit here
VIEW = ProviderView("gpu", 12048, residents=(Resident("idle:8b", 4000),), max_loaded=64)


@pytest.fixture(params=["memory", "nats"])
async def store(request: pytest.FixtureRequest, nats_server: NatsServer
                ) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        yield MemoryStore()
        _OPEN_BOOKS.clear()
        return
    await empty_buckets(nats_server.url)
    nats_store = NatsStore(NatsOptions(nats_server.url))
    await nats_store.start()
    assert await nats_store.replayed(5)  # the views whole before a book reads them
    yield nats_store
    # a book's delayed release write must not land in the next test's emptied buckets
    for book in _OPEN_BOOKS:
        await book.close()
    _OPEN_BOOKS.clear()
    await nats_store.close()


_OPEN_BOOKS: list[TicketBook] = []


def _book(store: StateStore, ttl_s: float = 60, release_delay_s: float = RELEASE_DELAY_S
          ) -> TicketBook:
    """A book the fixture closes: its delayed writes never land in the next test's buckets."""
    book = TicketBook(store, Policy(), ttl_s=ttl_s, release_delay_s=release_delay_s)
    _OPEN_BOOKS.append(book)
    return book


def _residents(book: TicketBook) -> tuple[Resident, ...]:
    """The probed VIEW as every sidecar sees it now, with the book's residency records."""
    return merge_recorded(VIEW, book.known("gpu")[0]).residents


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
    """Its ticket stops counting at its expiry; the copy its claim loaded still counts until
    a probe newer than the claim lists it (then it is an idle copy a claim may unload)."""
    dead = _book(store, ttl_s=0.3)  # the holder that never releases
    assert (await dead.claim(dead.new_ticket("d", "gpu", "m", 6000, True, {}, "x"), VIEW)).ok
    live = _book(store)
    late = live.new_ticket("l", "gpu", "m2", 6000, True, {}, "y")
    unloading = live.new_ticket("u", "gpu", "m2", 6000, True, {"m": 6000}, "y")
    assert not (await live.claim(late, VIEW)).ok
    refused = await live.claim(unloading, _probed_with("m"))
    assert not refused.ok and "in-flight" in refused.reason
    await asyncio.sleep(0.4)
    refused = await live.claim(late, VIEW)  # probed before the load: the copy still counts
    assert not refused.ok and "exceed" in refused.reason
    assert (await live.claim(unloading, _probed_with("m"))).ok


def _probed_with(model: str) -> ProviderView:
    """VIEW probed now, listing `model` (6000 MiB) idle beside idle:8b."""
    return replace(VIEW, residents=(*VIEW.residents, Resident(model, 6000)),
                   probed_at=time.time())


async def test_renew_keeps_a_long_call_counted(store: StateStore) -> None:
    book = _book(store, ttl_s=0.4)
    t = book.new_ticket("r", "gpu", "m", 6000, True, {}, "h")
    assert (await book.claim(t, VIEW)).ok
    for _ in range(3):
        await asyncio.sleep(0.2)
        assert (await book.renew(t)).ok
    other = book.new_ticket("o", "gpu", "m2", 1, True, {}, "h")
    assert not (await book.claim(other, VIEW)).ok


async def test_a_renewal_puts_back_a_ticket_its_set_lost(store: StateStore) -> None:
    """A store back without its storage, or a ticket that expired while renewals could not
    be written: the call runs on, so its renewal writes the ticket again, load and all."""
    book = _book(store)
    t = book.new_ticket("r", "gpu", "m", 6000, True, {}, "h")
    assert (await book.claim(t, VIEW)).ok
    await store.delete(PROVIDER_TICKETS, "gpu")
    assert await _stored(store) == {}
    assert (await book.renew(t)).ok
    entry = await store.get(PROVIDER_TICKETS, "gpu")
    assert entry is not None
    stored = decode_ticket_set("gpu", entry.value)
    assert set(stored.tickets) == {"r"} and set(stored.loads) == {"r"}
    # counted once: the 6000 MiB free are taken
    assert not (await book.claim(book.new_ticket("o", "gpu", "m2", 1, True, {}, "h"), VIEW)).ok


async def test_a_released_ticket_is_not_put_back(store: StateStore) -> None:
    book = _book(store, release_delay_s=10)  # its release still owed
    t = book.new_ticket("r", "gpu", "m", 6000, True, {}, "h")
    assert (await book.claim(t, VIEW)).ok
    await book.release(t)
    await book.restore(t)
    await book.renew(t)
    assert await _stored(store) == {}
    kept = book.new_ticket("k", "gpu", "m2", 1000, True, {}, "h")
    assert (await book.claim(kept, VIEW)).ok
    await store.put(PROVIDER_TICKETS, "gpu", encode_ticket_set(TicketSet()))  # lost
    for _ in range(100):  # (the NATS view has it when its watch brings it)
        if not book.known("gpu")[0].tickets:
            break
        await asyncio.sleep(0.01)
    await book.restore(kept, held=lambda: False)  # its holder let it go meanwhile
    assert await _stored(store) == {}
    await book.restore(kept)
    assert set(await _stored(store)) == {"k"}


@pytest.mark.parametrize("keep_alive_0", [False, True])
async def test_a_ticket_released_with_a_record_is_not_put_back(store: StateStore,
                                                               keep_alive_0: bool) -> None:
    """A release that records its copy removes the ticket in its own write; a renewal or a
    restore racing it must not write the ticket back."""
    book = _book(store)
    t = book.new_ticket("r", "gpu", "m", 6000, True, {}, "h")
    assert (await book.claim(t, VIEW)).ok
    if keep_alive_0:
        await book.release_to_unload(t)
    else:
        await book.release(t, Residency(6000, 4096, 0.0))
    await book.renew(t)
    await book.restore(t)
    assert "r" not in await _stored(store)


async def test_a_server_back_without_its_storage_is_connected_only_with_its_own_views() -> None:
    """Until the watches have replayed the new server's buckets, the store is not connected
    and the old views stand (an outage's); from then on no set of the old server counts."""
    server = NatsServer().start()
    store = NatsStore(NatsOptions(server.url))
    try:
        await store.start()
        assert await store.replayed(5)
        book = TicketBook(store, Policy())
        assert (await book.claim(book.new_ticket("old", "gpu", "m", 1000, True, {}, "h"),
                                 VIEW)).ok
        server.stop()
        shutil.rmtree(server.dir / "js")
        assert await _until(lambda: not store.connected, 10)
        assert set(book.known("gpu")[0].tickets) == {"old"}  # the outage's view
        server.start()
        assert await _until(lambda: store.connected, 10)  # (checked every 2 ms)
        assert book.known("gpu") == (TicketSet(), 0)
        # and a write finds the new server's set, not the old one's revision
        assert (await book.claim(book.new_ticket("new", "gpu", "m2", 1000, True, {}, "h"),
                                 VIEW)).ok
        assert set(await _stored(store)) == {"new"}
        await book.close()
    finally:
        await store.close()
        server.cleanup()


async def _until(check: Callable[[], bool], timeout_s: float) -> bool:
    for _ in range(int(timeout_s / 0.002)):
        if check():
            return True
        await asyncio.sleep(0.002)
    return check()


async def test_release_records_the_model_left_resident(store: StateStore) -> None:
    book = _book(store)
    t = book.new_ticket("c", "gpu", "new:14b", 5000, True, {}, "h")
    assert (await book.claim(t, VIEW)).ok
    await book.release(t, Residency(5000, 8192, time.time()))
    # The residency entry counts at once: only 1000 MiB are left beside idle:8b and new:14b.
    probe = book.new_ticket("q", "gpu", "x", 1001, True, {}, "h")
    assert not (await book.claim(probe, VIEW)).ok
    await book.mark_unloaded("gpu", {"new:14b": time.time(), "idle:8b": time.time()})
    assert (await book.claim(probe, VIEW)).ok
    # The probe still lists idle:8b, but it was unloaded after that probe: the view drops it.
    known = book.known("gpu")[0]
    assert not merge_residency(VIEW, known.residents).residents
    warm = book.new_ticket("w", "gpu", "idle:8b", 512, False, {}, "h")
    refused = await book.claim(warm, VIEW)
    assert not refused.ok and "neither loaded" in refused.reason


async def test_a_release_records_what_the_claim_found_beside_the_load(store: StateStore
                                                                       ) -> None:
    """The wide fleet soak's case: an 8b was decided with nothing seen beside it, and its
    claim found idle:8b's copy there (its ticket counts it); the release records that figure,
    not the decision's, so the copy goes on counting it (Resident.beside_mib) once the
    ticket is gone and whatever the probe first saw it with."""
    book = _book(store)
    t = book.new_ticket("c", "gpu", "new:8b", 3000, True, {}, "h")
    assert (await book.claim(t, VIEW)).ok
    beside = 4000 + RUNNER_OVERHEAD_MIB
    assert book.known("gpu")[0].tickets["c"].beside_mib == beside
    await book.release(t, Residency(3000, 8192, time.time()))
    assert book.known("gpu")[0].residents["new:8b"].beside == beside


class _Contested(MemoryStore):
    """A store whose writes wait for `gate`; the first after it loses to another writer."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.lose_next = False
        self.written: list[bytes] = []

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        if self.gate is not None:
            await self.gate.wait()
        if self.lose_next:
            self.lose_next = False
            await self.put(bucket, key, await self._value(bucket, key))  # the other writer
            raise CasConflict("another writer")
        revision = await super().cas(bucket, key, value, last_revision)
        self.written.append(value)
        return revision

    async def _value(self, bucket: str, key: str) -> bytes:
        entry = await self.get(bucket, key)
        assert entry is not None
        return entry.value


@pytest.mark.parametrize("unload", [False, True], ids=["kept", "keep_alive-0"])
async def test_a_load_is_in_every_set_written_until_its_release_records_the_copy(
        unload: bool) -> None:
    """The wide fleet soak's case: a load's call ends (its release records the copy, or with
    keep_alive 0 marks it leaving) while another write of the same set is in flight and
    loses a race. That write, retried, must not leave out the load's ticket before the copy
    is recorded: a set with neither let another sidecar plan a 32b beside a phi3 it could
    not see, and Ollama unloaded phi3."""
    store = _Contested()
    book = TicketBook(store, Policy(), ttl_s=60)
    load = book.new_ticket("a", "gpu", "new:8b", 3000, True, {}, "h")
    assert (await book.claim(load, VIEW)).ok
    store.gate, store.lose_next = asyncio.Event(), True
    other = asyncio.create_task(book.claim(book.new_ticket("b", "gpu", "idle:8b", 512, False,
                                                           {}, "h"), VIEW))
    await asyncio.sleep(0.01)  # its write waits at the gate
    loaded = Residency(3000, 8192, time.time())
    release = asyncio.create_task(book.release_to_unload(load, loaded) if unload else
                                  book.release(load, loaded))
    await asyncio.sleep(0.01)
    store.gate.set()
    assert (await other).ok
    if unload:
        assert await release  # nothing else names it: it may go
    else:
        assert (await release).ok
    for value in store.written:
        written = decode_ticket_set("gpu", value)
        assert "a" in written.tickets or "new:8b" in written.residents, written
    assert "a" not in book.known("gpu")[0].tickets


async def test_a_release_to_unload_records_it_only_when_no_other_ticket_names_the_model(
        store: StateStore) -> None:
    book = _book(store)
    mine = book.new_ticket("k0", "gpu", "idle:8b", 512, False, {}, "h")
    other = book.new_ticket("o", "gpu", "idle:8b", 512, False, {}, "h2")
    assert (await book.claim(mine, VIEW)).ok and (await book.claim(other, VIEW)).ok
    # keep_alive 0, but another call holds a ticket for the model (it may not have reached
    # Ollama yet): the model stays, and nobody may unload it.
    assert not await book.release_to_unload(mine)
    assert _residents(book)
    assert await book.release_to_unload(other)  # the last: marked leaving, unload now
    # Nobody joins the leaving copy (Ollama would reload it on memory no ticket holds)...
    late = book.new_ticket("w", "gpu", "idle:8b", 512, False, {}, "h3")
    refused = await book.claim(late, VIEW)
    assert not refused.ok and "neither loaded" in refused.reason
    # ...and its memory counts until it is seen gone: no other load lands on it meanwhile.
    (leaving,) = _residents(book)
    assert leaving.footprint_mib == 4000 and leaving.expires_at < time.time() + 1
    await book.mark_unloaded("gpu", {"idle:8b": time.time()})
    assert not _residents(book)


async def test_a_release_after_a_failure_marks_the_copy_leaving_whoever_holds_it(
        store: StateStore) -> None:
    """A copy whose engine failed a call goes (its runner closed, or a slot kept): the
    ticket's release and the mark are one write, so no call its release wakes joins it."""
    book = _book(store)
    cold = book.new_ticket("c", "gpu", "new:3b", 3000, True, {}, "h")
    joining = book.new_ticket("j", "gpu", "new:3b", 512, False, {}, "h2")
    assert (await book.claim(cold, VIEW)).ok and (await book.claim(joining, VIEW)).ok
    await book.release_leaving(cold)
    assert set(book.known("gpu")[0].tickets) == {joining.ticket_id}
    merged = {r.model: r for r in _residents(book)}
    assert merged["new:3b"].leaving and merged["new:3b"].footprint_mib == 3000
    late = book.new_ticket("w", "gpu", "new:3b", 512, False, {}, "h3")
    assert not (await book.claim(late, VIEW)).ok


async def test_a_copy_loaded_since_the_probe_counts_its_size_while_leaving(
        store: StateStore) -> None:
    book = _book(store)
    cold = book.new_ticket("c", "gpu", "new:3b", 3000, True, {}, "h")
    assert (await book.claim(cold, VIEW)).ok  # loaded after the probe: VIEW does not list it
    assert await book.release_to_unload(cold)
    merged = {r.model: r for r in _residents(book)}
    assert merged["new:3b"].leaving and merged["new:3b"].footprint_mib == 3000
    big = book.new_ticket("b", "gpu", "other:7b", 3500, True, {}, "h2")
    refused = await book.claim(big, VIEW)  # 4000 + 3000 leaving + 3500 > 10000 usable
    assert not refused.ok


async def test_a_copy_a_keep_alive_zero_call_loaded_is_recorded_when_others_keep_it(
        store: StateStore) -> None:
    book = _book(store)
    cold = book.new_ticket("c", "gpu", "new:3b", 3000, True, {}, "h")
    joining = book.new_ticket("j", "gpu", "new:3b", 512, False, {}, "h2")
    assert (await book.claim(cold, VIEW)).ok and (await book.claim(joining, VIEW)).ok
    # The loading call ends with keep_alive 0 while the other still uses the copy: it
    # stays, and every view must know it is there (the probe predates it).
    assert not await book.release_to_unload(cold, Residency(3000, 0, time.time()))
    merged = {r.model: r for r in _residents(book)}
    assert not merged["new:3b"].leaving and merged["new:3b"].footprint_mib == 3000


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


def _stored_now(store: MemoryStore) -> set[str]:
    """The embedded store's own copy, readable while the test has it 'down'."""
    return set(decode_ticket_set("gpu", store.view(PROVIDER_TICKETS)["gpu"].value).tickets)


async def test_a_release_stops_counting_at_once_and_is_written_shortly_after(
        store: StateStore) -> None:
    book = _book(store, release_delay_s=0.05)
    a = book.new_ticket("a", "gpu", "m1", 4000, True, {}, "h")
    b = book.new_ticket("b", "gpu", "m2", 1000, True, {}, "h")
    assert (await book.claim(a, VIEW)).ok and (await book.claim(b, VIEW)).ok
    assert (await book.release(a)).ok
    assert set(book.known("gpu")[0].tickets) == {"b"}  # free here at once
    assert set(await _stored(store)) == {"a", "b"}  # the other sidecars learn it shortly
    await asyncio.sleep(0.2)
    assert set(await _stored(store)) == {"b"} and not book.owes("gpu")
    await book.close()



async def test_a_release_after_its_ticket_expired_deletes_the_load_its_claim_recorded(
        store: StateStore) -> None:
    book = _book(store, ttl_s=0.3, release_delay_s=0.05)
    assert (await book.claim(book.new_ticket("a", "gpu", "m", 6000, True, {}, "h"), VIEW)).ok
    await asyncio.sleep(0.4)  # not renewed: the ticket expired, so its load counts alone
    live = book.known("gpu")[0].live(time.time())
    assert [r.model for r in merge_recorded(VIEW, live).residents] == ["idle:8b", "m"]
    await book.release(book.new_ticket("a", "gpu", "m", 6000, True, {}, "h"))
    await asyncio.sleep(0.2)
    entry = await store.get(PROVIDER_TICKETS, "gpu")
    assert entry is not None and decode_ticket_set("gpu", entry.value).loads == {}
    assert not book.owes("gpu")
    await book.close()

async def test_a_claim_after_a_release_carries_it_in_one_write(store: StateStore) -> None:
    book = _book(store, release_delay_s=10)
    a = book.new_ticket("a", "gpu", "m1", 6000, True, {}, "h")
    assert (await book.claim(a, VIEW)).ok
    before = await store.get(PROVIDER_TICKETS, "gpu")
    await book.release(a)
    c = book.new_ticket("c", "gpu", "m3", 6000, True, {}, "h")
    assert (await book.claim(c, VIEW)).ok  # room only the release frees
    after = await store.get(PROVIDER_TICKETS, "gpu")
    assert before is not None and after is not None
    assert set(await _stored(store)) == {"c"} and not book.owes("gpu")
    if isinstance(store, MemoryStore):  # NATS revisions count the whole bucket's writes
        assert after.revision == before.revision + 1
    await book.close()


async def test_a_release_the_store_missed_is_written_when_it_is_back() -> None:
    store = OutageStore()
    book = TicketBook(store, Policy(), release_delay_s=0.01)
    a = book.new_ticket("a", "gpu", "m1", 4000, True, {}, "h")
    b = book.new_ticket("b", "gpu", "m2", 1000, True, {}, "h")
    assert (await book.claim(a, VIEW)).ok and (await book.claim(b, VIEW)).ok
    store.down = True
    assert (await book.release(a)).ok
    await asyncio.sleep(0.1)  # the delayed write failed
    assert set(book.known("gpu")[0].tickets) == {"b"} and book.owes("gpu")
    assert _stored_now(store) == {"a", "b"}
    store.down = False
    store.changes.bump()  # what the NATS adapter does on reconnecting
    await asyncio.sleep(0.1)
    assert _stored_now(store) == {"b"} and not book.owes("gpu")
    await book.close()


async def test_a_release_that_changes_residents_is_written_at_once() -> None:
    """And when that write fails (the store away), the copy it recorded is counted here at
    once and written with the ticket's removal once the store is back: not left to a probe,
    which while the store is away wakes no waiting call of other sidecars."""
    store = OutageStore()
    book = _book(store)
    a = book.new_ticket("a", "gpu", "new:14b", 4000, True, {}, "h")
    assert (await book.claim(a, VIEW)).ok
    store.down = True
    left = Residency(4000, 8192, time.time())
    with pytest.raises(StoreUnavailable):
        await book.release(a, left)
    known = book.known("gpu")[0]
    assert not known.tickets  # still free here
    assert known.residents == {"new:14b": left}  # and its copy counted
    store.down = False
    await book.settle("gpu")
    assert _stored_now(store) == set()
    stored = decode_ticket_set("gpu", store.view(PROVIDER_TICKETS)["gpu"].value)
    assert stored.residents["new:14b"].context_length == 8192
    assert book.known("gpu")[0].residents["new:14b"].context_length == 8192
    await book.close()


async def test_a_burst_of_claims_fits_the_budget_exactly(store: StateStore) -> None:
    book = _book(store)
    tickets = [book.new_ticket(f"t{i}", "gpu", f"m{i}", 1000, True, {}, "h") for i in range(20)]
    results = await asyncio.gather(*(book.claim(t, VIEW) for t in tickets))
    assert sum(r.ok for r in results) == 6  # 6000 MiB free, whatever the batching
    assert len(await _stored(store)) == 6


async def test_claims_queued_behind_a_write_go_out_together(nats_server: NatsServer) -> None:
    await empty_buckets(nats_server.url)
    store = NatsStore(NatsOptions(nats_server.url))
    await store.start()
    assert await store.replayed(5)
    try:
        book = _book(store)
        first = book.new_ticket("first", "gpu", "m", 1, True, {}, "h")
        assert (await book.claim(first, VIEW)).ok
        before = (await store.get(PROVIDER_TICKETS, "gpu"))
        tickets = [book.new_ticket(f"t{i}", "gpu", f"m{i}", 100, True, {}, "h")
                   for i in range(20)]
        assert all(r.ok for r in await asyncio.gather(*(book.claim(t, VIEW) for t in tickets)))
        after = await store.get(PROVIDER_TICKETS, "gpu")
        assert before is not None and after is not None
        assert after.revision - before.revision <= 3  # 1 write for the first, 1-2 for the rest
        assert len(await _stored(store)) == 21
    finally:
        await store.close()


class GatedStore(MemoryStore):
    """Writes wait at a gate, so a test can cancel a writer mid-flight."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        await self.gate.wait()
        return await super().cas(bucket, key, value, last_revision)


async def test_a_cancelled_writer_hands_the_queued_changes_on() -> None:
    store = GatedStore()
    book = _book(store)

    def claim(name: str) -> asyncio.Task[object]:
        return asyncio.create_task(book.claim(book.new_ticket(name, "gpu", name, 100, True, {},
                                                              "h"), VIEW))

    async def settle() -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    x = claim("x")  # writing, held at the gate
    await settle()
    a, b, c = claim("a"), claim("b"), claim("c")  # queued behind it
    await settle()
    a.cancel()  # leaves the queue
    x.cancel()  # a writer takes b and c on
    await settle()
    store.gate.set()
    results = await asyncio.wait_for(asyncio.gather(b, c), 2)
    assert all(getattr(r, "ok", False) for r in results)
    assert set(await _stored(store)) == {"b", "c"}


async def _stored(store: StateStore) -> dict[str, object]:
    """The tickets in the store itself (not a mirror that may lag)."""
    entry = await store.get(PROVIDER_TICKETS, "gpu")
    return dict(decode_ticket_set("gpu", entry.value if entry else None).tickets)


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
    assert await store.replayed(5)
    book = TicketBook(store, Policy(), ttl_s=1.0)
    ticket = book.new_ticket("held-by-a-dead-process", "gpu", "m", 6000, True, {}, "doomed")
    assert (await book.claim(ticket, ProviderView("gpu", 12048))).ok
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
        assert holder.stdout is not None
        lines = iter(holder.stdout.readline, "")
        assert any(line.strip() == "claimed" for line in lines)  # (past any log lines)
        holder.send_signal(signal.SIGKILL)  # no finally, no release
        holder.wait(10)
    finally:
        holder.kill()

    async def claim_after_kill() -> tuple[bool, bool, float]:
        store = NatsStore(NatsOptions(nats_server.url))
        await store.start()
        assert await store.replayed(5)
        book = TicketBook(store, Policy(), ttl_s=60)
        # A probe after the kill lists the copy the dead holder loaded, idle.
        view = ProviderView("gpu", 12048, residents=(Resident("m", 6000),),
                            probed_at=time.time())
        ticket = book.new_ticket("survivor", "gpu", "m2", 6000, True, {"m": 6000}, "alive")
        at_once = (await book.claim(ticket, view)).ok
        entry = await store.get(PROVIDER_TICKETS, "gpu")
        assert entry is not None
        dead = decode_ticket_set("gpu", entry.value).tickets["held-by-a-dead-process"]
        wait_s = dead.expires_at - time.time()
        await asyncio.sleep(max(0.0, wait_s) + 0.05)  # expiry is silent: sleep to it once
        later = (await book.claim(ticket, view)).ok
        await store.close()
        return at_once, later, wait_s

    at_once, later, wait_s = asyncio.run(claim_after_kill())
    assert not at_once  # the dead holder's call still counted right after the kill...
    assert later and wait_s <= 1.0  # ... and stopped counting at its 1 s TTL: its copy goes
