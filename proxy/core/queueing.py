"""Queue or unload: when no copy has a free slot and no card has free room.

Both options are expected seconds of delay. Queue wins ties; with neither, the call waits
for memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from proxy.core.cost import call_seconds, load_seconds, queue_wait_s, remaining_load_s
from proxy.core.eviction import NO_DEMAND, choose_victims
from proxy.core.feasibility import context_reason, health_reason
from proxy.core.occupancy import ProviderIndex
from proxy.core.policy import Policy
from proxy.core.types import Resident, Snapshot


@dataclass(frozen=True, slots=True)
class QueueOption:
    provider: str
    model: str
    wait_s: float


@dataclass(frozen=True, slots=True)
class UnloadOption:
    provider: str
    cost_s: float
    victims: tuple[Resident, ...]
    load_s: float


def queue_option(indexes: Iterable[ProviderIndex], models: Iterable[str],
                 occupancies: Mapping[str, int | None], needed_tokens: int,
                 snapshot: Snapshot, policy: Policy) -> QueueOption | None:
    """The cheapest warm or loading copy of any acceptable model to queue at."""
    best: QueueOption | None = None
    wanted = list(models)
    for index in indexes:
        if health_reason(index, snapshot.health):
            continue
        call_s = call_seconds(index.name, snapshot.health, policy)
        for model in wanted:
            warm, loading = index.is_warm(model), index.is_loading(model)
            if not (warm or loading) or context_reason(index, model, needed_tokens):
                continue
            wait = queue_wait_s(index, model, snapshot.now, call_s)
            if loading:
                wait += remaining_load_s(index, model, occupancies.get(model), snapshot, policy)
            if best is None or wait < best.wait_s:
                best = QueueOption(index.name, model, wait)
    return best


def victims_cost_s(victims: Iterable[Resident], snapshot: Snapshot, policy: Policy) -> float:
    """Per victim: the unload, plus reloading it as often as it is expected to be needed."""
    total = 0.0
    for victim in victims:
        demand = snapshot.demand.get(victim.model, NO_DEMAND)
        total += policy.unload_s + load_seconds(victim.footprint_mib, snapshot, policy) * \
            demand.expected_reloads
    return total


def unload_option(indexes: Iterable[ProviderIndex], model: str, occupancy: int | None,
                  needed_tokens: int, snapshot: Snapshot, policy: Policy) -> UnloadOption | None:
    """The cheapest plan, over ready cards that could hold the model, to free room for it."""
    if occupancy is None:
        return None
    best: UnloadOption | None = None
    load_s = load_seconds(occupancy, snapshot, policy)
    for index in indexes:
        if health_reason(index, snapshot.health) or index.usable_mib is None:
            continue
        if occupancy > index.usable_mib or context_reason(index, model, needed_tokens):
            continue
        if index.is_warm(model) or index.is_loading(model):
            continue  # a copy is there already: that is the queue option
        if index.view.disk_mib and model not in index.view.disk_mib:
            continue  # not pulled there
        free = index.free_mib()
        assert free is not None
        victims = choose_victims(index, occupancy - free, snapshot.demand,
                                 policy.max_victim_candidates, index.models_over_limit(model))
        if not victims:
            continue
        cost = load_s + victims_cost_s(victims, snapshot, policy)
        if best is None or cost < best.cost_s:
            best = UnloadOption(index.name, cost, victims, load_s)
    return best


def queue_wins(queue: QueueOption | None, unload: UnloadOption | None) -> bool | None:
    """True: queue; False: unload; None: neither exists (wait for memory)."""
    if unload is None:
        return None if queue is None else True
    if queue is None:
        return False
    return queue.wait_s <= unload.cost_s
