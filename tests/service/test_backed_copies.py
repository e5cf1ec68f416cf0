"""A waiting call keeps from eviction every copy it could run on: its wait entry stays in its
preferred model's line, and names its other in-tolerance candidates that fit a card
(`also`), whose idle copies then go only when nothing else makes room, as a copy waited for
by name does (docs/rules.md, "Victims")."""

from __future__ import annotations

import asyncio

from proxy.core.types import WaitNeed
from tests.service.fakes import Answer
from tests.service.harness import Fleet

CANDIDATES = '[{"model": "qwen3:32b", "score": 70}, {"model": "qwen3:14b", "score": 65}]'


async def test_an_idle_copy_waiting_calls_could_run_on_is_not_the_victim_for_another_call(
        fleet: Fleet) -> None:
    """"big" (21.5 GiB) holds the 14b and the 8b, much used; "small" (8 GiB) phi3. phi3's
    call there runs 28 s, the 14b's 10 s. The 32b fits no card: three calls preferring it
    wait for the 14b's slot, after a phi3 call that waits for phi3's slot (unloading the
    much used 8b for it on "big" would cost more). When the 14b's call ends, the phi3 call
    decides first: the idle 14b, little used, would be the cheaper victim, but the three
    could run on it, so the 8b would be the victim, and waiting for phi3 stays cheaper.
    Before, they waited under the 32b's name only: the 14b was unloaded for phi3 (and
    loaded again for them)."""
    big = fleet.gpu("big", total_vram_mib=22016)
    small = fleet.gpu("small", total_vram_mib=8192)
    big.preload("qwen3:14b", "qwen3:8b")
    small.preload("phi3:mini")
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=120,
                                  model_candidates_mulling=CANDIDATES)
    for _ in range(10):  # the 8b is the copy most used
        assert (await sidecar.chat("qwen3:8b")).provider == "big"
    big.script(Answer(seconds=10))
    small.script(Answer(seconds=28))
    running = [sidecar.start_chat("qwen3:14b"), sidecar.start_chat("phi3:mini")]
    await asyncio.sleep(1)
    other = sidecar.start_chat("phi3:mini")
    await asyncio.sleep(1)
    waiting = [sidecar.start_chat("qwen3:32b") for _ in range(3)]
    await asyncio.sleep(1)
    demand = sidecar.services.demand.view()  # (in their own lines: none waits for the 14b)
    assert (demand["qwen3:32b"].waiters, demand["phi3:mini"].waiters) == (3, 1)
    assert "qwen3:14b" not in demand or not demand["qwen3:14b"].waiters
    answers = await asyncio.gather(*running, other, *waiting)
    assert [a.status for a in answers] == [200] * 6
    assert (answers[2].provider, answers[2].last.model) == ("small", "phi3:mini")
    assert {(a.provider, a.last.model, a.placement) for a in answers[3:]} == {
        ("big", "qwen3:14b", "warm")}
    assert (big.stats.unloads, big.stats.loads) == (0, 2)  # (the copies preloaded)


async def test_a_release_is_written_at_once_only_for_a_waiting_call_that_could_run_on_the_copy(
        fleet: Fleet) -> None:
    """Sidecar "two" has a call waiting for the 8b (or for the 32b, the 8b among its
    candidates): a release of the 8b's slot on the 4096 card is written at once for it (not
    50 ms later, with the next write) only when that call could run on the copy, as
    copy_wanted and the victims' choice have it; one that asked for a 32k context, or whose
    prompt the context cannot hold, waits for another copy, and the release rides along."""
    card = fleet.gpu("a", total_vram_mib=24564, context_length=4096)
    card.preload("qwen3:8b")
    one = await fleet.sidecar()
    two = await fleet.sidecar(store=one.services.store, agent_name="two")
    backs = ("qwen3:32b", ("qwen3:8b",))
    for (model, also), need, at_once in (
            (("qwen3:8b", ()), WaitNeed(num_ctx=32768), False),
            (("qwen3:8b", ()), WaitNeed(num_ctx=2048), True),
            (("qwen3:8b", ()), WaitNeed(prompt_tokens=8000), False),
            (backs, WaitNeed(num_ctx=32768), False), (backs, WaitNeed(), True)):
        entry = await two.services.demand.waiting(model, need=need, also=also)
        assert (await one.chat("qwen3:8b")).provider == "a"
        await asyncio.sleep(0.01)  # (virtual time: the deferred write is 40 ms away yet)
        assert (not two.tickets()) is at_once, (model, need)
        await asyncio.sleep(0.1)
        assert not two.tickets()
        await two.services.demand.done_waiting(entry)
