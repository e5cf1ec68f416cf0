"""A provider fails a call before its answer began, and no other card could ever hold the
model: the failure is the answer at once (502), not a wait to the limit and a 503. The
circuit of a card that went down and came back lets calls through once the prober sees it
ready, and a call retried elsewhere holds no other call back from the card it left."""

from __future__ import annotations

import asyncio

from loadtest.sim_model import CATALOG, SimModel
from proxy.core.health import OPEN_FOR_S
from proxy.core.types import Circuit
from tests.service.fakes import Answer
from tests.service.harness import Fleet, two_cards_one_busy

MODEL = "qwen3:14b"  # fits the 24 GiB card, never the 8 GiB one (at its 4096 context)


def _catalog(*names: str) -> tuple[SimModel, ...]:
    return tuple(m for m in CATALOG if m.name in names)


def only_big_holds_it(fleet: Fleet) -> None:
    big = fleet.gpu("big", total_vram_mib=24564, num_parallel=4, context_length=8192)
    fleet.gpu("small", total_vram_mib=8192, context_length=4096)
    big.preload(MODEL)


async def test_a_500_from_the_only_card_that_holds_the_model_is_a_prompt_502(
        fleet: Fleet) -> None:
    only_big_holds_it(fleet)
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=20)
    fleet.servers["big"].script(Answer.failing(500, "oops"))
    started = fleet.clock.monotonic()
    r = await sidecar.chat(MODEL)
    assert (r.status, r.error, [a.provider for a in r.attempts]) == (502, "oops", ["big"])
    assert fleet.clock.monotonic() - started < 1.0
    assert not sidecar.tickets()
    after = await sidecar.chat(MODEL)
    assert (after.status, after.provider) == (200, "big")


async def test_a_retry_takes_an_in_tolerance_candidate_on_the_other_card(
        fleet: Fleet) -> None:
    """The failed card is the only one with the preferred model; the other has an
    in-tolerance candidate on its disk: the retry serves that one (the retry and the question
    whether to retry see the same fleet, the failed card left out), not a wait to the limit."""
    big = fleet.gpu("big", total_vram_mib=24564, context_length=8192,
                    models=_catalog(MODEL))
    fleet.gpu("other", total_vram_mib=24564, context_length=8192,
              models=_catalog("qwen3:8b"))
    big.preload(MODEL)
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=20, model_candidates_mulling=(
        '[{"model": "qwen3:14b", "score": 70}, {"model": "qwen3:8b", "score": 65}]'))
    big.script(Answer.failing(500, "oops"))
    started = fleet.clock.monotonic()
    r = await sidecar.chat(MODEL)
    assert (r.status, r.provider, r.last.model) == (200, "other", "qwen3:8b")
    assert fleet.clock.monotonic() - started < 15  # a load of the 8b, no wait to the limit


async def test_a_refused_connection_on_the_only_card_is_a_prompt_502(fleet: Fleet) -> None:
    only_big_holds_it(fleet)
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=20)
    fleet.servers["big"].script(Answer(refused=True))
    started = fleet.clock.monotonic()
    r = await sidecar.chat(MODEL)
    assert (r.status, [a.provider for a in r.attempts]) == (502, ["big"])
    assert "connection refused" in (r.error or "")
    assert fleet.clock.monotonic() - started < 1.0


async def test_a_card_seen_down_and_ready_again_takes_calls_before_the_cooldown(
        fleet: Fleet) -> None:
    """It crashed under three calls (the circuit opens) and restarted 2 s later: once the
    prober has seen it down and then ready, a trial call goes (half-open), not after 60 s."""
    only_big_holds_it(fleet)
    big = fleet.servers["big"]
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=30,
                                  probe_interval_seconds=2)
    big.script(*[Answer(breaks=True)] * 3)  # the answers break off: no retry
    for _ in range(3):
        assert (await sidecar.chat(MODEL)).status == 502
    assert sidecar.circuit("big") is Circuit.OPEN
    big.reachable = False
    await asyncio.sleep(2.5)  # a probe sees it down
    big.reachable = True
    started = fleet.clock.monotonic()
    r = await sidecar.chat(MODEL)
    assert (r.status, [a.provider for a in r.attempts]) == (200, ["big"])
    assert fleet.clock.monotonic() - started <= 2 * 2 + 1.0  # a probe interval or two
    assert sidecar.circuit("big") is Circuit.CLOSED


async def test_a_card_never_seen_down_keeps_its_circuit_open_for_the_cooldown(
        fleet: Fleet) -> None:
    """Failures the prober cannot see (the card answers its probes) are no sign it is well."""
    only_big_holds_it(fleet)
    big = fleet.servers["big"]
    sidecar = await fleet.sidecar(probe_interval_seconds=2)
    big.script(*[Answer(breaks=True)] * 3)
    for _ in range(3):
        assert (await sidecar.chat(MODEL)).status == 502
    await asyncio.sleep(10)
    assert sidecar.circuit("big") is Circuit.OPEN
    await asyncio.sleep(OPEN_FOR_S)
    assert sidecar.circuit("big") is Circuit.HALF_OPEN


async def test_a_call_retried_elsewhere_holds_no_call_back_from_the_card_it_left(
        fleet: Fleet) -> None:
    """a fails a call; its retry waits for b's one busy slot. A call after it takes a's free
    slot at once: the retry, waiting with a turn before it, cannot use a."""
    sidecar, busy, free, other = await two_cards_one_busy(fleet)
    free.script(Answer.failing(500))
    retried = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)  # failed on `free`, waiting for `other`
    assert len(free.stats.calls) == 1 and not retried.done()
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.provider, r.last.waited_ms) == (200, free.config.name, 0)
    assert [t.provider for t in (await retried).attempts] == [
        free.config.name, other.config.name]
    await busy


async def test_a_retry_waits_only_for_what_is_left_of_the_calls_wait_limit(
        fleet: Fleet) -> None:
    """The call waited 15 s of its 20 for a's slot, and a fails it; b stays busy: the retry
    waits the 5 s left, and the 503 says what failed."""
    a = fleet.gpu("a", total_vram_mib=24564, context_length=4096)
    b = fleet.gpu("b", total_vram_mib=24564, context_length=4096)
    for gpu in (a, b):
        gpu.preload("qwen3:8b")
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=20)
    a.script(Answer(seconds=15), Answer.failing(500, "oops"))
    b.script(Answer(seconds=100))
    first = [sidecar.start_chat("qwen3:8b") for _ in range(2)]
    await asyncio.sleep(0.1)
    started = fleet.clock.monotonic()
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.reason, [t.provider for t in r.attempts]) == (503, "gpu-busy", ["a"])
    assert "provider a failed before answering (oops)" in (r.error or "")
    assert fleet.clock.monotonic() - started <= 20.5
    for call in first:
        call.cancel()


async def test_time_at_the_failing_card_is_not_taken_from_the_retrys_wait(
        fleet: Fleet) -> None:
    """b takes the call at once and fails it only after 25 s, more than the 20 s wait limit;
    the call waited for no GPU, so its retry may still wait for a's slot (free at 30 s)."""
    a = fleet.gpu("a", total_vram_mib=24564, context_length=4096)
    b = fleet.gpu("b", total_vram_mib=24564, context_length=4096)
    for gpu in (a, b):
        gpu.preload("qwen3:8b")
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=20)
    a.script(Answer(seconds=30), Answer(seconds=1))
    b.script(Answer(seconds=25, status=500, error="slow failure"))
    busy = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(0.1)
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, [t.provider for t in r.attempts]) == (200, ["b", "a"])
    await busy


async def test_a_card_that_could_hold_the_model_but_is_down_takes_no_retry(
        fleet: Fleet) -> None:
    """Another 24 GiB card could hold the model, but its last probe found it down: the retry
    would only wait for it to come back, so the failure is the answer at once."""
    only_big_holds_it(fleet)
    twin = fleet.gpu("twin", total_vram_mib=24564, num_parallel=4, context_length=8192)
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=20, probe_interval_seconds=2)
    twin.reachable = False
    await asyncio.sleep(2.5)  # a probe finds it down
    fleet.servers["big"].script(Answer.failing(500, "oops"))
    started = fleet.clock.monotonic()
    r = await sidecar.chat(MODEL)
    assert (r.status, r.error, [a.provider for a in r.attempts]) == (502, "oops", ["big"])
    assert fleet.clock.monotonic() - started < 1.0
