"""The simulator's /api/show as Ollama's: a non-verbose answer gives every non-empty array of
the file as null (getModelData reads it with maxArraySize 0, server/routes.go v0.12.6:
1152-1157, HEAD:1600-1605; fs/ggml/gguf.go newArray and array.MarshalJSON, v0.12.6:397-406,
HEAD:465-483; seen on real 0.12.6 and 0.24.0 builds), a verbose one the arrays."""

from __future__ import annotations

import math

import pytest

from loadtest.sim_model import CATALOG, LFM2_1_2B, WINDOWED_MODELS, SimConfig, SimModel
from loadtest.sim_sched import OllamaSim

MODELS = (*CATALOG, *WINDOWED_MODELS, LFM2_1_2B)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_a_plain_show_gives_every_array_as_null(model: SimModel) -> None:
    sim = OllamaSim(SimConfig(models=MODELS))
    plain = sim.show(model)["model_info"]
    verbose = sim.show(model, verbose=True)["model_info"]
    assert plain.keys() == verbose.keys()
    assert {k for k, v in plain.items() if v is None} == \
        {k for k, v in verbose.items() if isinstance(v, list) and v}
    assert {k: v for k, v in plain.items() if v is not None} == \
        {k: v for k, v in verbose.items() if not isinstance(v, list)}


def test_a_file_with_kv_heads_per_layer_keeps_their_cache_only() -> None:
    """lfm2: a cache in its 6 attention layers (8 KV heads of 64 + 64), none in the 10 short
    convolutions; the simulator sizes its copy from its own fields, not the answer."""
    assert LFM2_1_2B.kv_per_layer.count(8) == 6 and LFM2_1_2B.kv_per_layer.count(0) == 10
    verbose = OllamaSim(SimConfig(models=MODELS)).show(LFM2_1_2B, verbose=True)
    assert verbose["model_info"]["lfm2.attention.head_count_kv"] == LFM2_1_2B.kv_per_layer
    kv_mib = 6 * 8 * 128 * 2 * 32768 / (1 << 20)  # 384
    assert LFM2_1_2B.footprint_mib(32768, 1) == math.ceil(698 + kv_mib + 256)
    # Ollama's estimate counts the fewest KV heads of any layer (HeadCountKVMin, 0 -> 1)
    assert LFM2_1_2B.estimate_mib(4096, 1) == math.ceil(
        698 + 2 * 16 * 1 * 64 * 4096 * 2 / (1 << 20))
