"""Held plans: taken by their thread's first call, released, replaced, bounded in number
and in memory, reaped when unused, and a wait behind them ends at its limit. The decisions
of tests/e2e/test_scheduling.py and test_bounded_waits_and_plans.py, on fakes."""

from __future__ import annotations

import asyncio
import time

from proxy.core.tokens import PromptSize
from proxy.service.plans import PLAN_TTL_S
from proxy.service.routing import Attempt, CallOutcome, CallRequest
from tests.service.harness import Fleet, Sidecar


async def test_a_held_plan_is_taken_by_the_first_call_of_its_thread(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=24564)
    sidecar = await fleet.sidecar()
    plan = await sidecar.plan("t-1", "qwen3:14b")
    assert plan["planned"] and plan["placement"] == "cold"
    await asyncio.sleep(30)
    assert "qwen3:14b" in gpu.loaded  # the load started at once
    assert list(sidecar.services.plans.plans) == ["t-1"] and len(sidecar.tickets()) == 1
    r = await sidecar.chat("qwen3:14b", thread="t-1")
    assert (r.status, r.placement) == (200, "held")
    assert gpu.stats.loads == 1 and not sidecar.tickets()
    again = await sidecar.plan("t-2", "qwen3:14b")
    assert again["placement"] == "warm"
    assert await sidecar.services.plans.release("t-2")
    assert not sidecar.tickets()


async def test_a_plan_without_a_prompt_size_says_what_it_assumed(fleet: Fleet) -> None:
    fleet.gpu("gpu", total_vram_mib=24564, context_length=2048)
    sidecar = await fleet.sidecar()
    refused = await sidecar.plan("t-1", "qwen3:8b", prompt_chars=None)
    assert (refused["planned"], refused["outcome"]) == (False, "prompt-too-large")
    assert "no promptChars was given: a prompt of 16000 characters" in refused["reason"]
    assert (await sidecar.plan("t-1", "qwen3:8b", prompt_chars=2000))["planned"]


async def test_a_plan_on_a_copy_that_went_away_is_not_taken(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", num_parallel=2)
    sidecar = await fleet.sidecar(probe_interval_seconds=1)
    assert (await sidecar.chat("qwen3:8b")).status == 200
    plan = await sidecar.plan("t-1", "qwen3:8b")
    assert plan["placement"] == "warm"  # its ticket holds a call's share, not a load
    await gpu.unload("qwen3:8b")  # someone unloads it on the GPU itself
    await asyncio.sleep(2)  # the next probe sees it gone
    r = await sidecar.chat("qwen3:8b", thread="t-1")
    assert (r.status, r.placement) == (200, "cold")  # placed afresh: the load is claimed
    assert gpu.stats.loads == 2
    assert not sidecar.services.plans.plans and not sidecar.tickets()  # the plan's released


async def test_an_agent_holds_a_bounded_number_of_plans(fleet: Fleet) -> None:
    fleet.gpu("gpu", total_vram_mib=49140, context_length=2048)
    sidecar = await fleet.sidecar(max_plans=2)
    assert (await sidecar.plan("t1", "qwen3:8b"))["planned"]
    assert (await sidecar.plan("t2", "llama3.2:3b"))["planned"]
    assert (await sidecar.plan("t2", "phi3:mini"))["planned"]  # replaces t2's: still two
    assert len(sidecar.tickets()) == 2
    refused = await sidecar.plan("t3", "qwen3:8b")
    assert not refused["planned"] and refused["refusal"] == "plan-limit"
    assert "KUBEMOOT_MAX_PLANS" in refused["reason"]
    await sidecar.services.plans.release("t1")
    assert (await sidecar.plan("t3", "qwen3:8b"))["planned"]


async def test_plans_take_at_most_a_share_of_the_fleets_memory(fleet: Fleet) -> None:
    """One agent cannot hold the fleet through plans: a fifth of 21616 MiB is 4323 MiB (the
    first plan may take more)."""
    fleet.gpu("gpu", total_vram_mib=24564, context_length=2048)
    sidecar = await fleet.sidecar(plan_memory_share=0.2)
    assert (await sidecar.plan("first", "qwen3:8b"))["planned"]  # ~5.7 GiB, alone
    refused = await sidecar.plan("big", "llama3.2:3b")
    assert not refused["planned"] and refused["refusal"] == "plan-memory"
    assert "KUBEMOOT_PLAN_MEMORY_SHARE" in refused["reason"]
    assert len(sidecar.tickets()) == 1


async def test_an_unused_plan_is_released_after_its_ttl(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=24564)
    sidecar = await fleet.sidecar()
    assert (await sidecar.plan("t-1", "qwen3:14b"))["planned"]
    await asyncio.sleep(PLAN_TTL_S - 10)
    assert len(sidecar.tickets()) == 1  # renewed while held
    await asyncio.sleep(20)
    assert not sidecar.services.plans.plans and not sidecar.tickets()
    assert sidecar.residents("gpu") == ["qwen3:14b"] and "qwen3:14b" in gpu.loaded


async def test_a_call_waiting_behind_held_plans_answers_at_its_limit_without_spinning(
        fleet: Fleet) -> None:
    fleet.gpu("gpu", total_vram_mib=24564, context_length=4096)
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=30, plan_memory_share=1.0)
    assert (await sidecar.plan("a", "qwen3:32b"))["planned"]  # 21224 of 21616 MiB held
    before = sidecar.decisions()
    started = asyncio.get_running_loop().time()
    r = await sidecar.chat("phi3:mini")  # no room beside the plan, and nothing to evict
    assert (r.status, r.reason) == (503, "gpu-busy")
    assert r.refusal is not None and r.refusal.retry_after_s
    assert 30 <= asyncio.get_running_loop().time() - started < 31
    # Woken by changes (the plan's renewals), not re-placed over and over.
    assert sidecar.decisions() - before < 40


async def test_a_plans_call_goes_to_its_card_only_once_the_victims_are_gone(
        fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b", "phi3:mini")
    gpu.unload_gap_s = 3.0  # Ollama unloads one copy at a time: the second 3 s later
    sidecar = await fleet.sidecar()
    plan = await sidecar.plan("t-1", "qwen3:14b")
    assert plan["evicts"] == ["phi3:mini", "qwen3:8b"]
    loaded_when_sent: list[list[str]] = []
    sent = gpu.open

    async def open_(path: str, payload: bytes) -> object:
        loaded_when_sent.append(sorted(gpu.loaded))
        return await sent(path, payload)

    gpu.open = open_  # type: ignore[method-assign]
    await asyncio.sleep(0.5)  # the first victim has gone, the second has not
    r = await sidecar.chat("qwen3:14b", thread="t-1")
    assert (r.status, r.placement) == (200, "held")
    # Sent earlier, Ollama would have unloaded the 8b itself to load the 14b.
    assert loaded_when_sent[0] in ([], ["qwen3:14b"])
    assert not sidecar.tickets()


async def test_victims_of_a_plan_released_while_they_leave_are_not_joined(
        fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b", "phi3:mini")
    gpu.unload_gap_s = 3.0
    sidecar = await fleet.sidecar()
    plan = await sidecar.plan("t-1", "qwen3:14b")
    assert plan["evicts"] == ["phi3:mini", "qwen3:8b"]
    await asyncio.sleep(0.5)
    assert "qwen3:8b" in gpu.loaded  # asked to go: Ollama unloads it next
    assert await sidecar.services.plans.release("t-1")
    # The plan's ticket is gone, but the copy Ollama is unloading is not counted warm: a
    # call joining it would have Ollama reload it with no ticket holding its memory.
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.placement) == (200, "cold")
    assert gpu.stats.loads == 3  # the two preloaded, then the 8b again (no 14b: abandoned)
    await asyncio.sleep(10)
    assert not sidecar.tickets()


async def _leave_during_the_plans_load(sidecar: Sidecar, thread: str,
                                       unloads_after: bool = False) -> None:
    """The thread's call takes its plan while the plan's preload runs, then its agent
    leaves before the answer began (the relay's outcome for a client gone)."""
    calls = sidecar.services.calls
    call = CallRequest("/api/chat", "qwen3:14b", "mulling", thread=thread,
                       prompt=PromptSize(100), unloads_after=unloads_after)
    attempts = calls.attempts(call, time.perf_counter(), None)
    placed = await attempts.first()
    assert isinstance(placed, Attempt) and placed.placement == "held"
    await attempts.settle(CallOutcome(False, 0.5, client_left=True, began=False))


async def test_a_keep_alive_0_call_leaving_a_kept_preload_leaves_the_copy_to_its_waiter(
        fleet: Fleet) -> None:
    """The plan's preload goes on for a call waiting for the copy (one slot, the plan's);
    the thread's call, sent with keep_alive 0, leaves during the load: the copy stays for
    the waiter. It was unloaded (no ticket held it) and loaded again for the waiter, as
    Ollama does when the load's requester leaves (server/sched.go:733-739)."""
    gpu = fleet.gpu("gpu", total_vram_mib=24564, num_parallel=1)
    sidecar = await fleet.sidecar()
    assert (await sidecar.plan("t-1", "qwen3:14b"))["planned"]
    waiter = sidecar.start_chat("qwen3:14b")
    await asyncio.sleep(0.5)
    assert gpu.stats.loads == 1 and not gpu.stats.calls  # the load runs, the call waits
    await _leave_during_the_plans_load(sidecar, "t-1", unloads_after=True)
    r = await waiter
    assert (r.status, gpu.stats.loads, gpu.stats.unloads) == (200, 1, 0), r.placement
    assert sidecar.residents("gpu") == ["qwen3:14b"] and not sidecar.tickets()


async def test_a_kept_preload_counts_a_waiter_of_another_model_that_could_run_on_it(
        fleet: Fleet) -> None:
    """As above, the waiting call preferring the 32b (which fits no card) with the 14b as a
    candidate: it waits in the 32b's line, and the preload goes on for it. It was aborted
    (nobody waited for the 14b by name) and the 14b loaded again for the waiter."""
    gpu = fleet.gpu("gpu", total_vram_mib=16384, num_parallel=1)
    sidecar = await fleet.sidecar(model_candidates_mulling=(
        '[{"model": "qwen3:32b", "score": 70}, {"model": "qwen3:14b", "score": 65}]'))
    assert (await sidecar.plan("t-1", "qwen3:14b"))["planned"]
    waiter = sidecar.start_chat("qwen3:32b")
    await asyncio.sleep(0.5)
    assert gpu.stats.loads == 1 and not gpu.stats.calls  # the load runs, the call waits
    await _leave_during_the_plans_load(sidecar, "t-1", unloads_after=True)
    r = await waiter
    assert (r.status, r.last.model) == (200, "qwen3:14b")
    assert (gpu.stats.loads, gpu.stats.aborted_loads, gpu.stats.unloads) == (1, 0, 0)


async def test_a_preload_is_not_kept_for_a_waiter_its_copy_cannot_serve(
        fleet: Fleet) -> None:
    """The plan loads qwen3:14b at 4096 tokens; a call of that model asking for num_ctx 8192
    waits (the card's one slot is the plan's). The thread's call leaves during the load:
    nobody could run on that copy, so its load is aborted and the waiter loads its own.
    It was kept for the waiter, which then had it unloaded to load the 8192 one."""
    gpu = fleet.gpu("gpu", total_vram_mib=49140, num_parallel=1, context_length=4096)
    sidecar = await fleet.sidecar()
    assert (await sidecar.plan("t-1", "qwen3:14b"))["placement"] == "cold"
    waiter = sidecar.start_chat("qwen3:14b", prompt_chars=20000, num_ctx=8192)
    await asyncio.sleep(0.5)
    assert not gpu.stats.calls and gpu.loaded["qwen3:14b"].num_ctx == 4096
    await _leave_during_the_plans_load(sidecar, "t-1")
    r = await waiter
    assert (r.status, r.last.num_ctx) == (200, 8192)
    assert (gpu.stats.loads, gpu.stats.aborted_loads, gpu.stats.unloads) == (2, 1, 0)


async def test_a_victim_whose_unload_was_never_asked_stays_for_its_next_call(
        fleet: Fleet) -> None:
    """The plan's first unload takes a second to be answered; the plan is released
    meanwhile. The victim it asked for goes (Ollama unloads it anyway); the other, never
    asked, stays warm and the next call of it joins it. It was asked for after the release
    and loaded again for that call."""
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b", "phi3:mini")
    sidecar = await fleet.sidecar()
    asked: list[str] = []
    unload = gpu.unload

    async def slow_unload(model: str) -> None:
        asked.append(model)
        await asyncio.sleep(1.0 if len(asked) == 1 else 0.0)  # (the first's round trip)
        await unload(model)

    gpu.unload = slow_unload  # type: ignore[method-assign]
    plan = await sidecar.plan("t-1", "qwen3:14b")
    assert plan["evicts"] == ["phi3:mini", "qwen3:8b"]
    await asyncio.sleep(0.5)
    assert await sidecar.services.plans.release("t-1")
    await asyncio.sleep(2)
    assert sorted(gpu.loaded) == ["qwen3:8b"] and asked.count("qwen3:8b") == 0
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.placement, gpu.stats.loads) == (200, "warm", 2)
    assert not sidecar.tickets()
