"""Choosing victims: the fewest idle residents that make room, least needed first.

Ollama, making room itself, unloads the idle copy with the shortest keep-alive first, a copy
kept forever (keep_alive < 0: math.MaxInt64) last, then by name (server/sched.go:1557-1578
ByDurationAndName, 1663-1690 findRunnerToUnload; api/types.go:1243-1264). The sidecar sees
only when each copy expires (/api/ps `expires_at`: when it went idle + its keep-alive), so it
keeps a copy kept forever (or of unknown expiry) to the last, and ranks the others by its
demand board (the reloads a victim costs) and then by the keep-alive left.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from itertools import combinations

from proxy.core.context import could_run_in
from proxy.core.occupancy import ProviderIndex, copy_counted, runs_on
from proxy.core.types import ModelDemand, ProviderView, Resident, WaitNeed

NO_DEMAND = ModelDemand()
# Ollama lists a copy kept forever as expiring 292 years on; no keep-alive set by hand is
# near a century
FOREVER_AFTER_S = 100 * 365 * 86400.0


def kept_forever(resident: Resident, now: float | None) -> bool:
    """keep_alive -1, as /api/ps shows it (an expiry centuries on). An expiry not known yet
    (a copy loaded since the last probe) is not: Ollama ranks such a copy by its ordinary
    keep-alive."""
    return (now is not None and not math.isinf(resident.expires_at)
            and resident.expires_at - now > FOREVER_AFTER_S)


def waited_for(d: ModelDemand) -> int:
    """The waiting calls that could run on a copy: its model's, and those waiting for
    another model that have it as a candidate (ModelDemand.backing)."""
    return d.waiters + len(d.backing)


def need_key(resident: Resident, demand: Mapping[str, ModelDemand], now: float | None = None
             ) -> tuple[int, bool, int, float, float, float, str]:
    """LEAST_NEEDED_FIRST: fewer waiting calls, not kept forever, fewer intents, lower use
    + prediction, the sooner its keep-alive ends, LRU, name."""
    d = demand.get(resident.model, NO_DEMAND)
    last_used = max(d.last_used_at, resident.last_used_at)
    return (waited_for(d), kept_forever(resident, now), d.intents, d.recent_use + d.predicted,
            resident.expires_at, last_used, resident.model)


def copy_demand(view: ProviderView, model: str, demand: Mapping[str, ModelDemand]
                ) -> ModelDemand:
    """What the demand board says of `model`'s copy here: of every model Ollama runs on it
    (`runs_on`: models created FROM it join it), summed."""
    # (the board lists far fewer models than a card has: its entries are the ones asked)
    parts = [d for m, d in demand.items() if runs_on(view, m, model)]
    if len(parts) <= 1:
        return parts[0] if parts else NO_DEMAND
    return ModelDemand(
        waiters=sum(d.waiters for d in parts), intents=sum(d.intents for d in parts),
        recent_use=sum(d.recent_use for d in parts), predicted=sum(d.predicted for d in parts),
        last_used_at=max(d.last_used_at for d in parts),
        turns=tuple(sorted(t for d in parts for t in d.turns)),
        backing=tuple(n for d in parts for n in d.backing))


def backing_here(view: ProviderView, resident: Resident, d: ModelDemand) -> ModelDemand:
    """`d` with only the backing calls that could run on this copy: one kept off the card
    (a retry's), or whose num_ctx or prompt its context cannot hold, would have it unloaded
    (reloaded) or go elsewhere, so it keeps nothing here (as CallService.copy_wanted)."""
    if not d.backing:
        return d
    info = view.models.get(resident.model)
    trained = info.trained_context if info is not None else 0

    def could_run(need: WaitNeed) -> bool:
        return view.name not in need.excludes and could_run_in(
            resident.context_length, need.num_ctx, need.prompt_tokens, trained)

    runnable = tuple(n for n in d.backing if could_run(n))
    return d if len(runnable) == len(d.backing) else replace(d, backing=runnable)


def idle_residents(index: ProviderIndex) -> list[Resident]:
    """Residents with no in-flight ticket (under any name of their weights file: Ollama
    runs one copy of it) and not already planned for release by a ticket."""
    busy = {m for m, calls in index.calls_by_model.items() if calls}
    return [r for r in index.residents.values()
            if not copy_counted(index.view, r.model, busy) and
            r.model not in index.planned_victims and r.model not in index.loading]


def choose_victims(index: ProviderIndex, enough: Callable[[tuple[Resident, ...]], bool],
                   demand: Mapping[str, ModelDemand], max_candidates: int = 10,
                   forced: tuple[Resident, ...] = (), now: float | None = None
                   ) -> tuple[Resident, ...] | None:
    """The fewest victims (beside `forced`, which go whatever happens) for which `enough`
    holds; None when no choice makes room.

    Models with waiting agents (or waiting calls that could run on them: waited_for) are
    used only when nothing else makes room; copies kept forever only when no other choice
    (without those waited for) does.
    """
    if enough(forced):
        return forced
    idle = [r for r in idle_residents(index) if r not in forced]
    needs = {r.model: backing_here(index.view, r, copy_demand(index.view, r.model, demand))
             for r in idle}
    ordered = sorted(idle, key=lambda r: need_key(r, needs, now))
    without_waiters = [r for r in ordered if not waited_for(needs[r.model])]
    expiring = [r for r in without_waiters if not kept_forever(r, now)]
    for pool in (expiring, without_waiters, ordered):
        pool = pool[:max_candidates]
        for count in range(1, len(pool) + 1):
            # combinations() walks in order of the need ranking: the first that fits is the
            # least needed set of this size.
            for combo in combinations(pool, count):
                if enough((*forced, *combo)):
                    return (*forced, *combo)
    return None
