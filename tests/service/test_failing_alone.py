"""A provider fails a call before its answer began, and no other card could ever hold the
model: the failure is the answer at once (502), not a wait to the limit and a 503. The
circuit of a card that went down and came back lets calls through once the prober sees it
ready, and a call retried elsewhere holds no other call back from the card it left."""

from __future__ import annotations

import asyncio

from proxy.core.health import OPEN_FOR_S
from proxy.core.types import Circuit
from tests.service.fakes import Answer
from tests.service.harness import Fleet

MODEL = "qwen3:14b"  # fits the 24 GiB card, never the 8 GiB one (at its 4096 context)


def only_big_holds_it(fleet: Fleet) -> None:
    big = fleet.gpu("big", total_vram_mib=24564, num_parallel=4, context_length=8192)
    fleet.gpu("small", total_vram_mib=8192, context_length=4096)
    big.preload(MODEL)


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
