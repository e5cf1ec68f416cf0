"""Models whose files hold per-layer arrays that sizing reads, end to end: Ollama's
non-verbose /api/show gives every non-empty GGUF array as null (getModelData reads the file
with maxArraySize 0, server/routes.go HEAD:1600-1605, v0.12.6:1152-1157; fs/ggml/gguf.go
newArray keeps no values, HEAD:465-483), so the sidecar asks a verbose one, once per model
and card, for those models alone.

lfm2:1.2b keeps a KV cache in 6 of its 16 layers (8 KV heads x 128 + 128 x 2 B: 12 KiB a
token); read as null its KV heads would be taken as its 32 query heads in every layer,
131072 B a token, 4096 MiB at 32768 instead of 384.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from loadtest.sim_model import CATALOG, GEMMA3N_E4B, LFM2_1_2B
from tests.conftest import eventually
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims

MODELS = (LFM2_1_2B, GEMMA3N_E4B, CATALOG[2])  # qwen3:8b: every array it has is tokenizer's


def _verdict(url: str, model: str, provider: str, num_ctx: int) -> dict[str, Any]:
    verdicts = httpx.get(f"{url}/kubemoot/v1/explain",
                         params={"model": model, "numCtx": num_ctx}).json()["verdicts"]
    return next(v for v in verdicts if v["provider"] == provider)


def _described(url: str, model: str, provider: str) -> bool:
    source = _verdict(url, model, provider, 4096).get("footprintSource") or ""
    return source.startswith("architecture, file size and compute")  # (and how attention runs)


@pytest.mark.parametrize("version", ["0.12.6", "0.33.0"])
def test_a_model_with_per_layer_kv_heads_is_sized_from_its_file(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, version=version, models=MODELS,
                      time_scale=SCALE)
    plain = httpx.post(f"{gpu.url}/api/show", json={"model": "lfm2:1.2b"}).json()
    assert plain["model_info"]["lfm2.attention.head_count_kv"] is None  # as Ollama's
    sidecar = sidecar_factory([gpu], probe_interval_seconds=0.1)
    assert eventually(lambda: _described(sidecar.url, "lfm2:1.2b", "gpu"), timeout_s=10)
    verdict = _verdict(sidecar.url, "lfm2:1.2b", "gpu", 32768)
    # 6 layers x 8 KV heads x 256 x 2 B x 32768 (4096 MiB with every layer's 32 heads)
    assert verdict["footprintKvMiB"] == 384
    # no larger than the simulator's copy by more than the sidecar's own margins
    batch = gpu.sim.resolve(LFM2_1_2B, {"model": LFM2_1_2B.name,
                                        "options": {"num_ctx": 32768}}).num_batch
    real = LFM2_1_2B.footprint_mib(32768, 1, batch=batch, version=version,
                                   flash_attention=gpu.config.flash_attention_for(LFM2_1_2B))
    assert real <= verdict["footprintTotalMiB"] <= real + 1024
    # gemma3n's windowed layers as its file lists them (not every layer full)
    gemma = _verdict(sidecar.url, "gemma3n:e4b", "gpu", 32768)
    assert gemma["footprintKvMiB"] < 32768 * 40960 // (1 << 20)


def test_the_verbose_show_is_asked_once_per_model_and_card(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpus = [sim_factory(name, total_vram_mib=24564, models=MODELS, time_scale=SCALE)
            for name in ("a", "b")]
    sidecar = sidecar_factory(gpus, probe_interval_seconds=0.05)
    assert eventually(lambda: all(_described(sidecar.url, "lfm2:1.2b", g.config.name)
                                  for g in gpus), timeout_s=10)
    probes = [g.sim.stats.probes_by_path["/api/ps"] for g in gpus]
    assert eventually(lambda: all(g.sim.stats.probes_by_path["/api/ps"] >= p + 5
                                  for g, p in zip(gpus, probes, strict=True)), timeout_s=10)
    for gpu in gpus:  # not qwen3:8b's: its arrays are not needed
        assert gpu.sim.stats.verbose_shows == {"lfm2:1.2b": 1, "gemma3n:e4b": 1}
