"""Choosing victims: the fewest idle residents that make room, least needed first."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import combinations

from proxy.core.occupancy import ProviderIndex
from proxy.core.types import ModelDemand, Resident

NO_DEMAND = ModelDemand()


def need_key(resident: Resident, demand: Mapping[str, ModelDemand]
             ) -> tuple[int, int, float, float, str]:
    """LEAST_NEEDED_FIRST: fewer waiters, fewer intents, lower use + prediction, LRU, name."""
    d = demand.get(resident.model, NO_DEMAND)
    last_used = max(d.last_used_at, resident.last_used_at)
    return (d.waiters, d.intents, d.recent_use + d.predicted, last_used, resident.model)


def idle_residents(index: ProviderIndex) -> list[Resident]:
    """Residents with no in-flight ticket and not already planned for release by a ticket."""
    return [r for r in index.residents.values()
            if not index.calls_by_model.get(r.model) and r.model not in index.planned_victims
            and r.model not in index.loading]


def choose_victims(index: ProviderIndex, enough: Callable[[tuple[Resident, ...]], bool],
                   demand: Mapping[str, ModelDemand], max_candidates: int = 10,
                   forced: tuple[Resident, ...] = ()) -> tuple[Resident, ...] | None:
    """The fewest victims (beside `forced`, which go whatever happens) for which `enough`
    holds; None when no choice makes room.

    Models with waiting agents are used only when nothing else makes room.
    """
    if enough(forced):
        return forced
    ordered = sorted((r for r in idle_residents(index) if r not in forced),
                     key=lambda r: need_key(r, demand))
    without_waiters = [r for r in ordered if not demand.get(r.model, NO_DEMAND).waiters]
    for pool in (without_waiters, ordered):
        pool = pool[:max_candidates]
        for count in range(1, len(pool) + 1):
            # combinations() walks in order of the need ranking: the first that fits is the
            # least needed set of this size.
            for combo in combinations(pool, count):
                if enough((*forced, *combo)):
                    return (*forced, *combo)
    return None
