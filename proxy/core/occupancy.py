"""Memory arithmetic: what a model occupies, and what a provider has left.

`ProviderIndex` folds one provider's residents and active tickets into the figures every
filter and cost reads, once per placement rather than once per candidate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from proxy.core import fit_before_030
from proxy.core.context import effective, listed_as_loaded
from proxy.core.engines import lists_before_read
from proxy.core.gpus import FIT_MARGIN_MIB, RUNNER_OVERHEAD_MIB, spread_fits
from proxy.core.lengths import CallLengths
from proxy.core.policy import Policy
from proxy.core.sizing import (
    RUNNER_FILES,
    admission_rule,
    compute_mib,
    draft_num_predict,
    first_load_compute_mib,
    held_by_runners,
    model_slots,
    ollama_admits,
)
from proxy.core.types import ProviderView, Resident, Snapshot, Ticket


@dataclass(frozen=True, slots=True)
class Load:
    """A load in flight on a card, as Ollama's admission rule sees it."""

    model: str
    footprint_mib: int
    estimate_mib: int  # Ollama's own estimate of it; 0 unknown (the rule cannot be checked)
    evicts: Container[str] = ()  # unloaded before it is sent
    beside_mib: int = 0  # what the copies beside it held (Resident.beside_mib)

    @staticmethod
    def of(ticket: Ticket) -> Load:
        return Load(ticket.model, ticket.footprint_mib, ticket.estimate_mib,
                    frozenset(ticket.evicts), ticket.beside_mib)


def held_beside(model: str, evicts: Container[str], residents: Iterable[Resident],
                loads: Iterable[Ticket]) -> int:
    """What the copies a load of `model` finds beside it hold, runners' overhead included:
    the residents and the loads in flight of other models it does not evict. Its runner goes
    on counting them after they leave (Resident.beside_mib)."""
    staying = {r.model: r.footprint_mib for r in residents
               if r.model != model and r.model not in evicts}
    for t in loads:
        if t.cold and t.model != model and t.model not in evicts:
            staying.setdefault(t.model, t.footprint_mib)
    return held_by_runners(staying.values())


def stale_views(residents: Iterable[Resident]) -> dict[str, int]:
    """Per copy that loaded beside others, what its runner still counts of them
    (`admission_problem`'s `beside`)."""
    return {r.model: r.beside_mib for r in residents if r.beside_mib}


def admission_problem(total_mib: int, residents: Mapping[str, int], loads: Sequence[Load],
                      beside: Mapping[str, int] | None = None,
                      newcomer: Load | None = None,
                      admits: Callable[[int, int, int], bool] = ollama_admits
                      ) -> Load | None:
    """Ollama loads one model at a time, in the order the calls reach it, on every version
    (processPending; docs/engine.md, "Loads, one at a time on every version"): each load in
    flight must pass its 80 % rule beside the residents it does not evict and every other load.
    The free memory it reads is the least of that and what a staying copy's runner still
    counts (`beside`: what the others held when it loaded, Resident.beside_mib; which runner
    Ollama asks is a map's order, so the stalest). A load in flight counts the others in its
    `beside_mib` (the claims keep that so), but not itself: a runner that loaded first never
    saw the load it is checked against. `newcomer`: a load not claimed yet, which no other's
    figure counts. `admits(estimate, total, taken)`: the rule, the 80 % one by default
    (before 0.30: `fit_before_030.fits`, with no `beside`). The first load that would not,
    or None."""
    for load in loads:
        if not load.estimate_mib:
            continue
        others = used = stale = 0  # the residents it does not evict and the other loads
        for model, mib in residents.items():
            if model not in load.evicts and model != load.model:
                others += 1
                used += mib
                stale = max(stale, mib + RUNNER_OVERHEAD_MIB + (beside or {}).get(model, 0))
        for other in loads:
            if other.model != load.model:
                others += 1
                used += other.footprint_mib
                if other.model not in load.evicts:
                    counted_in = load is not newcomer and load.model not in other.evicts
                    own = load.footprint_mib + RUNNER_OVERHEAD_MIB if counted_in else 0
                    stale = max(stale, other.footprint_mib + RUNNER_OVERHEAD_MIB +
                                max(0, other.beside_mib - own))
        counted = max(used + RUNNER_OVERHEAD_MIB * others, stale)
        if others and not admits(load.estimate_mib, total_mib, counted):
            return load
    return None


def ollama_refuses(view: ProviderView, residents: Mapping[str, int], loads: Sequence[Load],
                   beside: Mapping[str, int], newcomer: Load | None = None) -> Load | None:
    """The first load in flight Ollama would not load beside the rest, by its 80 % rule
    from 0.30 (`admission_problem`) or its fit check before (core/fit_before_030.py), or
    None. (Over several GPUs before 0.30, `spread_problem` stands for it.)"""
    total = view.total_vram_mib
    if total is None:
        return None
    if admission_rule(view):
        return admission_problem(total, residents, loads, beside, newcomer)
    if fit_before_030.applies(view):
        def fits(required: int, total_mib: int, taken: int) -> bool:
            return fit_before_030.fits(required, total_mib, taken, view)
        # a load in flight takes what Ollama's estimate reports of it, once loaded; a listed
        # copy what it holds, where its listing is less
        taken = [replace(load, footprint_mib=fit_before_030.taken_mib(
            load.footprint_mib, load.estimate_mib)) for load in loads]
        arrived = next((t for load, t in zip(loads, taken, strict=True) if load is newcomer), None)
        refused = admission_problem(total, _held_as_listed(view, residents), taken,
                                    newcomer=arrived, admits=fits)
        return next((load for load, t in zip(loads, taken, strict=True) if t is refused), None)
    return None


def _held_as_listed(view: ProviderView, residents: Mapping[str, int]) -> dict[str, int]:
    """`residents` (as listed) with what each llama-engine copy holds beyond its listing
    before 0.30 (fit_before_030.listed_short_mib)."""
    held = dict(residents)
    for resident in view.residents:
        info = view.models.get(resident.model)
        if resident.model not in held or info is None or not resident.context_length:
            continue
        context = effective(resident.context_length, info.trained_context)
        slots = model_slots(view, resident.model)
        compute = first_load_compute_mib(info) + compute_mib(info, view, context, slots)
        held[resident.model] += fit_before_030.listed_short_mib(info, view, context, slots,
                                                                compute)
    return held


def spread_problem(view: ProviderView, residents: Mapping[str, int], loads: Sequence[Load]
                   ) -> Load | None:
    """On a provider of several GPUs, the first load in flight that would not fit spread
    over them beside the residents it does not evict and the other loads (gpus.py: a CUDA
    context for every copy on every GPU, and llama.cpp's fit margin from 0.30), or None."""
    if view.gpus <= 1 or not view.total_vram_mib:
        return None
    margin = FIT_MARGIN_MIB if admission_rule(view) else 0
    for load in loads:
        held = [mib for model, mib in residents.items()
                if model not in load.evicts and model != load.model]
        held += [other.footprint_mib for other in loads if other.model != load.model]
        if not spread_fits(load.footprint_mib, view.total_vram_mib, view.gpus, held, margin):
            return load
    return None


def _loads(ticket: Ticket, lasting: Container[str]) -> bool:
    """A ticket whose copy is being loaded (or reloaded at another context): its model has
    no copy that lasts (an idle one about to expire may be gone when the call arrives)."""
    return ticket.cold and (ticket.model not in lasting or ticket.reloads)


# Ollama's automatic OLLAMA_MAX_LOADED_MODELS (unset or 0): 3 per GPU, at least one GPU
# counted (server/sched.go:86 defaultModelsPerGPU, :280-288)
MODELS_PER_GPU = 3


def loaded_limit(max_loaded: int, gpus: int = 1) -> int:
    """How many models an Ollama with OLLAMA_MAX_LOADED_MODELS `max_loaded` on `gpus` GPUs
    keeps loaded before it unloads one itself."""
    return max_loaded if max_loaded > 0 else MODELS_PER_GPU * max(gpus, 1)


@dataclass(slots=True)
class ProviderIndex:
    """A provider's residents and active tickets, pre-digested."""

    view: ProviderView
    usable_mib: int | None
    residents: dict[str, Resident]
    resident_mib: int
    tickets: list[Ticket] = field(default_factory=list)
    calls_by_model: dict[str, int] = field(default_factory=dict)
    loading: dict[str, Ticket] = field(default_factory=dict)  # model -> earliest loading ticket
    # A copy Ollama lists once its memory is committed, while its runner may still read the
    # weights (core/engines.py): model -> its earliest cold ticket. Resident for memory and
    # joins; a load for time only, until its expected end (cost.load_ends)
    reading: dict[str, Ticket] = field(default_factory=dict)
    loading_mib: int = 0  # memory claimed by loads not yet resident
    scratch_mib: int = 0  # what calls sharing a copy claim beside it
    planned_victims: dict[str, int] = field(default_factory=dict)
    making_room: set[str] = field(default_factory=set)  # loads whose victims are still loaded
    reloading: set[str] = field(default_factory=set)  # models reloaded at another context
    leaving: frozenset[str] = frozenset()  # asked to unload, not yet seen gone
    # What Ollama counts against OLLAMA_MAX_LOADED_MODELS: every copy still listed (expiring
    # and leaving ones too) and every load in flight.
    loaded_models: set[str] = field(default_factory=set)
    # The loads in flight here and the residents' memory, as Ollama's admission rule reads
    # them: the same for every model weighed here, so worked out on the first load weighed
    _admission: tuple[list[Load], dict[str, int], dict[str, int]] | None = field(
        default=None, init=False, repr=False, compare=False)
    _running: dict[str, tuple[int, float]] | None = field(
        default=None, init=False, repr=False, compare=False)
    _run_lengths: tuple[CallLengths, float | None, float, dict[str, float]] | None = field(
        default=None, init=False, repr=False, compare=False)
    # loaded_models by weights file, worked out when first asked
    _by_weights: dict[str, tuple[str, ...]] | None = field(
        default=None, init=False, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def active_calls(self) -> int:
        return len(self.tickets)

    def free_mib(self) -> int | None:
        """Usable memory beside residents, loads in flight and what calls sharing a copy
        claim (as the claim counts them); None when unknown."""
        if self.usable_mib is None:
            return None
        return self.usable_mib - self.resident_mib - self.loading_mib - self.scratch_mib

    def is_warm(self, model: str) -> bool:
        """Resident, and neither planned for eviction by another ticket nor leaving."""
        return model in self.residents and model not in self.planned_victims and \
            model not in self.leaving

    def is_loading(self, model: str) -> bool:
        return model in self.loading and model not in self.planned_victims and \
            model not in self.leaving

    def serves(self, model: str) -> bool:
        """A copy here (warm or being loaded) that calls for `model` run on: its own, or
        another model's of its weights file whose runner options it shares (`same_runner`;
        at a context that may not suit every call)."""
        return any(self.is_warm(copy) or self.is_loading(copy)
                   for copy in self.copies_for(model))

    def copies_for(self, model: str) -> tuple[str, ...]:
        """`model` and the other models listed or being loaded here whose copy calls for
        `model` run on (`runs_on`)."""
        return (model, *(other for other in self.siblings(model)
                         if same_runner(self.view, model, other)))

    def siblings(self, model: str) -> tuple[str, ...]:
        """The other models listed or being loaded here made from `model`'s weights file
        (`same_weights`), in name order."""
        info = self.view.models.get(model)
        if info is None or not info.weights:
            return ()
        if self._by_weights is None:
            by: dict[str, list[str]] = {}
            for other in sorted(self.loaded_models):
                found = self.view.models.get(other)
                if found is not None and found.weights:
                    by.setdefault(found.weights, []).append(other)
            self._by_weights = {w: tuple(names) for w, names in by.items()}
        return tuple(m for m in self._by_weights.get(info.weights, ()) if m != model)

    def slots(self, model: str) -> int:
        return model_slots(self.view, model)

    def free_slots(self, model: str) -> int:
        return self.slots(model) - self.calls_by_model.get(model, 0)

    def admits(self, load: Load) -> bool:
        """Ollama's own admission of `load` here (its 80 % rule from 0.30, its fit check
        before), beside the loads already in flight (in whatever order they reach it)."""
        if self.view.total_vram_mib is None:
            return True
        if self._admission is None:
            self._admission = ([Load.of(t) for t in self.tickets if _loads(t, self.residents)],
                               {r.model: r.footprint_mib for r in self.view.residents},
                               stale_views(self.view.residents))
        loads, residents, beside = self._admission
        if spread_problem(self.view, residents, [*loads, load]) is not None:
            return False
        return ollama_refuses(self.view, residents, [*loads, load], beside, load) is None

    def running(self) -> dict[str, tuple[int, float]]:
        """Per model with calls running here (not plans, not on a copy being loaded): how
        many, and when the latest started; in the order of the tickets. The same for every
        call weighed here, so worked out on the first."""
        if self._running is None:
            running: dict[str, tuple[int, float]] = {}
            for ticket in self.tickets:
                if not ticket.plan and not self.is_loading(ticket.model):
                    count, latest = running.get(ticket.model, (0, ticket.started_at))
                    running[ticket.model] = (count + 1, max(latest, ticket.started_at))
            self._running = running
        return self._running

    def run_lengths(self, lengths: CallLengths, latency_s: float | None, default_s: float
                    ) -> dict[str, float]:
        """The expected seconds of a call of each model running here (`running`), for these
        learned lengths, filled in by `cost.contention_s` as it asks: every call weighed on
        the card asks the same."""
        kept = self._run_lengths
        if kept is None or kept[0] is not lengths or kept[1] != latency_s or \
                kept[2] != default_s:
            kept = self._run_lengths = (lengths, latency_s, default_s, {})
        return kept[3]

    def models_over_limit(self, model: str) -> int:
        """How many loaded models must go before `model` may load here without Ollama
        unloading one itself (OLLAMA_MAX_LOADED_MODELS); victims already planned by other
        loads count as gone. 0: it may load now."""
        limit = loaded_limit(self.view.max_loaded, self.view.gpus)
        staying = self.loaded_models.difference(set(self.planned_victims) - self.reloading)
        # (a model counted loaded may be a load abandoned, not there: counted once either way)
        return max(0, len(staying | {model}) - limit)

    def spills(self) -> bool:
        return self.usable_mib is not None and self.resident_mib > self.usable_mib


def lasting_residents(view: ProviderView, busy: set[str], now: float, policy: Policy
                      ) -> list[Resident]:
    """Residents a call can count on finding loaded: an idle copy whose keep-alive runs out
    within the margin is as good as gone; a copy with live tickets is in use, so Ollama keeps
    it; a load not seen finished is no copy to join yet. (An expiring copy's memory still
    counts until a probe shows it freed: the expiry published may be seconds old, and the
    copy may have been used since.)"""
    horizon = now + policy.expiry_margin_s
    return [r for r in view.residents
            if not r.loading and (r.expires_at > horizon or r.model in busy)]


def index_providers(snapshot: Snapshot, policy: Policy) -> dict[str, ProviderIndex]:
    out: dict[str, ProviderIndex] = {}
    busy: dict[str, set[str]] = {}
    for ticket in snapshot.tickets:
        if ticket.expires_at > snapshot.now:
            busy.setdefault(ticket.provider, set()).add(ticket.model)
    for view in snapshot.providers:
        usable = policy.usable_mib(view.total_vram_mib, view.gpus) if view.total_vram_mib \
            else None
        if not view.residents:  # (half a fleet, often: nothing to fold)
            out[view.name] = ProviderIndex(view, usable, {}, 0, loaded_models=set())
            continue
        kept = lasting_residents(view, busy.get(view.name, set()), snapshot.now, policy)
        residents = {r.model: r for r in kept}
        listed = {r.model for r in view.residents}
        out[view.name] = ProviderIndex(view, usable, residents,
                                       sum(r.footprint_mib for r in view.residents),
                                       leaving=frozenset(r.model for r in view.residents
                                                         if r.leaving),
                                       loaded_models=listed)
    for ticket in snapshot.tickets:
        index = out.get(ticket.provider)
        if index is None or ticket.expires_at <= snapshot.now:
            continue
        index.tickets.append(ticket)
        index.calls_by_model[ticket.model] = index.calls_by_model.get(ticket.model, 0) + 1
        for victim, mib in ticket.evicts.items():
            index.planned_victims.setdefault(victim, mib)
        if ticket.reloads:
            index.reloading.add(ticket.model)
        if not _loads(ticket, index.residents):
            index.scratch_mib += min(ticket.footprint_mib, policy.warm_scratch_mib)
            if ticket.cold and lists_before_read(index.view.version,
                                                 index.view.models.get(ticket.model)):
                _keep_earliest(index.reading, ticket)
        else:
            index.loaded_models.add(ticket.model)
            index.loading_mib += ticket.footprint_mib
            if ticket.evicts and _making_room(ticket, {r.model for r in index.view.residents}):
                index.making_room.add(ticket.model)  # a call sent now would load it early
                continue
            _keep_earliest(index.loading, ticket)
    return out


def _keep_earliest(loads: dict[str, Ticket], ticket: Ticket) -> None:
    earliest = loads.get(ticket.model)
    if earliest is None or ticket.started_at < earliest.started_at:
        loads[ticket.model] = ticket


def indexes_for(snapshot: Snapshot, policy: Policy) -> dict[str, ProviderIndex]:
    """`index_providers`, kept for the last snapshot: every plan made on one snapshot (a
    decision and its explanation, a fallback to another candidate) reads the same indexes.
    A snapshot built anew from the same cards and tickets (the same objects: the service
    builds them anew only when its state changed) reuses them while its `now` crosses no
    moment at which the indexes would differ (a ticket's expiry, a copy's keep-alive less
    the margin): each of a sidecar's waiting calls decides on a snapshot of its own, the
    cards being those of the others. The indexes are not changed once built (their lazy
    parts are worked out from what they hold)."""
    global _last_indexed
    last = _last_indexed
    if last is not None and last.policy == policy:
        if last.snapshot is snapshot:
            return last.indexes
        if last.snapshot.providers is snapshot.providers and \
                last.snapshot.tickets is snapshot.tickets:
            if last.span is None:
                last.span = _unchanged_between(last.snapshot, policy)
            if last.span[0] <= snapshot.now < last.span[1]:
                return last.indexes
    indexes = index_providers(snapshot, policy)
    _last_indexed = _Indexed(snapshot, policy, indexes)
    return indexes


@dataclass
class _Indexed:
    snapshot: Snapshot
    policy: Policy
    indexes: dict[str, ProviderIndex]
    span: tuple[float, float] | None = None  # see _unchanged_between, once asked


_last_indexed: _Indexed | None = None
# Widens a moment compared against `now` (an expiry, an age limit) by more than a rounding
# of either side: `now + margin` against `expires_at`, `now - at` against a limit
MOMENT_SLACK_S = 1e-6


def _unchanged_between(snapshot: Snapshot, policy: Policy) -> tuple[float, float]:
    """The span of `now` around the snapshot's over which `index_providers` folds its cards
    and tickets the same: no ticket expires and no idle copy's keep-alive runs out within
    the margin in it."""
    now = snapshot.now
    moments = [t.expires_at for t in snapshot.tickets]
    moments += [r.expires_at - policy.expiry_margin_s for v in snapshot.providers
                for r in v.residents if math.isfinite(r.expires_at)]
    valid_from, valid_until = -math.inf, math.inf
    for moment in moments:
        if moment <= now:
            valid_from = max(valid_from, moment + MOMENT_SLACK_S)
        else:
            valid_until = min(valid_until, moment - MOMENT_SLACK_S)
    return valid_from, valid_until


def _making_room(ticket: Ticket, present: Container[str]) -> bool:
    """A load that unloads victims first: until they are gone (expiring or not), only its own
    call may go."""
    return any(victim in present for victim in ticket.evicts)


def same_weights(view: ProviderView, model: str, other: str) -> bool:
    """Whether two models here are made from one weights file (`ollama create` FROM the
    other): Ollama runs one copy of it (server/sched.go schedulerModelKey)."""
    mine, theirs = view.models.get(model), view.models.get(other)
    return other != model and mine is not None and theirs is not None and \
        bool(mine.weights) and mine.weights == theirs.weights


def same_runner(view: ProviderView, model: str, other: str) -> bool:
    """Whether a call for `model` would share `other`'s copy of their weights file at one
    context: the same runner PARAMETERs (draft_num_predict as each gets it), adapters and
    projectors (ModelInfo.runner), not the DRAFT file, except that a call whose num_gpu is
    Ollama's default takes the copy's (needsReload sets both to
    -1, server/sched.go:1390-1395; v0.12.6 :600-606)."""
    mine, theirs = view.models.get(model), view.models.get(other)
    if mine is None or theirs is None:
        return False
    if mine.runner == theirs.runner:
        return True
    own, copy = _runner_parts(mine.runner), _runner_parts(theirs.runner)
    if not any(p.startswith("num_gpu=") for p in own):  # (a negative one is dropped)
        copy = [p for p in copy if not p.startswith("num_gpu=")]
    return own == copy


def _runner_parts(runner: str) -> list[str]:
    """ModelInfo.runner's parts as needsReload compares them: the PARAMETERs in name order
    (/api/show lists them in a Go map's order, server/routes.go:1499-1508), a negative
    num_gpu (Ollama's default: the copy's is taken) left out, draft_num_predict as the copy
    gets it; then the files in their order, but for the DRAFT (not compared, server/
    sched.go:1422-1424: a copy with another draft is joined)."""
    parts = [p for p in runner.split(";") if p]
    drafted = draft_num_predict(runner)
    parameters = sorted([*(p for p in parts if not p.startswith(RUNNER_FILES)
                           and not p.startswith(("num_gpu=-", "draft_num_predict="))),
                         *([f"draft_num_predict={drafted}"] if drafted else [])])
    return [*parameters, *(p for p in parts if p.startswith(RUNNER_FILES)
                           and not p.startswith("draft="))]


def runs_on(view: ProviderView, model: str, copy: str) -> bool:
    """Whether Ollama runs calls for `model` on `copy`'s copy here: its own, or one of its
    weights file whose runner options it shares (at a context that may not suit every
    call)."""
    return model == copy or (same_weights(view, model, copy) and same_runner(view, model, copy))


def copy_users(view: ProviderView, copy: str) -> tuple[str, ...]:
    """The models whose calls Ollama runs on `copy`'s copy here (`runs_on`), its own first."""
    return (copy, *sorted(m for m in view.models if m != copy and runs_on(view, m, copy)))


def copy_sharers(view: ProviderView, model: str) -> tuple[str, ...]:
    """The other models listed here that Ollama runs on the copy a call for `model` uses:
    those of its weights file with its runner options and context (a call for it joined
    theirs). An unload by any of their names unloads that one copy."""
    own = next((r.context_length for r in view.residents if r.model == model), 0)
    return tuple(r.model for r in view.residents
                 if not r.leaving and same_weights(view, model, r.model) and
                 same_runner(view, model, r.model) and
                 (not own or not r.context_length or r.context_length == own))


def sibling_loading(view: ProviderView, model: str, tickets: Iterable[Ticket],
                    residents: Container[str]) -> str | None:
    """Another model of `model`'s weights file whose load here is in flight (a cold ticket,
    its copy not listed yet, or a reload whose copy is listed still at the context it
    replaces): a load of `model` beside it would make Ollama reload it."""
    for t in tickets:
        if t.cold and same_weights(view, model, t.model) and (
                t.model not in residents or (t.reloads and _listed_as_before(view, t))):
            return t.model
    return None


def loaded_again(view: ProviderView, join: Ticket, tickets: Iterable[Ticket],
                 residents: Collection[str]) -> bool:
    """Whether the copy a join's ticket names is no longer counted here (`residents`), nor
    being loaded by a claim: it left (its keep-alive, maybe a call's own, ran out) before
    the call reached Ollama, which then loads it again for that call, outside every budget.
    Ollama keeps a copy while a call runs on it, so only a copy the call had not reached yet
    goes so."""
    return not join.cold and not copy_counted(view, join.model, residents) and \
        not any(t.cold and t.model == join.model for t in tickets)


def loaded_again_for_a_call(view: ProviderView, tickets: Sequence[Ticket],
                            residents: Collection[str], load: Ticket) -> str | None:
    """A model Ollama loads again, unclaimed, for a call (`loaded_again`), where `load` is
    not that copy: a load of the model at the join's context joins it, one at another
    context has Ollama reload it. A plan's ticket is left out: a held plan may wait long
    for its call."""
    return next((t.model for t in tickets
                 if not t.plan and loaded_again(view, t, tickets, residents) and not (
                     load.model == t.model and
                     listed_as_loaded(view, t.model, t.context, load.context))), None)


def copy_counted(view: ProviderView, model: str, counted: Collection[str]) -> bool:
    """Whether a copy `model` runs on is among the models `counted` here: its own, or
    another model's of its weights file."""
    return model in counted or any(same_weights(view, model, other) for other in counted)


def listed_sibling(view: ProviderView, load: Ticket) -> str | None:
    """Another model of the weights file a load is claimed for, counted loaded here (not
    leaving) at other runner options or another context than the load asks, and not planned
    as its eviction: Ollama would reload that copy for the load (a decision made before the
    copy was there plans it as an eviction, `Fitting.sibling`). A context not known on
    either side is taken as the same."""
    return next((r.model for r in view.residents
                 if not r.leaving and r.model not in load.evicts and
                 same_weights(view, load.model, r.model) and (
                     not same_runner(view, load.model, r.model) or
                     not listed_as_loaded(view, r.model, r.context_length, load.context))),
                None)


def _listed_as_before(view: ProviderView, reload: Ticket) -> bool:
    """A reload's model listed here at another context than the one it loads: the copy it
    replaces."""
    return any(r.model == reload.model and
               not listed_as_loaded(view, r.model, r.context_length, reload.context)
               for r in view.residents)


def ticket_budget_ok(tickets: list[Ticket], new: Ticket, view: ProviderView,
                     policy: Policy, needs_free_slot: bool = False) -> tuple[bool, str]:
    """The claim-first budget, checked against one provider's tickets.

    sum(active footprints) + this one <= (total - residents) + credit. A cold ticket counts its
    full footprint only while its model is not resident yet (after that the residents carry
    it), or while it reloads the model at another context; the credit counts each distinct
    planned victim once, only while still resident.
    A claim whose planned victim picked up in-flight work is refused. A claim that loads a
    model is held to the usable memory (total - reserve), as the decision was, and to
    Ollama's own admission rule against what stays loaded beside it. A join is held to its
    copy's free slots, not to memory: the copy's size holds its slots.
    """
    live = [t for t in tickets if t.expires_at > new.started_at and t.ticket_id != new.ticket_id]
    busy = {t.model for t in live}
    lasting = {r.model for r in lasting_residents(view, busy, new.started_at, policy)}
    residents = {r.model: r.footprint_mib for r in view.residents}  # memory, expiring or not
    # The decision's own assumptions, re-checked against the authoritative ticket set:
    same_model = [t for t in live if t.model == new.model]
    if needs_free_slot and len(same_model) >= model_slots(view, new.model):
        return False, f"no free slot left for {new.model}"
    loaders = [t for t in same_model if t.cold]
    if new.cold and new.model not in lasting and loaders:
        return False, f"{new.model} is already being loaded here"
    if not new.cold and new.model not in lasting:
        # It means to join a load. Sent while there is none (gone, or its claim refused), or
        # before that load's victims are unloaded, it would make the engine load the model
        # outside the budget.
        if not loaders:
            return False, f"{new.model} is neither loaded nor being loaded here"
        if all(_making_room(t, residents) for t in loaders):
            return False, f"room for {new.model} is still being made here"
        if new.context and all(t.context and t.context != new.context for t in loaders):
            # Decided on a load of its own asking (one reserved, then refused for this):
            # sent at that ask to a copy loaded at another, Ollama would reload it
            return False, (f"{new.model} is being loaded here with num_ctx "
                           f"{loaders[0].context}, not {new.context}")
    if any(new.model in t.evicts for t in live):  # no new work for a copy being unloaded
        return False, f"{new.model} is planned for eviction here"
    if any(r.leaving and r.model == new.model for r in view.residents):
        # Sent now, Ollama could serve it from the leaving copy and unload that right after,
        # while every view counted the model loaded.
        return False, f"{new.model} is being unloaded here"
    for victim in new.evicts:
        # (a call of another model of its weights file runs on it too, or loads it)
        if copy_counted(view, victim, busy):
            return False, f"planned victim {victim} has in-flight work"
    if new.cold:
        sibling = sibling_loading(view, new.model, live, residents)
        if sibling is not None and sibling not in new.evicts:
            return False, f"{sibling} is being loaded here from the same weights file"
        leaving = next((r.model for r in view.residents if r.leaving and
                        same_weights(view, new.model, r.model)), None)
        if leaving is not None:  # Ollama would reload it, once its calls end
            return False, f"{leaving} is being unloaded here from the same weights file"
        listed = listed_sibling(view, new)
        if listed is not None:
            return False, f"{listed} is loaded here from the same weights file at other " \
                "options: Ollama would reload it"
        again = loaded_again_for_a_call(view, live, residents, new)
        if again is not None:
            return False, f"{again} left while a call was on its way to it: Ollama loads " \
                "it again, unclaimed"
    victims: dict[str, int] = {}
    for ticket in [*live, new]:
        for victim in ticket.evicts:
            if victim in residents:
                victims[victim] = residents[victim]
    credit = sum(victims.values())
    if new.cold:  # (a load of a model counted loaded too: that may be a load abandoned)
        loaded = set(residents).union(t.model for t in live if t.cold)
        reloaded = {t.model for t in [*live, new] if t.reloads}  # gone and back: still loaded
        count = len(loaded.difference(set(victims) - reloaded) | {new.model})
        limit = loaded_limit(view.max_loaded, view.gpus)
        if count > limit:
            return False, (f"{new.model} would be model {count} loaded here "
                           f"(OLLAMA_MAX_LOADED_MODELS {limit})")

    if view.total_vram_mib is None:
        return True, "provider publishes no VRAM total"

    def counted(t: Ticket) -> int:
        return t.footprint_mib if _loads(t, lasting) else \
            min(t.footprint_mib, policy.warm_scratch_mib)

    # (A load Ollama's estimate is not known for is still checked: beside it, another load
    # in flight may no longer be admitted, `admission_problem` skipping its own check.)
    if _loads(new, lasting):
        loads = [Load.of(t) for t in [*live, new] if _loads(t, lasting)]
        refused = ollama_refuses(view, residents, loads, stale_views(view.residents))
        if refused is not None:
            bound = "over 80 % of" if admission_rule(view) else "more than"
            return False, (f"Ollama would unload a model to load {refused.model} beside the "
                           f"rest ({refused.estimate_mib} MiB by its estimate, {bound} the "
                           "memory free)")
    if _loads(new, lasting):
        spread = spread_problem(view, residents,
                                [Load.of(t) for t in [*live, new] if _loads(t, lasting)])
        if spread is not None:
            return False, (f"{spread.model} would be spread over the {view.gpus} GPUs, "
                           "whose free memory does not hold it with each GPU's share")
    if not new.cold:
        # A join runs in one of the copy's slots, whose memory Ollama reserved at the load
        # and reports in the copy's size: refused for room, a copy filling its card could
        # never be joined. Its scratch still counts against later loads.
        return True, "joins a copy whose slots hold its memory"
    spent = sum(counted(t) for t in live) + counted(new)
    limit = policy.usable_mib(view.total_vram_mib, view.gpus)
    headroom = limit - sum(residents.values()) + credit
    if spent <= headroom:
        return True, f"{spent} MiB claimed of {headroom} MiB"
    return False, f"{spent} MiB would exceed {headroom} MiB"
