"""The weighted cost, in expected seconds before the call can start (lowest wins).

Physical terms: queue wait at a copy (slot arithmetic over the call's learned length), what
queueing there adds to the model's backlog (the calls that find no free slot), what sharing
a copy's decode batch and the card with other models' running calls adds to the call
(contention), load time (footprint / load speed), remaining load
of a copy being loaded, the loads ahead of a new one (Ollama loads one model at a time), and
the unload a model in demand would first wait for on a card a load shuts it out of when
another card would not (docs/rules.md). Weights
scaled to seconds: best fit, reliability, spill (a copy partly in CPU memory,
or residents beyond the usable memory) and the policy's phase-aware provider weight.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.core.affinity import prefill_terms
from proxy.core.feasibility import Fitting
from proxy.core.lengths import CallLength
from proxy.core.load_times import LoadEstimate
from proxy.core.occupancy import ProviderIndex, indexes_for
from proxy.core.policy import Policy
from proxy.core.types import CallSpec, ProviderHealth, ProviderView, Snapshot

NO_HEALTH = ProviderHealth()


def call_length(provider: str, model: str, call: CallSpec, snapshot: Snapshot, policy: Policy
                ) -> CallLength:
    """How long a call of `model` holds a slot on `provider` (core/lengths.py)."""
    return snapshot.lengths.estimate(
        provider, model, num_predict=call.num_predict, prompt_tokens=call.prompt_tokens,
        provider_latency_s=snapshot.health.get(provider, NO_HEALTH).latency_ema_s,
        default_s=policy.default_call_s)


def load_estimate(view: ProviderView, model: str, footprint_mib: int | None,
                  snapshot: Snapshot, policy: Policy) -> LoadEstimate:
    """How long a load of `model` takes on the card, and whence (core/load_times.py): the
    start-up and the weights file `/api/tags` gave the size of (the footprint alone, as the
    design doc has it, when it gave none)."""
    return snapshot.loads.load(view.name, model, view.disk_mib.get(model), footprint_mib,
                               policy.load_mib_per_s, policy.load_startup_s)


def load_seconds(view: ProviderView, model: str, footprint_mib: int | None,
                 snapshot: Snapshot, policy: Policy) -> float:
    return load_estimate(view, model, footprint_mib, snapshot, policy).seconds


def unload_seconds(provider: str, victims: int, snapshot: Snapshot, policy: Policy) -> float:
    """`victims` copies unloaded together on `provider`, until `/api/ps` lists none."""
    return snapshot.loads.unloads_s(provider, victims, policy.unload_s)


def queue_wait_s(index: ProviderIndex, model: str, now: float, call_s: float) -> float:
    """0 with a free slot; else the soonest in-flight call's remaining time plus one call
    time per call queued beyond the slots, spread across the slots."""
    calls = [t for t in index.tickets if t.model == model]
    slots = max(index.slots(model), 1)
    if len(calls) < slots:
        return 0.0
    soonest = min(max(0.0, call_s - (now - t.started_at)) for t in calls)
    beyond = len(calls) - slots
    return soonest + beyond * call_s / slots


@dataclass(frozen=True, slots=True)
class Backlog:
    """A model's calls that find no free slot (queued at its copies beyond their slots, or
    waiting in a sidecar), and the slots of its copies (warm or loading)."""

    calls: int = 0
    slots: int = 0

    def delay_s(self, call_s: float) -> float:
        """What queueing one more call of `call_s` adds to the backlog's waits: the backlog
        shows the demand outrunning the slots, so as many calls come after this one and
        each starts one call length spread over the slots later."""
        return self.calls * call_s / max(self.slots, 1)


NO_BACKLOG = Backlog()


def queued_in_engines(indexes: Iterable[ProviderIndex], model: str) -> Backlog:
    """Calls of `model` queued inside the engines beyond its copies' slots, on every card,
    and the slots of its copies (warm or loading)."""
    calls = slots = 0
    for index in indexes:
        if index.is_warm(model) or index.is_loading(model):
            slots += index.slots(model)
            calls += max(0, -index.free_slots(model))
    return Backlog(calls, slots)


def backlog(indexes: Iterable[ProviderIndex], model: str, snapshot: Snapshot) -> Backlog:
    """Calls of `model` queued beyond its copies' slots, on every card, and its waiters on
    the demand board (a waiting call's own entry is not in its snapshot)."""
    queued = queued_in_engines(indexes, model)
    waiters = snapshot.demand[model].waiters if model in snapshot.demand else 0
    return Backlog(queued.calls + waiters, queued.slots)


# `fleet_backlog`'s figures for the last snapshot: the snapshot, the policy, per model
_last_backlogs: tuple[Snapshot, Policy, dict[str, Backlog]] | None = None


def fleet_backlog(snapshot: Snapshot, policy: Policy, model: str) -> Backlog:
    """`backlog` over every card, kept per model for the last snapshot: every verdict's
    contention asks it of the models running on its card (once per card, it cost a
    decision over 256 cards four times its time)."""
    global _last_backlogs
    kept = _last_backlogs
    if kept is None or kept[0] is not snapshot or kept[1] is not policy:
        kept = _last_backlogs = (snapshot, policy, {})
    found = kept[2].get(model)
    if found is None:
        found = kept[2][model] = backlog(indexes_for(snapshot, policy).values(), model,
                                         snapshot)
    return found


def waiting_line(indexes: Iterable[ProviderIndex], model: str, snapshot: Snapshot,
                 turn: float | None) -> Backlog:
    """The calls waiting in sidecars for `model` with turns sooner than `turn` (every one
    when None; a waiting call's own entry is not in its snapshot) over the slots of its
    copies. Late binding keeps them out of the engines' queues, so no copy's tickets show
    them, yet each takes a freed slot first: they are the queue the design's step 5
    counts."""
    slots = queued_in_engines(indexes, model).slots
    demand = snapshot.demand.get(model)
    if demand is None:
        return Backlog(0, slots)
    if turn is None:
        return Backlog(demand.waiters, slots)
    return Backlog(sum(1 for other in demand.turns if other < turn), slots)


def load_ends(index: ProviderIndex, snapshot: Snapshot, policy: Policy) -> dict[str, float]:
    """When each load in flight here is done. Ollama loads one model at a time, in the order
    the calls reached it (processPending blocks in llama-server's Load until the runner is
    ready: server/sched.go:627, llm/llama_server.go:1047-1084; in v0.12.6 the next load waits
    in updateFreeSpace for the loading runner's lock, held until it runs: server/sched.go:211,
    470, 515-528), so a load starts when the one before it ends. A copy listed while its
    runner still reads the weights (`ProviderIndex.reading`) is one until its expected end."""
    ends: dict[str, float] = {}
    free_at = -math.inf
    loads = sorted([*index.loading.items(), *index.reading.items()],
                   key=lambda item: item[1].started_at)
    for model, ticket in loads:
        start = max(ticket.started_at, free_at)
        free_at = end = start + load_seconds(
            index.view, model, ticket.footprint_mib, snapshot, policy)
        if end > snapshot.now or model in index.loading:
            ends[model] = end
    return ends


def loads_in_flight(index: ProviderIndex, snapshot: Snapshot, policy: Policy) -> int:
    """How many loads a new one here waits for."""
    return len(load_ends(index, snapshot, policy)) if index.loading or index.reading else 0


def remaining_load_s(index: ProviderIndex, model: str, snapshot: Snapshot, policy: Policy
                     ) -> float:
    """What the load of `model` here has left, the loads ahead of it included."""
    if model not in index.loading and model not in index.reading:
        return 0.0
    end = load_ends(index, snapshot, policy).get(model)
    return 0.0 if end is None else max(0.0, end - snapshot.now)


def loads_ahead_s(index: ProviderIndex, snapshot: Snapshot, policy: Policy) -> float:
    """What a new load here waits for: every load in flight, one after another."""
    ends = load_ends(index, snapshot, policy)
    return max(0.0, max(ends.values()) - snapshot.now) if ends else 0.0


def batched_beside(index: ProviderIndex, model: str) -> int:
    """The calls of `model` this call would decode beside in its copy's batch: Ollama's
    runner steps every busy slot together, so each one slows the others' tokens."""
    return max(0, min(index.calls_by_model.get(model, 0), index.slots(model) - 1))


def model_mib(index: ProviderIndex, model: str) -> int:
    """What a copy of `model` on this card holds (resident, else being loaded); 0 unknown."""
    resident = index.residents.get(model)
    if resident is not None:
        return resident.footprint_mib
    loading = index.loading.get(model)
    return loading.footprint_mib if loading is not None else 0


def contention_s(index: ProviderIndex, model: str, own_mib: int, call_s: float,
                 snapshot: Snapshot, policy: Policy) -> float:
    """What the other models' running calls on the card add to this call. Ollama runs each
    model as its own process and the card time-slices between those decoding, each step of
    theirs taking about as long as their weights are big against this model's (a decode
    step reads the weights once): while both run, this call advances at its own step over
    the sum of both. Taking turns so, the call ends `step` x its length later when it ends
    first, and the other's remaining time later when that ends first. That model's runner
    stays busy past its latest call while calls of it find no free slot (most wait in the
    sidecars, late binding): each takes one of its copies' next free slots, so each copy's
    runner runs their lengths spread over those slots more (`backlog`); a copy leaving the
    card, or to be evicted, is none of those: its runner stops with its calls."""
    running = index.running()
    if not running or (len(running) == 1 and model in running):
        return 0.0
    total = 0.0
    latency_s = snapshot.health.get(index.name, NO_HEALTH).latency_ema_s
    lengths = index.run_lengths(snapshot.lengths, latency_s, policy.default_call_s)
    for other, (count, latest) in running.items():
        if other == model:
            continue
        length = lengths.get(other)
        if length is None:
            length = lengths[other] = snapshot.lengths.estimate(
                index.name, other, default_s=policy.default_call_s,
                provider_latency_s=latency_s).seconds
        left = max(0.0, length - (snapshot.now - latest))
        if index.is_warm(other):  # (a copy leaving, or to be evicted, takes none of its line)
            left += fleet_backlog(snapshot, policy, other).delay_s(length)
        other_mib = model_mib(index, other)
        batch = min(count, max(index.slots(other), 1))  # calls beyond its slots wait
        step = (other_mib / own_mib if other_mib and own_mib else 1.0) * \
            (1 + policy.batch_share * (batch - 1))
        total += min(call_s * step, left)
    return total


def shared_terms(index: ProviderIndex, model: str, snapshot: Snapshot, policy: Policy,
                 phase: str, contention: float) -> dict[str, float]:
    """Terms every placement on this card pays, warm or cold."""
    health = snapshot.health.get(index.name, NO_HEALTH)
    terms = {"contention": contention} if contention else {}
    if health.success_rate is not None:
        terms["reliability"] = policy.reliability_s * (1.0 - health.success_rate)
    sign = -1.0 if phase == "mulling" else 1.0
    terms["provider_weight"] = sign * policy.provider_weight_s * index.view.weight
    return terms


def warm_terms(index: ProviderIndex, model: str, fitting: Fitting, snapshot: Snapshot,
               policy: Policy, phase: str, demand: Backlog = NO_BACKLOG) -> dict[str, float]:
    call_s = call_length(index.name, model, fitting.call, snapshot, policy).seconds
    terms = {"queue": queue_wait_s(index, model, snapshot.now, call_s)}
    if terms["queue"] > 0 and demand.calls:
        terms["backlog"] = demand.delay_s(call_s)
    batch = batched_beside(index, model)
    if batch:
        terms["batch"] = policy.batch_share * call_s * batch
    load = remaining_load_s(index, model, snapshot, policy)
    if load or index.is_loading(model):
        terms["load"] = load
    resident = index.residents.get(model)
    if resident is not None and resident.spilled:
        terms["spill"] = policy.spill_s  # partly in CPU memory: slow
    terms.update(prefill_terms(index, model, fitting.call, snapshot))
    terms.update(shared_terms(index, model, snapshot, policy, phase, contention_s(
        index, model, model_mib(index, model), call_s, snapshot, policy)))
    return terms


def best_fit_term(policy: Policy, usable_mib: int, footprint_mib: int) -> float:
    """Best fit: the room a load leaves, as a multiple of its size, at a small weight that
    breaks near-ties between cards, capped so that it stays one: a model of a few MiB on a
    card of GiBs (an embedding model, a tiny test model) would otherwise count minutes and
    make a call wait out a busy copy rather than load in a second on an idle card."""
    return min(policy.best_fit_s * (usable_mib - footprint_mib) / footprint_mib,
               policy.best_fit_max_s)


def cold_floor_s(index: ProviderIndex, model: str, fitting: Fitting, snapshot: Snapshot,
                 policy: Policy, phase: str) -> float:
    """What a cold load of `model` here costs at least: `cold_terms` less the terms that
    only add (the room it takes, the loads ahead, spill, prefill, reliability)."""
    footprint = fitting.footprint_mib(index, model)
    floor = load_seconds(index.view, model, footprint, snapshot, policy)
    if index.usable_mib is not None and footprint:
        floor += best_fit_term(policy, index.usable_mib, footprint)
    call_s = call_length(index.name, model, fitting.call, snapshot, policy).seconds
    sign = -1.0 if phase == "mulling" else 1.0
    return floor + contention_s(index, model, footprint or 0, call_s, snapshot, policy) + \
        sign * policy.provider_weight_s * index.view.weight


def cold_terms(index: ProviderIndex, model: str, fitting: Fitting, snapshot: Snapshot,
               policy: Policy, phase: str, shuts_out: tuple[str, ...] = ()
               ) -> dict[str, float]:
    """`shuts_out`: models in demand this load leaves no room for on the card while another
    card could hold it with room for them; a load of one of them here would first have to
    wait for this copy's unload."""
    footprint = fitting.footprint_mib(index, model)
    terms = {"load": load_seconds(index.view, model, footprint, snapshot, policy)}
    if shuts_out:
        terms["takes_room"] = unload_seconds(index.name, 1, snapshot, policy)
    ahead = loads_ahead_s(index, snapshot, policy) if index.loading or index.reading else 0.0
    if ahead:
        terms["loads_ahead"] = ahead
    if index.usable_mib is not None and footprint:
        terms["best_fit"] = best_fit_term(policy, index.usable_mib, footprint)
    if index.spills():
        terms["spill"] = policy.spill_s
    if fitting.call.conversation is not None:
        terms.update(prefill_terms(index, model, fitting.call, snapshot))
    call_s = call_length(index.name, model, fitting.call, snapshot, policy).seconds
    terms.update(shared_terms(index, model, snapshot, policy, phase, contention_s(
        index, model, footprint or 0, call_s, snapshot, policy)))
    return terms
