"""The hard filters, each rejection with a reason: health, context window, VRAM fit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from proxy.core.occupancy import ProviderIndex
from proxy.core.types import Circuit, ProviderHealth

HEALTHY = ProviderHealth()


@dataclass(frozen=True, slots=True)
class Fit:
    ok: bool
    reason: str
    warm: bool = False
    loading: bool = False


def health_reason(index: ProviderIndex, health: Mapping[str, ProviderHealth]) -> str | None:
    if not index.view.ready:
        return "provider not ready"
    state = health.get(index.name, HEALTHY).circuit
    if state is Circuit.OPEN:
        return "circuit open after repeated failures"
    return None


def context_reason(index: ProviderIndex, model: str, needed_tokens: int) -> str | None:
    """A prompt of exactly the context fits; an unknown context (0) never refuses."""
    ctx = index.context_for(model)
    if ctx and needed_tokens > ctx:
        return f"context {ctx} tokens cannot hold the prompt ({needed_tokens} tokens)"
    return None


def check(index: ProviderIndex, model: str, occupancy: int | None, needed_tokens: int,
          health: Mapping[str, ProviderHealth]) -> Fit:
    """Can `model` run on this provider for a prompt of `needed_tokens`?"""
    bad = health_reason(index, health)
    if bad:
        return Fit(False, bad)
    short = context_reason(index, model, needed_tokens)
    if short:
        return Fit(False, short)
    if index.is_warm(model):
        return Fit(True, "warm", warm=True)
    if index.is_loading(model):
        return Fit(True, "loading", loading=True)
    if model in index.planned_victims:
        return Fit(False, "resident but planned for eviction by another call")
    if model in index.leaving:
        return Fit(False, "being unloaded (keep_alive 0); placed again once it is gone")
    if index.view.disk_mib and model not in index.view.disk_mib:
        return Fit(False, "model not pulled on this provider")
    if index.models_over_limit(model):
        return Fit(False, f"{index.view.max_loaded} models loaded, the most this Ollama keeps "
                          "(OLLAMA_MAX_LOADED_MODELS): one must be unloaded first")
    usable = index.usable_mib
    if usable is None or occupancy is None:
        return Fit(True, "fit unknown (no VRAM total or no footprint published)")
    if occupancy > usable:
        return Fit(False, f"needs {occupancy} MiB, card has {usable} MiB usable")
    free = index.free_mib()
    assert free is not None
    if occupancy > free:
        return Fit(False, f"needs {occupancy} MiB, {free} MiB free beside residents")
    return Fit(True, f"fits: {occupancy} MiB of {free} MiB free")
