"""A call's attempts: a failure before the answer began is retried once on another provider
and not twice, a prompt the engine found too long is placed again once, a failing provider's
circuit opens and lets a trial through after its cooldown, and a call's ticket is held,
renewed and released. The decisions of tests/e2e/test_scheduling.py, on fakes."""

from __future__ import annotations

import asyncio
import time

from proxy.core.health import OPEN_FOR_S
from proxy.core.tokens import PromptSize
from proxy.core.types import Circuit
from proxy.service.routing import CallOutcome, CallRequest, Refusal
from tests.service.fakes import Answer
from tests.service.harness import Fleet, two_cards_one_busy


async def test_a_failure_before_any_byte_is_retried_once_on_another_provider(
        fleet: Fleet) -> None:
    a = fleet.gpu("a", total_vram_mib=16376)
    b = fleet.gpu("b", total_vram_mib=24564)
    a.preload("qwen3:8b")  # warm on a: a is picked
    sidecar = await fleet.sidecar()
    a.script(Answer.failing(500))
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, [t.provider for t in r.attempts]) == (200, ["a", "b"])
    assert b.stats.calls == ["qwen3:8b"]
    assert not sidecar.tickets()


async def test_a_call_is_retried_once_not_twice_and_the_failure_is_the_answer(
        fleet: Fleet) -> None:
    a = fleet.gpu("a", total_vram_mib=16376)
    b = fleet.gpu("b", total_vram_mib=24564)
    a.preload("qwen3:8b")
    sidecar = await fleet.sidecar()
    a.script(Answer.failing(503, "no room"), Answer.failing(503, "no room"))
    b.script(Answer.failing(503, "no room"), Answer.failing(503, "no room"))
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.error) == (502, "no room")
    assert [t.provider for t in r.attempts] == ["a", "b"]
    assert len(a.stats.calls) + len(b.stats.calls) == 2
    assert not sidecar.tickets()


async def test_a_refused_connection_is_retried_on_another_provider(fleet: Fleet) -> None:
    a = fleet.gpu("a", total_vram_mib=24564)  # twins: "a" is tried first, by name
    fleet.gpu("b", total_vram_mib=24564)
    sidecar = await fleet.sidecar(probe_interval_seconds=60)
    a.script(Answer(refused=True))  # the last probe still says it is ready
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, [t.provider for t in r.attempts]) == (200, ["a", "b"])


async def test_a_retry_waits_for_a_slot_like_a_first_attempt(fleet: Fleet) -> None:
    """The provider that answered fails; the other has the model but its one slot is busy
    for a while. The call waits for that slot instead of answering 502."""
    sidecar, busy, free, other = await two_cards_one_busy(fleet)
    free.script(Answer.failing(500))
    r = await sidecar.chat("qwen3:8b")  # the free copy fails; the retry waits for the busy one
    assert (r.status, [t.provider for t in r.attempts]) == (
        200, [free.config.name, other.config.name])
    assert r.last.waited_ms > 0
    await busy


async def test_a_prompt_the_engine_finds_too_long_is_placed_again_once_at_its_count(
        fleet: Fleet) -> None:
    small = fleet.gpu("small", context_length=4096)
    big = fleet.gpu("big", context_length=16384)
    small.preload("qwen3:8b")  # warm on the small context: the estimate goes there
    sidecar = await fleet.sidecar()
    small.script(Answer.too_long())  # no count in its message: at least the context
    r = await sidecar.chat("qwen3:8b", prompt_chars=8000)
    assert (r.status, [t.provider for t in r.attempts]) == (200, ["small", "big"])
    assert r.last.estimated_tokens >= 4096 and big.stats.calls == ["qwen3:8b"]
    assert not sidecar.tickets()


async def test_a_prompt_is_placed_again_once_not_twice(fleet: Fleet) -> None:
    small = fleet.gpu("small", context_length=4096)
    big = fleet.gpu("big", context_length=16384)
    small.preload("qwen3:8b")
    sidecar = await fleet.sidecar()
    small.script(Answer.too_long())
    big.script(Answer.too_long())
    r = await sidecar.chat("qwen3:8b", prompt_chars=8000)
    assert (r.status, r.reason) == (413, "prompt-too-large")
    assert [t.provider for t in r.attempts] == ["small", "big"]
    assert not sidecar.tickets()


async def test_a_call_has_one_retry_and_one_re_sizing_in_all(fleet: Fleet) -> None:
    """a fails, b (the retry) finds the prompt too long, c (the re-sizing) fails: the call
    has used both and ends with c's failure, not a second retry."""
    a = fleet.gpu("a", context_length=4096)
    b = fleet.gpu("b", context_length=4096)
    c = fleet.gpu("c", context_length=16384)
    a.preload("qwen3:8b")
    b.preload("qwen3:8b")
    sidecar = await fleet.sidecar()
    a.script(Answer.failing(500))
    b.script(Answer.too_long())
    c.script(Answer.failing(500), Answer.failing(500))
    r = await sidecar.chat("qwen3:8b", prompt_chars=2000)
    assert r.status == 502
    assert [t.provider for t in r.attempts] == ["a", "b", "c"]
    assert not sidecar.tickets()


async def test_failures_open_the_circuit_and_a_trial_goes_through_after_the_cooldown(
        fleet: Fleet) -> None:
    a = fleet.gpu("a", total_vram_mib=16376)
    b = fleet.gpu("b", total_vram_mib=24564)
    a.preload("qwen3:8b")
    b.preload("qwen3:8b")
    sidecar = await fleet.sidecar()
    a.script(*[Answer(breaks=True)] * 3)  # answers that break off mid-stream: no retry
    for _ in range(3):
        r = await sidecar.chat("qwen3:8b")
        assert (r.status, r.provider) == (502, "a")
    assert sidecar.circuit("a") is Circuit.OPEN
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.provider) == (200, "b")
    await asyncio.sleep(OPEN_FOR_S)  # the cooldown: one trial call may go to a
    assert sidecar.circuit("a") is Circuit.HALF_OPEN
    a.script(Answer(seconds=10))
    trial = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    meanwhile = await sidecar.chat("qwen3:8b")
    assert meanwhile.provider == "b"  # one trial at a time
    assert (await trial).provider == "a"
    assert sidecar.circuit("a") is Circuit.CLOSED


async def test_a_call_longer_than_the_ticket_ttl_keeps_its_ticket(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu")
    sidecar = await fleet.sidecar(ticket_ttl_seconds=60)
    gpu.script(Answer(seconds=300))  # five TTLs
    streaming = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    [ticket] = sidecar.tickets()
    await asyncio.sleep(250)  # past the TTL: only the renewal sweep keeps it counted
    [renewed] = sidecar.tickets()
    assert renewed.ticket_id == ticket.ticket_id and renewed.expires_at > ticket.expires_at
    assert (await streaming).status == 200
    assert not sidecar.tickets()  # released as the call settled


async def test_a_ticket_is_released_when_its_call_settles(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu")
    sidecar = await fleet.sidecar()
    gpu.script(Answer(seconds=5))
    call = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    assert [t.model for t in sidecar.tickets()] == ["qwen3:8b"]
    await call
    assert not sidecar.tickets()
    assert sidecar.residents("gpu") == ["qwen3:8b"]  # what its load left stays counted


async def test_a_call_placed_again_at_the_engines_count_waits_what_is_left_of_its_limit(
        fleet: Fleet) -> None:
    """Its first attempt waited 8 s of 10 for the small card, whose engine then counted
    the prompt too long for it: the big card stays busy, so 503 gpu-busy at the limit."""
    small = fleet.gpu("small", context_length=4096)
    big = fleet.gpu("big", context_length=16384)
    for card in (small, big):
        card.preload("qwen3:8b")
    small.script(Answer(seconds=8), Answer.too_long())
    big.script(Answer(seconds=60))
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=10)
    long_one = sidecar.start_chat("qwen3:8b", prompt_chars=20000)  # fits only big: 60 s
    await asyncio.sleep(0.5)
    short_one = sidecar.start_chat("qwen3:8b")  # small, 8 s
    await asyncio.sleep(0.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    r = await sidecar.chat("qwen3:8b", prompt_chars=8000)
    elapsed = loop.time() - started
    assert [t.provider for t in r.attempts] == ["small"]
    assert r.attempts[0].waited_ms > 5000  # its first attempt waited for small
    assert (r.status, r.reason) == (503, "gpu-busy")
    assert elapsed <= 10.5, f"answered gpu-busy after {elapsed:.1f} s of a 10 s wait limit"
    await short_one
    long_one.cancel()


async def test_a_404_whose_card_cannot_be_read_again_still_ends_its_call(
        fleet: Fleet) -> None:
    """Ollama's 404 for a model its listing had reads the card's listing again before the
    call goes on; a probe that fails on an odd answer (as a probe round survives) must not
    turn the call's end into an exception (its ticket released all the same)."""
    fleet.gpu("a", total_vram_mib=24564).preload("qwen3:8b")
    sidecar = await fleet.sidecar()
    calls = sidecar.services.calls

    async def odd_answer(name: str) -> object:
        raise ValueError("invalid literal for int() with base 10: 'x'")

    calls.prober.probe = odd_answer  # type: ignore[method-assign]
    call = CallRequest("/api/chat", "qwen3:8b", "mulling", prompt=PromptSize(100))
    attempts = calls.attempts(call, time.perf_counter(), None)
    placed = await attempts.first()
    assert not isinstance(placed, Refusal)
    await attempts.settle(CallOutcome(True, 0.01, error="HTTP 404: model not found",
                                      began=False, model_missing=True))
    assert not sidecar.tickets()
