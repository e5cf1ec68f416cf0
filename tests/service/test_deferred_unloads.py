"""An unload asked while the shared store is unreachable (a call's keep_alive 0): the other
sidecars could not be told the copy leaves, so it is carried out once the store answers
again, unless a call holds or waits for the copy by then."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from proxy.adapters.memory_kv import MemoryStore
from proxy.ports import SIDECAR_BUCKETS, StoreUnavailable
from tests.service.fakes import Answer
from tests.service.harness import Fleet


class Outage(MemoryStore):
    """The embedded store, unreachable while `away`."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(SIDECAR_BUCKETS, clock=fleet.clock)
        self.away = False

    @property
    def connected(self) -> bool:
        return not self.away

    def back(self) -> None:
        self.away = False
        self.changes.bump()

    async def put(self, bucket: str, key: str, value: bytes) -> int:
        if self.away:
            raise StoreUnavailable("NATS is not connected")
        return await super().put(bucket, key, value)

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        if self.away:
            raise StoreUnavailable("NATS is not connected")
        return await super().cas(bucket, key, value, last_revision)


async def test_a_keep_alive_0_call_during_an_outage_unloads_a_second_after_it(
        fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=24564)
    gpu.preload("qwen3:8b")
    store = Outage(fleet)
    sidecar = await fleet.sidecar(store)
    store.away = True
    r = await sidecar.chat("qwen3:8b", keep_alive_0=True)
    assert (r.status, r.placement) == (200, "warm")
    await asyncio.sleep(30)
    assert list(gpu.loaded) == ["qwen3:8b"]  # the others could not be told
    store.back()
    await asyncio.sleep(0.5)
    assert list(gpu.loaded) == ["qwen3:8b"]
    await asyncio.sleep(1.5)
    assert list(gpu.loaded) == []


@pytest.mark.parametrize("use", ["running", "waited for"])
async def test_a_deferred_unload_leaves_a_copy_a_call_runs_on_or_waits_for(
        fleet: Fleet, use: Literal["running", "waited for"]) -> None:
    """The call running began before the keep_alive-0 one (so it did not keep the copy by
    its own keep_alive); the waiter came after the outage."""
    gpu = fleet.gpu("gpu", total_vram_mib=24564, num_parallel=2)
    gpu.preload("qwen3:8b")
    store = Outage(fleet)
    sidecar = await fleet.sidecar(store)
    store.away = True
    if use == "running":
        gpu.script(Answer(seconds=60))
        running = sidecar.start_chat("qwen3:8b")
        await asyncio.sleep(1)
    r = await sidecar.chat("qwen3:8b", keep_alive_0=True)
    assert (r.status, r.placement) == (200, "warm")
    store.back()
    if use == "waited for":
        waiter = await sidecar.services.demand.waiting("qwen3:8b")
    await asyncio.sleep(5)
    assert list(gpu.loaded) == ["qwen3:8b"]
    if use == "running":
        assert not running.done()
        assert (await running).status == 200
    else:
        await sidecar.services.demand.done_waiting(waiter)
    await asyncio.sleep(5)
    assert list(gpu.loaded) == ["qwen3:8b"]  # dropped, not carried out once the call left


class Failing(Outage):
    """Still connected as far as the client knows, yet every write fails: the first moments
    of an outage, before the connection is seen lost."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(fleet)
        self.failing = False

    async def put(self, bucket: str, key: str, value: bytes) -> int:
        if self.failing:
            raise StoreUnavailable("nats: timeout")
        return await super().put(bucket, key, value)

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        if self.failing:
            raise StoreUnavailable("nats: timeout")
        return await super().cas(bucket, key, value, last_revision)


async def test_a_keep_alive_0_call_whose_release_finds_the_store_gone_is_deferred(
        fleet: Fleet) -> None:
    """Claimed in the shared book, its release (the write that marks the copy leaving) fails:
    the unload is carried out once the store answers again, as one asked during it."""
    gpu = fleet.gpu("gpu", total_vram_mib=24564)
    gpu.preload("qwen3:8b")
    store = Failing(fleet)
    sidecar = await fleet.sidecar(store)
    gpu.script(Answer(seconds=5))
    call = sidecar.start_chat("qwen3:8b", keep_alive_0=True)
    await asyncio.sleep(1)
    store.failing = True  # the call is running on a ticket in the shared book
    r = await call
    assert (r.status, r.placement) == (200, "warm")
    await asyncio.sleep(1)
    assert list(gpu.loaded) == ["qwen3:8b"]  # the others could not be told
    store.failing = False
    await asyncio.sleep(3)
    assert list(gpu.loaded) == []
