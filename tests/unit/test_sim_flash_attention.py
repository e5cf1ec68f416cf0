"""Flash attention in the simulator: whether a copy runs with it, by version, engine, model and
OLLAMA_FLASH_ATTENTION (sim_engine.runs_flash_attention), the KV cache type that follows,
and the compute buffers without it: the attention scores of a batch, as Ollama's estimate for
the llama family counts them (v0.12.6 fs/ggml/ggml.go:613-617)."""

from __future__ import annotations

import math
from collections.abc import Callable

import httpx
import pytest

from loadtest.ollama_sim import SimServer, configs_from
from loadtest.sim_engine import (
    MIB,
    attention_batch,
    attention_cells,
    attention_scores_bytes,
    runner_cache_type,
    runs_flash_attention,
    supports_flash_attention,
)
from loadtest.sim_model import CATALOG, GEMMA3N_E4B, SimConfig, SimModel

Sims = Callable[..., SimServer]

# Llama 3.1 8B's architecture (Meta's config: 32 layers, hidden 4096, 32 heads, 8 KV heads,
# head dim 128, vocabulary 128256), about 4.9 GB at Q4_K_M
LLAMA_8B = SimModel("llama3.1:8b", disk_mib=4700, arch="llama", block_count=32,
                    embedding_length=4096, head_count=32, head_count_kv=8, key_length=128,
                    value_length=128, trained_ctx=131072, feed_forward_length=14336)
QWEN3 = next(m for m in CATALOG if m.arch == "qwen3")
NOMIC = next(m for m in CATALOG if m.embedding)
EQUAL = (128, 128)


def llama_engine(version: str, arch: str = "llama", setting: bool | None = None,
                 gpu: bool = True, embedding: bool = False, dims: tuple[int, int] = EQUAL
                 ) -> bool:
    return runs_flash_attention(version, arch, embedding, dims, False, setting, gpu)


def own_engine(version: str, arch: str = "gemma3n", setting: bool | None = None,
               gpu: bool = True) -> bool:
    return runs_flash_attention(version, arch, False, EQUAL, True, setting, gpu)


def test_before_0_13_4_every_engine_takes_the_list_the_setting_gpu_and_model() -> None:
    """v0.12.6 llm/server.go:199-211: envconfig.FlashAttention(f.FlashAttention()), then off
    on a GPU or a model without support."""
    assert own_engine("0.12.6", "qwen3") and llama_engine("0.12.6", "gemma3")
    assert not llama_engine("0.12.6") and not llama_engine("0.13.3")
    assert llama_engine("0.13.3", setting=True)
    assert not own_engine("0.12.6", "qwen3", setting=False)
    assert not own_engine("0.12.6", "qwen3", gpu=False)
    assert not llama_engine("0.12.6", setting=True, gpu=False)
    assert not llama_engine("0.12.6", setting=True, embedding=True)


def test_from_0_13_4_the_llama_engine_runs_auto_unless_the_setting_is_set() -> None:
    """v0.24.0 llm/server.go:227-255 (commit bd6c1d6b4): auto when OLLAMA_FLASH_ATTENTION is
    unset (llama.cpp turns it on where the GPU runs it); when set, Ollama's decision, which
    still turns it off for a model or GPU without support (:203-211)."""
    assert llama_engine("0.13.4") and llama_engine("0.29.9")
    assert llama_engine("0.13.4", embedding=True) and llama_engine("0.13.4", "gemma2")
    assert not llama_engine("0.13.4", gpu=False)
    assert not llama_engine("0.13.4", setting=False)
    assert llama_engine("0.13.4", setting=True)
    assert not llama_engine("0.13.4", setting=True, embedding=True)
    assert not llama_engine("0.13.4", setting=True, gpu=False)


def test_ollamas_own_engine_keeps_the_list_until_0_30() -> None:
    """The `else` branch of v0.24.0 llm/server.go:256-271; 0.30+ runs every model in
    llama-server with --flash-attn auto unless set (HEAD llm/llama_server.go:596-621)."""
    assert not own_engine("0.13.4") and not own_engine("0.29.9")
    assert own_engine("0.29.9", setting=True)
    assert own_engine("0.30.0") and own_engine("0.33.0", "llama")
    assert not own_engine("0.30.0", gpu=False)
    assert own_engine("0.30.0", setting=True, gpu=False)  # --flash-attn on
    assert not own_engine("0.30.0", "qwen3", setting=False)
    assert runs_flash_attention("0.30.0", "nomic-bert", True, (64, 32), False, None, True)


@pytest.mark.parametrize(("arch", "since", "before"), [
    ("qwen3vl", "0.12.8", "0.12.7"), ("mistral3", "0.13.2", "0.13.1"),
    ("olmo3", "0.13.4", "0.13.3"), ("bert", "0.13.5", "0.13.4"),
    ("lfm2", "0.14.3", "0.14.2"), ("qwen3next", "0.15.5", "0.15.4"),
    ("nemotron_h", "0.17.1", "0.17.0"), ("gemma4", "0.20.4", "0.20.3"),
    ("nemotron_h_omni", "0.22.0", "0.21.2"),
])
def test_an_architecture_runs_with_it_from_the_version_whose_list_has_it(
        arch: str, since: str, before: str) -> None:
    """fs/ggml/ggml.go FlashAttention(), each tag's list (v0.12.6:893-901, v0.24.0:890-908)."""
    assert own_engine(since, arch) and not own_engine(before, arch)


def test_supports_flash_attention_by_model() -> None:
    """SupportsFlashAttention (v0.12.6 fs/ggml/ggml.go:876-891, v0.24.0:868-887)."""
    assert supports_flash_attention("llama", False, 128, 128, "0.12.6")
    assert not supports_flash_attention("qwen3", True, 128, 128, "0.12.6")  # pooling_type
    assert not supports_flash_attention("gemma2", False, 256, 256, "0.24.0")
    assert supports_flash_attention("grok", False, 128, 128, "0.18.3")
    assert not supports_flash_attention("grok", False, 128, 128, "0.19.0")
    assert not supports_flash_attention("deepseek2", False, 192, 128, "0.24.0")
    assert not supports_flash_attention("llama", False, 0, 0, "0.24.0")
    assert not supports_flash_attention("qwen35", False, 256, 128, "0.17.0")
    assert supports_flash_attention("qwen35", False, 256, 128, "0.17.1")
    # a model's own head dims: key_length / value_length, else embedding / heads
    unequal = SimModel("odd", disk_mib=100, arch="gemma3", key_length=256, value_length=128)
    config = SimConfig(models=(unequal,), version="0.12.6")
    assert not config.flash_attention_for(unequal)
    assert config.flash_attention_for(QWEN3)
    assert not config.flash_attention_for(NOMIC)


def test_the_cache_type_follows_flash_attention() -> None:
    """0.12: the cache type only with flash attention (v0.12.6 llm/server.go:213-228); from
    0.13.4 the llama engine takes a quantized one only when OLLAMA_FLASH_ATTENTION turned it
    on (v0.24.0 llm/server.go:237-253); 0.30+ always (HEAD llm/llama_server.go:393-396)."""
    old = SimConfig(version="0.12.6", kv_cache_type="q8_0")
    assert old.cache_type_for(QWEN3) == "q8_0" and old.cache_type_for(LLAMA_8B) == "f16"
    assert SimConfig(version="0.12.6", kv_cache_type="q8_0", flash_attention=True
                     ).cache_type_for(LLAMA_8B) == "q8_0"
    auto = SimConfig(version="0.13.4", kv_cache_type="q8_0")
    assert auto.flash_attention_for(LLAMA_8B) and auto.cache_type_for(LLAMA_8B) == "f16"
    assert SimConfig(version="0.13.4", kv_cache_type="q8_0", flash_attention=True
                     ).cache_type_for(LLAMA_8B) == "q8_0"
    assert auto.cache_type_for(QWEN3) == "q8_0"  # its own engine, in the list
    assert SimConfig(version="0.24.0", kv_cache_type="q8_0").cache_type_for(GEMMA3N_E4B) \
        == "f16"
    assert SimConfig(version="0.30.0", kv_cache_type="q8_0", flash_attention=False
                     ).cache_type_for(LLAMA_8B) == "q8_0"
    assert runner_cache_type("0.13.4", False, None, True, "f16") == "f16"


def test_without_flash_attention_the_compute_is_ollamas_llama_estimate() -> None:
    """4 x 512 x (1 + 4 x 4096 + 4096 x 33) B = 296.002 MiB at 4096 (llama.cpp reports 296.00
    for Llama 3 8B), 560.002 at 8192: 297 and 561 MiB rounded up; with it, its logits and
    hidden states, 4 x 512 x (4096 + 128256) B = 258.5 MiB: 259."""
    assert attention_scores_bytes(512, 4096, 4096, 32) == 4 * 512 * (1 + 16384 + 4096 * 33)
    assert attention_scores_bytes(512, 4096, 4096, 32) / MIB == pytest.approx(296.002, abs=1e-3)
    assert attention_scores_bytes(512, 8192, 4096, 32) / MIB == pytest.approx(560.002, abs=1e-3)
    for version in ("0.12.6", "0.33.0"):
        assert LLAMA_8B.compute_mib(4096, 1, 512, version, 512, False) == 297
        assert LLAMA_8B.compute_mib(8192, 1, 512, version, 512, False) == 561
        assert LLAMA_8B.compute_mib(8192, 1, 512, version, 512, True) == 259
    # never below the compute with it: a small model at a short context, a larger batch
    small = next(m for m in CATALOG if m.name == "llama3.2:3b")
    assert small.compute_mib(4096, 1, 512, "0.12.6", 512, False) == 257  # 224.9 MiB
    assert LLAMA_8B.compute_mib(8192, 1, 1024, "0.12.6", 512, False) == 259 + 768
    # an encoder without a cache attends to its batch: 4 x 512 x (1 + 3072 + 512 x 13) B
    assert NOMIC.compute_mib(2048, 1, 0, "0.12.6", 512, False) == 256
    footprint = LLAMA_8B.footprint_mib(8192, 1, "f16", 512, "0.12.6", 512, False)
    assert footprint - LLAMA_8B.footprint_mib(8192, 1, "f16", 512, "0.12.6", 512) == 561 - 259


def test_the_scores_batch_and_cells_follow_each_engine() -> None:
    """llama.cpp reserves min(n_ctx, n_ubatch) tokens: before 0.13.3 the llama engine's
    ubatch is llama.cpp's default 512, then the batch (commit 3475d915c); Ollama's own engine
    a batch of num_batch; one stream per slot in llama.cpp, one cache for all slots in
    Ollama's own engine; padded to 32 cells."""
    assert attention_batch("0.12.6", False, False, 1024, 8192, 1) == 512
    assert attention_batch("0.12.6", False, False, 256, 8192, 2) == 512
    assert attention_batch("0.13.3", False, False, 1024, 8192, 1) == 1024
    assert attention_batch("0.13.3", False, True, 512, 2048, 1) == 2048  # embedding: its context
    assert attention_batch("0.12.6", True, False, 1024, 8192, 2) == 1024
    assert attention_batch("0.12.6", False, False, 512, 256, 1) == 256
    assert attention_batch("0.33.0", False, False, 2048, 1024, 1) == 1024
    assert attention_cells("0.12.6", False, 8192, 4) == 8192
    assert attention_cells("0.12.6", True, 8192, 4) == 4 * 8192
    assert attention_cells("0.33.0", False, 8192, 4) == 8192
    assert attention_cells("0.12.6", True, 1000, 1) == 1024
    # Ollama's own engine attends to every slot's cells (its 262144-token logits, 516 MiB,
    # are the larger part at 8192 x 2)
    assert GEMMA3N_E4B.compute_mib(32768, 2, 512, "0.12.6", 512, False) == math.ceil(
        attention_scores_bytes(512, 2 * 32768, 2048, 8) / MIB)


def _size_vram(sim: SimServer, model: str, num_ctx: int) -> int:
    r = httpx.post(f"{sim.url}/api/generate", timeout=30, json={
        "model": model, "options": {"num_ctx": num_ctx, "num_batch": 512}})
    assert r.status_code == 200, r.text
    listed = httpx.get(f"{sim.url}/api/ps").json()["models"]
    return int(next(m for m in listed if m["model"] == model)["size_vram"]) // MIB


def _held(sim: SimServer, model: str, num_ctx: int) -> tuple[int, int]:
    """What the card holds of the copy, and what /api/ps reports (MiB)."""
    reported = _size_vram(sim, model, num_ctx)
    return sim.sim.runners[model].vram_mib, reported


def test_a_pre_0_30_card_holds_the_scores_of_a_llama_model(sim_factory: Sims) -> None:
    """Llama 3 8B at 8192 (batch 512): 0.12.6 runs it without flash attention (llama is not
    in its list), so the card holds 561 - 259 MiB more than 0.33.0's, which runs it with;
    the same once OLLAMA_FLASH_ATTENTION is set. 0.12.6's /api/ps reports Ollama's estimate
    (SimModel.llama_estimate), with or without: 6616 MiB; 0.33.0's what it holds."""
    models = (LLAMA_8B,)
    old, old_ps = _held(sim_factory("old", models=models, version="0.12.6"), LLAMA_8B.name,
                        8192)
    new, new_ps = _held(sim_factory("new", models=models, version="0.33.0"), LLAMA_8B.name,
                        8192)
    assert old - new == 561 - 259
    assert new_ps == new and old_ps == 6616
    assert old_ps == LLAMA_8B.llama_estimate(8192, 1, 512, "f16", "0.12.6").reported_bytes \
        // MIB
    flash = sim_factory("flash", models=models, version="0.12.6", flash_attention=True)
    assert _held(flash, LLAMA_8B.name, 8192) == (new, old_ps)


def test_a_spread_copys_compute_on_each_gpu_is_its_footprints(sim_factory: Sims) -> None:
    """0.12.6 over two GPUs (OLLAMA_SCHED_SPREAD): each GPU holds the compute buffers the
    footprint counts, the scores (561 MiB) without flash attention."""
    sim = sim_factory("two", models=(LLAMA_8B,), version="0.12.6", total_vram_mib=2 * 24564,
                      gpu_count=2, sched_spread=True)
    _size_vram(sim, LLAMA_8B.name, 8192)
    runner = sim.sim.runners[LLAMA_8B.name]
    assert runner.parts is not None and runner.parts.gpus == (0, 1)
    one_gpu = LLAMA_8B.footprint_mib(8192, 1, "f16", 512, "0.12.6", 512, False)
    assert LLAMA_8B.compute_mib(8192, 1, 512, "0.12.6", 512, False) == 561
    assert runner.footprint_mib == one_gpu + 561


def test_the_command_line_sets_both_flags() -> None:
    unset, = configs_from([])
    assert unset.flash_attention is None and unset.gpu_flash_attention
    on, = configs_from(["--flash-attention", "on", "--no-gpu-flash-attention"])
    assert on.flash_attention is True and not on.gpu_flash_attention
    off, = configs_from(["--flash-attention", "off"])
    assert off.flash_attention is False
