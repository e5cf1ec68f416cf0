"""The fleet's gauges on /metrics: what each GPU holds and does, and who waits, as the
placement sees it at the moment of the scrape."""

from __future__ import annotations

import asyncio

from tests.service.fakes import Answer
from tests.service.harness import Fleet, Sidecar

MIB = 1024 * 1024


def sample(sidecar: Sidecar, name: str, **labels: str) -> float | None:
    return sidecar.services.metrics.registry.get_sample_value(name, labels)


async def test_the_gauges_follow_a_gpu_filling_and_a_call_waiting(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=12288, num_parallel=1)
    sidecar = await fleet.sidecar()
    assert sample(sidecar, "kubemoot_provider_memory_total_bytes", provider="gpu") == \
        12288 * MIB
    assert sample(sidecar, "kubemoot_provider_memory_resident_bytes", provider="gpu") == 0
    assert sample(sidecar, "kubemoot_provider_circuit_state", provider="gpu") == 0
    assert sample(sidecar, "kubemoot_provider_ready", provider="gpu") == 1

    gpu.script(Answer(seconds=30))
    first = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(0.1)  # loading: its ticket claims the copy's memory
    assert sample(sidecar, "kubemoot_provider_copies", provider="gpu", model="qwen3:8b",
                  state="loading") == 1
    assert (sample(sidecar, "kubemoot_provider_memory_claimed_bytes", provider="gpu") or 0) > 0
    assert sample(sidecar, "kubemoot_provider_calls", provider="gpu") == 1

    second = sidecar.start_chat("qwen3:14b")  # no room beside a busy copy: it waits
    await asyncio.sleep(10)
    assert sample(sidecar, "kubemoot_model_waiters", model="qwen3:14b") == 1
    assert sample(sidecar, "kubemoot_provider_copies", provider="gpu", model="qwen3:8b",
                  state="loaded") == 1
    resident = sample(sidecar, "kubemoot_provider_memory_resident_bytes", provider="gpu")
    assert resident is not None and 0 < resident <= 12288 * MIB

    assert (await first).status == 200 and (await second).status == 200
    assert sample(sidecar, "kubemoot_model_waiters", model="qwen3:14b") is None
    assert sample(sidecar, "kubemoot_provider_calls", provider="gpu") == 0
