"""The embedded store and NATS JetStream KV pass the same contract tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.js.kv
import pytest

from loadtest.nats_server import NatsServer
from proxy.adapters.memory_kv import MemoryStore
from proxy.adapters.nats_kv import NatsOptions, NatsStore, ReplayEnd, ensure_buckets
from proxy.ports import (
    BINDINGS,
    BUCKETS,
    MODEL_DEMAND,
    PROVIDER_STATE,
    BucketSpec,
    CasConflict,
    StateStore,
    StoreUnavailable,
)
from tests.integration.conftest import empty_buckets

SHORT = BucketSpec("kubemoot_test_short", ttl_s=1.0)


@pytest.fixture(params=["memory", "nats"])
async def store(request: pytest.FixtureRequest, nats_server: NatsServer
                ) -> AsyncIterator[StateStore]:
    buckets = (*BUCKETS, SHORT)
    if request.param == "memory":
        yield MemoryStore(buckets)
        return
    await empty_buckets(nats_server.url, [b.name for b in buckets])
    nats_store = NatsStore(NatsOptions(nats_server.url), buckets)
    await nats_store.start()
    assert await nats_store.replayed(5)  # (the replays' ends bump the change counter)
    yield nats_store
    await nats_store.close()


async def _until(check, timeout_s: float = 3.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if check():
            return True
        await asyncio.sleep(0.005)
    return bool(check())


async def test_put_get_and_revisions(store: StateStore) -> None:
    assert await store.get(PROVIDER_STATE, "a") is None
    r1 = await store.put(PROVIDER_STATE, "a", b"one")
    r2 = await store.put(PROVIDER_STATE, "a", b"two")
    assert r2 > r1
    entry = await store.get(PROVIDER_STATE, "a")
    assert entry is not None and entry.value == b"two" and entry.revision == r2


async def test_compare_and_set_conflicts(store: StateStore) -> None:
    rev = await store.cas(PROVIDER_STATE, "k", b"v1", 0)  # 0: must be absent
    with pytest.raises(CasConflict):
        await store.cas(PROVIDER_STATE, "k", b"again", 0)
    rev2 = await store.cas(PROVIDER_STATE, "k", b"v2", rev)
    with pytest.raises(CasConflict):
        await store.cas(PROVIDER_STATE, "k", b"stale", rev)
    assert (await store.get(PROVIDER_STATE, "k")).value == b"v2"  # type: ignore[union-attr]
    await store.delete(PROVIDER_STATE, "k")
    assert await store.get(PROVIDER_STATE, "k") is None
    assert await store.cas(PROVIDER_STATE, "k", b"v3", 0) > rev2  # re-create after delete


async def test_view_mirrors_writes_and_deletes(store: StateStore) -> None:
    before = store.version(PROVIDER_STATE)
    await store.put(PROVIDER_STATE, "m", b"x")
    assert await _until(lambda: "m" in store.view(PROVIDER_STATE))
    written = store.version(PROVIDER_STATE)
    assert written > before
    await store.delete(PROVIDER_STATE, "m")
    assert await _until(lambda: "m" not in store.view(PROVIDER_STATE))
    assert store.version(PROVIDER_STATE) > written


async def test_change_counter_wakes_waiters(store: StateStore) -> None:
    seen = store.changes.value
    waiter = asyncio.create_task(store.changes.wait_past(seen, 5.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await store.put(PROVIDER_STATE, "wake", b"1")
    assert await asyncio.wait_for(waiter, 3.0)
    assert not await store.changes.wait_past(store.changes.value, 0.05)  # times out


async def test_a_refresh_in_a_quiet_bucket_wakes_nobody(store: StateStore) -> None:
    """A wait entry going, an intent coming or going wake waiters; a wait entry coming
    (it frees nothing) or rewritten (its refresh, a use count) does not, so N waiting calls
    do not make N^2 decisions."""
    async def wakes(write: Any) -> bool:
        seen = store.changes.value
        await write()
        return await store.changes.wait_past(seen, 0.3)

    before = store.version(MODEL_DEMAND)
    assert not await wakes(lambda: store.put(MODEL_DEMAND, "wait.m.a.1", b"1"))
    assert await _until(lambda: "wait.m.a.1" in store.view(MODEL_DEMAND))
    assert store.version(MODEL_DEMAND) > before  # the view moves
    assert not await wakes(lambda: store.put(MODEL_DEMAND, "wait.m.a.1", b"2"))
    assert await wakes(lambda: store.delete(MODEL_DEMAND, "wait.m.a.1"))
    assert await wakes(lambda: store.put(MODEL_DEMAND, "intent.m.a", b"1"))
    await store.put(PROVIDER_STATE, "p", b"1")
    assert await _until(lambda: "p" in store.view(PROVIDER_STATE))
    assert await wakes(lambda: store.put(PROVIDER_STATE, "p", b"2"))


async def test_a_wait_going_wakes_though_a_refresh_follows_it(store: StateStore) -> None:
    """The watch delivers the two in one burst; the refresh, last, wakes nobody itself."""
    missed = 0
    for n in range(20):
        await store.put(MODEL_DEMAND, "wait.m.a.1", b"1")
        assert await _until(lambda: "wait.m.a.1" in store.view(MODEL_DEMAND))
        await asyncio.sleep(0.02)
        seen = store.changes.value
        await asyncio.gather(store.delete(MODEL_DEMAND, "wait.m.a.1"),
                             store.put(MODEL_DEMAND, "use.m.a", b"%d" % n))
        assert await _until(lambda: (e := store.view(MODEL_DEMAND).get("use.m.a")) is not None
                            and e.value == b"%d" % n)  # noqa: B023
        missed += not await store.changes.wait_past(seen, 0.05)
    assert missed == 0, f"{missed} of 20 waits going woke nobody"


async def test_entries_expire_after_the_bucket_ttl(store: StateStore) -> None:
    await store.put(SHORT.name, "gone", b"1")
    assert await store.get(SHORT.name, "gone") is not None
    written = store.version(SHORT.name)
    await asyncio.sleep(1.3)
    assert await store.get(SHORT.name, "gone") is None
    # NATS sends watchers no marker for max-age expiry: the view drops the entry itself
    assert "gone" not in store.view(SHORT.name)
    assert store.version(SHORT.name) > written  # the view moved on: readers recompute


async def test_keys_of_agents_that_left_leave_the_view_with_the_bucket_ttl(
        store: StateStore) -> None:
    """Every sidecar that ever wrote (a use count, a cache entry, per agent and model) must
    not stay in the views of those that run on: the view holds what the bucket holds."""
    for i in range(200):
        await store.put(SHORT.name, f"use.m.agent-{i}", b"1")
    assert await _until(lambda: len(store.view(SHORT.name)) == 200)
    await asyncio.sleep(1.3)
    await store.put(SHORT.name, "use.m.here", b"1")  # one written since stays
    assert await _until(lambda: set(store.view(SHORT.name)) == {"use.m.here"})


async def test_nats_store_recovers_when_the_server_returns_empty() -> None:
    import shutil

    server = NatsServer().start()
    store = NatsStore(NatsOptions(server.url))
    try:
        await store.start()
        await store.put(PROVIDER_STATE, "before", b"1")
        server.stop()
        shutil.rmtree(server.dir / "js")  # JetStream data lost with the old server
        server.start()
        for _ in range(20):  # each watch rebuild bumps the change counter
            seen = store.changes.value
            try:
                await store.put(PROVIDER_STATE, "after", b"2")  # the buckets were made again
                break
            except StoreUnavailable:
                await store.changes.wait_past(seen, 1.0)
        assert await _until(lambda: "after" in store.view(PROVIDER_STATE))
    finally:
        await store.close()
        server.cleanup()


async def test_a_watch_whose_consumer_is_gone_is_rebuilt_at_the_next_write(
        nats_server: NatsServer) -> None:
    """As when the node leading the bucket dies under a connection to another node: the
    connection stays up, the watch's consumer is gone, and nats-py notices only after two
    missed heartbeats (10 s)."""
    import nats

    await empty_buckets(nats_server.url, [PROVIDER_STATE])
    store = NatsStore(NatsOptions(nats_server.url))
    other = await nats.connect(nats_server.url)
    try:
        await store.start()
        assert await store.replayed(5)
        jsm = other.jetstream()
        stream = f"KV_{PROVIDER_STATE}"
        for consumer in await jsm.consumers_info(stream):
            await jsm.delete_consumer(stream, consumer.name)
        started = asyncio.get_running_loop().time()
        await store.put(PROVIDER_STATE, "mine", b"1")
        kv = await jsm.key_value(PROVIDER_STATE)
        await kv.put("theirs", b"2")
        assert await _until(lambda: "theirs" in store.view(PROVIDER_STATE), timeout_s=8)
        assert asyncio.get_running_loop().time() - started < 6  # 3 s late, then rebuilt
        assert await store.replayed(5)
    finally:
        await other.close()
        await store.close()


async def test_old_delete_markers_are_purged_and_nothing_else(nats_server: NatsServer) -> None:
    """A bucket without a max age (the bindings) keeps a marker per deleted key for good:
    a key per discussion ever bound, replayed by every watch begun."""
    await empty_buckets(nats_server.url, [BINDINGS])
    store = NatsStore(NatsOptions(nats_server.url), BUCKETS)
    await store.start()
    try:
        for i in range(200):
            await store.put(BINDINGS, f"thread.t{i}.mulling", b"{}")
            await store.delete(BINDINGS, f"thread.t{i}.mulling")
        await store.put(BINDINGS, "crew=2Fa", b"{}")
        await store.put(BINDINGS, "thread.t0.mulling", b"again")  # written since its delete
        assert await store.purge_deleted(BINDINGS, older_than_s=60) == 0  # too recent
        assert await store.purge_deleted(BINDINGS, older_than_s=0) == 199
        nc = await nats.connect(nats_server.url)
        info = await nc.jetstream().stream_info(f"KV_{BINDINGS}")
        await nc.close()
        assert info.state.messages == 2
        assert (await store.get(BINDINGS, "thread.t0.mulling")).value == b"again"  # type: ignore[union-attr]
        assert set(store.view(BINDINGS)) == {"crew=2Fa", "thread.t0.mulling"}
    finally:
        await store.close()


class _MarkerFirst:
    """A watch as nats-py yields it when the server has sent the whole replay before the
    client asked what was pending: its end marker first, then every replayed entry."""

    def __init__(self, watcher: Any) -> None:
        self._watcher = watcher
        self._marked: bool | str = False

    def __aiter__(self) -> _MarkerFirst:
        return self

    async def __anext__(self) -> Any:
        if not self._marked:
            self._marked = True
            return None
        if self._marked is True:
            self._marked = "late"
            await asyncio.sleep(0.1)  # the replay comes after the marker has been read
        entry = await self._watcher.__anext__()
        while entry is None:  # (its own marker, after the replay)
            entry = await self._watcher.__anext__()
        return entry

    async def stop(self) -> None:
        await self._watcher.stop()


@pytest.fixture
def marker_first(monkeypatch: pytest.MonkeyPatch) -> None:
    real_watch = nats.js.kv.KeyValue.watch

    async def watch(self: Any, *args: Any, **kwargs: Any) -> _MarkerFirst:
        return _MarkerFirst(await real_watch(self, *args, **kwargs))

    monkeypatch.setattr(nats.js.kv.KeyValue, "watch", watch)


async def _bindings_written(url: str, count: int, deleted: bool = False) -> None:
    """The bindings bucket anew, with keys k0.. written (and deleted) by another store."""
    await empty_buckets(url, [BINDINGS])
    writer = NatsStore(NatsOptions(url), BUCKETS)
    await writer.start()
    try:
        for i in range(count):
            await writer.put(BINDINGS, f"k{i}", b"{}")
            if deleted:
                await writer.delete(BINDINGS, f"k{i}")
    finally:
        await writer.close()


async def test_a_view_is_replayed_whole_when_the_end_marker_comes_first(
        nats_server: NatsServer, marker_first: None) -> None:
    """Read as replayed at that early marker, the view was empty while the bucket held
    tickets: a placement then saw every card free."""
    await _bindings_written(nats_server.url, 50)
    store = NatsStore(NatsOptions(nats_server.url), BUCKETS)
    await store.start()
    try:
        assert await store.replayed(5)
        assert len(store.view(BINDINGS)) == 50
        assert await store.purge_deleted(BINDINGS, older_than_s=0) == 0  # none, and ends
        await store.delete(BINDINGS, "k0")
        assert await store.purge_deleted(BINDINGS, older_than_s=0) == 1
    finally:
        await store.close()


async def test_an_empty_bucket_is_replayed_at_its_marker(
        nats_server: NatsServer, marker_first: None) -> None:
    await empty_buckets(nats_server.url, [BINDINGS])
    store = NatsStore(NatsOptions(nats_server.url), BUCKETS)
    await store.start()
    try:
        assert await store.replayed(5)
        assert store.view(BINDINGS) == {}
        assert await store.purge_deleted(BINDINGS, older_than_s=0) == 0
    finally:
        await store.close()


async def _marker_nats_py_skips(url: str, key: str) -> None:
    """A marker of a reason nats-py does not know (a newer server's): its watch skips it,
    so a replay whose last message it is never shows its entry with nothing pending."""
    client = await nats.connect(url)
    try:
        await ensure_buckets(client.jetstream(), BUCKETS)
        await client.jetstream().publish(f"$KV.{BINDINGS}.{key}", b"",
                                         headers={"Nats-Marker-Reason": "NewReason"})
    finally:
        await client.close()


async def test_a_bucket_of_skipped_markers_is_replayed(nats_server: NatsServer) -> None:
    """nats-py's end marker came first with nothing shown and the stream not empty: the
    view waited for an entry that never comes, and the sidecar never counted NATS up."""
    await empty_buckets(nats_server.url, [BINDINGS])
    await _marker_nats_py_skips(nats_server.url, "k0")
    store = NatsStore(NatsOptions(nats_server.url, timeout_s=0.5), BUCKETS)
    await store.start()
    try:
        assert await store.replayed(2)
        assert store.view(BINDINGS) == {}
        assert await asyncio.wait_for(store.purge_deleted(BINDINGS, older_than_s=0), 2) == 0
    finally:
        await store.close()


async def test_a_replay_ending_in_a_skipped_marker_ends(
        nats_server: NatsServer, marker_first: None) -> None:
    """Its end marker first, then entries all with more pending: the last was skipped."""
    await _bindings_written(nats_server.url, 3)
    await _marker_nats_py_skips(nats_server.url, "k9")
    store = NatsStore(NatsOptions(nats_server.url, timeout_s=0.5), BUCKETS)
    await store.start()
    try:
        assert await store.replayed(2)
        assert set(store.view(BINDINGS)) == {"k0", "k1", "k2"}
    finally:
        await store.close()


async def test_a_bucket_of_only_delete_markers_is_replayed(
        nats_server: NatsServer, marker_first: None) -> None:
    """nats-py shows delete and purge markers as entries: the last, with nothing pending
    after it, ends the replay even when the end marker came first."""
    await _bindings_written(nats_server.url, 3, deleted=True)
    store = NatsStore(NatsOptions(nats_server.url, timeout_s=5), BUCKETS)
    await store.start()
    try:
        assert await store.replayed(2)
        assert store.view(BINDINGS) == {}
    finally:
        await store.close()


class _Stalled:
    """A watch whose replay stopped coming (its connection lost)."""

    def __aiter__(self) -> _Stalled:
        return self

    async def __anext__(self) -> Any:
        await asyncio.Event().wait()


async def test_a_replay_cut_by_an_outage_does_not_end_as_quiet() -> None:
    """Ended as quiet, the part replayed replaced the whole view seen before the outage
    (the one placements use meanwhile): a replay goes quiet only while NATS is there."""
    reachable = False

    async def holds_nothing() -> bool:
        return False

    end = ReplayEnd(holds_nothing, 0.05, lambda: reachable)
    item = asyncio.ensure_future(anext(end.items(_Stalled())))
    await asyncio.sleep(0.3)  # six times as long as the replay may be quiet
    assert not item.done()
    reachable = True
    assert await asyncio.wait_for(item, 1) is None
    assert await end.at(None)
