"""An unload asked while the shared store is unreachable (a call's keep_alive 0): the other
sidecars could not be told the copy leaves, so it is carried out once the store answers
again, unless a call holds or waits for the copy by then."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from tests.service.fakes import Answer, AwayStore
from tests.service.harness import Fleet


async def test_a_keep_alive_0_call_during_an_outage_unloads_a_second_after_it(
        fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=24564)
    gpu.preload("qwen3:8b")
    store = AwayStore(fleet.clock)
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
    store = AwayStore(fleet.clock)
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


async def test_a_keep_alive_0_call_whose_release_finds_the_store_gone_is_deferred(
        fleet: Fleet) -> None:
    """Claimed in the shared book, its release (the write that marks the copy leaving) fails:
    the unload is carried out once the store answers again, as one asked during it."""
    gpu = fleet.gpu("gpu", total_vram_mib=24564)
    gpu.preload("qwen3:8b")
    store = AwayStore(fleet.clock)
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
