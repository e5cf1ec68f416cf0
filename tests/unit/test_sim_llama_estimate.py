"""The llama engine's estimate in the simulator: before 0.30 Ollama sizes a copy on the llama
engine by its own estimator, which /api/ps reports and its fit check uses, while the GPU
holds what llama.cpp allocates (the footprint). 0.12.6-0.12.10: llm/memory.go
estimateGPULayers; 0.12.11-0.29: llm/server.go Load (v0.24.0 :576-693) and MemorySize
(:1895-1921); GraphSize in fs/ggml/ggml.go (docs/engine.md, "The llama engine's estimate in
the simulator")."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from loadtest.ollama_sim import SimServer
from loadtest.sim_engine import MIB, MINIMUM_MEMORY_MIB
from loadtest.sim_model import CATALOG, LFM2_1_2B, SimConfig, SimModel, tensor_bytes
from loadtest.sim_sched import OllamaSim

Sims = Callable[..., SimServer]

LLAMA = next(m for m in CATALOG if m.name == "llama3.2:3b")
PHI3 = next(m for m in CATALOG if m.name == "phi3:mini")
E, H, HKV, V, D = 3072, 24, 8, 128256, 128  # Llama 3.2 3B


def _group(model: SimModel, prefix: str) -> int:
    return sum(tensor_bytes(t) for t in model.tensors()
               if t["name"] == prefix or t["name"].startswith(prefix + "."))


def test_the_llama_graph_is_graphsize_s_llama_case() -> None:
    """v0.12.6 fs/ggml/ggml.go:614-625 at 4096 x 1, batch 512: full is the logits' 4b(E+V)
    (over 4b(1+4E+c(1+H))), partial 4bE + the attention term (over the vocabulary's)."""
    c, b = 4096, 512
    est = LLAMA.llama_estimate(c, 1, 512, "f16", "0.12.6")
    assert est.full == max(4 * b * (1 + 4 * E + c * (1 + H)), 4 * b * (E + V)) \
        == 4 * b * (E + V) == 268_959_744
    attention = 4 * b * (1 + E + max(c, E)) + E * E * 9 // 16 + 4 * c * (b * H + D * HKV)
    vocab = 4 * b * (E + V) + E * V * 105 // 128
    assert est.partial == 4 * b * E + max(attention, vocab) == 598_456_320
    # at 32768 x 1 the context's term is the larger full graph: 1624 MiB
    est = LLAMA.llama_estimate(32768, 1, 512, "f16", "0.12.6")
    assert est.full == 4 * b * (1 + 4 * E + 32768 * (1 + H)) == 1_702_889_472
    # the batch is min(num_ctx, num_batch) (v0.12.6 llm/memory.go:210)
    assert LLAMA.llama_estimate(256, 1, 512, "f16", "0.12.6").full == \
        max(4 * 256 * (1 + 4 * E + 256 * (1 + H)), 4 * 256 * (E + V))


def test_an_architecture_without_a_case_takes_gqa_times_the_cache_over_6() -> None:
    """GraphSize has no phi3 or lfm2 case (0), and memory.go / Load set partial = full =
    HeadCountMax / HeadCountKVMin x all the KV / 6 (v0.12.6 llm/memory.go:221-231; v0.24.0
    llm/server.go:631-641): phi3 mini 32/32; lfm2's convolution layers have 0 KV heads, the
    minimum taken as 1, so 32 x its six attention layers' cache / 6."""
    est = PHI3.llama_estimate(4096, 2, 512, "f16", "0.12.6")
    kv = 4096 * 2 * (96 + 96) * 32 * 2  # a layer's: 8192 cells x 192 dims x 32 KV heads, f16
    weights = (int(PHI3.gpu_weights_mib * MIB) - est.output) // 32  # a layer's, of the file
    assert sum(est.layers) - 32 * weights == 32 * kv
    assert est.full == est.partial == 1 * 32 * kv // 6
    lfm = LFM2_1_2B.llama_estimate(4096, 1, 512, "f16", "0.24.0")
    attn = 4096 * (64 + 64) * 8 * 2
    assert lfm.full == lfm.partial == 32 * 6 * attn // 6 == 32 * attn


def test_the_estimate_counts_the_cache_type_as_ollama_does() -> None:
    """kvCacheBytesPerElement (v0.12.6 fs/ggml/ggml.go:904-915): q8_0 one byte an element."""
    f16 = LLAMA.llama_estimate(4096, 1, 512, "f16", "0.24.0")
    q8 = LLAMA.llama_estimate(4096, 1, 512, "q8_0", "0.24.0")
    assert sum(f16.layers) - sum(q8.layers) == 28 * 4096 * 256 * HKV * 1


def test_the_buffer_layer_and_the_minimum_are_reported_only_before_0_12_11() -> None:
    """0.12.6-0.12.10 report MinimumMemory and blk.0 once more (llm/memory.go:306-337);
    0.12.11+ report the layers, the output and the full graph (v0.24.0 llm/server.go:
    1895-1921). Both fit on the minimum, the buffer and the larger graph."""
    old = LLAMA.llama_estimate(4096, 1, 512, "f16", "0.12.10")
    new = LLAMA.llama_estimate(4096, 1, 512, "f16", "0.12.11")
    # a layer's weights: the file the GPU holds (all of it: the output is the tied table)
    # less the output, over its 28 layers
    blk0 = (int(LLAMA.gpu_weights_mib * MIB) - new.output) // 28 + 4096 * 256 * HKV * 2
    assert old.buffer == new.buffer == blk0
    assert old.reported_bytes - new.reported_bytes == MINIMUM_MEMORY_MIB * MIB + blk0
    # the tied output is output_norm + token_embd (no output.weight in the file)
    assert new.output == _group(LLAMA, "output_norm") + _group(LLAMA, "token_embd")
    assert PHI3.llama_estimate(4096, 1, 512, "f16", "0.24.0").output == \
        _group(PHI3, "output_norm") + _group(PHI3, "output")
    assert new.reported_bytes == sum(new.layers) + new.output + new.full
    assert old.required_bytes == new.required_bytes == \
        MINIMUM_MEMORY_MIB * MIB + blk0 + sum(new.layers) + new.output + new.partial
    assert old.fits(old.required_bytes + 1) and not old.fits(old.required_bytes)
    assert new.fits(new.required_bytes) and not new.fits(new.required_bytes - 1)


def _load(sim: SimServer, model: str, num_ctx: int) -> dict[str, int]:
    r = httpx.post(f"{sim.url}/api/generate", timeout=30, json={
        "model": model, "options": {"num_ctx": num_ctx, "num_batch": 512}})
    assert r.status_code == 200, r.text
    listed = httpx.get(f"{sim.url}/api/ps").json()["models"]
    return next(m for m in listed if m["model"] == model)


def test_api_ps_reports_the_estimate_by_version(sim_factory: Sims) -> None:
    """Llama 3.2 3B at 4096 and 32768 on 0.12.6, 0.12.11 and 0.24.0: /api/ps's size and
    size_vram are the estimate; the card holds the footprint, which 0.33.0 reports."""
    for version in ("0.12.6", "0.12.11", "0.24.0", "0.33.0"):
        sim = sim_factory(version, models=(LLAMA,), version=version, total_vram_mib=49152)
        for ctx in (4096, 32768):
            listed = _load(sim, LLAMA.name, ctx)
            runner = sim.sim.runners[LLAMA.name]
            c = sim.config
            physical = LLAMA.footprint_mib(ctx, 1, c.cache_type_for(LLAMA), 512, version,
                                           512, c.flash_attention_for(LLAMA))
            assert runner.vram_mib == runner.footprint_mib == physical
            if version == "0.33.0":
                assert listed["size"] == listed["size_vram"] == physical * MIB
            else:
                est = LLAMA.llama_estimate(ctx, 1, 512, c.cache_type_for(LLAMA), version)
                assert listed["size"] == listed["size_vram"] == est.reported_bytes
    # the figures (MiB) as docs/engine.md gives them
    est = {(v, ctx): LLAMA.llama_estimate(ctx, 1, 512, "f16", v).reported_bytes // MIB
           for v in ("0.12.6", "0.12.11", "0.24.0") for ctx in (4096, 32768)}
    assert est == {("0.12.6", 4096): 3164, ("0.12.6", 32768): 7780,
                   ("0.12.11", 4096): 2630, ("0.12.11", 32768): 7134,
                   ("0.24.0", 4096): 2630, ("0.24.0", 32768): 7134}


def _card_for(sim_factory: Sims, version: str, target_free_mib: int) -> SimServer:
    """A card on which phi3 mini (4096) loaded first leaves `target_free_mib` as Ollama
    counts it free: the driver's free memory, or the total less what phi3 reports if less
    (v0.12.6 server/sched.go:511-548); 0.33.0: its runner's accounting (fit_free_mib)."""
    probe = sim_factory(f"probe-{version}", models=(PHI3, LLAMA), version=version,
                        total_vram_mib=65536, flash_attention=True)
    _load(probe, PHI3.name, 4096)
    runner = probe.sim.runners[PHI3.name]
    taken = max(runner.vram_mib + MINIMUM_MEMORY_MIB, -(-runner.reported_vram_bytes // MIB))
    sim = sim_factory(version, models=(PHI3, LLAMA), version=version,
                      total_vram_mib=taken + target_free_mib, flash_attention=True)
    _load(sim, PHI3.name, 4096)
    return sim


def test_a_copy_that_fits_physically_but_not_by_the_estimate_evicts(sim_factory: Sims
                                                                    ) -> None:
    """Llama 3.2 3B at 32768 with flash attention (OLLAMA_FLASH_ATTENTION) beside phi3 mini,
    with 7100 MiB free as Ollama counts it: llama.cpp would take its footprint (5767 MiB + a
    457 MiB CUDA context), but the estimate asks for more than 7100 (7901 MiB: the graph
    estimate has no flash attention for llama), so 0.12.6 and 0.24.0 evict phi3 first.
    0.33.0 asks that 80 % of the free memory hold its own estimate (file + f16 cache, 5510
    MiB: 80 % of 7100 is 5680): it loads beside."""
    target = 7100
    est = LLAMA.llama_estimate(32768, 1, 512, "f16", "0.24.0")
    assert est.required_bytes // MIB == 7901 and not est.fits(target * MIB)
    assert LLAMA.estimate_mib(32768, 1) == 5510 <= target * 80 // 100
    for version, evicts in (("0.12.6", True), ("0.24.0", True), ("0.33.0", False)):
        sim = _card_for(sim_factory, version, target)
        c = sim.config
        physical = LLAMA.footprint_mib(32768, 1, c.cache_type_for(LLAMA), 512, version, 512,
                                       c.flash_attention_for(LLAMA))
        assert physical + MINIMUM_MEMORY_MIB <= target, version  # it would fit
        if version != "0.33.0":
            assert target * MIB <= sim.sim.estimator_free_bytes() < (target + 1) * MIB
        _load(sim, LLAMA.name, 32768)
        assert sim.sim.stats.self_evictions == (1 if evicts else 0), version
        assert (PHI3.name in sim.sim.runners) is not evicts, version
        assert sim.sim.stats.spills == 0


def test_before_0_30_a_runner_s_batch_is_512_with_no_compute_tier() -> None:
    """The automatic batch and its compute (768 MiB from 4097 tokens in all, 2 GiB above
    32768) are 0.30's (server/sched.go:798-833, 906-915); v0.24.0's scheduler has none."""
    qwen3 = next(m for m in CATALOG if m.name == "qwen3:8b")
    body = {"model": qwen3.name, "options": {"num_ctx": 16384}}
    for version, batch in (("0.12.6", 512), ("0.24.0", 512), ("0.33.0", 1024)):
        sim = OllamaSim(SimConfig(models=CATALOG, version=version, num_parallel=2))
        assert sim.resolve(qwen3, body).num_batch == batch, version
