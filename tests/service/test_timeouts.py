"""A call the provider accepted and did not finish in time (a long answer, a slow load) is
no sign the card is sick: it counts against the card's health only when a probe right after
finds the card down too."""

from __future__ import annotations

import asyncio
import time

from proxy.core.types import Circuit
from proxy.service.routing import Attempt, CallOutcome, CallRequest, PromptSize
from tests.service.harness import Fleet

MODEL = "qwen3:8b"


async def _time_out(fleet: Fleet, calls: int) -> None:
    sidecar = fleet.sidecars[0]
    for _ in range(calls):
        call = CallRequest("/api/chat", MODEL, "mulling", prompt=PromptSize(100))
        attempts = sidecar.services.calls.attempts(call, time.perf_counter())
        placed = await attempts.first()
        assert isinstance(placed, Attempt)
        await attempts.settle(CallOutcome(False, 900.0, error="no answer within 900 s",
                                          began=False, timed_out=True))
        await asyncio.sleep(0.5)  # the probe after it


def _failures(fleet: Fleet, provider: str) -> int:
    return len(fleet.sidecars[0].services.experience.stats[provider].breaker.failures)


async def test_timeouts_on_a_card_that_answers_its_probes_leave_its_health_alone(
        fleet: Fleet) -> None:
    fleet.gpu("big", total_vram_mib=24564, context_length=8192).preload(MODEL)
    sidecar = await fleet.sidecar()
    await _time_out(fleet, 3)
    assert (sidecar.circuit("big"), _failures(fleet, "big")) == (Circuit.CLOSED, 0)
    assert not sidecar.tickets()  # each released


async def test_a_timeout_on_a_card_that_fails_its_probe_counts_against_it(
        fleet: Fleet) -> None:
    big = fleet.gpu("big", total_vram_mib=24564, context_length=8192)
    big.preload(MODEL)
    await fleet.sidecar()
    big.reachable = False  # hung: it took the call, and answers no probe either
    await _time_out(fleet, 1)
    assert _failures(fleet, "big") == 1
