"""Late binding: a call that must wait for a slot waits in the sidecar, not in one engine's
queue, and takes the first slot that frees on any card, the soonest turn first (arrival
order for calls of unknown or equal lengths; a short call may pass a long one that arrived
within its slack)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from proxy.adapters.memory_kv import MemoryStore
from proxy.core.waitline import YIELD_S
from proxy.ports import MODEL_DEMAND
from proxy.service.codec import escape_key
from proxy.service.demand import WAIT_TTL_S, DemandBoard
from tests.service.fakes import Answer, FakeModelServer, LoopClock
from tests.service.harness import Fleet, Sidecar


def waiters(sidecar: Sidecar, model: str) -> int:
    found = sidecar.services.demand.view().get(model)
    return found.waiters if found else 0


async def warm_8b(fleet: Fleet, **settings: Any) -> tuple[FakeModelServer, Sidecar]:
    """One 24 GiB card holding the 8b (one slot) and a sidecar placing calls on it."""
    gpu = fleet.gpu("a", total_vram_mib=24564)
    gpu.preload("qwen3:8b")
    return gpu, await fleet.sidecar(**settings)


async def test_a_burst_while_a_copy_loads_spreads_over_both_copies(fleet: Fleet) -> None:
    """The 14b is warm on "a" and busy for 3 s; a burst of four arrives. The first loads a
    second copy on "b" (~12 s); the others wait, and "a" serves them as it frees, long before
    "b" has loaded: none is bound to the loading copy's one slot."""
    a = fleet.gpu("a", total_vram_mib=24564)
    b = fleet.gpu("b", total_vram_mib=24564)
    a.preload("qwen3:14b")
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=120)
    a.script(Answer(seconds=3), Answer(seconds=1), Answer(seconds=1), Answer(seconds=1))
    b.script(Answer(seconds=1))
    busy = sidecar.start_chat("qwen3:14b")
    await asyncio.sleep(0.1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    burst = [sidecar.start_chat("qwen3:14b") for _ in range(4)]
    ended: dict[int, float] = {}
    for i, task in enumerate(burst):
        task.add_done_callback(lambda _, i=i: ended.setdefault(i, loop.time()))
    answers = await asyncio.gather(*burst)
    assert (await busy).provider == "a"
    assert all(r.status == 200 for r in answers)
    on = [r.provider for r in answers]
    assert on.count("b") == 1 and answers[on.index("b")].placement == "cold"
    assert on.count("a") == 3
    load_ended = max(ended[i] for i, r in enumerate(answers) if r.provider == "b") - 1
    assert all(ended[i] < load_ended for i, r in enumerate(answers) if r.provider == "a")
    assert max(ended.values()) - started < 16  # not 4 calls queued behind one load
    assert a.stats.loads == b.stats.loads == 1
    assert waiters(sidecar, "qwen3:14b") == 0


async def test_a_slot_freeing_on_another_card_takes_the_oldest_waiting_call(
        fleet: Fleet) -> None:
    """Both cards hold the 8b, both busy ("b" frees first); three calls wait. The oldest
    goes to "b" the moment it frees, the next to "a" when that frees."""
    a = fleet.gpu("a", total_vram_mib=24564)
    b = fleet.gpu("b", total_vram_mib=24564)
    a.preload("qwen3:8b")
    b.preload("qwen3:8b")
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=120)
    a.script(Answer(seconds=10), Answer(seconds=1))
    b.script(Answer(seconds=5), Answer(seconds=20))
    holding = [sidecar.start_chat("qwen3:8b"), sidecar.start_chat("qwen3:8b")]
    waiting = []
    for _ in range(3):
        await asyncio.sleep(1)
        waiting.append(sidecar.start_chat("qwen3:8b"))
    await asyncio.sleep(0.5)
    assert waiters(sidecar, "qwen3:8b") == 3
    first, second, third = await asyncio.gather(*waiting)
    await asyncio.gather(*holding)
    assert (first.provider, first.placement) == ("b", "warm")
    assert 3900 <= first.last.waited_ms <= 4100  # arrived at 1 s, "b" freed at 5 s
    assert (second.provider, second.placement) == ("a", "warm")
    assert 7900 <= second.last.waited_ms <= 8100  # arrived at 2 s, "a" freed at 10 s
    assert third.provider == "a"  # arrived at 3 s; the second's 1 s call on "a" ends at 11 s
    assert 7900 <= third.last.waited_ms <= 8100


async def test_a_short_call_passes_a_long_one_that_arrived_within_its_slack(
        fleet: Fleet) -> None:
    """The agent's 8b answers run 200 tokens at 100 tokens/s (2 s: a 1 s slack). The one
    slot is busy until 10 s. A call of that usual length waits from 1 s (turn 2 s); one
    capped at 10 tokens arrives at 1.5 s (turn 1.55 s) and goes first; another capped one
    arrives at 3 s, after the long call's turn, and goes after it."""
    gpu, sidecar = await warm_8b(fleet, discuss_gpu_wait_limit_seconds=120)
    gpu.script(Answer(seconds=2, answer_tokens=200))
    assert (await sidecar.chat("qwen3:8b")).status == 200
    gpu.script(Answer(seconds=10), Answer(seconds=1, answer_tokens=10),
               Answer(seconds=2, answer_tokens=200), Answer(seconds=1, answer_tokens=10))
    loop = asyncio.get_running_loop()
    started = loop.time()
    busy = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    long = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(0.5)
    short = sidecar.start_chat("qwen3:8b", num_predict=10)
    await asyncio.sleep(1.5)
    late = sidecar.start_chat("qwen3:8b", num_predict=10)
    ended: dict[str, float] = {}
    for name, task in (("long", long), ("short", short), ("late", late)):
        task.add_done_callback(lambda _, name=name: ended.setdefault(name, loop.time()))
    answers = await asyncio.gather(busy, long, short, late)
    assert [r.status for r in answers] == [200] * 4
    assert ended["short"] < ended["long"] < ended["late"]
    assert 10.9 <= ended["short"] - started <= 11.2  # the slot freed at 10 s
    assert 8400 <= answers[2].last.waited_ms <= 8600  # arrived at 1.5 s


async def test_calls_of_unknown_length_keep_arrival_order(fleet: Fleet) -> None:
    """Nothing is known of the 8b's answers yet: a capped call that arrives later does not
    pass an uncapped one (no rate to say how short it is)."""
    gpu, sidecar = await warm_8b(fleet, discuss_gpu_wait_limit_seconds=120)
    gpu.script(Answer(seconds=5), Answer(seconds=2), Answer(seconds=1))
    busy = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    first = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(0.5)
    capped = sidecar.start_chat("qwen3:8b", num_predict=10)
    answers = await asyncio.gather(busy, first, capped)
    assert 3900 <= answers[1].last.waited_ms <= 4100  # took the slot at 5 s
    assert 5400 <= answers[2].last.waited_ms <= 5600  # then the capped call, at 7 s


async def test_a_waiting_call_still_ends_at_its_wait_limit_with_gpu_busy(fleet: Fleet) -> None:
    gpu, sidecar = await warm_8b(fleet, discuss_gpu_wait_limit_seconds=20)
    gpu.script(Answer(seconds=60))
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    loop = asyncio.get_running_loop()
    asked = loop.time()
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.reason) == (503, "gpu-busy")
    assert 19.9 <= loop.time() - asked <= 20.1
    assert waiters(sidecar, "qwen3:8b") == 0
    assert gpu.stats.calls == ["qwen3:8b"]  # it never reached the engine
    assert (await working).status == 200


async def test_the_gpu_busy_answer_names_the_wait_limit_as_set(fleet: Fleet) -> None:
    gpu, sidecar = await warm_8b(fleet, discuss_gpu_wait_limit_seconds=1.5)
    gpu.script(Answer(seconds=10))
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    r = await sidecar.chat("qwen3:8b")
    assert r.refusal is not None and "stayed busy for 1.5 s (" in r.refusal.message, r.refusal
    assert (await working).status == 200


async def test_a_client_that_leaves_while_waiting_frees_its_place_at_once(
        fleet: Fleet) -> None:
    """Two calls wait for the one busy slot; the older leaves. Its entry goes at once and
    the younger takes the slot the moment it frees (no turn is left to the one gone)."""
    gpu, sidecar = await warm_8b(fleet, discuss_gpu_wait_limit_seconds=120)
    gpu.script(Answer(seconds=10))
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    gone = asyncio.Event()
    leaving = sidecar.start_chat("qwen3:8b", client_gone=gone)
    await asyncio.sleep(1)
    staying = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    assert waiters(sidecar, "qwen3:8b") == 2
    gone.set()
    left = await leaving
    assert (left.status, left.reason) == (499, "client-gone")
    assert waiters(sidecar, "qwen3:8b") == 1
    r = await staying
    assert (r.status, r.provider) == (200, "a")
    assert 7900 <= r.last.waited_ms <= 8100  # arrived at 2 s, the slot freed at 10 s
    assert waiters(sidecar, "qwen3:8b") == 0
    await working


async def test_a_free_slot_is_left_to_an_older_waiting_call_of_another_sidecar(
        fleet: Fleet) -> None:
    """Another sidecar's call has waited longer for the 8b (its entry on the board): a call
    arriving here when the slot frees leaves it that slot, for YIELD_S at most (that sidecar
    never takes it here: it is only an entry), then takes it."""
    _, sidecar = await warm_8b(fleet)
    other = DemandBoard(sidecar.services.store, "elsewhere", sidecar.clock)
    await other.waiting("qwen3:8b")
    await asyncio.sleep(2)
    r = await sidecar.chat("qwen3:8b")
    assert r.status == 200
    # the older call's turn, then its own
    assert YIELD_S * 1000 - 10 <= r.last.waited_ms <= YIELD_S * 1000 + 10
    await other.close()


async def test_a_call_that_cannot_wait_takes_a_slot_due_to_an_older_call_rather_than_a_503(
        fleet: Fleet) -> None:
    """No static endpoint: leaving the slot to the older call would refuse this one, which
    cannot wait; the older call can wait for the next."""
    _, sidecar = await warm_8b(fleet)
    other = DemandBoard(sidecar.services.store, "elsewhere", sidecar.clock)
    await other.waiting("qwen3:8b")
    await asyncio.sleep(2)
    r = await sidecar.chat("qwen3:8b", can_wait=False)
    assert (r.status, r.provider, r.placement) == (200, "a", "warm")
    assert r.last.waited_ms == 0
    await other.close()


async def test_a_dead_sidecars_wait_entries_leave_the_board_while_a_live_ones_stay() -> None:
    clock = LoopClock()
    store = MemoryStore(clock=clock)
    live = DemandBoard(store, "crew/live", clock)
    reader = DemandBoard(store, "crew/reader", clock)
    dead = {"expiresAt": clock.now() + WAIT_TTL_S, "since": clock.now() - 1}
    key = f"wait.{escape_key('qwen3:8b')}.{escape_key('crew/dead')}.1"
    await store.put(MODEL_DEMAND, key, orjson.dumps(dead))  # written once, never again
    await live.waiting("qwen3:8b")
    assert reader.view()["qwen3:8b"].waiters == 2
    await asyncio.sleep(WAIT_TTL_S + 1)  # the live sidecar rewrote its entry meanwhile
    assert reader.view()["qwen3:8b"].waiters == 1
    await live.close()


async def test_waiting_calls_do_not_wake_each_other_with_their_refreshes(fleet: Fleet) -> None:
    """Twenty calls wait a minute for one busy slot. Each rewrites its wait entry every
    WAIT_REFRESH_S; were a refresh a change, every one would wake all twenty (300 decisions
    in the minute, measured). Departures wake them, and the busy call's ticket
    renewals (three a minute: 60), and probes, which this test keeps out of the minute
    (their state kept fresh meanwhile)."""
    gpu, sidecar = await warm_8b(fleet, discuss_gpu_wait_limit_seconds=120,
                                  probe_interval_seconds=600, state_stale_seconds=900)
    gpu.script(Answer(seconds=70), *[Answer(seconds=0.1)] * 20)
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    waiting = [sidecar.start_chat("qwen3:8b") for _ in range(20)]
    await asyncio.sleep(5)
    before = sidecar.decisions()
    await asyncio.sleep(60)
    assert waiters(sidecar, "qwen3:8b") == 20
    assert sidecar.decisions() - before < 100
    answers = await asyncio.gather(working, *waiting)
    assert [(r.status, r.reason) for r in answers] == [(200, None)] * 21
