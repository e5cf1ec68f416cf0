"""Queue or unload: when no copy has a free slot and no card has free room.

Both options are expected seconds of delay. Queue wins ties; with neither, the call waits
for memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy.core.cost import (
    Backlog,
    call_length,
    load_seconds,
    queue_wait_s,
    remaining_load_s,
    unload_seconds,
    waiting_line,
)
from proxy.core.eviction import choose_victims, copy_demand
from proxy.core.feasibility import Fitting, health_reason, leaving_sibling, loading_unclaimed
from proxy.core.models import not_listed
from proxy.core.occupancy import Load, ProviderIndex, same_runner, same_weights
from proxy.core.policy import Policy
from proxy.core.sizing import Footprint
from proxy.core.types import ProviderView, Resident, Snapshot


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
    unload_s: float  # the victims' unloads alone, without their reloads


def queue_option(indexes: Iterable[ProviderIndex], models: Iterable[str], fitting: Fitting,
                 snapshot: Snapshot, policy: Policy) -> QueueOption | None:
    """The cheapest warm or loading copy of any acceptable model to queue at: the calls
    running there and queued in its engine, then the model's line of calls waiting in the
    sidecars, spread over its copies' slots."""
    best: QueueOption | None = None
    wanted = list(models)
    indexes = list(indexes)
    lines: dict[str, Backlog] = {}
    for index in indexes:
        if health_reason(index, snapshot.health):
            continue
        for model in wanted:
            if not (index.is_warm(model) or index.is_loading(model)) or fitting.copy_problem(
                    index, model, fitting.copy_context(index, model)) or \
                    fitting.lacking(index, model):  # (Ollama would refuse the call there)
                continue
            call_s = call_length(index.name, model, fitting.call, snapshot, policy).seconds
            if model not in lines:
                lines[model] = waiting_line(indexes, model, snapshot, fitting.call.turn)
            wait = queue_wait_s(index, model, snapshot.now, call_s) + \
                lines[model].delay_s(call_s)
            wait += remaining_load_s(index, model, snapshot, policy)
            if best is None or wait < best.wait_s:
                best = QueueOption(index.name, model, wait)
    return best


def victims_cost_s(view: ProviderView, victims: Iterable[Resident], snapshot: Snapshot,
                   policy: Policy, loading: str = "") -> float:
    """The victims' unloads (one at a time), plus reloading each as often as it is expected
    to be needed (the model being loaded itself, reloaded at another context, only the
    unload)."""
    victims = tuple(victims)
    total = unload_seconds(view.name, len(victims), snapshot, policy)
    for victim in victims:
        if victim.model != loading:
            demand = copy_demand(view, victim.model, snapshot.demand)
            total += load_seconds(view, victim.model, victim.footprint_mib, snapshot,
                                  policy) * demand.expected_reloads
    return total


def _obstacle(index: ProviderIndex, model: str, fitting: Fitting) -> tuple[Resident, ...] | None:
    """What must go besides room for a load of `model` here: nothing, its own copy (loaded
    with a context this call cannot use, and idle: a reload), or None when no load can be
    planned here (a usable copy is there, or being loaded, or busy)."""
    if not_listed(index.view, model):
        return None  # not pulled there
    if model in index.leaving or model in index.planned_victims or \
            model in index.loading or model in index.making_room or \
            leaving_sibling(index, model) is not None or \
            loading_unclaimed(index, model) is not None:
        return None
    copy = index.residents.get(model)
    if copy is None and fitting.joined_sibling(index, model) is not None:
        return None  # Ollama would run the call on that copy: no load here
    if copy is None:
        sibling = fitting.sibling(index, model)
        if sibling is not None:
            return _idle_copy(index, sibling)
        stale = fitting.stale_copy(index, model)
        if stale is None:
            return ()
        return None if index.calls_by_model.get(model) else (stale,)
    if index.calls_by_model.get(model) or fitting.copy_problem(
            index, model, copy.context_length) is None:
        return None  # busy, or usable: that is the queue option
    return (copy,)


def _idle_copy(index: ProviderIndex, model: str) -> tuple[Resident, ...] | None:
    """`model`'s copy here as a load's forced victim, or None while it cannot go yet (in
    use, being loaded, already another load's victim, or being unloaded)."""
    if index.calls_by_model.get(model) or model in index.loading or \
            model in index.planned_victims or model in index.making_room or \
            model in index.leaving:
        return None
    copy = index.residents.get(model) or next(
        (r for r in index.view.residents if r.model == model), None)
    return None if copy is None else (copy,)


def unload_option(indexes: Iterable[ProviderIndex], model: str, fitting: Fitting,
                  snapshot: Snapshot, policy: Policy) -> UnloadOption | None:
    """The cheapest plan, over ready cards that could hold the model, to free room for it."""
    best: UnloadOption | None = None
    for index in indexes:
        if health_reason(index, snapshot.health) or index.usable_mib is None:
            continue
        forced = _obstacle(index, model, fitting)
        resolved, footprint = fitting.load(index, model)
        if forced is None or footprint is None or footprint.total_mib > index.usable_mib or \
                fitting.context_problem(index, model, resolved.context):
            continue
        free = index.free_mib()
        assert free is not None
        over_limit = index.models_over_limit(model)
        # A copy of the model's weights file that Ollama would have the call join (the same
        # context): unloading it to make room for the load beside it is pointless.
        spared = frozenset(r.model for r in index.view.residents
                           if r not in forced and same_weights(index.view, model, r.model)
                           and same_runner(index.view, model, r.model))

        def enough(victims: tuple[Resident, ...], index: ProviderIndex = index,
                   free: int = free, need: Footprint = footprint, over: int = over_limit,
                   spared: frozenset[str] = spared) -> bool:
            gone = {v.model for v in victims}
            return not gone & spared and \
                need.total_mib <= free + sum(v.footprint_mib for v in victims) and \
                len(gone - {model}) >= over and \
                index.admits(Load(model, need.total_mib, need.estimate_mib, gone))

        victims = choose_victims(index, enough, snapshot.demand, policy.max_victim_candidates,
                                 forced, snapshot.now)
        if not victims:
            continue
        load_s = load_seconds(index.view, model, footprint.total_mib, snapshot, policy)
        cost = load_s + victims_cost_s(index.view, victims, snapshot, policy, model)
        if best is None or cost < best.cost_s:
            best = UnloadOption(index.name, cost, victims, load_s,
                                unload_seconds(index.name, len(victims), snapshot, policy))
    return best


def queue_wins(queue: QueueOption | None, unload: UnloadOption | None) -> bool | None:
    """True: queue; False: unload; None: neither exists (wait for memory)."""
    if unload is None:
        return None if queue is None else True
    if queue is None:
        return False
    return queue.wait_s <= unload.cost_s
