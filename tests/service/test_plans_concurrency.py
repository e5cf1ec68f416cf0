"""Plans made, taken and released at once for one thread, over a store with round trips:
nothing left behind, the limit kept, one call at most takes the plan."""

from __future__ import annotations

import asyncio

from tests.service.fakes import RoundTripStore
from tests.service.harness import Fleet


async def test_concurrent_creates_takes_and_releases_of_one_thread_leak_nothing(
        fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=24564, num_parallel=4, context_length=4096)
    gpu.preload("qwen3:8b")  # warm plans: no load is cancelled (the fake keeps those forever)
    sidecar = await fleet.sidecar(RoundTripStore(clock=fleet.clock), max_plans=2,
                                  discuss_gpu_wait_limit_seconds=20)
    plans = sidecar.services.plans
    work = [plans.create("t", "mulling", "qwen3:8b", 100) for _ in range(4)]
    work += [plans.create(f"o{i}", "mulling", "qwen3:8b", 100) for i in range(3)]
    work += [plans.release("t")]
    results = await asyncio.gather(*work)
    assert len(plans.plans) <= 2, results
    assert plans._creating == 0 and not plans._thread_locks
    calls = [sidecar.start_chat("qwen3:8b", thread="t") for _ in range(3)]
    answers = await asyncio.gather(*calls)
    assert [a.status for a in answers] == [200] * 3
    assert sum(a.placement == "held" for a in answers) <= 1
    for thread in list(plans.plans):
        await plans.release(thread)
    await asyncio.sleep(1)
    assert not sidecar.tickets() and not plans._thread_locks


async def test_a_cancelled_create_leaves_no_lock_and_no_count(fleet: Fleet) -> None:
    fleet.gpu("gpu", total_vram_mib=24564)
    sidecar = await fleet.sidecar(RoundTripStore(clock=fleet.clock))
    plans = sidecar.services.plans
    task = asyncio.ensure_future(plans.create("t", "mulling", "qwen3:8b", 100))
    waiter = asyncio.ensure_future(plans.release("t"))
    await asyncio.sleep(0.003)
    task.cancel()
    await asyncio.gather(task, waiter, return_exceptions=True)
    assert plans._creating == 0 and not plans._thread_locks
