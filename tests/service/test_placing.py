"""Where a call goes and when: warm reuse, cold loads, queueing or unloading, waiting for a
GPU and waking when one frees. The decisions of tests/e2e/test_scheduling.py, on fakes."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import orjson
import pytest

from loadtest.ollama_sim import with_derived
from loadtest.sim_model import CATALOG
from proxy.adapters.memory_kv import MemoryStore
from proxy.core.tickets import LEAVING_MAX_S
from proxy.ports import SIDECAR_BUCKETS, StoreUnavailable
from tests.service.fakes import Answer, AwayStore, FakeModelServer, SlowStore
from tests.service.harness import Fleet, Sidecar


async def test_a_warm_copy_is_reused(fleet: Fleet) -> None:
    a = fleet.gpu("a", total_vram_mib=32768)
    b = fleet.gpu("b", total_vram_mib=16376)
    a.preload("qwen3:8b")  # warm on the big card
    sidecar = await fleet.sidecar()
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.provider, r.placement) == (200, "a", "warm")
    assert b.stats.loads == 0


async def test_a_cold_load_goes_to_free_room_on_the_smallest_card_then_is_warm(
        fleet: Fleet) -> None:
    fleet.gpu("big", total_vram_mib=32768)
    small = fleet.gpu("small", total_vram_mib=16376)
    sidecar = await fleet.sidecar()
    r = await sidecar.chat("qwen3:8b")
    assert (r.provider, r.placement) == ("small", "cold")
    again = await sidecar.chat("qwen3:8b")
    assert (again.provider, again.placement) == ("small", "warm")
    assert small.stats.loads == 1


async def test_idle_unwanted_models_are_unloaded_to_make_room(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b", "phi3:mini")
    sidecar = await fleet.sidecar()
    r = await sidecar.chat("qwen3:14b")
    assert (r.status, r.placement) == (200, "evict")
    # The 8b alone would leave the memory, but not Ollama's own 80 % rule with phi3 beside
    # the 14b.
    assert r.last.evicted == ("phi3:mini", "qwen3:8b")
    assert list(gpu.loaded) == ["qwen3:14b"]
    assert gpu.stats.peak_mib <= 16376  # room was made before the load


async def test_a_model_with_work_in_flight_is_never_unloaded(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("phi3:mini")
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=30)
    gpu.script(Answer(seconds=120))  # a long answer holds qwen3:8b
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(10)
    started = loop_time()
    r = await sidecar.chat("qwen3:14b")
    assert (r.status, r.reason) == (503, "gpu-busy")
    assert 30 <= loop_time() - started < 31  # answered at its wait limit
    assert "qwen3:8b" in gpu.loaded and not working.done()  # still there, still working
    assert (await working).status == 200


async def test_a_slow_store_does_not_hold_a_gpu_busy_answer_past_the_wait_limit(
        fleet: Fleet) -> None:
    """Every write to the store takes 3 s; the call waits for a busy card with a 2 s limit:
    it is refused at the limit, not once its wait entry is written."""
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b")
    store = SlowStore(SIDECAR_BUCKETS, clock=fleet.clock)
    sidecar = await fleet.sidecar(store, discuss_gpu_wait_limit_seconds=2)
    gpu.script(Answer(seconds=120))
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(10)
    store.delay_s = 3.0
    started = loop_time()
    r = await sidecar.chat("qwen3:14b")
    assert (r.status, r.reason) == (503, "gpu-busy")
    assert 1.99 < loop_time() - started < 2.1, f"{loop_time() - started:.2f} s"
    working.cancel()


async def test_a_waiting_call_wakes_when_a_ticket_is_released_not_by_a_timer(
        fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b")
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=600)
    gpu.script(Answer(seconds=8))
    working = sidecar.start_chat("qwen3:8b")  # answered 8 s from now
    await asyncio.sleep(1)
    r = await sidecar.chat("qwen3:14b")
    assert (r.status, r.placement, r.last.evicted) == (200, "evict", ("qwen3:8b",))
    # Woken as the 8b's call ended, 7 s later: its ticket's 60 s TTL or the wait limit
    # would be later.
    assert r.last.waited_ms == pytest.approx(7000, abs=50)
    assert (await working).status == 200


async def goes_to_the_static_endpoint(sidecar: Sidecar, static: FakeModelServer, model: str
                                      ) -> None:
    """A call for `model` that cannot wait is answered by the static endpoint, alone."""
    r = await sidecar.chat(model, can_wait=False)
    assert (r.status, r.provider, r.placement) == (200, "static", "static")
    assert static.stats.calls == [model]


async def test_a_call_that_cannot_wait_goes_to_the_static_endpoint(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    static = fleet.static_endpoint("static", total_vram_mib=49152)
    sidecar = await fleet.sidecar(model_endpoint=static.endpoint)
    gpu.script(Answer(seconds=60))
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    await goes_to_the_static_endpoint(sidecar, static, "qwen3:14b")
    await working


async def test_a_triage_call_no_gpu_can_hold_goes_to_the_triage_endpoint(fleet: Fleet) -> None:
    """Only the triage endpoint is set: a triage call for a model no card can hold, that
    cannot wait, is answered there, not refused as too large."""
    fleet.gpu("gpu", total_vram_mib=16376)
    triage = fleet.static_endpoint("static", total_vram_mib=49152)
    sidecar = await fleet.sidecar(triage_model_endpoint=triage.endpoint)
    r = await sidecar.chat("qwen3:32b", can_wait=False, phase="triage")
    assert (r.status, r.provider, r.placement) == (200, "static", "static")
    assert (await sidecar.chat("qwen3:32b", can_wait=False)).status == 507


async def test_a_call_that_cannot_wait_loads_rather_than_queue_at_a_busy_copy(
        fleet: Fleet) -> None:
    """The 8b's calls on "gpu" are learned to take 1 s and its one slot is busy: waiting
    costs less than loading another copy on "idle". A call that may wait waits in the
    sidecar; one that cannot (X-Kubemoot-Wait: false) is not queued inside that engine
    (queueing there is waiting): it takes the load onto idle's free room, and a GPU has room,
    so the static endpoint is not used (CONTRACT.md)."""
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    idle = fleet.gpu("idle", total_vram_mib=16376)
    static = fleet.static_endpoint("static", total_vram_mib=49152)
    gpu.preload("qwen3:8b")
    sidecar = await fleet.sidecar(model_endpoint=static.endpoint)
    gpu.script(*[Answer(seconds=1)] * 6)
    for _ in range(3):
        assert (await sidecar.chat("qwen3:8b")).provider == "gpu"
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(0.5)
    waits = sidecar.start_chat("qwen3:8b")
    r = await sidecar.chat("qwen3:8b", can_wait=False)
    assert (r.status, r.provider, r.placement, r.last.waited_ms) == (200, "idle", "cold", 0)
    assert (await waits).placement == "warm"  # it waited for the slot on "gpu"
    assert static.stats.calls == [] and idle.stats.loads == 1
    await working


async def test_a_call_that_cannot_wait_is_refused_gpu_busy_at_once_by_the_only_busy_copy(
        fleet: Fleet) -> None:
    """One card, its one slot busy, nothing to load or unload and no static endpoint: a call
    that cannot wait is refused 503 gpu-busy with Retry-After at once, not queued behind the
    running call (CONTRACT.md)."""
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b")
    sidecar = await fleet.sidecar()
    gpu.script(Answer(seconds=1), Answer(seconds=5), Answer(seconds=1))
    assert (await sidecar.chat("qwen3:8b")).provider == "gpu"  # learns a call's length
    loads = gpu.stats.loads
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(0.5)
    loop = asyncio.get_running_loop()
    asked = loop.time()
    r = await sidecar.chat("qwen3:8b", can_wait=False)
    assert loop.time() - asked < 0.1  # not after the running call's 4.5 s
    assert (r.status, r.reason, r.attempts) == (503, "gpu-busy", [])
    assert r.refusal is not None and r.refusal.retry_after_s == 5
    assert "this call cannot wait" in r.refusal.message
    assert gpu.stats.loads == loads and gpu.stats.calls.count("qwen3:8b") == 2
    await working


async def test_a_call_that_cannot_wait_takes_the_static_endpoint_over_a_busy_copy_alone(
        fleet: Fleet) -> None:
    """As above, with a static endpoint: no load could relieve the busy copy, so the call
    goes there rather than queueing behind the running call (CONTRACT.md)."""
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    static = fleet.static_endpoint("static", total_vram_mib=49152)
    gpu.preload("qwen3:8b")
    sidecar = await fleet.sidecar(model_endpoint=static.endpoint)
    gpu.script(Answer(seconds=1), Answer(seconds=60))
    assert (await sidecar.chat("qwen3:8b")).provider == "gpu"
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(0.5)
    await goes_to_the_static_endpoint(sidecar, static, "qwen3:8b")
    await working


async def test_a_client_that_leaves_while_waiting_is_never_placed(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=300)
    gpu.script(Answer(seconds=30))
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    gone = asyncio.Event()
    waiting = sidecar.start_chat("qwen3:14b", client_gone=gone)
    await asyncio.sleep(5)
    gone.set()
    r = await waiting
    assert (r.status, r.reason) == (499, "client-gone")
    await working
    await asyncio.sleep(5)  # the release has happened; an abandoned waiter would be placed
    assert "qwen3:14b" not in gpu.stats.calls
    assert not sidecar.tickets()
    assert not sidecar.services.demand.view().get("qwen3:14b", None) or \
        not sidecar.services.demand.view()["qwen3:14b"].waiters


async def test_a_busy_warm_copy_is_waited_for_until_the_wait_is_long(fleet: Fleet) -> None:
    a = fleet.gpu("a", total_vram_mib=24564)
    b = fleet.gpu("b", total_vram_mib=24564)
    sidecar = await fleet.sidecar()
    for _ in range(3):  # a warm copy on one card, and an observed call latency
        assert (await sidecar.chat("qwen3:8b")).status == 200
    home = "a" if a.stats.loads else "b"
    answers = await asyncio.gather(*(sidecar.chat("qwen3:8b") for _ in range(24)))
    placements = [(r.provider, r.placement) for r in answers]
    assert all(r.status == 200 for r in answers)
    # a short wait for a slot does not duplicate the model
    assert any(r.provider == home and r.last.waited_ms > 0 for r in answers)
    second = {kind for provider, kind in placements if provider != home}
    assert "cold" in second, placements  # a long one does
    assert a.stats.loads == b.stats.loads == 1


def loop_time() -> float:
    return asyncio.get_running_loop().time()


async def test_an_unload_the_shared_state_cannot_record_still_serves_the_call(
        fleet: Fleet) -> None:
    """The 8b makes room for the 14b; the store is unreachable when the unload is to be
    recorded. The call is served (the next probe shows the 8b gone) and leaves no ticket."""
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b")
    sidecar = await fleet.sidecar()

    async def unreachable(provider: str, seen_gone: dict[str, float]) -> object:
        raise StoreUnavailable("NATS is not connected")

    sidecar.services.claims.tickets.mark_unloaded = unreachable  # type: ignore[method-assign]
    r = await sidecar.chat("qwen3:14b")
    assert (r.status, r.placement, r.last.evicted) == (200, "evict", ("qwen3:8b",))
    await asyncio.sleep(1)
    assert sidecar.tickets() == []


async def test_a_call_whose_room_cannot_be_made_leaves_no_ticket(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b")
    sidecar = await fleet.sidecar()

    async def broken(claimed: object) -> None:
        raise RuntimeError("unload failed")

    sidecar.services.scheduler.evictions.make_room = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await sidecar.chat("qwen3:14b")
    await asyncio.sleep(1)
    assert sidecar.tickets() == []


async def test_a_reload_whose_call_goes_before_the_unload_leaves_no_copy_marked_leaving(
        fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=24564, context_length=4096)
    sidecar = await fleet.sidecar()
    assert (await sidecar.chat("qwen3:8b")).placement == "cold"
    evictions = sidecar.services.scheduler.evictions
    asked = evictions._ask_unload
    stalled = asyncio.Event()

    async def first_ask_stalls(provider: str, model: str) -> bool:
        if not stalled.is_set():
            stalled.set()
            await asyncio.Event().wait()  # the call goes (a shutdown) while this is asked
        return await asked(provider, model)

    evictions._ask_unload = first_ask_stalls  # type: ignore[method-assign]
    call = sidecar.start_chat("qwen3:8b", num_ctx=16384)  # a reload at another context
    await stalled.wait()
    call.cancel()
    await asyncio.sleep(5)
    # Its copy was its own victim: unloaded as planned, not left loaded and marked leaving
    # (no call could join it) under a ticket that named it.
    assert "qwen3:8b" not in gpu.loaded and not sidecar.tickets()
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.placement) == (200, "cold")


async def test_a_copy_left_marked_leaving_by_a_sidecar_that_died_serves_again(
        fleet: Fleet) -> None:
    """A sidecar marks the 8b leaving (its victim, or a keep_alive 0) and dies before it
    asks Ollama to unload it: the copy stays loaded, and once probes have listed it a
    minute past the mark it counts as loaded again, rather than shut out for the ten
    minutes a record lasts."""
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b")
    store = MemoryStore(SIDECAR_BUCKETS, clock=fleet.clock)
    dead = await fleet.sidecar(store)
    await dead.services.claims.tickets.mark_leaving("gpu", ("qwen3:8b",))
    alive = await fleet.sidecar(store, discuss_gpu_wait_limit_seconds=300)
    started = loop_time()
    r = await alive.chat("qwen3:8b")
    assert (r.status, r.placement) == (200, "warm")
    assert LEAVING_MAX_S <= loop_time() - started < LEAVING_MAX_S + 10
    assert gpu.stats.loads == 1  # (its preload)


async def test_an_unload_waits_for_the_copy_under_whatever_name_of_its_file_it_is_listed(
        fleet: Fleet) -> None:
    """Two calls of models of one weights file raced to load it: a view has it as
    `phi3-helper` (its call's record), Ollama lists it as `phi3:mini`, busy with another
    client's call. The unload of `phi3-helper` takes that copy once the call ends; room is
    made only then, not as soon as `phi3-helper` is seen unlisted (it never was listed)."""
    models = with_derived(CATALOG, ["phi3-helper=phi3:mini:0"])
    gpu = fleet.gpu("gpu", total_vram_mib=16376, models=models)
    sidecar = await fleet.sidecar()
    gpu.preload("phi3:mini")
    gpu.script(Answer(seconds=5))
    other_client = await gpu.open("/api/chat", orjson.dumps({"model": "phi3:mini"}))
    reading = asyncio.ensure_future(other_client.read())
    evictions = sidecar.services.scheduler.evictions
    started = loop_time()
    await gpu.unload("phi3-helper")
    gone = await evictions._seen_gone("gpu", ("phi3-helper:latest",))
    assert gone is not None and gone["phi3-helper:latest"] - started == pytest.approx(5, abs=0.5)
    await reading



async def test_a_copy_loaded_under_a_sibling_name_after_its_victim_left_stays_counted(
        fleet: Fleet) -> None:
    """The 14b evicts phi3:mini and the 8b; Ollama unloads one copy at a time, the 8b
    seconds after phi3. Meanwhile another client loads phi3-helper (FROM phi3:mini) and a
    probe lists it. When the unloads are recorded, the view still counts phi3-helper:
    it was loaded after phi3:mini left, and probed since."""
    models = with_derived(CATALOG, ["phi3-helper=phi3:mini:0"])
    gpu = fleet.gpu("gpu", total_vram_mib=16376, models=models)
    gpu.preload("qwen3:8b", "phi3:mini")
    gpu.unload_gap_s = 12.0  # the 8b goes 12 s after phi3:mini
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=120)
    book = sidecar.services.claims.tickets
    record = book.mark_unloaded
    recorded: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()

    async def then_look(provider: str, models: tuple[str, ...], *more: object) -> object:
        result = await record(provider, models, *more)
        if not recorded.done():
            recorded.set_result(sidecar.residents("gpu"))
        return result

    book.mark_unloaded = then_look  # type: ignore[method-assign]
    call = sidecar.start_chat("qwen3:14b")
    await asyncio.sleep(1)
    assert "phi3:mini" not in gpu.loaded  # the first victim left
    started = loop_time()
    await gpu.load("phi3-helper")  # another client's load, of the file phi3:mini left
    await sidecar.services.prober.refresh("gpu")  # a probe lists it
    assert "qwen3:8b" in gpu.loaded and loop_time() - started < 10  # (the 8b still there)
    seen = await recorded
    assert "phi3-helper:latest" in seen, seen
    await call


# A small model (here ~260 MiB loaded; real Ollama's 2-layer test model lists 1 MiB) beside
# cards of 192 GiB: best fit's ratio of the room left to its size is in the hundreds.
TINY = replace(next(m for m in CATALOG if m.name == "llama3.2:3b"), name="tiny:latest",
               disk_mib=2, block_count=2, embedding_length=64, head_count=2, head_count_kv=2,
               trained_ctx=2048)


async def test_best_fit_does_not_make_a_small_model_wait_out_a_busy_copy(
        fleet: Fleet) -> None:
    """Best fit is a tie-breaker: it does not outweigh a wait. With the tiny model's only
    copy busy for 20 s, the next call loads it in a second on the idle card rather than
    waiting (uncapped, best fit counted the idle card 33 s, more than the 28 s wait; a
    real Ollama's tiny model on a 4 GiB CPU "card": 102 s)."""
    a = fleet.gpu("a", total_vram_mib=196608, models=(*CATALOG, TINY))
    b = fleet.gpu("b", total_vram_mib=196608, models=(*CATALOG, TINY))
    a.preload("tiny:latest")
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=600)
    a.script(Answer(seconds=20))
    busy = sidecar.start_chat("tiny:latest")
    await asyncio.sleep(1)
    r = await sidecar.chat("tiny:latest")
    assert (r.status, r.provider, r.placement) == (200, "b", "cold")
    assert r.last.waited_ms < 5000
    assert (await busy).status == 200
    assert b.stats.loads == 1


async def test_a_copy_loaded_again_for_a_call_that_joined_it_is_counted_before_its_ticket_goes(
        fleet: Fleet) -> None:
    """The 8b's keep-alive ran out just before a call the sidecar placed on it reached
    Ollama, which loads it again for that call; a probe meanwhile saw it gone. Its ticket
    was all that stood for the load: the card is read again before the ticket goes, so
    the copy is counted at once, not at the next probe a minute later."""
    gpu = fleet.gpu("gpu", total_vram_mib=24564)
    gpu.preload("qwen3:8b")
    sidecar = await fleet.sidecar(probe_interval_seconds=60)
    assert sidecar.residents("gpu") == ["qwen3:8b"]
    del gpu.loaded["qwen3:8b"]  # its keep-alive ran out, unseen
    gpu.script(Answer(seconds=5))
    call = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)  # Ollama loading it for the call
    await sidecar.services.prober.refresh("gpu")
    assert sidecar.residents("gpu") == [] and len(sidecar.tickets()) == 1
    started = loop_time()
    other = sidecar.start_chat("phi3:mini")  # no load claimed beside the unclaimed one
    r = await call
    ended = loop_time()
    assert (r.status, r.placement) == (200, "warm")
    assert sidecar.residents("gpu") == ["qwen3:8b"]
    beside = await other
    assert beside.status == 200 and beside.last.waited_ms >= 1000 * (ended - started) - 1


@pytest.mark.parametrize(("keep_alive_s", "then"), [(2.0, "cold"), (300.0, "warm"), (None, "warm")])
async def test_a_short_keep_alive_a_call_sets_is_counted_before_the_next_probe(
        fleet: Fleet, keep_alive_s: float | None, then: str) -> None:
    """A call sets `keep_alive: "2s"`: Ollama unloads the 8b two seconds after it ends,
    while the last probe (a minute ago) still says it stays. Its release records when it
    goes, so 1.5 s on the copy is no longer taken as one to join. A longer keep-alive
    leaves the probe's figure, the sooner of the two."""
    gpu = fleet.gpu("gpu", total_vram_mib=24564)
    gpu.preload("qwen3:8b")
    sidecar = await fleet.sidecar(probe_interval_seconds=60)
    assert (await sidecar.chat("qwen3:8b", keep_alive_s=keep_alive_s)).status == 200
    ended = fleet.clock.now()
    copy = sidecar.services.scheduler.provider_view("gpu").residents[0]
    assert copy.expires_at == (ended + 2.0 if keep_alive_s == 2.0 else math.inf)
    await asyncio.sleep(1.5)
    assert (await sidecar.chat("qwen3:8b")).placement == then


async def test_a_victim_the_store_never_heard_of_is_not_joined_during_the_outage(
        fleet: Fleet) -> None:
    """The shared state goes away as a claim's victim is to be marked leaving: the other
    sidecars cannot be told, but this one's calls, claimed in-process meanwhile, do not join
    the victim before a probe shows it gone (Ollama would load it again for them, unclaimed,
    beside the copy that took its room)."""
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b")
    store = AwayStore(fleet.clock)
    sidecar = await fleet.sidecar(store, probe_interval_seconds=60)

    async def going_away(*args: object, **kwargs: object) -> object:
        store.away = True
        raise StoreUnavailable("NATS is not connected")

    sidecar.services.claims.tickets.mark_leaving = going_away  # type: ignore[method-assign]
    await asyncio.sleep(1)  # (after the probe: on the virtual clock they would be one instant)
    big = sidecar.start_chat("qwen3:14b")
    await asyncio.sleep(0)
    small = sidecar.start_chat("qwen3:8b")  # waits: the 14b's claim plans the 8b's eviction
    assert (await big).last.evicted == ("qwen3:8b",)
    await asyncio.sleep(0.5)
    assert list(gpu.loaded) == ["qwen3:14b"]  # no load without the shared state
    store.back()
    r = await small
    assert (r.status, r.placement) == (200, "evict")
    assert gpu.stats.peak_mib <= 16376 * 0.8


async def test_a_copy_another_sidecar_evicted_unheard_is_looked_at_again_before_a_join(
        fleet: Fleet) -> None:
    """This sidecar's shared state is away; another sidecar, which it cannot hear, evicts the
    8B for the 14B. This one's last look still lists the 8B warm: before an in-process join
    it reads the card again, finds the 8B gone, and loads nothing (Ollama would have loaded
    it again for the call, unclaimed, beside the 14B)."""
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b")
    cut_off = AwayStore(fleet.clock)
    unheard = await fleet.sidecar(cut_off, probe_interval_seconds=60,
                                  discuss_gpu_wait_limit_seconds=3)
    other = await fleet.sidecar(probe_interval_seconds=60)
    await asyncio.sleep(1)
    cut_off.away = True
    assert (await other.chat("qwen3:14b")).last.evicted == ("qwen3:8b",)
    assert list(gpu.loaded) == ["qwen3:14b"]
    await asyncio.sleep(1)
    r = await unheard.chat("qwen3:8b")
    assert (r.status, r.reason) == (503, "gpu-busy"), r
    assert list(gpu.loaded) == ["qwen3:14b"]
