"""One simulated `ollama serve` over several GPUs, as Ollama's source places and admits
loads (docs/engine.md, "Several GPUs"; the arithmetic in loadtest/sim_gpus.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from loadtest.ollama_sim import SimServer, configs_from
from loadtest.sim_gpus import CUDA_CONTEXT_MIB
from loadtest.sim_model import CATALOG

Sims = Callable[..., SimServer]
MIB = 1 << 20
CARD = 24564  # each GPU of a 2 x 24 GiB server


def load(sim: SimServer, model: str, num_ctx: int) -> None:
    r = httpx.post(f"{sim.url}/api/generate",
                   json={"model": model, "options": {"num_ctx": num_ctx}}, timeout=30)
    assert r.status_code == 200, r.text


def listed(sim: SimServer) -> dict[str, Any]:
    return {m["model"]: m for m in httpx.get(f"{sim.url}/api/ps").json()["models"]}


def footprint(model: str, num_ctx: int) -> tuple[int, int]:
    """A copy's memory on one GPU and its compute buffers (num_batch 1024 at these contexts)."""
    m = next(m for m in CATALOG if m.name == model)
    return m.footprint_mib(num_ctx, 1, "f16", 1024, "0.33.0", 1024), m.base_compute_mib + 768


def test_a_copy_that_fits_one_gpu_goes_to_it_and_a_larger_one_is_spread(
        sim_factory: Sims) -> None:
    """HEAD: qwen3:14b at 16384 goes to one GPU (bestSingleGPUFit, server/sched.go:1009-1026);
    qwen3:32b at 16384 (estimate ~23 GiB) fits no GPU's 80 %, so it is spread over both
    (:1028), each GPU holding its compute buffers (llm/llama_server.go:2821-2851); /api/ps
    size_vram sums the parts."""
    sim = sim_factory("gpus", total_vram_mib=2 * CARD, gpu_count=2, max_loaded_models=0)
    load(sim, "qwen3:14b", 16384)
    small = sim.sim.runners["qwen3:14b"].parts
    assert small is not None and small.gpus == (0,)
    load(sim, "qwen3:32b", 16384)
    big = sim.sim.runners["qwen3:32b"]
    assert big.parts is not None and big.parts.gpus == (0, 1) and not big.spilled
    one_card, compute = footprint("qwen3:32b", 16384)
    assert big.footprint_mib == one_card + compute
    assert listed(sim)["qwen3:32b"]["size_vram"] == big.parts.vram_mib * MIB == \
        (one_card + compute) * MIB
    # the driver: each GPU less its parts and a CUDA context for every runner on it
    assert sim.sim.gpu_free_mib() == [
        CARD - small.on_gpu[0] - big.parts.on_gpu[0] - 2 * CUDA_CONTEXT_MIB,
        CARD - big.parts.on_gpu[1] - CUDA_CONTEXT_MIB]
    assert sim.sim.stats.spills == sim.sim.stats.self_evictions == 0


def test_ollama_sched_spread_puts_even_a_small_copy_on_every_gpu(sim_factory: Sims) -> None:
    """OLLAMA_SCHED_SPREAD=1 skips the single-GPU fit (server/sched.go:1009): every GPU
    holds the copy's compute buffers and a CUDA context."""
    sim = sim_factory("spread", total_vram_mib=4 * 12288, gpu_count=4, sched_spread=True)
    load(sim, "qwen3:8b", 8192)
    runner = sim.sim.runners["qwen3:8b"]
    one_card, compute = footprint("qwen3:8b", 8192)
    assert runner.parts is not None and runner.parts.gpus == (0, 1, 2, 3)
    assert runner.footprint_mib == one_card + 3 * compute
    assert all(mib > compute for mib in runner.parts.on_gpu)


def test_a_spread_load_beside_others_is_admitted_on_the_summed_free_memory(
        sim_factory: Sims) -> None:
    """HEAD, 2 x 24 GiB: qwen3:32b at 32768 (estimate 25320 MiB) is spread; beside it
    qwen3:8b at 32768 (estimate 9808 MiB) fits no GPU's 80 % but does the GPUs' free memory
    summed (server/sched.go:544-551 on availableMemoryForLoad, :928-950): spread too, beside.
    gemma3:27b at 4096 (estimate 19194 MiB) then passes neither: Ollama evicts."""
    sim = sim_factory("gpus", total_vram_mib=2 * CARD, gpu_count=2)
    load(sim, "qwen3:32b", 32768)
    load(sim, "qwen3:8b", 32768)
    runners = sim.sim.runners
    assert all(r.parts is not None and r.parts.gpus == (0, 1) for r in runners.values())
    view = sim.sim.ollama_free_mib()
    assert sum(view) * 80 // 100 < 19194  # what gemma3:27b then finds
    assert sim.sim.stats.self_evictions == 0
    load(sim, "gemma3:27b", 4096)
    assert sim.sim.stats.self_evictions >= 1 and sim.sim.stats.spills == 0


def test_issue_18349_a_copy_alone_on_the_second_gpu_is_not_counted(sim_factory: Sims) -> None:
    """From 0.30 a copy alone on a GPU but the first is looked up under the wrong device name
    (llm/llama_server.go:2610, 2622, 2866; Ollama issue 18349): Ollama sees that GPU free.
    qwen3:14b at 32768 goes to GPU 0, qwen3:8b at 32768 to GPU 1 (the most free); for
    gemma3:27b at 4096 (estimate 19194 MiB, 17293 MiB on one card) Ollama then sees GPU 1
    wholly free (80 %: 19651) and puts it there alone, where 13431 MiB really are: llama.cpp
    spills it to the CPU. Counting GPU 1 right, no GPU alone passes and the sum does not
    (9399 + 13888 at 80 % is 18629): Ollama would evict instead. 0.12.6 has no such lookup
    (it spreads the copy over both GPUs, beside): no spill."""
    spills = {}
    for version in ("0.33.0", "0.12.6"):
        sim = sim_factory(f"bug-{version}", total_vram_mib=2 * CARD, gpu_count=2,
                          version=version)
        load(sim, "qwen3:14b", 32768)
        load(sim, "qwen3:8b", 32768)
        if version == "0.33.0":
            assert sim.sim.ollama_free_mib()[1] == CARD  # qwen3:8b's 10676 MiB not counted
        load(sim, "gemma3:27b", 4096)
        gemma = sim.sim.runners["gemma3:27b"]
        spills[version] = sim.sim.stats.spills
        if version == "0.33.0":
            assert gemma.parts is not None and gemma.parts.gpus == (1,) and gemma.spilled
    assert spills == {"0.33.0": 1, "0.12.6": 0}


def test_the_command_line_gives_each_gpu_its_vram() -> None:
    """`--gpus 2 --vram 24564`: two 24 GiB GPUs, 49128 MiB in all, listed for the sidecar
    with `gpus`; Ollama's default context reads the total (262144 from 47 GiB,
    server/routes.go:2043-2058)."""
    (config,) = configs_from(["--gpus", "2", "--vram", "24564"])
    assert (config.total_vram_mib, config.gpu_count) == (49128, 2)
    assert config.provider_entry("http://x")["gpus"] == 2
    assert config.default_context() == 262144
    (one,) = configs_from(["--vram", "24564"])
    assert (one.total_vram_mib, one.gpu_count) == (24564, 1)
    assert "gpus" not in one.provider_entry("http://x")


def test_ollama_gpu_overhead_lowers_the_default_context_and_is_kept_free_before_030(
        sim_factory: Sims) -> None:
    """OLLAMA_GPU_OVERHEAD comes off each GPU's total for the default context (server/
    routes.go: 2 x (24564 - 512) is under 47 GiB: 32768, not 262144). Before 0.30 a load's
    layout keeps it free (v0.24.0 llm/server.go:1004): qwen3:14b at 4096 tokens (9892 MiB)
    on 12 GiB less 2.5 GiB runs partly on the CPU; 0.30 only logs it, so there it fits."""
    (config,) = configs_from(["--gpus", "2", "--vram", "24564", "--gpu-overhead", "512"])
    assert config.default_context() == 32768
    assert config.provider_entry("http://x")["gpuOverheadBytes"] == 512 * MIB
    spilled = {}
    for version, overhead in (("0.24.0", 2560), ("0.24.0", 0), ("0.33.0", 2560)):
        gpu = sim_factory(f"gpu-{version}-{overhead}", total_vram_mib=12288, version=version,
                          gpu_overhead_mib=overhead)
        load(gpu, "qwen3:14b", 4096)
        copy = listed(gpu)["qwen3:14b"]
        spilled[version, overhead] = copy["size_vram"] < copy["size"]
    assert spilled == {("0.24.0", 2560): True, ("0.24.0", 0): False, ("0.33.0", 2560): False}
