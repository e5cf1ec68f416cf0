"""Bounds a placement policy is measured against, from a run's own calls.

The contention-free limit: every call served at once on a warm copy of its preferred model
(its prompt read at the card's prompt rate, its answer at the model's token rate).

The slot-aware bound adds what no policy can avoid: a model runs at most as many calls at
once as its copies have slots, and a copy costs its load time. Each model is given a copy on
every card that could hold it, loaded in parallel from the moment its first call arrives (as
if the model had the cards to itself: no other model's memory or slots compete), and its
calls, in arrival order, each take the slot that frees first. A call's model is its first
candidate that fits some card; its length is the limit's with that model's token rate. No
policy serving calls in arrival order, without preempting them, starts any call earlier.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence

from loadtest.fleet_model import GpuSpec, ModelSpec, SimCall


def call_seconds(call: SimCall, model: ModelSpec, prompt_tokens_per_s: float) -> float:
    return call.prompt_tokens / prompt_tokens_per_s + call.output_tokens / model.tokens_per_s


def contention_free(calls: Iterable[SimCall], models: Mapping[str, ModelSpec],
                    prompt_tokens_per_s: float = 2000.0) -> list[float]:
    return [call_seconds(c, models[c.preferred], prompt_tokens_per_s) for c in calls]


def runnable_model(call: SimCall, models: Mapping[str, ModelSpec], gpus: Sequence[GpuSpec]
                   ) -> ModelSpec | None:
    for name, _ in call.candidates:
        model = models[name]
        if any(model.footprint_mib <= g.total_mib for g in gpus):
            return model
    return None


def slot_aware(calls: Sequence[SimCall], models: Mapping[str, ModelSpec],
               gpus: Sequence[GpuSpec]) -> list[float]:
    """Each call's latency in the slot-aware schedule (calls no card can run are left out)."""
    by_model: dict[str, list[SimCall]] = {}
    chosen: dict[int, ModelSpec] = {}
    for call in sorted(calls, key=lambda c: (c.arrived, c.ident)):
        model = runnable_model(call, models, gpus)
        if model is not None:
            chosen[call.ident] = model
            by_model.setdefault(model.name, []).append(call)
    out: list[float] = []
    for name, queue in by_model.items():
        model = models[name]
        first = queue[0].arrived
        slots = [first + model.footprint_mib / g.load_mib_per_s
                 for g in gpus if model.footprint_mib <= g.total_mib for _ in range(g.slots)]
        heapq.heapify(slots)
        rate = max(g.prompt_tokens_per_s for g in gpus)
        for call in queue:
            free_at = heapq.heappop(slots)
            finish = max(call.arrived, free_at) + call_seconds(call, model, rate)
            heapq.heappush(slots, finish)
            out.append(finish - call.arrived)
    return out
