"""A half-open card takes one trial call at a time: the trial is the call's from its
decision (before its claim's write returns), only its own end ends it, and a held plan is
not taken onto an open circuit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loadtest.sim_model import load_seconds
from proxy.core.health import OPEN_FOR_S
from proxy.core.types import Circuit
from tests.service.fakes import Answer, RoundTripStore
from tests.service.harness import Fleet

MODEL = "qwen3:14b"


def only_big_holds_it(fleet: Fleet) -> None:
    big = fleet.gpu("big", total_vram_mib=24564, num_parallel=4, context_length=8192)
    fleet.gpu("small", total_vram_mib=8192, context_length=4096)
    big.preload(MODEL)


async def _opened(fleet: Fleet, store: RoundTripStore | None = None, **settings: Any
                  ) -> tuple[Any, Any]:
    """The sidecar and the big card, whose circuit three failed calls have just opened."""
    only_big_holds_it(fleet)
    big = fleet.servers["big"]
    sidecar = await fleet.sidecar(store, discuss_gpu_wait_limit_seconds=120, **settings)
    big.script(*[Answer(breaks=True)] * 3)
    for _ in range(3):
        assert (await sidecar.chat(MODEL)).status == 502
    assert sidecar.circuit("big") is Circuit.OPEN
    return sidecar, big


async def _open_then_half_open(fleet: Fleet, store: RoundTripStore | None = None
                               ) -> tuple[Any, Any]:
    sidecar, big = await _opened(fleet, store)
    await asyncio.sleep(OPEN_FOR_S + 1)
    assert sidecar.circuit("big") is Circuit.HALF_OPEN
    return sidecar, big


@pytest.mark.parametrize("round_trips", [False, True], ids=["in-process", "store-round-trips"])
async def test_half_open_lets_one_trial_at_a_time(fleet: Fleet, round_trips: bool) -> None:
    """Two calls arriving together at a half-open card: one trial goes, also when a claim's
    write takes a round trip (NATS), during which the other call decides."""
    store = RoundTripStore(clock=fleet.clock) if round_trips else None
    sidecar, big = await _open_then_half_open(fleet, store)
    before = len(big.stats.calls)
    big.script(Answer(seconds=10), Answer(seconds=10))
    calls = [sidecar.start_chat(MODEL) for _ in range(2)]
    await asyncio.sleep(2)
    assert len(big.stats.calls) - before == 1
    for c in calls:
        await c


async def test_a_held_plan_is_not_taken_onto_an_open_circuit(fleet: Fleet) -> None:
    only_big_holds_it(fleet)
    big = fleet.servers["big"]
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=5)
    planned = await sidecar.plan("t1", MODEL)
    assert planned["planned"] and planned["provider"] == "big"
    big.script(*[Answer(breaks=True)] * 3)
    for _ in range(3):
        assert (await sidecar.chat(MODEL)).status == 502
    assert sidecar.circuit("big") is Circuit.OPEN
    before = len(big.stats.calls)
    big.script(Answer(breaks=True))
    r = await sidecar.chat(MODEL, thread="t1")
    # an open circuit takes no call: the plan should be released, the call wait/refused
    assert len(big.stats.calls) == before, f"call sent to an open card: {r}"


async def test_another_calls_abandonment_does_not_end_the_trial(fleet: Fleet) -> None:
    from loadtest.sim_engine import PROMPT_TOO_LONG
    only_big_holds_it(fleet)
    big = fleet.servers["big"]
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=300)
    # C: placed while the card is well, refused as too long 80 s later (after a load, say)
    big.script(Answer(seconds=80, status=400, error=PROMPT_TOO_LONG),
               *[Answer(breaks=True)] * 3, Answer(seconds=100), Answer(seconds=1),
               Answer(seconds=1))
    early = sidecar.start_chat(MODEL)
    await asyncio.sleep(0.1)
    for _ in range(3):
        assert (await sidecar.chat(MODEL)).status == 502
    assert sidecar.circuit("big") is Circuit.OPEN
    await asyncio.sleep(OPEN_FOR_S + 1)
    trial = sidecar.start_chat(MODEL)  # the trial: 100 s
    await asyncio.sleep(1)
    sent = len(big.stats.calls)
    assert (await early).status == 413  # C ended at 80 s: too long, telling nothing
    other = sidecar.start_chat(MODEL)  # while the trial (until ~161 s) is still out
    await asyncio.sleep(5)
    assert len(big.stats.calls) == sent, "a second call went while the trial was out"
    await trial
    await other


async def test_a_streamed_trial_closes_the_circuit_once_its_answer_begins(fleet: Fleet
                                                                          ) -> None:
    """A long trial call (300 s) on a card with four slots: once its stream has begun, the
    card serves again, and the next call does not wait out the trial."""
    sidecar, big = await _open_then_half_open(fleet)
    big.script(Answer(seconds=300), Answer(seconds=1))
    trial = sidecar.start_chat(MODEL, stream=True)
    await asyncio.sleep(5)
    assert sidecar.circuit("big") is Circuit.CLOSED
    r = await sidecar.chat(MODEL)
    assert r.status == 200 and r.last.waited_ms < 1000
    await trial



async def test_a_call_waiting_for_an_open_circuit_goes_the_moment_it_half_opens(
        fleet: Fleet) -> None:
    """The cooldown's end is silent (nothing is written then): the waiting call sets a timer
    for it, as for a ticket's expiry, rather than wait for the next probe (a minute here)."""
    sidecar, big = await _opened(fleet, probe_interval_seconds=60)
    opened = fleet.clock.now()
    await asyncio.sleep(1)
    big.script(Answer(seconds=1))
    r = await sidecar.chat(MODEL)
    assert r.status == 200 and r.provider == "big"
    went = opened + 1 + r.last.waited_ms / 1000
    assert opened + OPEN_FOR_S <= went < opened + OPEN_FOR_S + 0.5, went - opened


async def test_calls_waiting_behind_a_trial_go_once_its_answer_begins(fleet: Fleet) -> None:
    """A call that came while the trial was out (a cold load of the 3B, its prompt too long
    for the small card's context) waits for it; the trial's first bytes, once loaded, close
    the circuit and wake it, not the trial's end (300 s) or the next probe (a minute)."""
    sidecar, big = await _opened(fleet, probe_interval_seconds=60)
    await asyncio.sleep(OPEN_FOR_S + 1)
    big.script(Answer(seconds=300), Answer(seconds=1))
    trial = sidecar.start_chat("llama3.2:3b", prompt_chars=20000, stream=True)
    await asyncio.sleep(0.1)
    r = await sidecar.chat(MODEL)
    assert r.status == 200 and r.provider == "big" and not trial.done()
    small = big.config.model("llama3.2:3b")
    assert small is not None
    loaded_in = load_seconds(big.config.startup_s, small.disk_mib, big.config.load_mib_per_s)
    assert r.last.waited_ms / 1000 < loaded_in + 0.5, (r.last.waited_ms, loaded_in)
    assert (await trial).provider == "big"
