"""Whether a copy runs with flash attention, and what running without it costs.

Without flash attention llama.cpp (and Ollama's own engine) materialise a batch's attention
scores, one f32 per cached token x batch token x head, in the compute buffers: 512 MiB for
64 heads at 4096 tokens, 4 GiB at 32768. Whether a copy has flash attention depends on the
version, the engine, the architecture and OLLAMA_FLASH_ATTENTION (docs/engine.md, "Flash
attention"); without it a quantized OLLAMA_KV_CACHE_TYPE does not apply either. Paths below
are Ollama's.
"""

from __future__ import annotations

import math

from proxy.core.context import Version, parse_version
from proxy.core.engines import LLAMA_SERVER_SINCE, listed_by, own_engine
from proxy.core.types import ModelInfo, ProviderView

MIB = 1 << 20
# The llama engine's `--flash-attn auto` unless OLLAMA_FLASH_ATTENTION is set (bd6c1d6b4,
# v0.24.0 llm/server.go:192-255, the `tok == nil` branch); from 0.30 llama-server's for
# every model (HEAD llm/llama_server.go:596-621, LlamaServerFlashAttention)
LLAMA_AUTO_SINCE: Version = (0, 13, 4)
# fs/ggml/ggml.go FlashAttention(): the architectures with flash attention on unless
# OLLAMA_FLASH_ATTENTION says otherwise, by the release that listed each (v0.12.6 :893-901,
# v0.24.0 :890-908; read at every tag)
DEFAULT_ON_SINCE: tuple[tuple[Version, frozenset[str]], ...] = (
    ((0, 0, 0), frozenset(("gemma3", "gptoss", "gpt-oss", "qwen3", "qwen3moe"))),
    ((0, 12, 8), frozenset(("qwen3vl", "qwen3vlmoe"))),
    ((0, 13, 2), frozenset(("mistral3",))),
    ((0, 13, 4), frozenset(("olmo3",))),
    ((0, 13, 5), frozenset(("bert",))),
    ((0, 14, 3), frozenset(("glm4moelite", "lfm2"))),
    ((0, 15, 5), frozenset(("glmocr", "qwen3next"))),
    ((0, 17, 1), frozenset(("lfm2moe", "nemotron_h", "nemotron_h_moe", "qwen35",
                            "qwen35moe"))),
    ((0, 20, 4), frozenset(("gemma4",))),
    ((0, 22, 0), frozenset(("nemotron_h_omni",))),
)
# fs/ggml/ggml.go SupportsFlashAttention (v0.12.6 :868-882, v0.24.0 :868-887): never these;
# always these from v0.17.1; else equal, non-zero key and value head sizes
UNSUPPORTED = frozenset(("gemma2",))
UNSUPPORTED_SINCE_0_19 = frozenset(("grok",))
SUPPORTED_SINCE_0_17_1 = frozenset(("qwen35", "qwen35moe", "qwen3next"))


def default_on(architecture: str, version: Version) -> bool:
    """Whether `version` lists the architecture in FlashAttention()."""
    return listed_by(DEFAULT_ON_SINCE, architecture, version)


def supported(info: ModelInfo, version: Version) -> bool:
    """SupportsFlashAttention: not for an embedding model (a pooling type), nor gemma2 (nor
    grok from 0.19), else equal head sizes."""
    arch = info.architecture or info.family
    if info.embedding:
        return False
    if arch in SUPPORTED_SINCE_0_17_1 and version >= (0, 17, 1):
        return True
    if arch in UNSUPPORTED or (arch in UNSUPPORTED_SINCE_0_19 and version >= (0, 19, 0)):
        return False
    return info.head_dims_equal


def flash_attention(info: ModelInfo, view: ProviderView) -> bool:
    """Whether a copy of the model on `view` runs with flash attention. The card's GPUs are
    taken to support it (an operator whose GPUs do not sets `flashAttention: false`), and
    llama.cpp's `auto` to turn it on."""
    version = parse_version(view.version)
    setting = view.flash_attention
    if version >= LLAMA_SERVER_SINCE:
        return True if setting is None else setting
    if setting is None and version >= LLAMA_AUTO_SINCE and not own_engine(info, version):
        return True  # the llama engine's `auto`; a setting still meets the model's support
    wanted = default_on(info.architecture or info.family, version) if setting is None \
        else setting
    return wanted and supported(info, version)


def copy_cache_type(info: ModelInfo, view: ProviderView) -> str:
    """The KV cache type a copy gets: before 0.30 a quantized OLLAMA_KV_CACHE_TYPE only with
    flash attention, and on the llama engine from 0.13.4 only with it set on (v0.24.0
    llm/server.go:237-245; v0.12.6 :214-227); from 0.30 as set."""
    wanted = view.kv_cache_type
    version = parse_version(view.version)
    if wanted == "f16" or version >= LLAMA_SERVER_SINCE:
        return wanted
    if version >= LLAMA_AUTO_SINCE and not own_engine(info, version):
        return wanted if view.flash_attention is True else "f16"
    return wanted if flash_attention(info, view) else "f16"


def scores_compute_mib(info: ModelInfo, context: int, slots: int, version: Version,
                       batch: int) -> int:
    """The compute buffers of a batch without flash attention: its attention scores over
    the cached tokens a stream reads, f32 x (heads + a mask), beside the batch's own
    activations (Ollama's own estimate for the llama family, v0.12.6 fs/ggml/ggml.go:
    613-617, which is llama.cpp's figure: 296 MiB for Llama 3 8B at 4096 tokens, 560 MiB at
    8192). Ollama's own engine keeps one cache for every slot before 0.30 (kvcache/causal.go
    Init, v0.12.6:179-185); llama.cpp gives each slot a stream of its own (kv_unified off by
    default, v0.12.6 llama/llama.cpp/src/llama-context.cpp:2296; llama-server's -np), both
    padded to 32 cells without flash attention. 0 when the heads are not known."""
    if not (info.attention_heads and info.embedding_length):
        return 0
    unified = version < LLAMA_SERVER_SINCE and own_engine(info, version)
    cells = -(-(context * slots if unified else context) // SCORES_PADDING) * SCORES_PADDING
    batch = min(batch, context * slots)
    scores = 4 * batch * (1 + 4 * info.embedding_length + cells * (1 + info.attention_heads))
    return math.ceil(scores / MIB)


# Cache cells without flash attention are padded to 32 (v0.12.6 ml/backend/ggml/ggml.go:
# 685-691; llama-model.cpp:19643-19651)
SCORES_PADDING = 32
