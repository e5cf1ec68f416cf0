"""The fleet as an operator reads it: per GPU its memory, copies, calls and circuit; per model
its waiters. Computed from one snapshot with the same arithmetic placement uses, so what the
metrics (and the status page) show is what the decisions saw."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.core.occupancy import index_providers
from proxy.core.policy import Policy
from proxy.core.types import Circuit, Snapshot

CIRCUIT_LEVEL = {Circuit.CLOSED: 0, Circuit.HALF_OPEN: 1, Circuit.OPEN: 2}


@dataclass(frozen=True, slots=True)
class Copy:
    model: str
    state: str  # loaded, loading or leaving
    mib: int


@dataclass(frozen=True, slots=True)
class GpuFigures:
    provider: str
    ready: bool
    total_mib: int | None  # None: never published
    usable_mib: int | None
    resident_mib: int  # what the copies on it hold
    claimed_mib: int  # what tickets claim beside the copies: loads in flight, calls' scratch
    copies: tuple[Copy, ...]
    calls: int  # calls (and held plans) holding a ticket here
    circuit: Circuit
    state_age_s: float
    reserve_mib: int | None  # the policy's reserve: total less usable
    scratch_mib: int  # the part of claimed_mib that calls sharing a copy claim beside it
    parallel: int  # calls one copy serves at once


@dataclass(frozen=True, slots=True)
class ModelFigures:
    model: str
    waiters: int  # calls waiting for a GPU, every sidecar's
    intents: int  # held plans announcing a call soon
    recent_use: float  # the decayed count of recent calls


@dataclass(frozen=True, slots=True)
class FleetFigures:
    gpus: tuple[GpuFigures, ...]
    waiters: dict[str, int]  # model -> calls waiting for a GPU, every sidecar's
    demand: tuple[ModelFigures, ...] = ()  # every model anyone waits for, plans or used


def fleet_figures(snapshot: Snapshot, policy: Policy) -> FleetFigures:
    indexes = index_providers(snapshot, policy)
    gpus = []
    for view in snapshot.providers:
        index = indexes[view.name]
        listed = {r.model for r in view.residents}
        copies = [Copy(r.model, "leaving" if r.leaving else "loading" if r.loading else "loaded",
                       r.footprint_mib) for r in view.residents]
        copies += [Copy(model, "loading", t.footprint_mib) for model, t in index.loading.items()
                   if model not in listed]
        health = snapshot.health.get(view.name)
        gpus.append(GpuFigures(
            view.name, view.ready, view.total_vram_mib, index.usable_mib, index.resident_mib,
            index.loading_mib + index.scratch_mib, tuple(copies), index.active_calls,
            health.circuit if health else Circuit.CLOSED,
            max(0.0, snapshot.now - view.probed_at) if view.probed_at else 0.0,
            None if index.usable_mib is None or view.total_vram_mib is None
            else view.total_vram_mib - index.usable_mib,
            index.scratch_mib, view.max_parallel))
    waiters = {model: d.waiters for model, d in snapshot.demand.items() if d.waiters}
    demand = tuple(ModelFigures(model, d.waiters, d.intents, d.recent_use)
                   for model, d in sorted(snapshot.demand.items())
                   if d.waiters or d.intents or d.recent_use)
    return FleetFigures(tuple(gpus), waiters, demand)
