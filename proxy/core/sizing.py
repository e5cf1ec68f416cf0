"""What a copy of a model takes of a card's memory, and what Ollama's own admission says.

A copy is weights + KV cache + compute buffers. The KV cache is the context per slot x the
card's slots for that model x the model's KV bytes per token (from /api/show: per-layer KV
heads x (key + value length), at the card's OLLAMA_KV_CACHE_TYPE), except in sliding-window
layers, which hold only their window and a batch as the card's engine keeps them
(`windowed_cells`, docs/engine.md "Sliding-window models"); the compute allowance
follows Ollama's batch tiers by context x slots (server/sched.go:859-868, 906-915: 0, 768 MiB,
2 GiB), and a copy without flash attention holds a batch's attention scores besides
(core/attention.py). The weights part is calibrated from copies seen fully on a GPU
(size_vram less the KV and compute parts at the context they were seen with, never less than
the file less its token embeddings); before any is seen it is the on-disk size less the
token table kept on the CPU, plus the compute buffers of a batch of 512
(`first_load_weights_mib`). A copy seen on this card at this context is its own best figure.
From 0.30 a model's DRAFT model adds a KV cache and compute buffers of its own (`draft_mib`;
its file is in the on-disk size).

Ollama itself admits a load beside other models only when its own estimate (file size + KV
at f16 by embedding / heads, llm/llama_server.go:2681-2700) is within 80 % of the free VRAM
(total less what loaded models use, sched.go:547-561, from 0.30); otherwise it unloads a
model of its choosing first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from proxy.core import fit_before_030
from proxy.core.attention import copy_cache_type, flash_attention, scores_compute_mib
from proxy.core.context import Resolved, Version, effective, for_card, parse_version
from proxy.core.engines import LLAMA_SERVER_SINCE, own_engine
from proxy.core.gpus import RUNNER_OVERHEAD_MIB, spread_graph_mib
from proxy.core.types import ModelInfo, ProviderView

MIB = 1 << 20
# Ollama's tensor types as /api/show names them: (elements a block, bytes a block)
# (fs/ggml/ggml.go TensorType.BlockSize and TypeSize; fs/ggml/type.go String)
GGML_BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "F64": (1, 8),
    "I8": (1, 1), "I16": (1, 2), "I32": (1, 4), "I64": (1, 8),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "Q8_0": (32, 34), "Q8_1": (32, 36), "IQ4_NL": (32, 18), "MXFP4": (32, 17),
    "NVFP4": (64, 36), "Q1_0": (128, 18),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176),
    "Q6_K": (256, 210), "Q8_K": (256, 292), "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74),
    "IQ2_S": (256, 82), "IQ3_XXS": (256, 98), "IQ3_S": (256, 110), "IQ1_S": (256, 50),
    "IQ1_M": (256, 56), "IQ4_XS": (256, 136),
}
# Bytes per cached element at each OLLAMA_KV_CACHE_TYPE, by those blocks
KV_BYTES_PER_ELEMENT = {kind.lower(): size / elements for kind, (elements, size)
                        in GGML_BLOCKS.items() if kind in ("F16", "Q8_0", "Q4_0")}
ADMISSION_RULE_SINCE: Version = (0, 30, 0)
# Ollama's free memory is the driver's: each loaded runner's CUDA context comes off it too
# (RUNNER_OVERHEAD_MIB, Ollama's own figure for that, MinimumMemory, ml/device.go:359-364).
# Ollama's default num_batch (api/types.go:1116): 0.12's runner batch, and 0.30+'s automatic
# batch for a small context; the windowed caches hold one more batch than the window
BATCH = 512
# llama.cpp pads an SWA cache to 256 cells (llama-kv-cache-iswa.cpp); 0.12's engine pads to
# 256 with flash attention, 32 without (ml/backend/ggml/ggml.go:685-691): the larger
SWA_PADDING = 256


@dataclass(frozen=True, slots=True)
class WindowRule:
    """How an architecture's windowed layers are laid out and kept (docs/engine.md
    "Sliding-window models"): every `period`-th layer full, the others windowed, unless the
    file lists its own pattern (period 0: only that); the window under `key` (else
    `default`); `memory` tokens a sequence on Ollama's own engine at least
    (NewSWAMemCache); `llama_server` False where llama-server (0.30+) is not known to keep
    them short, so they count whole there."""

    period: int
    key: str = "attention.sliding_window"
    default: int = 0
    chunked: bool = False
    memory: int = 0
    llama_server: bool = True


# Architectures whose windowed layers Ollama's engines keep short, with file:line of Ollama's
# own engine and of llama.cpp's load_hparams (set_swa_pattern; read at the llama.cpp Ollama
# vendored last, v0.24.0 llama/llama.cpp/src/llama-model.cpp)
WINDOWED: dict[str, WindowRule] = {
    # v0.12.6 model/models/gemma3/model_text.go:33, 182-188; llama-model.cpp:1268-1273
    "gemma3": WindowRule(6),
    # gemma2/model.go:183-191; llama-model.cpp:1244-1251
    "gemma2": WindowRule(2),
    # gptoss/model.go:36-41, NewSWAMemCache(window, 4096) :267-270; llama-model.cpp:2154-2161
    "gpt-oss": WindowRule(2, memory=4096),
    "gptoss": WindowRule(2, memory=4096),
    # chunks: llama4/model_text.go:216-223, chunk_size's default llama4/model.go:57;
    # llama-model.cpp:657-673
    "llama4": WindowRule(4, "attention.chunk_size", 8192, chunked=True),
    # llama.cpp only (0.12 runs it on the llama engine): llama-model.cpp:1462-1467
    "cohere2": WindowRule(4),
    # 0.13.4-0.24 own engine: the file's pattern (v0.24.0 model/models/olmo3/model.go:77,
    # 81-83, 181-204); 0.30+ llama.cpp's olmo2 loader (llama/compat/llama-ollama-compat.cpp
    # v0.30.0:1549-1561) with a window: llama-model.cpp:1497-1506
    "olmo3": WindowRule(4),
    "olmo2": WindowRule(4),
    # own engine: the file's pattern (v0.12.6 model/models/gemma3n/model_text.go:58-65,
    # 329-330, 354; model.go:42-45); llama-model.cpp:1300-1310
    "gemma3n": WindowRule(5),
    # own engine 0.20-0.24 only: the file's pattern, 4096 a sequence (v0.24.0 model/models/
    # gemma4/model.go:114-118, model_text.go:106, 186-199); llama.cpp b9452's rules not read
    # here (the vendored llama.cpp has no gemma4), so whole from 0.30
    "gemma4": WindowRule(0, memory=4096, llama_server=False),
    # own engine 0.22-0.24 only: the file's pattern (or layer types 1), a window of 512
    # unless set (v0.24.0 model/models/laguna/model.go:281-283, 314-315, 345-360, 417-423);
    # not in the llama.cpp Ollama vendored, so whole from 0.30
    "laguna": WindowRule(0, default=512, llama_server=False),
}
# Encoders that keep no KV cache on either engine (Ollama's estimate still counts one):
# llama.cpp's create_memory gives them none (llama/llama.cpp/src/llama-model.cpp,
# v0.12.6:19576-19588, v0.24.0:7126-7140) and Ollama's own bert has no cache (v0.12.6
# model/models/bert/embed.go)
CACHELESS = frozenset(("bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3",
                       "neo-bert"))
# Architectures whose last `<arch>.attention.shared_kv_layers` layers read an earlier
# layer's cache and keep none of their own: gemma3n (v0.12.6 model_text.go:48-56, 262;
# llama.cpp's reuse from n_layer_kv_from_start = 20, llama-model.cpp:1305, 7192-7195)
SHARED_KV = frozenset(("gemma3n",))
# The largest vocabulary among the library's models (gemma3's), for a token embedding table
# whose vocabulary /api/show does not give
LARGEST_VOCAB = 262144


def held_by_runners(footprints: Iterable[int]) -> int:
    """What copies of these footprints hold of the driver's memory, each runner's CUDA
    context included: what a runner loading beside them sees taken (Resident.beside_mib)."""
    mibs = list(footprints)
    return sum(mibs) + RUNNER_OVERHEAD_MIB * len(mibs)
# Families Ollama runs with one slot whatever OLLAMA_NUM_PARALLEL says (sched.go:497-510);
# before 0.30 only mllama (and embedding models).
SINGLE_SLOT_FAMILIES = frozenset((
    "mllama", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen3next", "lfm2", "lfm2moe",
    "nemotron_h", "nemotron_h_moe", "nemotron_h_omni"))


def automatic_batch(tokens: int) -> int:
    """The num_batch (llama-server's -b and -ub) Ollama 0.30+ gives a copy with `tokens` of
    context in all (server/sched.go:798-833, the tier before any step down)."""
    if tokens <= 4096:
        return BATCH
    return 1024 if tokens <= 32768 else 2048


# The compute a larger batch adds (server/sched.go:906-915), by automatic batch
GRAPH_MIB = {BATCH: 0, 1024: 768, 2048: 2048}


def graph_mib(tokens: int) -> int:
    """Compute buffers for a copy with `tokens` of context in all (Ollama's batch tiers)."""
    return GRAPH_MIB[automatic_batch(tokens)]


def compute_mib(info: ModelInfo, view: ProviderView, context: int, slots: int) -> int:
    """The compute a copy holds beyond a batch of 512's with flash attention (which the
    weights part counts, `first_load_weights_mib`): the batch tiers, and without flash
    attention what its attention scores take above both (core/attention.py)."""
    version = parse_version(view.version)
    # The automatic batch and its compute are 0.30's: before, every runner's batch is 512
    tiers = graph_mib(context * slots) if version >= LLAMA_SERVER_SINCE else 0
    if flash_attention(info, view):
        return tiers
    batch = automatic_batch(context * slots) if version >= LLAMA_SERVER_SINCE else BATCH
    scores = scores_compute_mib(info, context, slots, version, batch)
    return tiers + max(0, scores - first_load_compute_mib(info) - tiers)


def windowed_cells(info: ModelInfo, context: int, slots: int, version: Version) -> int:
    """Tokens each sliding-window (or chunked) layer's cache holds for a copy of `context`
    per slot x `slots`, all slots together, as the engine of that Ollama version sizes it."""
    full = context * slots
    window = info.swa_window
    rule = WINDOWED.get(info.architecture)
    if version >= LLAMA_SERVER_SINCE:
        if rule is not None and not rule.llama_server:
            return full
        # llama.cpp's iSWA cache, one stream per slot (-np without --kv-unified): the window
        # and a ubatch (-ub: Ollama's automatic batch), at most the slot's context, padded
        # to 256 cells
        ubatch = automatic_batch(full)
        return slots * _round_up(min(context, window + ubatch), SWA_PADDING)
    if info.swa_chunked or not own_engine(info, version):
        # 0.12's own engine keeps a chunked layer whole; its llama engine sets swa_full
        return full
    # kvcache/causal.go Init: a window's memory per sequence (gpt-oss: 4096), one more cell
    # with several slots; the whole context when that is no smaller
    memory = max(window, rule.memory if rule else 0)
    if slots > 1:
        memory = max(memory, window + 1)
    if memory >= context:
        return full
    return _round_up(slots * memory + BATCH, SWA_PADDING)


def kv_mib(info: ModelInfo, context: int, slots: int, cache_type: str = "f16",
           version: str = "") -> int:
    """The KV cache of a copy: full layers hold every slot's context, windowed ones only
    what their engine keeps of it (`windowed_cells`)."""
    per_element = KV_BYTES_PER_ELEMENT.get(cache_type, 2.0)
    windowed = info.swa_kv_bytes_per_token if info.swa_window else 0
    cells = windowed_cells(info, context, slots, parse_version(version)) if windowed else 0
    total = (info.kv_bytes_per_token - windowed) * context * slots + windowed * cells
    return math.ceil(total * per_element / 2 / MIB)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def weights_floor_mib(info: ModelInfo, disk_mib: int) -> int:
    """The least a copy's weights can take of the GPU: the file less its token embeddings
    (what llama.cpp keeps on the CPU) at f16, more than any quantised table takes."""
    if not info.token_embedding_bytes:
        return 0
    return max(0, disk_mib - math.ceil(info.token_embedding_bytes / MIB))


# llama.cpp's compute buffers for a batch of 512 are at least its logits (`batch_logits_bytes`);
# below this floor the attention and feed-forward scratch the logits leave out may be the
# larger part (a small vocabulary: phi3's logits are 69 MiB)
COMPUTE_FLOOR_MIB = 256


def first_load_weights_mib(info: ModelInfo, disk_mib: int) -> int:
    """A copy's weights and compute for a batch of 512 before any copy of its weights was
    seen: the file less the table llama.cpp keeps on the CPU (`cpu_table_bytes`: none when
    the output layer reads it; never more than the table at f16, which model_info sizes),
    plus the compute buffers, at least their logits."""
    table = info.cpu_table_bytes
    if info.token_embedding_bytes:
        table = min(table, info.token_embedding_bytes)
    return max(0, disk_mib - table // MIB) + first_load_compute_mib(info)


def first_load_compute_mib(info: ModelInfo) -> int:
    """The compute buffers of a batch of 512 with flash attention: at least their logits."""
    return max(COMPUTE_FLOOR_MIB, math.ceil(info.logits_bytes / MIB))


def ollama_estimate_mib(info: ModelInfo, disk_mib: int, context: int, slots: int) -> int:
    """Ollama's own pre-load estimate (PredictServerVRAM; f16 whatever the cache type). It
    stats the model's file alone (llm/llama_server.go:2681-2685); `disk_mib` (/api/tags) has
    a DRAFT's file too, which neither /api/tags nor /api/show sizes apart: over by it, so a
    load may be taken for refused (an unload first) where Ollama would admit it."""
    return disk_mib + math.ceil(info.estimate_kv_bytes_per_token * context * slots / MIB)


def draft_num_predict(runner: str) -> int:
    """A copy's draft_num_predict from the model's ModelInfo.runner: its Modelfile's, else
    api.DefaultOptions' 4 for a model with a DRAFT and 0 for one without (server/routes.go:
    136-156; the sidecar sends none of its own). needsReload compares it, not the DRAFT file
    (server/sched.go:1422-1424)."""
    parts = runner.split(";")
    for part in parts:
        key, _, value = part.partition("=")
        if key == "draft_num_predict":
            try:
                return int(float(value))
            except (ValueError, OverflowError):  # not a number, or an infinite one
                return 0
    return DEFAULT_DRAFT_NUM_PREDICT if any(p.startswith("draft=") for p in parts) else 0


DEFAULT_DRAFT_NUM_PREDICT = 4  # api.DefaultOptions (api/types.go:1119)


def drafts(info: ModelInfo) -> bool:
    """Whether a copy of the model runs a draft: a DRAFT in its Modelfile or an MTP head in
    its weights (llm/llama_server.go:901-907), and its draft_num_predict above 0 (:807-813;
    0 for an MTP model unless its Modelfile sets it, server/routes.go:153-155)."""
    return ("draft=" in info.runner or info.mtp) and draft_num_predict(info.runner) > 0


def draft_mib(info: ModelInfo, context: int, slots: int, version: str) -> int:
    """What a DRAFT model adds to a copy beside its file (/api/tags counts that file in the
    model's size): from 0.30 llama-server runs it with a KV cache of its own for every slot's
    context, at llama.cpp's draft cache type (f16: Ollama passes only --cache-type-k/-v,
    llm/llama_server.go:382, 390-393), and compute buffers of its own. /api/show does not
    describe the draft, so its cache is taken as the model's own per token with every layer
    full (a draft is a smaller model or a one-layer head, never a larger one; Ollama's tree
    does not say what llama-server gives an MTP head, so it is sized so too) and its
    compute as the batch tiers' figure and a batch's logits (DRAFT_COMPUTE_MIB)."""
    if not drafts(info) or parse_version(version) < LLAMA_SERVER_SINCE:
        return 0
    return (math.ceil(info.kv_bytes_per_token * context * slots / MIB)
            + graph_mib(context * slots) + DRAFT_COMPUTE_MIB)


# A draft's compute buffers below the batch tiers: its logits for a batch of 512 over a
# vocabulary of ~150k tokens at f32 take ~300 MiB
DRAFT_COMPUTE_MIB = 256


def model_slots(view: ProviderView, model: str) -> int:
    info = view.models.get(model)
    if info is None:
        return view.max_parallel
    if info.embedding:
        return 1
    newest = parse_version(view.version) >= ADMISSION_RULE_SINCE
    single = info.family in SINGLE_SLOT_FAMILIES if newest else info.family == "mllama"
    return 1 if single else view.max_parallel


def admission_rule(view: ProviderView) -> bool:
    """Whether this Ollama applies its 80 % rule before a load beside others."""
    return parse_version(view.version) >= ADMISSION_RULE_SINCE


def ollama_admits(estimate_mib: int, total_mib: int, others_mib: int) -> bool:
    """Ollama's 80 % rule (strict >, integer arithmetic as in sched.go:558)."""
    return estimate_mib <= max(0, total_mib - others_mib) * 80 // 100


@dataclass(frozen=True, slots=True)
class Footprint:
    total_mib: int
    source: str  # where the figure comes from, for explain
    weights_mib: int = 0
    kv_mib: int = 0
    graph_mib: int = 0
    # Ollama's own estimate; 0 unknown (no architecture). From 0.30 its PredictServerVRAM
    # (the 80 % rule); before, what its fit check asks free (core/fit_before_030.py)
    estimate_mib: int = 0
    draft_mib: int = 0  # its DRAFT model's cache and compute (draft_mib); 0 none

    def parts(self) -> dict[str, int | str]:
        draft: dict[str, int | str] = {"draftMiB": self.draft_mib} if self.draft_mib else {}
        return {"totalMiB": self.total_mib, "weightsMiB": self.weights_mib,
                "kvMiB": self.kv_mib, "graphMiB": self.graph_mib, **draft,
                "ollamaEstimateMiB": self.estimate_mib, "source": self.source}


SizerInputs = tuple[float, tuple[tuple[object, ...], ...]]


def _sizing_inputs(view: ProviderView) -> tuple[object, ...]:
    """Every field of a card that a footprint, a resolved context or a slot count reads (the
    residents, tickets and health are not among them)."""
    return (view.name, view.total_vram_mib, view.context_length, view.max_parallel,
            view.kv_cache_type, view.flash_attention, view.version, view.models, view.disk_mib,
            view.observed)


class Sizer:
    """Footprints of models on cards, for one fleet's sizing inputs; weights calibrated once
    per model, every figure worked out once and kept while those inputs stay the same."""

    def __init__(self, views: Iterable[ProviderView], disk_to_vram_factor: float) -> None:
        self.views = tuple(views)
        self.factor = disk_to_vram_factor
        self._weights: dict[str, tuple[int, str] | None] = {}
        self._infos: dict[tuple[str, str], ModelInfo | None] = {}
        self._loads: dict[tuple[str, str, int, int | None],
                          tuple[Resolved, Footprint | None]] = {}

    @classmethod
    def for_fleet(cls, views: Iterable[ProviderView], disk_to_vram_factor: float) -> Sizer:
        """The Sizer of the last few fleets whose cards have equal sizing inputs, else a new
        one. The fleet changes far less often than calls come, and a service rebuilds its
        views for every call from the same decoded mappings, so the inputs compare equal by
        identity, cheaply. A snapshot's mappings are never changed in place (types.py), so
        equal inputs give equal figures."""
        views = tuple(views)
        key: SizerInputs = (disk_to_vram_factor, tuple(_sizing_inputs(v) for v in views))
        for i, (inputs, sizer) in enumerate(_RECENT_FLEETS):
            if inputs == key:
                if i:
                    _RECENT_FLEETS.insert(0, _RECENT_FLEETS.pop(i))
                return sizer
        sizer = cls(views, disk_to_vram_factor)
        _RECENT_FLEETS.insert(0, (key, sizer))
        del _RECENT_FLEETS[_FLEETS_KEPT:]
        return sizer

    def info(self, model: str, view: ProviderView) -> ModelInfo | None:
        key = (view.name, model)
        try:
            return self._infos[key]
        except KeyError:
            pass
        info = view.models.get(model)
        if info is None:
            info = next((v.models[model] for v in self.views if model in v.models), None)
        if len(self._infos) >= _FIGURES_KEPT:
            self._infos.clear()
        self._infos[key] = info
        return info

    def load(self, model: str, view: ProviderView, requested: int, declared: int | None
             ) -> tuple[Resolved, Footprint | None]:
        """The context a copy loaded with num_ctx `requested` (0: the call sets none) gets on
        `view`, and its footprint there."""
        key = (view.name, model, requested, declared)
        found = self._loads.get(key)
        if found is None:
            if len(self._loads) >= _FIGURES_KEPT:
                self._loads.clear()
            resolved = for_card(view, self.info(model, view), requested)
            found = self._loads[key] = (resolved, self.footprint(model, view, resolved.requested,
                                                                 declared))
        return found

    def disk_mib(self, model: str, view: ProviderView) -> int:
        disk = view.disk_mib.get(model)
        if disk:
            return disk
        return max((v.disk_mib.get(model, 0) for v in self.views), default=0)

    def footprint(self, model: str, view: ProviderView, recorded_ctx: int,
                  declared: int | None = None) -> Footprint | None:
        """A copy of `model` on `view` loaded with num_ctx `recorded_ctx` (0 unknown)."""
        seen = view.observed.get(model, {}).get(recorded_ctx)
        info = self.info(model, view)
        if info is None or not info.kv_bytes_per_token or not recorded_ctx:
            if seen:
                return self._fit_estimate(Footprint(seen, f"seen on {view.name}", seen),
                                          model, view, recorded_ctx, seen=True)
            return self._without_architecture(model, view, declared, recorded_ctx)
        context = effective(recorded_ctx, info.trained_context)
        slots = model_slots(view, model)
        kv = kv_mib(info, context, slots, copy_cache_type(info, view), view.version)
        graph = compute_mib(info, view, context, slots)
        draft = draft_mib(info, context, slots, view.version)
        disk = self.disk_mib(model, view)
        estimate = ollama_estimate_mib(info, disk, context, slots) if disk else 0
        if seen:
            weights = max(0, seen - kv - graph - draft)
            if fit_before_030.applies(view):
                estimate = fit_before_030.required_free_mib(
                    info, view, seen, weights, kv, first_load_compute_mib(info) + graph,
                    context, slots, seen=True)
            return Footprint(seen, f"seen on {view.name} at this context", weights, kv, graph,
                             estimate, draft)
        weights, source = self._calibrated_weights(model) or (
            first_load_weights_mib(info, disk), "architecture, file size and compute")
        floor = weights_floor_mib(info, disk)
        if weights < floor:
            # A KV figure modelled too large leaves too little for the weights: never less
            # than the file can put on the GPU
            weights, source = floor, f"{source}, raised to the file less its token embeddings"
        total = weights + kv + graph + draft
        if not flash_attention(info, view):
            source = f"{source}, without flash attention"
        if draft:
            source = f"{source}, its DRAFT model's cache and compute"
        if declared and declared > total:
            total, source = declared, "declared vramMib (above the architecture's figure)"
        extra = spread_graph_mib(first_load_compute_mib(info) + graph, view.gpus)
        if extra:
            total, source = total + extra, f"{source}, spread over {view.gpus} GPUs"
        if fit_before_030.applies(view):
            estimate = fit_before_030.required_free_mib(
                info, view, total, weights, kv, first_load_compute_mib(info) + graph, context,
                slots, seen=False)
        return Footprint(total, source, weights, kv, graph, estimate, draft)

    def _calibrated_weights(self, model: str) -> tuple[int, str] | None:
        """The weights part of copies seen fully on a GPU: what they took less their KV and
        compute parts; the largest, so a card's own overheads are not undercounted. Not from
        a listing that is Ollama's estimate (fit_before_030.listed_as_estimate: llama3.2:3b
        at 32768 on 0.24.0 is listed 1.4 GiB over what it holds). A model
        none of whose copies was seen takes the figure of another name of its weights file
        loaded with the same files (a model created FROM it, `ollama cp`): their copies
        hold the same weights, and a figure seen beats one worked out from the file."""
        if model in self._weights:
            return self._weights[model]
        best = self._calibrated_from(model)
        if best is None:
            for kin in self._same_weights(model):
                found = self._calibrated_from(kin)
                if found is not None and (best is None or found[0] > best[0]):
                    best = (found[0], f"{found[1]}, a copy of {kin}")
        self._weights[model] = best
        return best

    def _same_weights(self, model: str) -> list[str]:
        """The other models of `model`'s weights file on any card loaded with the same
        adapters, projectors and DRAFT (ModelInfo.runner's files), in name order."""
        own = [(v.models[model].weights, runner_files(v.models[model].runner))
               for v in self.views if model in v.models and v.models[model].weights]
        return sorted({other for v in self.views for other, info in v.models.items()
                       if other != model and info.weights and
                       (info.weights, runner_files(info.runner)) in own})

    def _calibrated_from(self, model: str) -> tuple[int, str] | None:
        """The weights part of `model`'s own copies seen fully on a GPU
        (`_calibrated_weights`)."""
        best: tuple[int, str] | None = None
        for view in self.views:
            seen = view.observed.get(model)
            if not seen:
                continue
            info = self.info(model, view)
            if info is None or not info.kv_bytes_per_token or \
                    fit_before_030.listed_as_estimate(info, view):
                continue
            for recorded, mib in seen.items():
                if not recorded:
                    continue
                context = effective(recorded, info.trained_context)
                slots = model_slots(view, model)
                weights = mib - kv_mib(info, context, slots, copy_cache_type(info, view),
                                       view.version) - compute_mib(info, view, context, slots) \
                    - draft_mib(info, context, slots, view.version)
                if weights > 0 and (best is None or weights > best[0]):
                    best = (weights, f"calibrated from {view.name} at {context} x {slots}")
        return best

    def _without_architecture(self, model: str, view: ProviderView, declared: int | None,
                              context: int) -> Footprint | None:
        """No KV arithmetic possible (an encoder keeps no cache): the largest copy seen, else
        declared, else disk x factor (most measured first; none of them follows the
        context). Over several GPUs, with the compute buffers on each but one (its graph
        unknown: their base), unless seen on this card, where the listing holds them."""
        seen = max((mib for v in self.views for mib in v.observed.get(model, {}).values()),
                   default=0)
        here = max(view.observed.get(model, {}).values(), default=0)
        spread = 0 if seen and seen == here else spread_graph_mib(COMPUTE_FLOOR_MIB, view.gpus)

        def sized(mib: int, source: str) -> Footprint:
            where = f", spread over {view.gpus} GPUs" if spread else ""
            return self._fit_estimate(Footprint(mib + spread, source + where, mib), model,
                                      view, context, seen=bool(seen))

        if seen:
            return sized(seen, "seen on a GPU (context not known to scale)")
        if declared:
            return sized(declared, "declared vramMib")
        disk = self.disk_mib(model, view)
        if disk:
            # (a small file's compute buffers outgrow what the factor adds to it)
            least = first_load_weights_mib(self.info(model, view) or ModelInfo(), disk)
            return sized(max(int(disk * self.factor), least),
                         f"file size x {self.factor:g}, at least with its compute")
        return None

    def _fit_estimate(self, footprint: Footprint, model: str, view: ProviderView,
                      context: int, seen: bool) -> Footprint:
        """`footprint` with what Ollama's check before a load beside others reads of it: from
        0.30 its estimate (the file and a cache even an encoder is given, PredictServerVRAM,
        v0.30.0 llm/llama_server.go:2386-2405); before, what its fit check asks free, all of
        the copy taken as weights (no KV known to scale)."""
        info = self.info(model, view)
        if info is None:
            return footprint
        context = effective(context, info.trained_context)
        slots = model_slots(view, model)
        if admission_rule(view):
            disk = self.disk_mib(model, view)
            return replace(footprint, estimate_mib=ollama_estimate_mib(
                info, disk, context, slots)) if disk else footprint
        if not fit_before_030.applies(view):
            return footprint
        total = footprint.total_mib
        estimate = fit_before_030.required_free_mib(
            info, view, total, total, 0, first_load_compute_mib(info), context, slots, seen)
        return replace(footprint, estimate_mib=estimate)


# ModelInfo.runner's parts that name files (service/prober.py runner_files), in their order
RUNNER_FILES = ("adapter=", "from=", "draft=")


def runner_files(runner: str) -> tuple[str, ...]:
    """The files in ModelInfo.runner (RUNNER_FILES): what a copy holds beside its weights
    file, whatever its runner PARAMETERs."""
    return tuple(p for p in runner.split(";") if p.startswith(RUNNER_FILES))


# Figures a Sizer keeps before it starts again: calls name models and contexts at will, so
# a fleet that stays the same must not gather them without end
_FIGURES_KEPT = 4096
# (inputs, Sizer), most recently used first: a few, so that fleets told apart by a card
# marked not ready or a card left out (sizing inputs alike otherwise) keep theirs
_FLEETS_KEPT = 4
_RECENT_FLEETS: list[tuple[SizerInputs, Sizer]] = []


def forget_fleets() -> None:
    """Drop every kept Sizer (tests compare with figures worked out afresh)."""
    _RECENT_FLEETS.clear()


# The model_info keys sizing reads that a file may hold as an array (per layer): head counts
# (lfm2's KV heads, 0 in its convolution layers, convert/convert_lfm2.go:124-143; laguna's
# heads, convert_laguna.go:293; gemma4's KV heads, convert_gemma4.go:107) and which layers are
# windowed (gemma3, gemma3n, gemma4, olmo2, laguna). A non-verbose /api/show gives every
# non-empty array as null, every version (getModelData reads the file with maxArraySize 0:
# server/routes.go v0.12.6:1152-1157, HEAD:1600-1605; fs/ggml/gguf.go newArray keeps no
# values and array.MarshalJSON writes null: v0.12.6:397-406, HEAD:465-483).
HEAD_ARRAYS = ("attention.head_count", "attention.head_count_kv")
WINDOW_ARRAYS = ("attention.sliding_window_pattern", "attention.layer_types")


def arrays_withheld(info: Mapping[str, object], arch: str) -> tuple[str, ...]:
    """The keys sizing would read that the answer lists with a null value (an array a
    non-verbose /api/show withheld); () when nothing sizing reads is missing that way. The
    window arrays count only where they are read: a windowed architecture, or a head size
    of the windowed layers' own (key_length_swa)."""
    names: tuple[str, ...] = HEAD_ARRAYS
    if arch in WINDOWED or f"{arch}.attention.key_length_swa" in info:
        names += WINDOW_ARRAYS
    return tuple(key for name in names
                 if (key := f"{arch}.{name}") in info and info[key] is None)


def with_arrays(info: Mapping[str, object], arch: str, shown: Mapping[str, object]
                ) -> tuple[dict[str, object], tuple[str, ...]]:
    """`info` with the arrays it withheld taken from `shown` (a verbose /api/show's
    model_info; {} when that failed), and the keys still unknown. For those the larger
    figure is taken: no layer windowed; as many KV heads as query heads (the key left out);
    for unknown query heads, the KV heads when those are one figure, else as many heads as
    the key length divides the embedding into, else one head the embedding wide (no
    grouping either way). Every layer then keeps a cache (none of lfm2's left out)."""
    filled = {**info, **{k: shown[k] for k in arrays_withheld(info, arch)
                         if shown.get(k) is not None}}
    unknown = arrays_withheld(filled, arch)
    sized = {k: v for k, v in filled.items() if k not in unknown}
    blocks = _number(filled, f"{arch}.block_count")
    heads_key, kv_key = (f"{arch}.{name}" for name in HEAD_ARRAYS)
    for key in unknown:
        if key.endswith("sliding_window_pattern"):
            sized[key] = [False] * blocks
        elif key.endswith("layer_types"):  # (what the pattern, when the file has one, says)
            sized.setdefault(f"{arch}.attention.sliding_window_pattern", [False] * blocks)
        elif key == heads_key:
            key_length = _number(filled, f"{arch}.attention.key_length")
            embedding = _number(filled, f"{arch}.embedding_length")
            sized[key] = _number(filled, kv_key) or (
                max(1, embedding // key_length) if key_length else 1)
    return sized, unknown


def _number(info: Mapping[str, object], key: str) -> int:
    value = info.get(key)
    return int(value) if isinstance(value, int | float) and value > 0 else 0


def kv_per_token(info: Mapping[str, object], arch: str) -> tuple[int, int]:
    """(real, Ollama-estimate) KV bytes per token at f16 from an /api/show `model_info`;
    (0, 0) when the architecture keys are missing."""
    attention = _attention(info, arch)
    if attention is None:
        return 0, 0
    blocks, embedding, heads, kv_heads, _, _ = attention
    estimate = 4 * blocks * max(1, min(kv_heads)) * (embedding // max(heads))
    if arch in CACHELESS:
        return 0, estimate
    return sum(kv_per_layer(info, arch)), estimate


def attention_shape(info: Mapping[str, object], arch: str
                    ) -> tuple[int, int, bool, int, int]:
    """(the most query heads of a layer, the embedding length, key and value heads of one
    size, the layers, the most KV heads of a layer) from an /api/show `model_info`;
    (0, 0, True, 0, 0) when the keys are missing."""
    attention = _attention(info, arch)
    if attention is None:
        return 0, 0, True, 0, 0
    blocks, embedding, heads, kv_heads, key, value = attention
    return max(heads), embedding, key == value, blocks, max(kv_heads)


def kv_per_layer(info: Mapping[str, object], arch: str) -> list[int]:
    """Each layer's KV bytes per token at f16 (KV heads x (key + value length) x 2 B; 0 for a
    layer without attention or one that reads another's cache, SHARED_KV); [] when the
    architecture keys are missing."""
    attention = _attention(info, arch)
    if attention is None:
        return []
    per_layer = _layer_bytes(attention)
    # Windowed layers with a head size of their own (gemma4's key_length_swa: v0.24.0
    # model/models/gemma4/model_text.go:57-72, 86-88, 265-268)
    key, value = _length(info, arch, "key_length_swa"), _length(info, arch, "value_length_swa")
    pattern = _file_pattern(info, arch, len(per_layer))
    if key and value and pattern is not None:
        kv_heads = attention[3]
        per_layer = [kv_heads[i] * (key + value) * 2 if windowed and bytes_ else bytes_
                     for i, (bytes_, windowed) in enumerate(zip(per_layer, pattern,
                                                                strict=True))]
    shared = info.get(f"{arch}.attention.shared_kv_layers") if arch in SHARED_KV else 0
    if isinstance(shared, int | float) and 0 < shared < len(per_layer):
        per_layer[len(per_layer) - int(shared):] = [0] * int(shared)
    return per_layer


def _file_pattern(info: Mapping[str, object], arch: str, layers: int) -> list[bool] | None:
    """Which layers are windowed, as the file lists them (newer converters), if it does."""
    pattern = info.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) == layers:
        return [bool(p) for p in pattern]
    return None


def _length(info: Mapping[str, object], arch: str, key: str) -> int:
    value = info.get(f"{arch}.attention.{key}")
    return int(value) if isinstance(value, int | float) and value > 0 else 0


def _layer_bytes(attention: tuple[int, int, list[int], list[int], int, int]) -> list[int]:
    _, _, heads, kv_heads, key, value = attention
    return [kv * (key + value) * 2 if h and kv else 0
            for h, kv in zip(heads, kv_heads, strict=True)]


def _attention(info: Mapping[str, object], arch: str
               ) -> tuple[int, int, list[int], list[int], int, int] | None:
    """(blocks, embedding, heads and KV heads per layer, key and value length), None when
    the architecture keys are missing."""
    def number(key: str) -> int:
        value = info.get(f"{arch}.{key}")
        return int(value) if isinstance(value, int | float) and value > 0 else 0

    def per_layer(key: str, blocks: int, default: list[int]) -> list[int]:
        value = info.get(f"{arch}.{key}")
        if isinstance(value, list) and value:
            numbers = [int(v) if isinstance(v, int | float) else 0 for v in value]
            return (numbers + [numbers[-1]] * blocks)[:blocks]
        if isinstance(value, int | float):
            return [int(value)] * blocks
        return default

    blocks = number("block_count")
    embedding = number("embedding_length")
    heads = per_layer("attention.head_count", blocks, [])
    if not blocks or not embedding or not heads or not max(heads):
        return None
    # Missing KV heads: as many as query heads (no grouping), the larger figure.
    kv_heads = per_layer("attention.head_count_kv", blocks, heads)
    fewest_heads = min((h for h in heads if h), default=1)
    key = number("attention.key_length") or embedding // fewest_heads
    value = number("attention.value_length") or embedding // fewest_heads
    return blocks, embedding, heads, kv_heads, key, value


def windowed_kv(info: Mapping[str, object], arch: str) -> tuple[int, int, bool]:
    """(KV bytes per token at f16 in the windowed layers, the window, chunked) from an
    /api/show `model_info`, for the architectures whose windowed layers Ollama keeps short;
    (0, 0, False) for any other (every layer full, the larger figure)."""
    rule = WINDOWED.get(arch)
    if rule is None:
        return 0, 0, False
    raw = info.get(f"{arch}.{rule.key}")
    window = int(raw) if isinstance(raw, int | float) and raw > 0 else rule.default
    per_layer = kv_per_layer(info, arch)
    if not window or not per_layer:
        return 0, 0, False
    types = info.get(f"{arch}.attention.layer_types")
    if (pattern := _file_pattern(info, arch, len(per_layer))) is not None:
        windowed = pattern
    elif isinstance(types, list) and len(types) == len(per_layer):
        windowed = [t == 1 for t in types]  # laguna's layer types, 1 sliding
    elif rule.period:
        windowed = [(i + 1) % rule.period != 0 for i in range(len(per_layer))]
    else:
        return 0, 0, False
    return (sum(b for b, w in zip(per_layer, windowed, strict=True) if w), window,
            rule.chunked)


def token_embedding_bytes(info: Mapping[str, object], arch: str) -> int:
    """The token embedding table at f16: vocabulary (`_vocabulary`, else the largest in use)
    x embedding length x 2 B; 0 without an embedding length."""
    embedding = _number(info, f"{arch}.embedding_length")
    return (_vocabulary(info, arch) or LARGEST_VOCAB) * embedding * 2


def _vocabulary(info: Mapping[str, object], arch: str) -> int:
    """<arch>.vocab_size, else the number of tokens listed; 0 unknown."""
    tokens = info.get("tokenizer.ggml.tokens")
    return _number(info, f"{arch}.vocab_size") or (len(tokens) if isinstance(tokens, list)
                                                   else 0)


TOKEN_TABLE, OUTPUT_LAYER = "token_embd.weight", "output.weight"


def listed_tensors(show_tensors: object) -> dict[str, Mapping[str, object]]:
    """/api/show's `tensors` (listed whether verbose or not, server/routes.go) by name; only
    the token table and the output layer, which is all sizing reads of them."""
    if not isinstance(show_tensors, list):
        return {}
    return {str(t["name"]): t for t in show_tensors
            if isinstance(t, dict) and t.get("name") in (TOKEN_TABLE, OUTPUT_LAYER)}


def _stored_bytes(tensor: Mapping[str, object]) -> int:
    """What a listed tensor takes in the file; 0 for a type or shape not understood."""
    blocks = GGML_BLOCKS.get(str(tensor.get("type")))
    shape = tensor.get("shape")
    if blocks is None or not isinstance(shape, list) or not shape or \
            not all(type(n) is int and n > 0 for n in shape):
        return 0
    return math.prod(shape) // blocks[0] * blocks[1]


def cpu_table_bytes(tensors: Mapping[str, Mapping[str, object]]) -> int:
    """The token table as stored, when an output layer of the file's own stands beside it:
    llama.cpp's input layer keeps the table on the CPU; a tied output layer loads it onto
    the GPU as well (TENSOR_DUPLICATED), so then none of the file stays off it."""
    table = tensors.get(TOKEN_TABLE)
    return _stored_bytes(table) if table is not None and OUTPUT_LAYER in tensors else 0


def batch_logits_bytes(tensors: Mapping[str, Mapping[str, object]],
                       info: Mapping[str, object], arch: str) -> int:
    """The logits a batch of 512 computes, 4 x 512 x (embedding + vocabulary) B: Ollama's
    own graph estimate's floor (v0.12.6 fs/ggml/ggml.go:615-618), llama.cpp's compute
    buffer for Llama 3's 128256 tokens (256.5 MiB). The token table's shape gives both
    sizes, else model_info does; 0 when neither says."""
    table = tensors.get(TOKEN_TABLE)
    shape = table.get("shape") if table is not None else None
    if isinstance(shape, list) and len(shape) == 2 and all(type(n) is int for n in shape):
        embedding, vocab = shape
    else:
        embedding, vocab = _number(info, f"{arch}.embedding_length"), _vocabulary(info, arch)
        if not (embedding and vocab):
            return 0
    return 4 * BATCH * (int(embedding) + int(vocab))
