"""Ollama's own fit check before 0.30, when it loads a model beside others.

Before 0.30 Ollama takes the free memory as the driver's (every loaded runner's memory and
its CUDA context gone), lowered to the total less what the loaded runners report
(updateFreeSpace, v0.12.6 server/sched.go:511-548, v0.24.0 :590-630), and loads beside them
only when that holds what the new copy asks; otherwise it unloads a model of its choosing
first. What a copy asks:
- on Ollama's own engine, its memory and CUDA's MinimumMemory (457 MiB, v0.12.6
  discover/gpu.go:67-69; v0.24.0 ml/device.go:353-358);
- on the llama engine, its estimate with everything on the GPU (requireFull): MinimumMemory,
  one layer more as a buffer, the layers, the output layer and the larger of the two graph
  sizes, full and partial offload (v0.12.6 llm/memory.go:306-386; v0.24.0 llm/server.go:
  576-693, 1895-1921), where its copy holds the full one. Strictly more free before 0.12.11
  (memory.go), at least as much after.
So a card of many small copies keeps a CUDA context per runner and the new copy's own
allowance free: more than the sidecar's reserve once four or five runners share it (with
OLLAMA_MAX_LOADED_MODELS above its default of 3 a GPU).
"""

from __future__ import annotations

import math

from proxy.core.attention import MIB, copy_cache_type
from proxy.core.context import Version, parse_version
from proxy.core.engines import LLAMA_SERVER_SINCE, own_engine
from proxy.core.gpus import RUNNER_OVERHEAD_MIB
from proxy.core.types import ModelInfo, ProviderView

MINIMUM_MEMORY_MIB = RUNNER_OVERHEAD_MIB  # the same figure, CUDA's MinimumMemory
# llm/memory.go (0.12.6-0.12.10) counts MinimumMemory and the buffer layer in the copy's
# own reported size, and wants strictly more free than it asks
MEMORY_GO_UNTIL: Version = (0, 12, 11)
# What Ollama's estimate counts a quantized cache at, as a share of f16's 2 bytes an element
# (kvCacheBytesPerElement, v0.24.0 fs/ggml/ggml.go:911-922)
ESTIMATE_KV_SHARE = {"q8_0": 0.5, "q4_0": 0.25}
# Ollama's graph sizes are the runner's batch's, 512 unless the call sets num_batch
BATCH = 512
# Architectures whose partial-offload graph adds the output matrix's dequantized copy,
# embedding x vocabulary x 105/128 B (GraphSize, v0.12.6 fs/ggml/ggml.go:613-797; v0.24.0
# :663-800): "llama" and "llama4" worked out whole below, these bounded by that term and a
# batch of embeddings (their full graph is at least the logits, which the partial one has too)
OUTPUT_MATRIX_ARCHS = frozenset(("mllama", "gemma", "gemma2", "gemma3", "gemma3n",
                                 "command-r", "qwen2", "phi2", "deepseek2", "chatglm"))


def applies(view: ProviderView) -> bool:
    """Whether this card's Ollama fits loads so (before 0.30, one GPU; over several GPUs
    the layout's own check stands, occupancy.spread_problem)."""
    return parse_version(view.version) < LLAMA_SERVER_SINCE and view.gpus <= 1


def listed_as_estimate(info: ModelInfo, view: ProviderView) -> bool:
    """Whether /api/ps lists a copy of this model here at Ollama's estimate rather than at
    what it holds: the llama engine before 0.30 (MemorySize, v0.24.0 llm/server.go:
    1895-1921), over by the minimum and a layer to 0.12.10 and by a graph without flash
    attention in its sums, under by a quantized cache's blocks (listed_short_mib)."""
    version = parse_version(view.version)
    return version < LLAMA_SERVER_SINCE and not own_engine(info, version)


def required_free_mib(info: ModelInfo | None, view: ProviderView, footprint_mib: int,
                      weights_mib: int, kv_mib: int, compute_mib: int, context: int,
                      slots: int, seen: bool) -> int:
    """What the free memory must hold for Ollama to load this copy beside others:
    `footprint_mib` (`seen`: as /api/ps reported it, Ollama's own figure) and what Ollama
    asks beyond it. `compute_mib`: the compute buffers the copy holds, which Ollama's
    estimate counts as its full graph instead (larger without flash attention in its sums)."""
    version = parse_version(view.version)
    if info is None or own_engine(info, version):
        return footprint_mib + MINIMUM_MEMORY_MIB
    full, partial = graph_bytes(info, context, slots)
    excess = math.ceil(max(0, partial - full) / MIB)
    if seen:
        reported = footprint_mib + 1  # /api/ps's bytes, rounded down to MiB (prober.py)
        if version < MEMORY_GO_UNTIL:  # its report has the minimum and the buffer
            return reported + excess
    else:
        reported = footprint_mib + max(0, math.ceil(full / MIB) - compute_mib)
    layer = math.ceil((weights_mib + kv_mib) / info.block_count) if info.block_count else 0
    return reported + MINIMUM_MEMORY_MIB + layer + excess


def taken_mib(footprint_mib: int, required_mib: int) -> int:
    """What a copy loaded (or being loaded) takes of the free memory Ollama reads, its CUDA
    context aside: the larger of what it holds and what Ollama's estimate reports of it
    (`required_mib` less the minimum: over by the buffer layer and the graphs' difference)."""
    return max(footprint_mib, required_mib - MINIMUM_MEMORY_MIB)


def listed_short_mib(info: ModelInfo | None, view: ProviderView, context: int, slots: int,
                     compute_mib: int) -> int:
    """How much less than it holds a llama-engine copy is listed at (its /api/ps size is the
    estimate): a quantized cache the estimate counts at 1 byte an element for q8_0 and 0.5
    for q4_0 (kvCacheBytesPerElement, v0.24.0 fs/ggml/ggml.go:911-922) where llama.cpp holds
    ggml's blocks, 34/32 and 18/32 (1/32 of the f16 cache more); and `compute_mib`, the
    compute it holds, against the full graph the estimate counts instead (KV x gqa / 6 for
    an architecture without a case of its own: phi3's 128 MiB at 4096 where it holds 256;
    without flash attention in its sums, more than held at a large context)."""
    if info is None or own_engine(info, parse_version(view.version)):
        return 0
    cache = copy_cache_type(info, view)
    kv_short = math.ceil(info.kv_bytes_per_token * context * slots / 32 / MIB) \
        if cache in ESTIMATE_KV_SHARE else 0
    full, _ = graph_bytes(info, context, slots, ESTIMATE_KV_SHARE.get(cache, 1.0))
    # (a MiB for /api/ps's bytes, rounded down to MiB by the prober)
    return max(0, kv_short + compute_mib - full // MIB) + 1


def fits(required_mib: int, total_mib: int, taken_mib: int, view: ProviderView) -> bool:
    """Whether Ollama finds `required_mib` free with `taken_mib` of `total_mib` taken."""
    free = total_mib - taken_mib
    if parse_version(view.version) < MEMORY_GO_UNTIL:
        return free > required_mib
    return free >= required_mib


def graph_bytes(info: ModelInfo, context: int, slots: int, kv_share: float = 1.0
                ) -> tuple[int, int]:
    """Ollama's full- and partial-offload graph sizes for a copy on the llama engine
    (GraphSize), in bytes, its cache counted at `kv_share` of f16 (ESTIMATE_KV_SHARE); (0, 0)
    where the shape is unknown."""
    arch = info.architecture or info.family
    embedding, heads = info.embedding_length, info.attention_heads
    vocab = info.logits_bytes // (4 * BATCH) - embedding if info.logits_bytes else 0
    if not (embedding and heads and vocab > 0):
        return 0, 0
    b = min(context, BATCH)
    c = context * slots
    output_matrix = embedding * vocab * 105 // 128
    kv_heads = info.kv_heads or heads
    if arch in ("llama", "llama4"):
        head_size = embedding // heads
        full = max(4 * b * (1 + 4 * embedding + c * (1 + heads)), 4 * b * (embedding + vocab))
        partial = 4 * b * embedding + max(
            4 * b * (1 + embedding + max(c, embedding)) + embedding * embedding * 9 // 16
            + 4 * c * (b * heads + head_size * kv_heads),
            4 * b * (embedding + vocab) + output_matrix)
        return full, partial
    if arch in OUTPUT_MATRIX_ARCHS:
        # their scores term, c x (1 + heads) a token of the batch, bounds the rest of each
        full = max(4 * b * (embedding + vocab), 4 * b * (2 + 4 * embedding + c * (1 + heads)))
        return full, full + output_matrix + 4 * b * 2 * embedding
    # No case: the KV cache at f16 x query heads a KV head / 6, both graphs
    kv = int(info.estimate_kv_bytes_per_token * c * kv_share)
    graph = heads // kv_heads * kv // 6
    return graph, graph
