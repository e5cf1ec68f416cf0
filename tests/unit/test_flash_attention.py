"""Flash attention as each Ollama version decides it, and what a copy without it holds
(proxy/core/attention.py; the rules are Ollama's, cited there)."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from pydantic import ValidationError

from proxy.core.attention import copy_cache_type, flash_attention, scores_compute_mib
from proxy.core.sizing import Sizer, first_load_compute_mib
from proxy.core.types import ModelInfo, ProviderView
from proxy.service.codec import ProviderState, decode_model_info, encode_model_info
from proxy.settings import ProviderConfig

# Llama 3.1 8B's shape: 32 layers of 8 KV heads x 128 x 2 (key, value) x 2 B a token
LLAMA = ModelInfo(trained_context=131072, kv_bytes_per_token=32 * 8 * 256 * 2,
                  estimate_kv_bytes_per_token=32 * 8 * 256 * 2, family="llama",
                  architecture="llama", logits_bytes=4 * 512 * (4096 + 128256),
                  attention_heads=32, embedding_length=4096)
QWEN3 = dataclasses.replace(LLAMA, family="qwen3", architecture="qwen3", attention_heads=32)


def card(version: str, setting: bool | None = None, kv: str = "f16") -> ProviderView:
    return ProviderView("gpu", 24576, version=version, flash_attention=setting, kv_cache_type=kv)


def arch(name: str, **changes: object) -> ModelInfo:
    return dataclasses.replace(LLAMA, family=name, architecture=name, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(("model", "version", "setting", "on"), [
    # before 0.13.4: the version's list, unless OLLAMA_FLASH_ATTENTION says otherwise
    (LLAMA, "0.12.6", None, False), (QWEN3, "0.12.6", None, True),
    (LLAMA, "0.12.6", True, True), (QWEN3, "0.12.6", False, False),
    (LLAMA, "0.13.3", None, False),
    # a model the GPU cannot run with it, whatever the setting
    (arch("nomic-bert", embedding=True), "0.12.6", True, False),
    (arch("gemma2"), "0.12.6", True, False),
    (arch("deepseek2", head_dims_equal=False), "0.12.6", True, False),
    # an architecture listed from its release on
    (arch("mistral3"), "0.13.1", None, False), (arch("mistral3"), "0.13.2", None, True),
    # the llama engine's `auto` from 0.13.4; Ollama's own engine keeps its list until 0.30
    (LLAMA, "0.13.4", None, True), (LLAMA, "0.24.0", False, False),
    (arch("deepseek2"), "0.24.0", None, False),  # own engine from 0.13.0, not listed
    (arch("qwen35", head_dims_equal=False), "0.17.1", True, True),
    (arch("grok"), "0.18.0", True, True), (arch("grok"), "0.19.0", True, False),
    # 0.30+: llama-server's `auto` for every model unless set
    (LLAMA, "0.29.9", None, True), (arch("deepseek2"), "0.30.0", None, True),
    (LLAMA, "0.30.0", False, False), (LLAMA, "", None, True),
])
def test_flash_attention_follows_the_version_engine_and_setting(
        model: ModelInfo, version: str, setting: bool | None, on: bool) -> None:
    assert flash_attention(model, card(version, setting)) is on


@pytest.mark.parametrize(("model", "version", "setting", "kind"), [
    (QWEN3, "0.12.6", None, "q8_0"), (LLAMA, "0.12.6", None, "f16"),
    (LLAMA, "0.12.6", True, "q8_0"),
    # the llama engine's `auto` does not take a quantized cache: only a setting that is on
    (LLAMA, "0.24.0", None, "f16"), (LLAMA, "0.24.0", True, "q8_0"),
    (QWEN3, "0.24.0", None, "q8_0"), (QWEN3, "0.24.0", False, "f16"),
    (LLAMA, "0.30.0", None, "q8_0"),
])
def test_a_quantized_cache_needs_flash_attention_before_0_30(
        model: ModelInfo, version: str, setting: bool | None, kind: str) -> None:
    assert copy_cache_type(model, card(version, setting, "q8_0")) == kind


def test_the_scores_are_llama_cpps_compute_without_flash_attention() -> None:
    # llama.cpp's compute buffer for Llama 3 8B without flash attention: 296.00 MiB at 4096
    # tokens, 560.00 MiB at 8192; Ollama's llama estimate, which this is, a few bytes over
    assert scores_compute_mib(LLAMA, 4096, 1, (0, 12, 6), 512) == 297
    assert scores_compute_mib(LLAMA, 8192, 1, (0, 12, 6), 512) == 561
    # Ollama's own engine keeps one cache for every slot before 0.30; llama.cpp a stream each
    assert scores_compute_mib(arch("deepseek2"), 4096, 2, (0, 24, 0), 512) == 561
    assert scores_compute_mib(LLAMA, 4096, 2, (0, 12, 6), 512) == 297
    assert scores_compute_mib(arch("deepseek2"), 4096, 2, (0, 30, 0), 512) == 297
    assert scores_compute_mib(LLAMA, 4001, 1, (0, 12, 6), 512) == \
        scores_compute_mib(LLAMA, 4032, 1, (0, 12, 6), 512)  # padded to 32 cells
    assert scores_compute_mib(ModelInfo(), 4096, 1, (0, 12, 6), 512) == 0  # heads unknown


def footprint(view: ProviderView, context: int, observed: dict[int, int] | None = None
              ) -> tuple[int, int, str]:
    view = dataclasses.replace(view, models={"llama3.1:8b": LLAMA},
                               disk_mib={"llama3.1:8b": 4693},
                               observed={"llama3.1:8b": observed} if observed else {})
    got = Sizer((view,), 1.2).footprint("llama3.1:8b", view, context)
    assert got is not None
    return got.total_mib, got.graph_mib, got.source


def test_a_copy_without_flash_attention_counts_its_scores() -> None:
    for context in (4096, 8192, 32768):
        with_fa, graph_fa, _ = footprint(card("0.12.6", True), context)
        without, graph, source = footprint(card("0.12.6"), context)
        scores = scores_compute_mib(LLAMA, context, 1, (0, 12, 6), 512)
        assert graph_fa == 0  # a batch of 512 at any context before 0.30: no batch tier
        # the scores replace the compute a batch has with flash attention when larger
        assert graph == max(0, scores - first_load_compute_mib(LLAMA))
        assert without - with_fa == graph - graph_fa
        assert "without flash attention" in source
    # at 32768 tokens: 2145 MiB of scores, less the 259 of a batch's logits
    assert footprint(card("0.12.6"), 32768)[1] == 2145 - 259


def test_a_copy_seen_without_flash_attention_scales_its_scores_with_the_context() -> None:
    """The weights part calibrated from a copy seen at one context is the same whether the
    copy ran with flash attention or not: its scores are counted apart."""
    fa_on, fa_off = card("0.12.6", True), card("0.12.6")
    seen_on = footprint(fa_on, 4096)[0]
    seen_off = footprint(fa_off, 4096)[0]
    view_on = dataclasses.replace(fa_on, observed={"llama3.1:8b": {4096: seen_on}})
    view_off = dataclasses.replace(fa_off, observed={"llama3.1:8b": {4096: seen_off}})
    assert footprint(view_on, 32768, {4096: seen_on})[0] == footprint(fa_on, 32768)[0]
    assert footprint(view_off, 32768, {4096: seen_off})[0] == footprint(fa_off, 32768)[0]


def test_the_setting_and_the_shape_travel_in_the_published_state() -> None:
    state = ProviderState("gpu", "http://127.0.0.1:1", True, 0.0, flash_attention=False,
                          models={"llama3.1:8b": dataclasses.replace(LLAMA,
                                                                     head_dims_equal=False)})
    decoded = ProviderState.decode(state.encode())
    assert decoded.flash_attention is False
    assert decoded.models["llama3.1:8b"] == state.models["llama3.1:8b"]
    older = orjson.loads(state.encode())
    del older["flashAttention"]
    assert ProviderState.decode(orjson.dumps(older)).flash_attention is None  # unset
    assert decode_model_info({}).head_dims_equal  # an older writer: the default
    assert encode_model_info(LLAMA)["attentionHeads"] == 32


def test_an_operator_says_how_a_provider_runs_flash_attention() -> None:
    entry = {"name": "gpu", "endpoint": "http://127.0.0.1:1"}
    assert ProviderConfig.model_validate(entry).flash_attention is None
    assert ProviderConfig.model_validate({**entry, "flashAttention": False}).flash_attention \
        is False
    with pytest.raises(ValidationError, match="flashAttention"):
        ProviderConfig.model_validate({**entry, "flashAttention": "sometimes"})
