"""Sliding-window (and chunked) attention: what the windowed layers' KV cache holds, as
Ollama's engines size it, one row per worked example.

Expected figures are worked out by hand: from 0.30 llama-server's iSWA cache (one stream per
slot, each min(context, window + ubatch) cells padded to 256, llama-kv-cache-iswa.cpp; -ub
the automatic batch, 512 / 1024 / 2048 by context x slots, llm/llama_server.go:581-593,
server/sched.go:798-833); before, Ollama's own engine (v0.12.6 kvcache/causal.go:136-186:
slots x memory + 512 padded to 256, memory the window, one more cell with several slots,
gpt-oss 4096; the whole context when that is no smaller), and its llama engine's swa_full.
Architectures from the models' published configs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadtest import sim_model
from loadtest.sim_engine import auto_batch
from proxy.core.sizing import Sizer, kv_mib, ollama_estimate_mib, weights_floor_mib
from proxy.core.types import ModelInfo, ProviderView
from proxy.service.codec import decode_model_info, encode_model_info
from proxy.service.prober import model_info

KIB = 1024
MIB = 1 << 20


def show(arch: str, blocks: int, embedding: int, heads: int, kv_heads: int, head_dim: int,
         **extra: object) -> dict[str, object]:
    info: dict[str, object] = {
        "general.architecture": arch, f"{arch}.block_count": blocks,
        f"{arch}.embedding_length": embedding, f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv_heads, f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim, f"{arch}.context_length": 131072}
    info.update({f"{arch}.{k}": v for k, v in extra.items()})
    return {"model_info": info, "details": {"family": arch}}


# 62 layers x 16 KV heads x (128 + 128) x 2 B = 8 KiB a layer; every 6th of 62 full: 10
GEMMA3_27B = model_info(show("gemma3", 62, 5376, 32, 16, 128,
                             **{"attention.sliding_window": 1024}))
# 24 layers x 8 KV heads x (64 + 64) x 2 B = 2 KiB a layer; every other windowed: 12
GPT_OSS_20B = model_info(show("gpt-oss", 24, 2880, 64, 8, 64,
                              **{"attention.sliding_window": 128}))
# llama4 scout: 48 layers x 8 x 256 x 2 = 4 KiB a layer; 36 chunked, chunks of 8192
LLAMA4_SCOUT = model_info(show("llama4", 48, 5120, 40, 8, 128))
# gemma2 9b: 42 layers x 8 x 512 x 2 = 8 KiB a layer; every other windowed (21), 4096
GEMMA2_9B = model_info(show("gemma2", 42, 3584, 16, 8, 256,
                            **{"attention.sliding_window": 4096}))
# command-r7b (cohere2): 32 layers x 8 x 256 x 2 = 4 KiB a layer; every 4th full: 24 windowed
COMMAND_R7B = model_info(show("cohere2", 32, 4096, 32, 8, 128,
                              **{"attention.sliding_window": 4096}))
# olmo-3 7b: 32 layers x 32 x 256 x 2 = 16 KiB a layer; every 4th full: 24 windowed
OLMO3_7B = model_info(show("olmo3", 32, 4096, 32, 32, 128,
                           **{"attention.sliding_window": 4096}))
# gemma3n e4b: 35 layers x 2 x 512 x 2 = 2 KiB a layer, the last 15 reading earlier layers'
# cache; of the first 20, every 5th full: 4 full, 16 windowed of 512
GEMMA3N_E4B = model_info(show("gemma3n", 35, 2048, 8, 2, 256, **{
    "attention.sliding_window": 512, "attention.shared_kv_layers": 15,
    "attention.sliding_window_pattern": [(i + 1) % 5 != 0 for i in range(35)]}))
# gemma4, a layout of 6 layers, every 6th full: windowed 8 KV heads x (256 + 256) x 2 B =
# 8 KiB a layer (its key_length_swa), the full one 2 x (512 + 512) x 2 = 4 KiB; 44 KiB a token
GEMMA4 = model_info(show("gemma4", 6, 2816, 16, 8, 512, **{
    "attention.head_count_kv": [8, 8, 8, 8, 8, 2], "attention.key_length_swa": 256,
    "attention.value_length_swa": 256, "attention.sliding_window": 1024,
    "attention.sliding_window_pattern": [True] * 5 + [False]}))
# laguna, a layout of 8 layers x 8 KV heads x 256 x 2 = 4 KiB a layer, the file's pattern
# (3 windowed, 1 full) and its window's default of 512
LAGUNA = model_info(show("laguna", 8, 2048, 16, 8, 128, **{
    "attention.sliding_window_pattern": [True, True, True, False] * 2}))


def test_the_windowed_layers_and_their_window_are_read_from_show() -> None:
    assert (GEMMA3_27B.kv_bytes_per_token, GEMMA3_27B.swa_kv_bytes_per_token,
            GEMMA3_27B.swa_window, GEMMA3_27B.swa_chunked) == (496 * KIB, 52 * 8 * KIB, 1024,
                                                               False)
    assert (GPT_OSS_20B.swa_kv_bytes_per_token, GPT_OSS_20B.swa_window) == (12 * 2 * KIB, 128)
    assert (LLAMA4_SCOUT.swa_kv_bytes_per_token, LLAMA4_SCOUT.swa_window,
            LLAMA4_SCOUT.swa_chunked) == (36 * 4 * KIB, 8192, True)
    # a file that lists its own pattern (newer converters): that pattern
    listed = model_info(show("gemma3", 4, 1024, 8, 4, 128, **{
        "attention.sliding_window": 512,
        "attention.sliding_window_pattern": [True, False, True, True]}))
    assert listed.swa_kv_bytes_per_token == 3 * 4 * 256 * 2
    # an architecture whose window Ollama's engines do not keep short here: every layer full
    phi3 = model_info(show("phi3", 32, 3072, 32, 32, 96, **{"attention.sliding_window": 2047}))
    assert (phi3.swa_kv_bytes_per_token, phi3.swa_window) == (0, 0)
    # no window in the file: no windowed layers
    assert model_info(show("gemma3", 62, 5376, 32, 16, 128)).swa_window == 0
    assert model_info(show("olmo2", 16, 2048, 16, 16, 128)).swa_window == 0


@pytest.mark.parametrize(("info", "kv", "windowed", "window"), [
    (COMMAND_R7B, 32 * 4 * KIB, 24 * 4 * KIB, 4096),
    (OLMO3_7B, 32 * 16 * KIB, 24 * 16 * KIB, 4096),
    (GEMMA3N_E4B, 20 * 2 * KIB, 16 * 2 * KIB, 512),  # not 35 layers of cache
    (LAGUNA, 8 * 4 * KIB, 6 * 4 * KIB, 512),
    (GEMMA4, 44 * KIB, 40 * KIB, 1024),  # not 84: the windowed layers' own head size
    # its layer types (1 sliding) when the file lists no pattern; neither: no windowed layers
    (model_info(show("laguna", 8, 2048, 16, 8, 128, **{
        "attention.sliding_window": 1024, "attention.layer_types": [1, 1, 1, 0] * 2})),
     8 * 4 * KIB, 6 * 4 * KIB, 1024),
    (model_info(show("laguna", 8, 2048, 16, 8, 128)), 8 * 4 * KIB, 0, 0),
])
def test_the_other_windowed_architectures_are_read_from_show(info: ModelInfo, kv: int,
                                                              windowed: int,
                                                              window: int) -> None:
    assert (info.kv_bytes_per_token, info.swa_kv_bytes_per_token, info.swa_window,
            info.swa_chunked) == (kv, windowed, window, False)
    assert decode_model_info(encode_model_info(info)) == info
    assert decode_model_info(encode_model_info(GEMMA3_27B)) == GEMMA3_27B


@pytest.mark.parametrize(("info", "version", "context", "slots", "mib"), [
    # gemma3 27b at 0.33: 10 full layers x 8 KiB x context x slots, 52 windowed x 8 KiB x
    # slots x pad256(min(context, 1024 + ubatch))
    (GEMMA3_27B, "0.33.0", 32768, 1, 2560 + 832),  # 2048 cells: not the 15872 of all 62
    (GEMMA3_27B, "0.33.0", 4096, 1, 320 + 624),  # ubatch 512: 1536 cells
    (GEMMA3_27B, "0.33.0", 1024, 1, 80 + 416),  # the context is less than window + batch
    (GEMMA3_27B, "0.33.0", 8192, 4, 2560 + 3328),  # 4 streams of 1024 + 1024
    (GEMMA3_27B, "", 4096, 1, 320 + 624),  # an unknown version: the newest rules
    # 0.12.6's own engine: pad256(slots x (1024, +1 with several slots) + 512)
    (GEMMA3_27B, "0.12.6", 4096, 1, 320 + 624),
    (GEMMA3_27B, "0.12.6", 8192, 4, 2560 + 1976),  # 4 x 1025 + 512 = 4612 -> 4864 cells
    (GEMMA3_27B, "0.12.6", 1024, 1, 496),  # the window is the whole context: all full
    # gpt-oss 20b: 12 full x 2 KiB, 12 windowed; 0.33: pad256(128 + 1024) = 1280 cells
    (GPT_OSS_20B, "0.33.0", 32768, 1, 768 + 30),
    # 0.12.6: 4096 a sequence + 512 = 4608 cells (also its own estimate, fs/ggml GraphSize)
    (GPT_OSS_20B, "0.12.6", 32768, 1, 768 + 108),
    (GPT_OSS_20B, "0.12.6", 4096, 1, 192),  # 4096 is no smaller than the context: all full
    # llama4: 12 full x 4 KiB; 0.33: 36 chunked x pad256(8192 + 1024) = 9216 cells
    (LLAMA4_SCOUT, "0.33.0", 32768, 1, 1536 + 1296),
    (LLAMA4_SCOUT, "0.12.6", 32768, 1, 6144),  # 0.12's engine keeps a chunk layer whole
    # gemma2 9b: 0.33 21 windowed x pad256(4096 + 1024) = 5120 cells; 0.12.6 runs it on the
    # llama engine with swa_full (llama_context_default_params): every layer full
    (GEMMA2_9B, "0.33.0", 8192, 1, 1344 + 840),
    (GEMMA2_9B, "0.12.6", 8192, 1, 2688),
    # command-r7b: 8 full x 4 KiB; 0.33 24 windowed x 4 KiB x pad256(4096 + ubatch) a slot
    (COMMAND_R7B, "0.33.0", 32768, 1, 1024 + 480),  # 5120 cells: not 4096 for all 32
    (COMMAND_R7B, "0.33.0", 8192, 4, 1024 + 1920),  # 4 streams of 4096 + 1024
    (COMMAND_R7B, "0.33.0", 4096, 1, 512),  # the context is less than window + batch
    (COMMAND_R7B, "0.12.6", 32768, 1, 4096),  # the llama engine: swa_full
    # olmo-3 7b: 8 full x 16 KiB; 0.33 24 windowed x 16 KiB x pad256(4096 + 1024) = 5120
    (OLMO3_7B, "0.33.0", 32768, 1, 4096 + 1920),
    # 0.13.4-0.24 its own engine: 4096 + 512 = 4608 cells
    (OLMO3_7B, "0.24.0", 32768, 1, 4096 + 1728),
    (OLMO3_7B, "0.13.3", 32768, 1, 16384),  # not yet on the own engine: whole
    # gemma3n e4b: 4 full x 2 KiB; 16 windowed x 2 KiB; 15 shared layers none
    (GEMMA3N_E4B, "0.33.0", 32768, 1, 256 + 48),  # pad256(512 + 1024) = 1536 cells
    (GEMMA3N_E4B, "0.12.6", 32768, 1, 256 + 32),  # 512 + 512 = 1024 cells
    (GEMMA3N_E4B, "0.12.6", 8192, 4, 256 + 88),  # 4 x 513 + 512 = 2564 -> 2816 cells
    (GEMMA3N_E4B, "0.12.6", 512, 1, 20),  # the window is the whole context: all full
    # gemma4: 1 full x 4 KiB; 0.20-0.24 its own engine, 5 windowed x 8 KiB x (4096 a
    # sequence + 512) cells; 0.30+ every layer whole, at its own head size
    (GEMMA4, "0.24.0", 32768, 1, 128 + 180),
    (GEMMA4, "0.24.0", 4096, 1, 176),  # 4096 is no smaller than the context: all full
    (GEMMA4, "0.33.0", 32768, 1, 1408),
    # laguna: 2 full x 4 KiB; 0.22-0.24 its own engine, 6 windowed x 4 KiB x (512 + 512)
    (LAGUNA, "0.24.0", 32768, 1, 256 + 24),
    (LAGUNA, "0.21.0", 32768, 1, 1024),  # not yet on the own engine: whole
    (LAGUNA, "0.33.0", 32768, 1, 1024),  # llama-server not known to keep it short: whole
])
def test_windowed_layers_hold_what_the_engine_keeps(info: ModelInfo, version: str,
                                                    context: int, slots: int, mib: int) -> None:
    assert kv_mib(info, context, slots, "f16", version) == mib


def test_the_cache_type_scales_both_parts() -> None:
    # q8_0: 34 B for 32 values, (2560 + 832) MiB x 17 / 32
    assert kv_mib(GEMMA3_27B, 32768, 1, "q8_0", "0.33.0") == 1802


def test_ollamas_own_estimate_still_counts_every_layer_at_the_full_context() -> None:
    """PredictServerVRAM (llm/llama_server.go:2678-2700) knows no window: 62 layers x 16 KV
    heads x 5376 / 32 x (K and V) x 2 B a token."""
    assert GEMMA3_27B.estimate_kv_bytes_per_token == 62 * 16 * 168 * 4
    assert ollama_estimate_mib(GEMMA3_27B, 16590, 32768, 1) == 16590 + 20832


def card(name: str, version: str = "0.33.0", **fields: object) -> ProviderView:
    return ProviderView(name, 32768, version=version, disk_mib={"gemma3:27b": 16590},
                        models={"gemma3:27b": GEMMA3_27B}, **fields)  # type: ignore[arg-type]


def test_a_copy_seen_at_a_large_context_is_not_made_small_at_a_smaller_one() -> None:
    """Seen at 32768 with 20509 MiB (the simulator's gemma3:27b: 0.97 of the file, 3392 KV,
    256 compute and the 1024 batch's 768): the weights are 20509 - 3392 - 768. Counted with
    every layer full, the KV would be 15872 and the weights 3869, and a copy at 4096 would
    look 5853 MiB, not the 17293 it takes."""
    seen = card("seen", observed={"gemma3:27b": {32768: 20509}})
    other = card("other", context_length=4096)
    fp = Sizer((seen, other), 1.2).footprint("gemma3:27b", other, 4096)
    assert fp is not None and fp.source == "calibrated from seen at 32768 x 1"
    assert (fp.weights_mib, fp.kv_mib, fp.graph_mib, fp.total_mib) == (
        16349, 944, 0, 17293)


def test_calibrated_weights_never_fall_below_the_file_less_its_token_embeddings() -> None:
    """A windowed KV the sidecar does not model (here the window left out of what it read)
    makes the weights of a copy seen at a large context come out far too small: they are
    raised to the file less its token embeddings at f16 (262144 x 5376 x 2 B = 2688 MiB)."""
    unmodelled = ModelInfo(trained_context=131072, kv_bytes_per_token=496 * KIB,
                           architecture="gemma3", token_embedding_bytes=262144 * 5376 * 2)
    assert weights_floor_mib(unmodelled, 16590) == 13902
    assert weights_floor_mib(ModelInfo(), 16590) == 0  # nothing known: no floor
    views = [ProviderView(n, 32768, disk_mib={"gemma3:27b": 16590},
                          models={"gemma3:27b": unmodelled}, observed=seen)
             for n, seen in (("seen", {"gemma3:27b": {32768: 20509}}), ("other", {}))]
    fp = Sizer(views, 1.2).footprint("gemma3:27b", views[1], 4096)
    assert fp is not None and fp.weights_mib == 13902  # not 20509 - 15872 - 768 = 3869
    assert fp.source.endswith("raised to the file less its token embeddings")
    assert fp.total_mib == 13902 + 1984
    # the catalog's other models stay above it: qwen3 8b's file 5200 less 2048 MiB
    qwen = model_info(show("qwen3", 36, 4096, 32, 8, 128))
    assert weights_floor_mib(qwen, 5200) == 5200 - 2048


def test_the_vocabulary_when_show_gives_it() -> None:
    sized = model_info(show("gemma3", 62, 5376, 32, 16, 128, vocab_size=1000))
    assert sized.token_embedding_bytes == 1000 * 5376 * 2
    listed = show("gemma3", 62, 5376, 32, 16, 128)
    listed["model_info"]["tokenizer.ggml.tokens"] = ["a", "b"]  # type: ignore[index]
    assert model_info(listed).token_embedding_bytes == 2 * 5376 * 2


@pytest.mark.parametrize("version", ["0.12.6", "0.33.0"])
@pytest.mark.parametrize(("context", "slots"), [(1024, 1), (4096, 1), (8192, 4), (32768, 1),
                                                (131072, 1)])
def test_the_sidecar_reads_the_simulators_window_models_as_it_sizes_them(
        version: str, context: int, slots: int) -> None:
    """What the sidecar reads of the simulator's /api/show gives the KV the simulator holds
    (its batch: 0.30+'s automatic one, 0.12's 512)."""
    for model in (sim_model.CATALOG[-1], *sim_model.WINDOWED_MODELS):
        info = model_info({"model_info": model.model_info(),
                           "details": {"family": model.model_family}})
        batch = auto_batch(context, slots) if version == "0.33.0" else 512
        windowed = model.footprint_mib(context, slots, "f16", batch, version)
        flat = replace(model, sliding_window=0).footprint_mib(context, slots, "f16", batch,
                                                              version)
        weights_and_compute = flat - kv_mib(replace(info, swa_window=0), context, slots)
        assert abs(windowed - weights_and_compute
                   - kv_mib(info, context, slots, "f16", version)) <= 1, model.name


def test_a_cohere2_copy_seen_at_a_large_context_sizes_a_smaller_one_as_the_simulator() -> None:
    """command-r7b seen at 32768 on 0.33 takes 7880 MiB in the simulator (all 5100 of its
    file, its output tied to the token table; 1504 KV, 508 compute for its 256000-token
    logits, the 1024 batch's 768): the weights are 7880 - 1504 - 768 = 5608, and a copy at
    4096 is 5608 + 512 = 6120, what the
    simulator holds. With every layer full the KV seen would be 4096, the weights 3016 raised
    to the file less its embeddings (5100 - 2048 = 3052), and the copy at 4096 3564 MiB: 2556
    too few."""
    model = sim_model.COMMAND_R7B
    views = [ProviderView(n, 32768, version="0.33.0", disk_mib={model.name: model.disk_mib},
                          models={model.name: COMMAND_R7B}, observed=seen)
             for n, seen in (("seen", {model.name: {32768: model.footprint_mib(
                 32768, 1, "f16", 1024, "0.33.0")}}), ("other", {}))]
    assert views[0].observed[model.name][32768] == 7880
    fp = Sizer(views, 1.2).footprint(model.name, views[1], 4096)
    assert fp is not None and fp.source == "calibrated from seen at 32768 x 1"
    assert (fp.weights_mib, fp.kv_mib, fp.total_mib) == (5608, 512, 6120)
    assert fp.total_mib == model.footprint_mib(4096, 1, "f16", 512, "0.33.0")
