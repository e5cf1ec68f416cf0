"""The probe's GET /api/status (service/prober.py probe): asked now and then, within a
short limit, so that a slow endpoint holds back no round, and what it said last holds."""

from __future__ import annotations

import asyncio

from proxy.ports import ShowAnswer, UpstreamError
from proxy.service.prober import PROBE_TIMEOUT_S
from tests.service.harness import Fleet

CLOUD_OFF = ShowAnswer(200, b'{"cloud":{"disabled":true,"source":"env"}}')


def loop_time() -> float:
    return asyncio.get_running_loop().time()


async def test_a_hanging_status_does_not_hold_back_the_residents(fleet: Fleet) -> None:
    """An endpoint whose /api/status never answers (a gateway in front of Ollama that
    holds unknown paths): /api/ps answers at once, and so should the probe."""
    a = fleet.gpu("a", total_vram_mib=24564)
    b = fleet.gpu("b", total_vram_mib=24564)
    sidecar = await fleet.sidecar()

    async def hangs(path: str, timeout_s: float | None = None) -> ShowAnswer:
        await asyncio.sleep(timeout_s or 0)
        raise UpstreamError(f"{a.endpoint}{path}: timed out")

    a.fetch = hangs  # type: ignore[method-assign]
    b.preload("qwen3:8b")
    started = loop_time()
    states = await sidecar.services.prober.round()
    took = loop_time() - started
    assert [s.loaded_mib.keys() for s in states if s.name == "b"] == [{"qwen3:8b"}]
    assert took < PROBE_TIMEOUT_S / 4, f"the round took {took:.2f} s"


async def test_a_status_that_fails_once_keeps_the_cloud_off(fleet: Fleet) -> None:
    a = fleet.gpu("a", total_vram_mib=24564)
    answers = [CLOUD_OFF]

    async def status(path: str, timeout_s: float | None = None) -> ShowAnswer:
        if answers:
            return answers.pop()
        raise UpstreamError(f"{a.endpoint}{path}: timed out")

    a.fetch = status  # type: ignore[method-assign]
    sidecar = await fleet.sidecar()  # (its first probe reads the cloud off)
    prober = sidecar.services.prober
    assert prober.latest["a"].cloud_off is True
    assert (await prober.probe("a")).cloud_off is True  # /api/status timed out this time
