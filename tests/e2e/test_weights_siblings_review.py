"""Review of ee16979 (core/shared_copies.py) against the simulator: a call for a model made
FROM another whose copy is busy, when that other model is among the call's candidates."""

from __future__ import annotations

import threading

import httpx

from tests.e2e.test_scheduling import SCALE, Sidecars, Sims, chat, stream_in_background
from tests.e2e.test_weights_siblings import MODELS, listed

CANDIDATES = [{"model": "qwen3-plain", "score": 100}, {"model": "qwen3:8b", "score": 95}]


def test_a_candidates_busy_copy_of_the_file_unloads_nothing_for_a_model_made_from_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, context_length=4096, models=MODELS,
                      time_scale=SCALE, version="0.12.6")  # (no 80 % rule to refuse the load)
    for model in ("qwen3:8b", "llama3.2:3b", "phi3:mini"):  # (no call length learned)
        assert httpx.post(f"{gpu.url}/api/generate", json={"model": model}).status_code == 200
    url = sidecar_factory([gpu], model_candidates_mulling=CANDIDATES).url
    started = threading.Event()
    long_call = stream_in_background(url, "qwen3:8b", 400, started)
    assert started.wait(30)
    r = chat(url, "qwen3-plain", timeout=60)
    assert r.status_code == 200, r.text
    long_call.join(60)
    assert r.headers.get("x-kubemoot-evicted", "") == "", dict(r.headers)
    assert listed(gpu.url) == {"qwen3:8b", "llama3.2:3b", "phi3:mini"}
    assert (gpu.sim.stats.loads, gpu.sim.stats.reloads) == (3, 0)
