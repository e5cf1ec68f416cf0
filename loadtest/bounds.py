"""Bounds a placement policy is measured against, from a run's own calls.

The contention-free limit: every call served at once on a warm copy of its preferred model
(its whole prompt read as the fleet model reads it, slower per token the deeper, with
nothing cached; its answer at the model's token rate).

The slot-aware bound adds what no policy can avoid: a model runs at most as many calls at
once as its copies have slots, and a copy costs its load time (the fleet model's
`load_seconds`: start-up and the read of the weights file, seen on Ollama's 250 ms readiness
poll). Each model is given a copy on every card that could hold it (as if the model had the
cards to itself: no other model's memory or slots compete), and its calls, in arrival order,
each start at the soonest moment any card can run them: a free slot of a loaded copy, or a
new copy loaded from the call's arrival on a card without one (a copy left idle for the
card's keep-alive is gone, as Ollama unloads it). A call's model is its first candidate that
fits some card; its length is the limit's with that model's token rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from loadtest.fleet_model import DEPTH_SCALES, GpuSpec, ModelSpec, SimCall, load_seconds
from loadtest.sim_cache import DEFAULT_DEPTH_SCALE, prefill_seconds


def call_seconds(call: SimCall, model: ModelSpec, prompt_tokens_per_s: float) -> float:
    prefill = prefill_seconds(0, call.prompt_tokens, prompt_tokens_per_s,
                              DEPTH_SCALES.get(model.name, DEFAULT_DEPTH_SCALE))
    return prefill + call.output_tokens / model.tokens_per_s


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
    for call in sorted(calls, key=lambda c: (c.arrived, c.ident)):
        model = runnable_model(call, models, gpus)
        if model is not None:
            by_model.setdefault(model.name, []).append(call)
    rate = max(g.prompt_tokens_per_s for g in gpus)
    out: list[float] = []
    for name, queue in by_model.items():
        model = models[name]
        cards = [g for g in gpus if model.footprint_mib <= g.total_mib]
        free: dict[str, list[float]] = {g.name: [] for g in cards}  # per slot; [] not loaded
        for call in queue:
            best: tuple[float, GpuSpec] | None = None
            for g in cards:
                slots = free[g.name]
                soonest = max(call.arrived, min(slots)) if slots else math.inf
                if not slots or max(slots) + g.keep_alive_s < soonest:
                    # no copy, or it expired idle: a new one, loaded from the call's arrival
                    soonest = call.arrived + load_seconds(model, g)
                if best is None or soonest < best[0]:
                    best = (soonest, g)
            assert best is not None
            start, g = best
            slots = free[g.name]
            if not slots or max(slots) + g.keep_alive_s < start or min(slots) > start:
                slots[:] = [start] * g.slots  # (re)loaded: every slot free at `start`
            slots.sort()
            slots[0] = start + call_seconds(call, model, rate)
            out.append(slots[0] - call.arrived)
    return out
