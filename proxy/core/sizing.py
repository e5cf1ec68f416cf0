"""What a copy of a model takes of a card's memory, and what Ollama's own admission says.

A copy is weights + KV cache + compute buffers. The KV cache is the context per slot x the
card's slots for that model x the model's KV bytes per token (from /api/show: per-layer KV
heads x (key + value length), at the card's OLLAMA_KV_CACHE_TYPE); the compute allowance
follows Ollama's batch tiers by context x slots (server/sched.go:859-868, 906-915: 0, 768 MiB,
2 GiB). The weights part is calibrated from copies seen fully on a GPU (size_vram less the
KV and compute parts at the context they were seen with); before any is seen it is the
on-disk size. A copy seen on this card at this context is its own best figure.

Ollama itself admits a load beside other models only when its own estimate (file size + KV
at f16 by embedding / heads, llm/llama_server.go:2681-2700) is within 80 % of the free VRAM
(total less what loaded models use, sched.go:547-561, from 0.30); otherwise it unloads a
model of its choosing first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from proxy.core.context import Resolved, Version, effective, for_card, parse_version
from proxy.core.types import ModelInfo, ProviderView

MIB = 1 << 20
# Bytes per cached element (ggml's block sizes: q8_0 34 B and q4_0 18 B per 32 values).
KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
ADMISSION_RULE_SINCE: Version = (0, 30, 0)
# Ollama's free memory is the driver's: each loaded runner's CUDA context comes off it too
# (its own figure for that, MinimumMemory, ml/device.go:359-364).
RUNNER_OVERHEAD_MIB = 457


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


def graph_mib(tokens: int) -> int:
    """Compute buffers for a copy with `tokens` of context in all (Ollama's batch tiers)."""
    if tokens <= 4096:
        return 0
    return 768 if tokens <= 32768 else 2048


def kv_mib(info: ModelInfo, context: int, slots: int, cache_type: str = "f16") -> int:
    per_element = KV_BYTES_PER_ELEMENT.get(cache_type, 2.0)
    return math.ceil(info.kv_bytes_per_token * per_element / 2 * context * slots / MIB)


def ollama_estimate_mib(info: ModelInfo, disk_mib: int, context: int, slots: int) -> int:
    """Ollama's own pre-load estimate (PredictServerVRAM; f16 whatever the cache type)."""
    return disk_mib + math.ceil(info.estimate_kv_bytes_per_token * context * slots / MIB)


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
    estimate_mib: int = 0  # Ollama's own estimate; 0 unknown (no architecture)

    def parts(self) -> dict[str, int | str]:
        return {"totalMiB": self.total_mib, "weightsMiB": self.weights_mib,
                "kvMiB": self.kv_mib, "graphMiB": self.graph_mib,
                "ollamaEstimateMiB": self.estimate_mib, "source": self.source}


SizerInputs = tuple[float, tuple[tuple[object, ...], ...]]


def _sizing_inputs(view: ProviderView) -> tuple[object, ...]:
    """Every field of a card that a footprint, a resolved context or a slot count reads (the
    residents, tickets and health are not among them)."""
    return (view.name, view.total_vram_mib, view.context_length, view.max_parallel,
            view.kv_cache_type, view.version, view.models, view.disk_mib, view.observed)


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
                return Footprint(seen, f"seen on {view.name}", seen)
            return self._without_architecture(model, view, declared)
        context = effective(recorded_ctx, info.trained_context)
        slots = model_slots(view, model)
        kv = kv_mib(info, context, slots, view.kv_cache_type)
        graph = graph_mib(context * slots)
        disk = self.disk_mib(model, view)
        estimate = ollama_estimate_mib(info, disk, context, slots) if disk else 0
        if seen:
            return Footprint(seen, f"seen on {view.name} at this context",
                             max(0, seen - kv - graph), kv, graph, estimate)
        weights, source = self._calibrated_weights(model) or (disk, "architecture, file size")
        total = weights + kv + graph
        if declared and declared > total:
            total, source = declared, "declared vramMib (above the architecture's figure)"
        return Footprint(total, source, weights, kv, graph, estimate)

    def _calibrated_weights(self, model: str) -> tuple[int, str] | None:
        """The weights part of copies seen fully on a GPU: what they took less their KV and
        compute parts; the largest, so a card's own overheads are not undercounted."""
        if model in self._weights:
            return self._weights[model]
        best: tuple[int, str] | None = None
        for view in self.views:
            seen = view.observed.get(model)
            if not seen:
                continue
            info = self.info(model, view)
            if info is None or not info.kv_bytes_per_token:
                continue
            for recorded, mib in seen.items():
                if not recorded:
                    continue
                context = effective(recorded, info.trained_context)
                slots = model_slots(view, model)
                weights = mib - kv_mib(info, context, slots, view.kv_cache_type) - \
                    graph_mib(context * slots)
                if weights > 0 and (best is None or weights > best[0]):
                    best = (weights, f"calibrated from {view.name} at {context} x {slots}")
        self._weights[model] = best
        return best

    def _without_architecture(self, model: str, view: ProviderView, declared: int | None
                              ) -> Footprint | None:
        """No KV arithmetic possible: the largest copy seen, else declared, else disk x
        factor (most measured first; none of them follows the context)."""
        seen = max((mib for v in self.views for mib in v.observed.get(model, {}).values()),
                   default=0)
        if seen:
            return Footprint(seen, "seen on a GPU (context not known to scale)", seen)
        if declared:
            return Footprint(declared, "declared vramMib", declared)
        disk = self.disk_mib(model, view)
        if disk:
            total = int(disk * self.factor)
            return Footprint(total, f"file size x {self.factor:g}", total)
        return None


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


def kv_per_token(info: Mapping[str, object], arch: str) -> tuple[int, int]:
    """(real, Ollama-estimate) KV bytes per token at f16 from an /api/show `model_info`;
    (0, 0) when the architecture keys are missing."""
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
        return 0, 0
    # Missing KV heads: as many as query heads (no grouping), the larger figure.
    kv_heads = per_layer("attention.head_count_kv", blocks, heads)
    fewest_heads = min((h for h in heads if h), default=1)
    key = number("attention.key_length") or embedding // fewest_heads
    value = number("attention.value_length") or embedding // fewest_heads
    real = sum(kv * (key + value) * 2 for h, kv in zip(heads, kv_heads, strict=True)
               if h and kv)
    estimate = 4 * blocks * max(1, min(kv_heads)) * (embedding // max(heads))
    return real, estimate
