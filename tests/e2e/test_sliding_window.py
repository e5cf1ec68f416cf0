"""A sliding-window model (gemma3:27b: 52 of its 62 layers keep 1024 tokens and a batch) seen
at a large context and then placed at a small one, end to end: the sidecar, the official
ollama client, simulated GPUs that size its cache as Ollama's engines do.

Counted with every layer full, its KV cache at 32768 would be 15872 MiB rather than 3392, so
the weights learned from the copy seen there would be 3869 MiB, and a copy at 4096 would look
5853 MiB: it would go beside the 14b on the 24 GiB card (Ollama 0.12 then unloads the 14b
itself) or alone on the 16 GiB card (where it spills to the CPU).
"""

from __future__ import annotations

from typing import Any

import httpx
import ollama
import pytest

from tests.conftest import eventually
from tests.e2e.test_engine_fidelity import NOTHING, _residents, quiet
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims


def _explain(url: str, provider: str) -> dict[str, Any]:
    verdicts = httpx.get(f"{url}/kubemoot/v1/explain",
                         params={"model": "gemma3:27b", "numCtx": 4096}).json()["verdicts"]
    return next(v for v in verdicts if v["provider"] == provider)


@pytest.mark.parametrize("version", ["0.12.6", "0.33.0"])
def test_a_window_model_seen_at_a_large_context_is_not_undersized_at_a_small_one(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str) -> None:
    small = sim_factory("small", total_vram_mib=16376, version=version, time_scale=SCALE)
    big = sim_factory("big", total_vram_mib=24564, version=version, time_scale=SCALE)
    seen = httpx.post(f"{big.url}/api/generate", timeout=30, json={
        "model": "gemma3:27b", "options": {"num_ctx": 32768}})
    assert seen.status_code == 200, seen.text
    assert big.sim.runners["gemma3:27b"].ctx == 32768
    ps = httpx.get(f"{big.url}/api/ps").json()["models"]
    seen_mib = ps[0]["size_vram"] // (1 << 20)
    sidecar = sidecar_factory([small, big], probe_interval_seconds=0.1)
    # the sidecar learns the copy's size, then it goes
    assert eventually(lambda: _explain(sidecar.url, "small")["footprintSource"]
                      == "calibrated from big at 32768 x 1", timeout_s=10)
    httpx.post(f"{big.url}/api/generate", json={"model": "gemma3:27b", "keep_alive": 0},
               timeout=30)
    loaded = httpx.post(f"{big.url}/api/generate", timeout=30, json={
        "model": "qwen3:14b", "options": {"num_ctx": 4096}})
    assert loaded.status_code == 200, loaded.text
    assert set(big.sim.runners) == {"qwen3:14b"}
    assert eventually(lambda: _residents(sidecar.url, "big") == ["qwen3:14b"])
    # what was seen less its KV (2560 full + 52 windowed layers x 8 KiB x 2048 cells at
    # 0.33's 1024 batch, 1536 at 0.12's 512) and 0.33's 768 of batch-tier compute (0.12's
    # batch is 512 at any context); at 4096 the KV is 320 full + 624 windowed (1536 cells)
    on_small = _explain(sidecar.url, "small")
    weights = seen_mib - {"0.33.0": 3392 + 768, "0.12.6": 3184}[version]
    assert (on_small["footprintWeightsMiB"], on_small["footprintKvMiB"],
            on_small["footprintTotalMiB"]) == (weights, 944, weights + 944)
    # the simulator's copy at 4096: 0.97 x 16590 + 944 + 256
    assert weights + 944 >= 17293

    client = ollama.Client(host=sidecar.url, timeout=60)
    answer = client.chat(model="gemma3:27b", options={"num_ctx": 4096},
                         messages=[{"role": "user", "content": "hi"}])
    assert answer.message.content
    assert "gemma3:27b" in big.sim.runners and "qwen3:14b" not in big.sim.runners
    assert big.sim.runners["gemma3:27b"].ctx == 4096
    for gpu in (small, big):
        assert (gpu.sim.stats.oom_events, gpu.sim.stats.spills) == (0, 0)
        assert quiet(gpu) == NOTHING
