"""The arithmetic of Ollama's engine as the sidecar does it, one row per worked example.

Expected figures are worked out by hand from Ollama's source (llm/llama_server.go
PredictServerVRAM, fs/ggml GraphSize's KV term, sched.go's batch tiers and 80 % rule,
server/routes.go's context defaults) and the models' published architectures.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadtest.sim_model import CATALOG
from proxy.core import context
from proxy.core.context import NEWEST, fits, parse_version, reserve, resolve
from proxy.core.engine_errors import is_out_of_memory
from proxy.core.sizing import (
    Sizer,
    draft_num_predict,
    drafts,
    graph_mib,
    kv_mib,
    kv_per_token,
    model_slots,
    ollama_admits,
    ollama_estimate_mib,
)
from proxy.core.types import ModelInfo, ProviderView
from proxy.service.codec import decode_model_info, encode_model_info
from proxy.service.prober import model_info, modelfile_num_ctx, runner_files, weights_file

KIB = 1024


def arch(name: str, blocks: int, embedding: int, heads: int | list[int],
         kv_heads: int | list[int], head_dim: int = 0, trained: int = 40960) -> dict[str, object]:
    info: dict[str, object] = {
        f"{name}.block_count": blocks, f"{name}.embedding_length": embedding,
        f"{name}.attention.head_count": heads, f"{name}.attention.head_count_kv": kv_heads,
        f"{name}.context_length": trained}
    if head_dim:
        info[f"{name}.attention.key_length"] = info[f"{name}.attention.value_length"] = head_dim
    return info


QWEN3_8B = arch("qwen3", 36, 4096, 32, 8, 128)
QWEN3_14B = arch("qwen3", 40, 5120, 40, 8, 128)
QWEN3_32B = arch("qwen3", 64, 5120, 64, 8, 128)
PHI3_MINI = arch("phi3", 32, 3072, 32, 32, trained=4096)  # no key_length: 3072 / 32 = 96


@pytest.mark.parametrize(("info", "real", "estimate"), [
    # 2 (K and V) x blocks x KV heads x head dim x 2 bytes
    (QWEN3_8B, 144 * KIB, 144 * KIB),  # 36 x 8 x 256 x 2
    (QWEN3_14B, 160 * KIB, 160 * KIB),  # 40 x 8 x 256 x 2
    # Ollama's estimate takes embedding / heads = 80, not the real head dim of 128
    (QWEN3_32B, 256 * KIB, 160 * KIB),
    (PHI3_MINI, 384 * KIB, 384 * KIB),  # 32 x 32 x 192 x 2: no grouped-query attention
    # per-layer KV heads: layers without attention (recurrent) hold no KV cache; the
    # estimate takes the fewest KV heads (1 when 0) on every layer
    (arch("hybrid", 4, 2048, 16, [8, 0, 0, 8], 128), 2 * 8 * 256 * 2, 4 * 4 * 1 * 128),
])
def test_kv_bytes_per_token(info: dict[str, object], real: int, estimate: int) -> None:
    name = next(iter(info)).split(".")[0]
    assert kv_per_token(info, name) == (real, estimate)


@pytest.mark.parametrize(("info", "ctx", "slots", "mib"), [
    (QWEN3_8B, 4096, 1, 576), (QWEN3_8B, 32768, 4, 18432),
    (QWEN3_14B, 4096, 1, 640), (QWEN3_14B, 32768, 4, 20480),
    (QWEN3_32B, 4096, 1, 1024), (QWEN3_32B, 32768, 4, 32768),
    (PHI3_MINI, 4096, 1, 1536), (PHI3_MINI, 4096, 4, 6144),  # trained for 4096: capped
])
def test_kv_cache_at_4k_x_1_and_32k_x_4(info: dict[str, object], ctx: int, slots: int,
                                        mib: int) -> None:
    name = next(iter(info)).split(".")[0]
    real, _ = kv_per_token(info, name)
    assert kv_mib(ModelInfo(kv_bytes_per_token=real), ctx, slots) == mib


@pytest.mark.parametrize(("cache", "mib"), [("f16", 18432), ("q8_0", 9792), ("q4_0", 5184)])
def test_the_cache_type_scales_the_kv_cache_by_ggml_block_sizes(cache: str, mib: int) -> None:
    info = ModelInfo(kv_bytes_per_token=144 * KIB)
    assert kv_mib(info, 32768, 4, cache) == mib  # q8_0 34/32 bytes, q4_0 18/32


@pytest.mark.parametrize(("tokens", "mib"), [(4096, 0), (4097, 768), (32768, 768),
                                             (32769, 2048), (131072, 2048)])
def test_compute_follows_ollamas_batch_tiers(tokens: int, mib: int) -> None:
    assert graph_mib(tokens) == mib


QWEN3_32B_INFO = ModelInfo(trained_context=40960, kv_bytes_per_token=256 * KIB,
                           estimate_kv_bytes_per_token=160 * KIB)


def test_a_footprint_from_the_architecture_and_the_file() -> None:
    card = ProviderView("a", 49140, disk_mib={"qwen3:32b": 20200},
                        models={"qwen3:32b": QWEN3_32B_INFO})
    fp = Sizer((card,), 1.2).footprint("qwen3:32b", card, 8192)
    assert fp is not None
    # 20200 + 256 of compute (no tensors listed: the whole file on the GPU, the compute
    # floor) + 256 KiB x 8192 + 768 (8192 tokens: the 1024 batch)
    assert (fp.weights_mib, fp.kv_mib, fp.graph_mib, fp.total_mib) == (20456, 2048, 768, 23272)
    assert fp.estimate_mib == 20200 + 1280  # Ollama's own: 160 KiB x 8192
    assert ollama_estimate_mib(QWEN3_32B_INFO, 20200, 32768, 1) == 25320


@pytest.mark.parametrize(("version", "observed"), [("0.33.0", {}), ("0.33.0", {2048: 540}),
                                                   ("0.30.0", {2048: 540})])
def test_an_encoder_gets_ollamas_estimate_from_0_30(version: str,
                                                    observed: dict[int, int]) -> None:
    """Ollama's rule before a load beside others reads an encoder's estimate as any model's:
    its file and a cache it will not keep (36 KiB a token for nomic-bert's shape)."""
    nomic = ModelInfo(trained_context=2048, estimate_kv_bytes_per_token=36 * KIB,
                      architecture="nomic-bert", embedding=True)
    card = ProviderView("a", 12450, version=version, disk_mib={"nomic-embed-text": 262},
                        models={"nomic-embed-text": nomic},
                        observed={"nomic-embed-text": observed})
    fp = Sizer((card,), 1.2).footprint("nomic-embed-text", card, 2048)
    assert fp is not None and fp.estimate_mib == 262 + 72


def test_a_draft_model_adds_its_own_cache_and_compute_from_0_30() -> None:
    """A DRAFT runs in the copy's llama-server with a KV cache of its own (f16) and compute
    buffers; its file is in /api/tags' size already. Its architecture is not shown, so its
    cache is taken at the model's own per token: 144 KiB x 16384 = 2304, + 768 + 256."""
    drafted = ModelInfo(trained_context=40960, kv_bytes_per_token=144 * KIB,
                        runner="draft=sha256-" + "d" * 64)

    def footprint(info: ModelInfo, version: str = "0.33.0", context: int = 16384,
                  seen: dict[int, int] | None = None) -> tuple[int, int, int]:
        card = ProviderView("a", 24564, version=version, disk_mib={"m": 5700},
                            models={"m": info}, observed={"m": seen} if seen else {})
        other = ProviderView("b", 24564, version=version, disk_mib={"m": 5700},
                             models={"m": info})
        fp = Sizer((card, other), 1.2).footprint("m", other, context)
        assert fp is not None
        return fp.weights_mib, fp.draft_mib, fp.total_mib

    first = 5700 + 256  # the file and the compute floor: no copy seen, no tensors listed
    assert footprint(drafted) == (first, 3328, first + 2304 + 768 + 3328)
    # none drafts with draft_num_predict 0 in the Modelfile, nor before 0.30
    off = replace(drafted, runner="draft_num_predict=0;" + drafted.runner)
    assert footprint(off)[1:] == (0, first + 2304 + 768)
    assert footprint(drafted, "0.12.6")[1:] == (0, first + 2304)  # no batch tier before 0.30
    assert footprint(replace(drafted, runner="draft_num_predict=8;" + drafted.runner))[1] \
        == 3328
    # a copy seen at 16384 (the simulator's 11673) is calibrated without its draft's part,
    # then sized with the draft's at 32768: 4608 + 768 + 256
    weights = 11673 - 2304 - 768 - 3328
    assert footprint(drafted, context=32768, seen={16384: 11673}) == (
        weights, 5632, weights + 4608 + 768 + 5632)


def test_a_model_with_an_mtp_head_is_sized_with_its_draft_when_draft_num_predict_is_set(
) -> None:
    """A weights file with an MTP head (<arch>.nextn_predict_layers > 0) runs it as the draft
    when draft_num_predict is set (llm/llama_server.go:837-842, 901-907); Ollama leaves it 0
    for a model without a DRAFT unless its Modelfile sets it (server/routes.go:153-155)."""
    show = {"model_info": {"general.architecture": "qwen35", "qwen35.context_length": 40960,
                           "qwen35.nextn_predict_layers": 1},
            "parameters": "draft_num_predict 3"}
    info = model_info(show)
    assert info.mtp and decode_model_info(encode_model_info(info)) == info
    card = ProviderView("a", 24564, version="0.33.0", disk_mib={"m": 5700},
                        models={"m": replace(info, kv_bytes_per_token=144 * KIB)})
    fp = Sizer((card,), 1.2).footprint("m", card, 16384)
    assert fp is not None and fp.draft_mib == 2304 + 768 + 256
    # without draft_num_predict in its Modelfile, or without the head, no draft runs
    assert not drafts(model_info({**show, "parameters": ""}))
    assert not model_info({**show, "model_info": {**show["model_info"],
                                                  "qwen35.nextn_predict_layers": 0}}).mtp


@pytest.mark.parametrize(("value", "drafted"), [
    ("8", 8), ("4.5", 4), ("-1", -1), ("1e+21", 10**21), ("+Inf", 0), ("1e999", 0),
    ("NaN", 0), ('"8"', 0), ("true", 0), ("", 0)])
def test_an_odd_draft_num_predict_is_read_without_failing(value: str, drafted: int) -> None:
    """/api/show prints a PARAMETER with Go's %#v: a number set through /api/create's JSON
    may be a float (FromMap truncates it, api/types.go); anything else is no count. None
    may raise: every call sizing the model would fail."""
    assert draft_num_predict(f"draft_num_predict={value};draft=sha256-{'d' * 64}") == drafted


def test_a_copy_seen_on_one_card_is_rederived_for_anothers_context_and_slots() -> None:
    info = ModelInfo(trained_context=40960, kv_bytes_per_token=144 * KIB)
    # Seen fully on the GPU at 4096 x 1: 5300 MiB, so the weights part is 5300 - 576 - 0.
    small = ProviderView("small", 16376, disk_mib={"qwen3:8b": 5200},
                         models={"qwen3:8b": info}, observed={"qwen3:8b": {4096: 5300}})
    big = ProviderView("big", 49140, max_parallel=4, disk_mib={"qwen3:8b": 5200},
                       models={"qwen3:8b": info})
    sizer = Sizer((small, big), 1.2)
    here = sizer.footprint("qwen3:8b", small, 4096)
    assert here is not None and here.total_mib == 5300 and "seen on small" in here.source
    there = sizer.footprint("qwen3:8b", big, 32768)
    assert there is not None and "calibrated from small" in there.source
    assert there.total_mib == (5300 - 576) + 18432 + 2048  # not the 5300 seen elsewhere


def test_ollamas_80_percent_rule_is_strict_and_counts_what_stays_loaded() -> None:
    # free 12097 MiB: 80 % is 9677 (integer arithmetic)
    assert ollama_admits(9677, 16000, 3903)
    assert not ollama_admits(9678, 16000, 3903)


@pytest.mark.parametrize(("version", "family", "embedding", "slots"), [
    ("0.33.0", "qwen3", False, 4), ("0.33.0", "qwen3vl", False, 1),
    ("0.33.0", "nomic-bert", True, 1), ("0.12.6", "qwen3vl", False, 4),
    ("0.12.6", "mllama", False, 1),
])
def test_one_slot_for_embedding_models_and_some_families(version: str, family: str,
                                                         embedding: bool, slots: int) -> None:
    card = ProviderView("a", 24564, max_parallel=4, version=version,
                        models={"m": ModelInfo(family=family, embedding=embedding)})
    assert model_slots(card, "m") == slots


@pytest.mark.parametrize(("version", "vram", "expected"), [
    ("0.6.6", 24564, 2048), ("0.6.7", 24564, 4096), ("0.12.6", 49140, 4096),
    ("0.15.4", 49140, 4096), ("0.15.5-rc0", 16376, 4096), ("0.15.5", 23552, 32768),
    ("0.33.0", 23551, 4096), ("0.33.0", 48127, 32768), ("0.33.0", 48128, 262144),
    ("0.0.0", 32768, 32768), ("", 32768, 32768),  # source builds and unknown: the newest
    ("0.33.0", None, 0),  # by VRAM, and the VRAM is not known
])
def test_ollamas_default_context_by_version(version: str, vram: int | None,
                                            expected: int) -> None:
    assert context.default_context(parse_version(version), vram) == expected


@pytest.mark.parametrize(("kwargs", "requested", "ctx", "source"), [
    (dict(requested=8192, modelfile=16384, configured=2048), 8192, 8192, "request"),
    (dict(modelfile=16384, configured=2048), 16384, 16384, "modelfile"),
    (dict(configured=2048), 2048, 2048, "provider"),
    (dict(), 32768, 32768, "default 0.33.0"),
    (dict(configured=65536), 65536, 40960, "provider, trained 40960"),  # the trained cap
    (dict(requested=2), 4, 4, "request"),  # a floor of 4
    (dict(configured=1024, vision=True), 2048, 2048, "provider"),  # 2048 for vision
])
def test_context_precedence_floors_and_the_trained_cap(kwargs: dict[str, object],
                                                        requested: int, ctx: int,
                                                        source: str) -> None:
    args: dict[str, object] = dict(requested=0, modelfile=0, configured=0,
                                   version=(0, 33, 0), total_vram_mib=32768, trained=40960)
    resolved = resolve(**{**args, **kwargs})  # type: ignore[arg-type]
    assert (resolved.requested, resolved.context, resolved.source) == (requested, ctx, source)


@pytest.mark.parametrize(("version", "asked", "configured", "sent"), [
    ((0, 24, 0), 16384, 8192, 8192),  # at the cap: the ask of a call that sets none
    ((0, 24, 0), 4096, 8192, 8192),
    ((0, 24, 0), 2048, 8192, 2048),  # under the cap: the listing says it
    ((0, 24, 0), 16384, 2048, 4096),  # a call that sets none stays under: the cap itself
    ((0, 15, 5), 16384, 8192, 8192),
    ((0, 15, 4), 16384, 8192, 16384),  # the listing is the ask
    ((0, 33, 0), 16384, 8192, 16384),  # Ollama compares both capped
])
def test_a_copy_at_its_trained_cap_is_loaded_with_one_ask_from_0_15_5_to_0_29(
        version: tuple[int, int, int], asked: int, configured: int, sent: int) -> None:
    """phi3:mini, trained 4096: /api/ps lists a copy at 4096 whatever it was asked with
    (v0.15.5 server/routes.go:1914) and until 0.30 Ollama reloads for another ask (v0.24.0
    server/sched.go:691-705): every copy at the cap is loaded, and a listing of one read,
    with one ask."""
    resolved = resolve(requested=asked, modelfile=0, configured=configured, version=version,
                       total_vram_mib=24564, trained=4096)
    assert (resolved.requested, resolved.context) == (sent, min(asked, 4096))
    assert context.as_loaded(4096, configured, 4096, version) == (
        max(configured, 4096) if (0, 15, 5) <= version < (0, 30, 0) else 4096)
    assert resolve(requested=asked, modelfile=0, configured=configured, version=version,
                   total_vram_mib=24564, trained=4096, as_sent=False).requested == asked


def test_ollama_reloads_for_another_ask_compared_as_asked_before_0_30() -> None:
    assert context.reloads_for(8192, 4096, 4096, (0, 24, 0))
    assert not context.reloads_for(8192, 8192, 4096, (0, 24, 0))
    assert context.reloads_for(4096, 8192, 4096, (0, 12, 6))
    assert not context.reloads_for(16384, 8192, 4096, (0, 33, 0))  # both capped at 4096
    assert context.reloads_for(2048, 8192, 4096, (0, 33, 0))


def test_gpt_oss_gets_at_least_8192_on_large_cards_from_0_11_to_0_15_4() -> None:
    def ctx(version: tuple[int, int, int], vram: int) -> int:
        return resolve(requested=4096, modelfile=0, configured=0, version=version,
                       total_vram_mib=vram, family="gptoss").context

    assert ctx((0, 12, 6), 24564) == 8192
    assert ctx((0, 12, 6), 16376) == 4096  # low-VRAM mode: no bump
    assert ctx((0, 33, 0), 24564) == 4096
    assert resolve(requested=0, modelfile=0, configured=0, version=NEWEST,
                   total_vram_mib=None).context == 0


@pytest.mark.parametrize(("prompt", "ctx", "predict", "generates", "fits_"), [
    (4096 - 257, 4096, 0, True, True),  # 256 kept for the answer, and the engine's one
    (4096 - 256, 4096, 0, True, False),
    (4096 - 1025, 4096, 1024, True, True),  # num_predict kept too ...
    (4096 - 1024, 4096, 1024, True, False),
    (4096 - 2049, 4096, 100000, True, True),  # ... up to half the context
    (4096 - 2, 4096, 0, False, True),  # an embedding: BOS and EOS only
    (4096 - 1, 4096, 0, False, False),
    (10**9, 0, 0, True, True),  # an unknown context never refuses
])
def test_a_prompt_fits_with_room_for_the_answer(prompt: int, ctx: int, predict: int,
                                                generates: bool, fits_: bool) -> None:
    assert fits(prompt, ctx, predict, generates) is fits_
    assert reserve(4096, 0) == 257


def test_a_capped_answer_keeps_only_its_cap() -> None:
    """num_predict 4 on a 4096-token context: the answer cannot pass 4 tokens, so a
    3930-token prompt fits (Ollama serves it); an uncapped guess still keeps 256."""
    assert fits(3930, 4096, 4, capped=True)
    assert not fits(3930, 4096, 4)
    assert reserve(4096, 4, capped=True) == 5
    assert reserve(4096, 100000, capped=True) == 2049  # half the context at most


def test_a_small_context_keeps_at_most_half_for_an_uncapped_answer() -> None:
    """num_ctx 256 with no num_predict: 256 kept for the answer would leave no room for any
    prompt; half the context is the most kept, as for a capped answer."""
    assert reserve(256, 0) == 129
    assert fits(100, 256)
    assert fits(127, 256) and not fits(128, 256)
    assert reserve(256, 1000) == 129 and reserve(256, 4, capped=True, prompt_tokens=5000) == 129
    assert reserve(600, 0) == 257  # from 512 up the 256 stay


def test_a_capped_answer_also_keeps_what_the_estimate_may_fall_short_by() -> None:
    """A soak's call: 4073 tokens estimated, num_predict 17, a 4096-token context. The
    engine counted 4083, and the answer made it shift the context. A thirty-second of the
    estimate is kept besides the cap, never more than an uncapped answer keeps."""
    assert reserve(4096, 17, capped=True, prompt_tokens=4073) == 17 + 128 + 1
    assert not fits(4073, 4096, 17, capped=True)
    assert fits(4073 - 146, 4096, 17, capped=True)
    assert reserve(4096, 4, capped=True, prompt_tokens=100_000) == 257  # as uncapped


def test_a_modelfile_num_ctx_is_read_from_show_parameters() -> None:
    padded = f"{'num_ctx':<30} 8192"
    assert modelfile_num_ctx({"parameters": f'stop                           "<|im_end|>"\n'
                                            f"{padded}"}) == 8192
    assert modelfile_num_ctx({"parameters": f"{'num_ctx':<30} 1.6384e+04"}) == 16384
    assert modelfile_num_ctx({"parameters": "num_keep                       4"}) == 0
    assert modelfile_num_ctx({}) == 0


BLOB = "sha256-" + "ab" * 32


def test_the_weights_file_is_read_from_the_first_from_of_show_modelfile() -> None:
    """/api/show's modelfile: a head whose comment names the model, then FROM the model blob
    (HEAD server/routes.go:1519-1533, images.go:586-640), projectors in FROMs after it."""
    modelfile = ('# Modelfile generated by "ollama show"\n'
                 "# To build a new Modelfile based on this, replace FROM with:\n"
                 "# FROM qwen3:8b\n\n"
                 f"FROM /root/.ollama/models/blobs/{BLOB}\n"
                 f"FROM /root/.ollama/models/blobs/sha256-{'cd' * 32}\n"
                 'TEMPLATE """{{ .Prompt }}"""\n')
    assert weights_file({"modelfile": modelfile}) == BLOB
    windows = f"FROM C:\\Users\\me\\.ollama\\models\\blobs\\{BLOB}\n"
    assert weights_file({"modelfile": windows}) == BLOB
    assert weights_file({"modelfile": "FROM gemma3-mlx\n"}) == ""  # no GGUF blob named
    assert weights_file({}) == ""
    info = model_info({"modelfile": modelfile})
    assert info.weights == BLOB
    assert decode_model_info(encode_model_info(info)).weights == BLOB
    assert "weights" not in encode_model_info(ModelInfo())


def test_what_else_a_copy_is_loaded_with_is_read_from_show() -> None:
    """needsReload compares the runner options, adapters and projectors (HEAD server/
    sched.go:1400-1425): the Modelfile's runner PARAMETERs, its ADAPTER lines and the FROMs
    after the model's own (server/images.go:586-640)."""
    adapter = "sha256-" + "ef" * 32
    show = {"parameters": f"{'num_gpu':<30} 20\n{'temperature':<30} 0.2\n"
                          f"{'num_batch':<30} 1024",
            "modelfile": (f"# FROM qwen3:8b\n\nFROM /root/.ollama/models/blobs/{BLOB}\n"
                          f"ADAPTER /root/.ollama/models/blobs/{adapter}\n")}
    assert runner_files(show) == f"num_gpu=20;num_batch=1024;adapter={adapter}"
    info = model_info(show)
    assert (info.weights, info.runner) == (BLOB, runner_files(show))
    assert decode_model_info(encode_model_info(info)).runner == info.runner
    assert runner_files({"modelfile": f"FROM /m/blobs/{BLOB}\n", "parameters": ""}) == ""


def test_what_show_says_of_a_model_is_reduced_to_what_sizing_needs() -> None:
    show = {"model_info": {"general.architecture": "qwen3", **QWEN3_32B},
            "details": {"family": "qwen3"}, "capabilities": ["completion", "tools"],
            "parameters": f"{'num_ctx':<30} 16384"}
    assert model_info(show) == ModelInfo(40960, 256 * KIB, 160 * KIB, 16384, "qwen3",
                                         capabilities=("completion", "tools"),
                                         architecture="qwen3",
                                         # no vocabulary given: the largest in use
                                         token_embedding_bytes=262144 * 5120 * 2,
                                         attention_heads=64, embedding_length=5120,
                                         block_count=64, kv_heads=8)
    # an Ollama whose answer lists none: what the model can do is unknown, not nothing
    assert model_info({k: v for k, v in show.items() if k != "capabilities"}) \
        .capabilities is None
    embed = {"model_info": {"general.architecture": "nomic-bert", "nomic-bert.pooling_type": 1,
                            **arch("nomic-bert", 12, 768, 12, 12, trained=2048)},
             "capabilities": ["embedding"]}
    # a BERT-like encoder keeps no KV cache; Ollama's own estimate counts one all the same
    assert model_info(embed).embedding and model_info(embed).kv_bytes_per_token == 0
    assert model_info(embed).estimate_kv_bytes_per_token == 36 * KIB
    assert model_info({"capabilities": ["vision"]}).vision
    assert model_info("not a show answer") == ModelInfo()


def test_an_encoder_holds_no_kv_cache_in_the_simulator_either() -> None:
    nomic = next(m for m in CATALOG if m.arch == "nomic-bert")
    assert nomic.footprint_mib(512, 1) == nomic.footprint_mib(2048, 4)


@pytest.mark.parametrize("message", [
    "llama runner process has terminated: VK_ERROR_OUT_OF_DEVICE_MEMORY",
    "ggml_vulkan: vk::Device::allocateMemory: ErrorOutOfMemory",
    "CUDA error: out of memory",
    "cudaMalloc failed: out of memory",
])
def test_every_out_of_memory_wording_ollama_matches_is_read_as_one(message: str) -> None:
    # llm/status.go:85-96, matched lower-cased (:117-119)
    assert is_out_of_memory(message)
