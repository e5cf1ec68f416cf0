"""OLLAMA_GPU_OVERHEAD, mirrored by a provider's `gpuOverheadBytes`: Ollama takes it off each
GPU's total for its default context (every version with VRAM tiers), and before 0.30 each
load's layout keeps it free (docs/engine.md, "OLLAMA_GPU_OVERHEAD"). The official client is
the agent; the simulator is Ollama."""

from __future__ import annotations

import ollama
import pytest

from loadtest.sim_model import CATALOG
from tests.e2e.test_engine_fidelity import NOTHING, SMALL_LLAMAS, WORDS, quiet
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims

GIB = 1024


def test_the_default_context_is_the_tier_of_the_total_less_the_overhead(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """A 24 GiB card with 2 GiB kept per GPU counts 22 GiB: Ollama 0.33's default context
    there is 4096, not 32768 (server/routes.go, the VRAM tiers). A prompt of ~6400 tokens
    is refused with 413 instead of cut by the engine; a short one runs at 4096 with no
    reload."""
    gpu = sim_factory("gpu", total_vram_mib=24 * GIB, gpu_overhead_mib=2 * GIB,
                      version="0.33.0", time_scale=SCALE)
    assert gpu.sim.config.default_context() == 4096
    client = ollama.Client(host=sidecar_factory([gpu]).url)
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="qwen3:8b", messages=WORDS)
    assert refused.value.status_code == 413, refused.value
    assert "4096" in str(refused.value.error), refused.value
    client.chat(model="qwen3:8b", messages=[{"role": "user", "content": "hi"}])
    client.chat(model="qwen3:8b", messages=[{"role": "user", "content": "hi again"}])
    assert gpu.sim.runners["qwen3:8b"].ctx == 4096
    assert quiet(gpu) == NOTHING


def test_a_first_copy_the_overhead_leaves_no_room_for_is_refused_not_spilled(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """0.24.0 keeps the overhead free when it lays a copy out: qwen3:14b at 4096 tokens
    (9892 MiB) on 12 GiB less 2.5 GiB would run partly on the CPU. The sidecar says the
    model is too large for the card instead."""
    gpu = sim_factory("gpu", total_vram_mib=12 * GIB, gpu_overhead_mib=2560,
                      context_length=4096, version="0.24.0", time_scale=SCALE)
    client = ollama.Client(host=sidecar_factory([gpu]).url)
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="qwen3:14b", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 507, refused.value
    assert not gpu.sim.runners and quiet(gpu) == NOTHING
    client.chat(model="qwen3:8b", messages=[{"role": "user", "content": "hi"}])
    assert quiet(gpu) == NOTHING


def test_a_card_of_small_copies_keeps_the_overhead_free_before_030(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """The card of test_engine_fidelity's many small copies (13650 MiB, where a fourth copy
    beside three is 9 MiB short of Ollama's fit check), 1 GiB larger with 1 GiB kept: the
    same three copies, and no unload by Ollama itself."""
    gpu = sim_factory("gpu", total_vram_mib=13650 + GIB, gpu_overhead_mib=GIB,
                      context_length=4096, version="0.24.0", time_scale=SCALE,
                      models=(*CATALOG, *SMALL_LLAMAS), max_loaded_models=12)
    client = ollama.Client(host=sidecar_factory([gpu]).url)
    for model in SMALL_LLAMAS:
        client.chat(model=model.name, messages=[{"role": "user", "content": "hi"}],
                    keep_alive="1h")
        assert quiet(gpu) == NOTHING, (model.name, sorted(gpu.sim.runners))
    assert len(gpu.sim.runners) == 3
