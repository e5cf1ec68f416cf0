"""A wait for a slot expected to outlast what is left of the call's wait limit loses to a
load, even a dearer one (docs/rules.md, "Late binding"): the call is not refused gpu-busy
while an idle card could have loaded the model. With time enough, the cheaper wait stays."""

from __future__ import annotations

import asyncio

from tests.service.fakes import Answer, FakeModelServer
from tests.service.harness import Fleet, Sidecar

CALL_S = 5.0  # the 8b's calls on "busy", learned


async def busy_copy_beside_an_idle_card(fleet: Fleet, limit_s: float
                                        ) -> tuple[Sidecar, FakeModelServer]:
    """The 8b warm on "busy" (one slot), its calls learned to take 5 s, one of them 0.5 s
    in; "idle" has room for a copy. Waiting for the slot is expected to cost less than the
    load (explain says so)."""
    busy = fleet.gpu("busy", total_vram_mib=24564)
    idle = fleet.gpu("idle", total_vram_mib=24564)
    busy.preload("qwen3:8b")
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=limit_s)
    busy.script(*[Answer(seconds=CALL_S)] * 4)
    for _ in range(2):
        assert (await sidecar.chat("qwen3:8b")).provider == "busy"
    sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(0.5)
    explained = sidecar.services.scheduler.explain("mulling", "qwen3:8b", 100, None)
    assert explained is not None
    costs = {v.provider: v.cost_s for v in explained[1]}
    assert costs["busy"] < costs["idle"]
    return sidecar, idle


async def test_a_wait_longer_than_the_limit_left_loads_on_the_idle_card(fleet: Fleet) -> None:
    """The slot is 4.5 s away, the limit 4.4 s: the load (~6.1 s: the 1 s start-up and
    the 5200 MiB file at 1 GiB/s) starts the call within
    the wait plus the time left, so it is taken over a wait that would end in gpu-busy."""
    sidecar, idle = await busy_copy_beside_an_idle_card(fleet, limit_s=4.4)
    explained = sidecar.services.scheduler.explain("mulling", "qwen3:8b", 100, None)
    assert explained is not None
    decision, verdicts, _ = explained
    terms = {v.provider: v.terms for v in verdicts}
    assert terms["busy"]["queue"] == 4.5  # the call's own wait: it outlasts 4.4 s
    assert decision.placement is not None and decision.placement.provider == "idle"
    assert "(4.5 s) would outlast the 4.4 s left of its wait limit" in decision.reason
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.provider, r.placement, r.last.waited_ms) == (200, "idle", "cold", 0)
    assert idle.stats.loads == 1


async def test_a_load_much_slower_than_the_doomed_wait_is_not_taken(fleet: Fleet) -> None:
    """The same with 0.4 s left: the load (~6.1 s, 5.1 s less the provider weight's
    second) would start the call later than the wait (4.5 s) plus the time left; the call
    waits, and its limit ends it."""
    sidecar, idle = await busy_copy_beside_an_idle_card(fleet, limit_s=0.4)
    explained = sidecar.services.scheduler.explain("mulling", "qwen3:8b", 100, None)
    assert explained is not None and explained[0].outcome == "wait"
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.reason) == (503, "gpu-busy")
    assert idle.stats.loads == 0


async def test_with_time_enough_left_the_call_still_waits_for_the_slot(fleet: Fleet) -> None:
    sidecar, idle = await busy_copy_beside_an_idle_card(fleet, limit_s=10)
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.provider, r.placement) == (200, "busy", "warm")
    assert 4400 <= r.last.waited_ms <= 4600  # the running call's 4.5 s
    assert idle.stats.loads == 0


async def test_a_waiting_call_unloads_once_its_wait_would_outlast_what_is_left(
        fleet: Fleet) -> None:
    """The 8b's calls on "a" are learned to take 10 s; "b" is full with a 14b that is busy
    for 4 s. A call with an 8 s limit waits (step 5: nothing can be unloaded yet). When the
    14b's call ends, 4 s are left and a's slot is still 5.5 s away: rather than a gpu-busy at
    8 s, it unloads the idle 14b and loads the 8b on b."""
    a = fleet.gpu("a", total_vram_mib=24564)
    b = fleet.gpu("b", total_vram_mib=16376)
    a.preload("qwen3:8b")
    b.preload("qwen3:14b")
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=8)
    a.script(*[Answer(seconds=10)] * 3)
    b.script(Answer(seconds=4.5), Answer(seconds=1))
    for _ in range(2):
        assert (await sidecar.chat("qwen3:8b")).provider == "a"
    running = sidecar.start_chat("qwen3:8b")
    fourteen = sidecar.start_chat("qwen3:14b")
    await asyncio.sleep(0.5)
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.provider, r.placement, r.last.evicted) == (
        200, "b", "evict", ("qwen3:14b",))
    assert 3900 <= r.last.waited_ms <= 4100  # until the 14b's call ended
    assert (await fourteen).status == 200 and (await running).status == 200
