"""A model's first copy, before any copy of its weights was seen: the file less the token table
llama.cpp keeps on the CPU (only beside an output layer of the file's own) plus the compute
buffers for a batch of 512, at least their logits, from /api/show's tensors."""

from __future__ import annotations

import pytest

from loadtest.sim_model import CATALOG, CURRENT_VERSION, LFM2_1_2B, WINDOWED_MODELS, SimConfig
from loadtest.sim_sched import OllamaSim
from proxy.core.sizing import (
    COMPUTE_FLOOR_MIB,
    MIB,
    Sizer,
    batch_logits_bytes,
    cpu_table_bytes,
    first_load_weights_mib,
    listed_tensors,
)
from proxy.core.types import ModelInfo, ProviderView
from proxy.service.codec import decode_model_info, encode_model_info
from proxy.service.prober import model_info

MODELS = (*CATALOG, *WINDOWED_MODELS, LFM2_1_2B)


def tensor(name: str, kind: str, *shape: int) -> dict[str, object]:
    return {"name": name, "type": kind, "shape": list(shape)}


def test_the_table_stays_on_the_cpu_only_beside_an_output_layer_of_its_own() -> None:
    table = tensor("token_embd.weight", "Q4_K", 4096, 151936)
    untied = listed_tensors([table, tensor("blk.0.attn_q.weight", "Q4_K", 4096, 4096),
                             tensor("output.weight", "Q6_K", 4096, 151936)])
    assert set(untied) == {"token_embd.weight", "output.weight"}
    assert cpu_table_bytes(untied) == 4096 * 151936 // 256 * 144  # 334 MiB
    assert cpu_table_bytes(listed_tensors([table])) == 0  # tied: the GPU holds it as well
    assert cpu_table_bytes(listed_tensors(None)) == 0  # nothing listed: none assumed off it


@pytest.mark.parametrize(("kind", "shape"), [
    ("TQ1_0", [4096, 151936]),  # a type Ollama gives no size either
    ("Q4_K", [4096, -1]), ("Q4_K", []), ("Q4_K", "4096x151936"), ("Q4_K", [4096.0, 2.0]),
])
def test_a_table_not_understood_is_taken_as_on_the_gpu(kind: str, shape: object) -> None:
    tensors = listed_tensors([{"name": "token_embd.weight", "type": kind, "shape": shape},
                              tensor("output.weight", "Q6_K", 4096, 151936)])
    assert cpu_table_bytes(tensors) == 0


def test_the_logits_come_from_the_tables_shape_else_model_info() -> None:
    llama3 = listed_tensors([tensor("token_embd.weight", "Q4_K", 3072, 128256)])
    assert batch_logits_bytes(llama3, {}, "llama") / MIB == 256.5  # llama.cpp's figure
    info = {"qwen3.embedding_length": 5120, "qwen3.vocab_size": 151936}
    assert batch_logits_bytes({}, info, "qwen3") == 4 * 512 * (5120 + 151936)
    tokens = {"qwen3.embedding_length": 8, "tokenizer.ggml.tokens": ["a", "b"]}
    assert batch_logits_bytes({}, tokens, "qwen3") == 4 * 512 * 10
    assert batch_logits_bytes({}, {"qwen3.embedding_length": 5120}, "qwen3") == 0


def test_both_figures_travel_in_the_shared_state() -> None:
    info = ModelInfo(cpu_table_bytes=350 << 20, logits_bytes=305 << 20)
    assert decode_model_info(encode_model_info(info)) == info
    assert decode_model_info({}).cpu_table_bytes == 0  # an older writer's: none assumed


def test_the_compute_is_never_taken_below_its_floor() -> None:
    assert first_load_weights_mib(ModelInfo(), 2176) == 2176 + COMPUTE_FLOOR_MIB
    small = ModelInfo(cpu_table_bytes=52 * MIB, logits_bytes=69 * MIB)  # phi3's
    assert first_load_weights_mib(small, 2176) == 2176 - 52 + COMPUTE_FLOOR_MIB
    gemma3 = ModelInfo(logits_bytes=4 * 512 * (5376 + 262144))  # tied: no table off it
    assert first_load_weights_mib(gemma3, 16590) == 16590 + 523
    # a listed table larger than model_info's at f16 (a shape not to be believed) takes
    # no more off the file than that
    odd = ModelInfo(cpu_table_bytes=1 << 50, token_embedding_bytes=151936 * 4096 * 2)
    assert first_load_weights_mib(odd, 5200) == 5200 - 1187 + COMPUTE_FLOOR_MIB


@pytest.mark.parametrize("version", ["0.12.6", "0.13.3", "0.13.4", "0.24.0", CURRENT_VERSION])
@pytest.mark.parametrize("slots", [1, 2])
@pytest.mark.parametrize("flash_attention", [None, False])
def test_a_first_copy_is_never_counted_below_what_the_simulator_holds(
        version: str, slots: int, flash_attention: bool | None) -> None:
    """Every model of the simulator's catalog at four contexts, with OLLAMA_FLASH_ATTENTION
    unset (before 0.30 most architectures then run without it) or off: the first-load figure
    is at least the copy's and over it by no more than an encoder's table, which has no
    output layer beside it (nomic-embed-text: 44 MiB). 0.13.3 and 0.13.4 straddle olmo3's
    move to Ollama's own engine (v0.13.4 fs/ggml/ggml.go:256), 0.24.0 is the last with it."""
    config = SimConfig(models=MODELS, version=version, num_parallel=slots,
                       flash_attention=flash_attention)
    sim = OllamaSim(config)
    for model in MODELS:
        info = model_info(sim.show(model, verbose=True))  # the prober reads the arrays too
        for context in (2048, 4096, 8192, 32768):
            options = sim.resolve(model, {"model": model.name,
                                          "options": {"num_ctx": context}})
            ctx = min(options.num_ctx, model.trained_ctx)
            held_slots = model.slots(slots, version)
            batch = 0 if model.embedding else options.num_batch
            window_batch = options.num_batch if sim.newest or not options.num_batch_auto \
                else 512
            held = model.footprint_mib(ctx, held_slots, config.cache_type_for(model), batch,
                                       version, window_batch,
                                       config.flash_attention_for(model))
            if sim.newest and options.draft_num_predict > 0:
                held += model.draft_mib(ctx, held_slots, batch, version, window_batch)
            card = ProviderView("gpu", 98304, context_length=context, max_parallel=slots,
                                version=version, flash_attention=flash_attention,
                                models={model.name: info},
                                disk_mib={model.name: model.disk_mib})
            counted = Sizer((card,), 1.2).footprint(model.name, card, context)
            assert counted is not None
            assert 0 <= counted.total_mib - held <= 64, (model.name, context, counted, held)
