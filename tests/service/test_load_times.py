"""Load and unload times learned per card from what the sidecar saw (core/load_times.py),
and shown by explain."""

from __future__ import annotations

import asyncio

import pytest

from loadtest.sim_model import load_seconds
from proxy.api.kubemoot import verdict_json
from tests.service.harness import Fleet


async def test_each_card_load_time_is_learned_and_explained(fleet: Fleet) -> None:
    """A card with a slow disk and one with a fast one: each load's load_duration teaches
    its own card, and a model never loaded on a card is priced at that card's speed."""
    fleet.gpu("slow", total_vram_mib=16376, load_mib_per_s=200)
    fleet.gpu("fast", total_vram_mib=32768, load_mib_per_s=2000)
    sidecar = await fleet.sidecar()
    assert (await sidecar.chat("qwen3:14b")).provider == "slow"  # the smallest card that fits
    assert (await sidecar.chat("qwen3:8b")).provider == "fast"  # no room left on "slow"
    loads = sidecar.services.scheduler.learning.loads
    slow_14b = load_seconds(1.0, 9300, 200)  # start-up, then the weights file (9300 MiB)
    fast_8b = load_seconds(1.0, 5200, 2000)
    assert loads.copies[("slow", "qwen3:14b")] == pytest.approx(slow_14b)
    assert loads.copies[("fast", "qwen3:8b")] == pytest.approx(fast_8b)
    assert loads.cards["fast"] == pytest.approx(5200 / (fast_8b - 1.0))  # after start-up

    explained = sidecar.services.scheduler.explain("mulling", "phi3:mini", 100, None)
    assert explained is not None
    shown = {v.provider: verdict_json(v) for v in explained[1]}
    assert shown["fast"]["loadSource"] == "this card's speed"
    assert shown["fast"]["terms"]["load"] == pytest.approx(1.0 + 2176 / loads.cards["fast"],
                                                           abs=1e-4)
    assert shown["slow"]["loadSource"] == "this card's speed"


async def test_an_eviction_teaches_its_card_unload_time(fleet: Fleet) -> None:
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:8b", "phi3:mini")
    sidecar = await fleet.sidecar()
    r = await sidecar.chat("qwen3:14b")
    assert (r.status, r.placement, r.last.evicted) == (200, "evict", ("phi3:mini", "qwen3:8b"))
    loads = sidecar.services.scheduler.learning.loads
    # the fake unloads at once: the first /api/ps shows both gone
    assert (loads.first_unloads, loads.unload_gaps) == ({"gpu": 0.0}, {"gpu": 0.0})


async def test_an_eviction_waits_for_victims_that_ollama_unloads_one_at_a_time(
        fleet: Fleet) -> None:
    """Ollama unloads one copy at a time and waits up to 5 s for the memory between two:
    the fourth of four victims leaves `/api/ps` 15 s after the first. The call waits for
    all of them (10 s and 5 s per victim after the first) before it loads, and learns its
    card's unloads: the first victim's, and the gap between two."""
    gpu = fleet.gpu("gpu", total_vram_mib=32768, max_loaded_models=4)
    gpu.preload("qwen3:8b", "phi3:mini", "llama3.2:3b", "qwen3:14b")
    gpu.unload_gap_s = 5.0
    sidecar = await fleet.sidecar()
    started = asyncio.get_running_loop().time()
    r = await sidecar.chat("qwen3:32b", num_ctx=16384)  # with phi3 beside it, too large
    assert (r.status, r.placement, len(r.last.evicted)) == (200, "evict", 4), r.last.evicted
    loads = sidecar.services.scheduler.learning.loads
    # the first gone at once, then one every 5 s
    assert loads.first_unloads["gpu"] <= 0.05  # one poll
    assert loads.unload_gaps["gpu"] == pytest.approx(5.0, abs=0.05)
    load_s = load_seconds(1.0, 20200, gpu.config.load_mib_per_s)
    assert loads.copies[("gpu", "qwen3:32b")] == pytest.approx(load_s)
    # sent once the last victim had gone, 15 s in (and answered in under a second)
    assert 15 + load_s < asyncio.get_running_loop().time() - started < 16 + load_s
