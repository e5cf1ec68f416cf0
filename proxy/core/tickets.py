"""A provider's ticket set and the changes made to it, as pure functions.

The ticket book (`proxy/service/tickets.py`) reads a provider's set, applies one of these
transitions and writes the result with compare-and-set; on a conflict it applies the same
transition to the newer set. So each takes the set and `now` and returns the new set, the
very same set when nothing changes (nothing to write), or `Refused` with the reason. The
store's encoding of a set lives in the shell (`proxy/service/codec.py`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from proxy.core.context import (
    CAPPED_COMPARE_SINCE,
    CAPPED_LISTING_SINCE,
    listed_as_loaded,
    parse_version,
)
from proxy.core.occupancy import MOMENT_SLACK_S, held_beside, same_weights, ticket_budget_ok
from proxy.core.policy import Policy
from proxy.core.sizing import held_by_runners
from proxy.core.types import ProviderView, Resident, Ticket

RESIDENCY_MAX_AGE_S = 600.0  # a probe has long replaced such an entry; the next write drops it
# Ollama lists a copy only once it is loaded: a load that may still be under way counts this
# long even when probes since do not list it.
LOAD_GRACE_S = 120.0
# A load its sidecar abandoned (its connection to Ollama closed) counts only until a probe
# started this long after it: Ollama aborts such a load (llm/llama_server.go:1299-1301,
# server/sched.go:733-739) and lists a copy that finished just before the close; the margin
# covers Ollama's reading of the close and the sidecars' clocks.
ABANDONED_GRACE_S = 1.0
# A copy marked leaving that probes still list this long after the mark: its unload was
# never asked (its sidecar died between the two), or Ollama keeps it for another client's
# call. It counts as loaded again, and joinable (a call joining it makes Ollama keep it).
LEAVING_MAX_S = 60.0


@dataclass(frozen=True)
class Residency:
    """What a call changed on the GPU, counted at once rather than at the next probe: a model
    it left loaded, (`mib` 0) a model it unloaded, or (`leaving`) a model asked to unload:
    nobody may join that copy any more, but its memory counts until it is seen gone.
    (`loading`) a load the call started may still be under way (its call ended before an
    answer, or its plan went unused); (`abandoned`) the sidecar closed that load's
    connection, so Ollama aborted it unless it had just finished: a probe lists it then.
    (`expires`) the call set a short keep-alive: the copy goes then, not when the probe
    before it said."""

    mib: int
    context_length: int
    at: float
    leaving: bool = False
    loading: bool = False
    abandoned: bool = False
    beside: int = 0  # a load: what the copies beside it held then (Resident.beside_mib)
    # when the copy's keep-alive, as the call set it, runs out (inf: not set by the call)
    expires: float = math.inf

    @property
    def gone(self) -> bool:
        return self.mib == 0


@dataclass(frozen=True)
class Load:
    """A load a cold claim started, recorded in the claim's own write and deleted by its
    release. While the ticket lives, the ticket counts the load; an entry whose ticket is gone
    (its holder died before releasing) counts in its place, as a copy loading."""

    model: str
    mib: int
    context_length: int
    at: float


@dataclass(frozen=True)
class TicketSet:
    """One provider's tickets, what calls recorded of its residents, and the loads cold
    claims started, by ticket (one store entry)."""

    tickets: dict[str, Ticket] = field(default_factory=dict)
    residents: dict[str, Residency] = field(default_factory=dict)
    loads: dict[str, Load] = field(default_factory=dict)

    def live(self, now: float) -> TicketSet:
        """Unexpired tickets; residency entries young enough that no probe replaced them;
        loads within their grace (a probe has listed such a copy since, or it never came)."""
        return TicketSet({k: t for k, t in self.tickets.items() if t.expires_at > now},
                         {m: r for m, r in self.residents.items()
                          if now - r.at < RESIDENCY_MAX_AGE_S},
                         {k: load for k, load in self.loads.items()
                          if now - load.at < LOAD_GRACE_S})

    def live_until(self, now: float) -> float:
        """Until when, from `now`, `live` keeps the same entries: the first moment a ticket
        expires or an entry ages out (one within a rounding of `now` ends it at once)."""
        moments = [t.expires_at for t in self.tickets.values()]
        moments += [r.at + RESIDENCY_MAX_AGE_S for r in self.residents.values()]
        moments += [load.at + LOAD_GRACE_S for load in self.loads.values()]
        return min((m - MOMENT_SLACK_S for m in moments if m > now - MOMENT_SLACK_S),
                   default=math.inf)

    def orphaned_loads(self) -> dict[str, Load]:
        """The loads whose ticket is gone without a release: their holder died."""
        return {k: load for k, load in self.loads.items() if k not in self.tickets}


@dataclass(frozen=True, slots=True)
class Refused:
    """A transition that may not be made, and why (the caller's refusal reason)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Admitted:
    """A claim let in: the set with it, the budget arithmetic that let it in, and the provider
    as that budget saw it (the probe with what calls recorded since)."""

    tickets: TicketSet
    budget: str
    seen: ProviderView | None = None  # None: the ticket was there already


def claim(current: TicketSet, ticket: Ticket, view: ProviderView, policy: Policy,
          ttl_s: float, now: float, needs_free_slot: bool = False) -> Admitted | Refused:
    """Add `ticket`, started `now` and held `ttl_s`, when the budget lets it in."""
    if ticket.ticket_id in current.tickets:
        # An earlier attempt committed it, and the answer to that write was lost.
        return Admitted(current, "already claimed")
    fresh = replace(ticket, started_at=now, expires_at=now + ttl_s)
    seen = merge_recorded(view, current)
    if fresh.cold:  # what it loads beside, as the set says now (the decision's may be older)
        fresh = replace(fresh, beside_mib=max(fresh.beside_mib, held_beside(
            fresh.model, fresh.evicts, seen.residents, current.tickets.values())))
    # the loads in flight count it beside them before the check, as they will after it
    others = _beside_later_loads(current.tickets, fresh, seen) if fresh.cold else \
        current.tickets
    ok, why = ticket_budget_ok(list(others.values()), fresh, seen, policy, needs_free_slot)
    if not ok:
        return Refused(why)
    loads = current.loads
    if fresh.cold:
        # Recorded with the ticket: should the holder die before its release, the copy
        # still counts once the ticket has expired.
        loads = {**loads, ticket.ticket_id: Load(fresh.model, fresh.footprint_mib,
                                                 fresh.context, now)}
    return Admitted(replace(current, tickets={**others, ticket.ticket_id: fresh},
                            loads=loads), why, seen)


def _beside_later_loads(tickets: dict[str, Ticket], fresh: Ticket, seen: ProviderView
                        ) -> dict[str, Ticket]:
    """The loads in flight that may load after `fresh`, each counting it beside them: Ollama
    loads in the order the calls reach it, which the order of claims does not fix, and a
    runner counts what was loaded when it loaded (Resident.beside_mib). A copy already
    listed loaded before it."""
    settled = {r.model for r in seen.residents if not r.loading} | {fresh.model}
    everyone = [*tickets.values(), fresh]
    out = tickets
    for key, held in tickets.items():
        if not held.cold or held.model in settled or fresh.model in held.evicts:
            continue
        beside = held_beside(held.model, held.evicts, seen.residents, everyone)
        if beside > held.beside_mib:
            out = {**out, key: replace(held, beside_mib=beside)}
    return out


def without(current: TicketSet, ticket_ids: Collection[str]) -> TicketSet:
    """`current` less the tickets named (released, whatever the store still says) and the
    loads their claims recorded (the release records what the call left, if anything)."""
    if not any(k in current.tickets or k in current.loads for k in ticket_ids):
        return current
    return replace(current,
                   tickets={k: t for k, t in current.tickets.items() if k not in ticket_ids},
                   loads={k: load for k, load in current.loads.items() if k not in ticket_ids})


def extend(current: TicketSet, ticket_id: str, ttl_s: float, now: float
           ) -> TicketSet | Refused:
    """Hold the ticket `ttl_s` from `now`: only while it is still in the set."""
    held = current.tickets.get(ticket_id)
    if held is None:
        return Refused("ticket expired before it was renewed")
    return replace(current,
                   tickets={**current.tickets, ticket_id: replace(held, expires_at=now + ttl_s)})


def restore(current: TicketSet, ticket: Ticket, ttl_s: float, now: float) -> TicketSet:
    """Put back a ticket its holder still holds that the set lacks (claimed while the store
    was away, lost with a store that came back empty, or expired before its renewal), held
    `ttl_s` from `now`. Its call runs already, so this is a fact, not a claim: no budget
    check. A cold ticket brings back the load its claim recorded, keyed by the ticket as
    then, so the load counts once (the ticket carries it while it lives), from when the
    claim made it."""
    if ticket.ticket_id in current.tickets:
        return current
    back = replace(ticket, expires_at=now + ttl_s)
    loads = current.loads
    if ticket.cold and ticket.ticket_id not in loads and now - ticket.started_at < LOAD_GRACE_S:
        loads = {**loads, ticket.ticket_id: Load(ticket.model, ticket.footprint_mib,
                                                 ticket.context, ticket.started_at)}
    return replace(current, tickets={**current.tickets, ticket.ticket_id: back}, loads=loads)


def renew(current: TicketSet, ticket: Ticket, ttl_s: float, now: float) -> TicketSet:
    """Hold `ticket` `ttl_s` from `now`: extended while in the set, else put back (`restore`)."""
    extended = extend(current, ticket.ticket_id, ttl_s, now)
    return restore(current, ticket, ttl_s, now) if isinstance(extended, Refused) else extended


def record_residency(current: TicketSet, model: str, residency: Residency | None
                     ) -> TicketSet:
    """Record what a call left of `model` (a copy loaded; `mib` 0, unloaded); None: nothing.
    A copy loaded where a load of it at that context was recorded not seen through (its
    call left, or it is under way) may be the copy that load left, loaded for a call that
    joined it: it keeps what that load was beside too (Resident.beside_mib)."""
    before = current.residents.get(model)
    if residency is None or before == residency:
        return current
    if before is not None and before.loading and not before.gone and not residency.gone and \
            before.context_length == residency.context_length and \
            before.beside > residency.beside:
        residency = replace(residency, beside=before.beside)
    return replace(current, residents={**current.residents, model: residency})


def in_use(current: TicketSet, model: str, now: float, sharing: Collection[str] = ()) -> bool:
    """Whether a live ticket names `model` (or a model in `sharing`: its copy's other names)."""
    return any((t.model == model or t.model in sharing) and t.expires_at > now
               for t in current.tickets.values())


def mark_leaving(current: TicketSet, models: Iterable[str], now: float, mib: int = 1
                 ) -> TicketSet:
    """Record `models` as asked to unload: no claim joins them, and their memory (as a call
    recorded it, else `mib`) counts until they are seen gone, with what their runners count
    beside them (Ollama may read a card's free memory through one until it goes)."""
    marked = {}
    for model in models:
        known = current.residents.get(model)  # a copy a call recorded it left loaded
        size, ctx, beside = (known.mib, known.context_length, known.beside) \
            if known and not known.gone else (max(mib, 1), 0, 0)
        marked[model] = Residency(size, ctx, now, leaving=True, beside=beside)
    return replace(current, residents={**current.residents, **marked})


# A copy's leaving mark and the record it replaced (None: there was none)
Mark = tuple[Residency, Residency | None]


def unmark_leaving(current: TicketSet, marks: Mapping[str, Mark], now: float,
                   keeping: str = "") -> TicketSet:
    """Copies marked leaving whose unload was never asked (their call went first): each
    has its record before the mark again, where the mark is still its newest record and no
    live ticket but `keeping`'s (the call's own) plans its eviction."""
    residents = dict(current.residents)
    for model, (mark, before) in marks.items():
        if residents.get(model) != mark or any(
                model in t.evicts and t.ticket_id != keeping and t.expires_at > now
                for t in current.tickets.values()):
            continue
        if before is None:
            del residents[model]
        else:
            residents[model] = before
    return current if residents == current.residents else replace(current, residents=residents)


def leave_unless_used(current: TicketSet, model: str, mib: int, loaded: Residency | None,
                      now: float, sharing: tuple[str, ...] = ()) -> TicketSet:
    """`model` marked leaving unless a live ticket names it (`in_use`); if one does, the copy
    stays, and `loaded` (the copy the caller loaded) is recorded as any release records it.
    `sharing`: other models Ollama runs on the same copy, used and marked with it."""
    if in_use(current, model, now, sharing):
        return record_residency(current, model, loaded)
    return mark_leaving(current, (model, *sharing), now, mib)


def mark_unloaded(current: TicketSet, seen_gone: Mapping[str, float], now: float) -> TicketSet:
    """Record models as unloaded, each when it was seen gone (`seen_gone`; at latest `now`),
    so every view drops them before the next probe does. Stamped when each went, not when
    written: a copy of its weights file loaded and probed since, under another name, is no
    copy of it (`_by_weights`)."""
    return replace(current, residents={**current.residents, **{
        m: Residency(0, 0, min(at, now)) for m, at in seen_gone.items()}})


def merge_residency(view: ProviderView, residency: dict[str, Residency]) -> ProviderView:
    """Residents as probed, plus models calls left loaded after that probe (or left loading
    before it: Ollama lists a copy only once loaded), less models calls unloaded after it
    (otherwise, until the next probe, others would take them as warm and make Ollama load
    them again). A copy a call reloaded at another context since is counted as reloaded; a
    copy asked to unload stays marked leaving while probes still list it, up to
    LEAVING_MAX_S. Ollama runs one copy per weights file: one asked to unload, or unloaded,
    under a name of that file is so under the name the probe lists it by (`_by_weights`)."""
    view = _asked_as_loaded(_beside_as_loaded(view, residency), residency)
    known = {r.model for r in view.residents}
    newer = {m: r for m, r in residency.items() if r.at > view.probed_at or (
        r.leaving and m in known and view.probed_at - r.at < LEAVING_MAX_S) or (
        r.loading and not r.gone and m not in known and r.at > view.probed_at - (
            ABANDONED_GRACE_S if r.abandoned else LOAD_GRACE_S))}
    newer.update(_by_weights(view, residency, newer))
    if not newer:
        return view
    kept = tuple(_as_recorded(view, r, newer.get(r.model)) for r in view.residents
                 if not (r.model in newer and newer[r.model].gone))
    # a copy a call loaded since the probe loaded beside what the probe listed, and beside
    # what the call saw (Ollama's runner for it goes on counting those, Resident.beside_mib)
    extra = tuple(Resident(m, r.mib, r.context_length, r.at,
                           expires_at=r.at if r.leaving else r.expires, leaving=r.leaving,
                           loading=r.loading, beside_mib=max(r.beside, held_by_runners(
                               o.footprint_mib for o in view.residents if o.model != m)))
                  for m, r in newer.items() if m not in known and not r.gone)
    merged = _one_copy_per_file(view, kept + extra, newer)
    return replace(view, residents=merged) if merged != view.residents else view


def _one_copy_per_file(view: ProviderView, residents: tuple[Resident, ...],
                       newer: dict[str, Residency]) -> tuple[Resident, ...]:
    """Ollama keeps one copy per weights file (s.loaded is keyed by its path, v0.24.0
    server/sched.go:88-100; v0.12.6 :107): of the names of one file counted loaded, the one
    loaded last is that copy, and a load under another name since the probe replaced the
    one it lists (at other options it reloads it). Copies leaving are `_by_weights`'."""
    files = [(_weights(view, r), r) for r in residents]
    newest: dict[str, tuple[float, str]] = {}
    for weights, r in files:
        if weights:
            at = newer[r.model].at if r.model in newer else view.probed_at
            if weights not in newest or at > newest[weights][0]:
                newest[weights] = (at, r.model)
    if len(newest) == sum(1 for weights, _ in files if weights):
        return residents
    return tuple(r for weights, r in files if not weights or newest[weights][1] == r.model)


def _weights(view: ProviderView, resident: Resident) -> str:
    """The weights file of a copy counted loaded, not leaving ("": unknown, or leaving)."""
    info = view.models.get(resident.model)
    return info.weights if info is not None and not resident.leaving else ""


def _by_weights(view: ProviderView, residency: dict[str, Residency],
                newer: dict[str, Residency]) -> dict[str, Residency]:
    """For each probed copy with no record of its own, the newest record that it is leaving
    or gone under another name of its weights file: two calls of models of one file that
    raced to load it each recorded it under their own name, and Ollama lists it under the
    first's; an unload by either name takes it (the wide fleet soak's self-evictions: a copy
    marked gone as `phi3-helper`, still listed as `phi3`, was taken as warm)."""
    if not any(r.leaving or r.gone for r in residency.values()):
        return {}
    found: dict[str, Residency] = {}
    for probed in view.residents:
        if probed.model in newer:
            continue
        own = residency.get(probed.model)  # a load of it recorded since comes after
        after = max(own.at if own is not None else -math.inf,
                    found[probed.model].at if probed.model in found else -math.inf)
        for model, r in residency.items():
            if model != probed.model and r.at > after and same_weights(
                    view, model, probed.model) and (
                    (r.gone and r.at > view.probed_at) or
                    (r.leaving and view.probed_at - r.at < LEAVING_MAX_S)):
                found[probed.model] = r
                after = r.at
    return found


def _asked_as_loaded(view: ProviderView, residency: dict[str, Residency]) -> ProviderView:
    """A copy listed at its trained context that a call loaded asking more keeps the num_ctx
    asked for: from 0.15.5 /api/ps lists the capped one (server/routes.go:1914), but up to
    0.24 needsReload compares the ask (v0.24.0 server/sched.go:692-705), so a call joining it
    must send that (0.30+ caps both sides: either does). Not before 0.15.5, whose listing
    is the ask itself: a record of an earlier copy must not override it."""
    if not CAPPED_LISTING_SINCE <= parse_version(view.version) < CAPPED_COMPARE_SINCE:
        return view
    out, changed = [], False
    for r in view.residents:
        rec = residency.get(r.model)
        info = view.models.get(r.model)
        trained = info.trained_context if info else 0
        if rec is not None and not (rec.gone or rec.leaving) and trained and \
                r.context_length == trained < rec.context_length:
            r = replace(r, context_length=rec.context_length)
            changed = True
        out.append(r)
    return replace(view, residents=tuple(out)) if changed else view


def _beside_as_loaded(view: ProviderView, residency: dict[str, Residency]) -> ProviderView:
    """A probed copy a call loaded counts what the call found beside it, when a probe first
    saw it only after some of those had gone (Resident.beside_mib). A load recorded under
    another name of its weights file counts too: Ollama loaded the copy for a call that had
    joined that load when it was abandoned, beside the same copies."""
    if not residency:
        return view
    by_file: dict[str, list[Residency]] = {}  # weights file -> its models' records
    for model, rec in residency.items():
        info = view.models.get(model)
        if info is not None and info.weights:
            by_file.setdefault(info.weights, []).append(rec)
    out, changed = [], False
    for r in view.residents:
        info = view.models.get(r.model)
        own = residency.get(r.model)
        records = by_file.get(info.weights, []) if info is not None and info.weights else \
            [own] if own is not None else []
        beside = max((rec.beside for rec in records
                      if rec.beside > r.beside_mib and not rec.gone and
                      listed_as_loaded(view, r.model, r.context_length, rec.context_length)),
                     default=0)
        if beside > r.beside_mib:
            r = replace(r, beside_mib=beside)
            changed = True
        out.append(r)
    return replace(view, residents=tuple(out)) if changed else view


def merge_recorded(view: ProviderView, recorded: TicketSet) -> ProviderView:
    """The provider as every sidecar counts it: `merge_residency`, and each load whose holder
    died (`orphaned_loads`) as a copy loading, in place of what else is counted of its model,
    until a probe newer than the load lists the model (that copy counts then) or its grace
    passes (`live`). The load is no resident entry: nothing recorded of the model, before or
    after, replaces it or is replaced by it."""
    merged = _beside_as_claimed(merge_residency(view, recorded.residents),
                                recorded.tickets.values())
    probed = {r.model: r.context_length for r in view.residents}
    orphaned: dict[str, Load] = {}
    for load in recorded.orphaned_loads().values():
        if load.model in probed and view.probed_at > load.at and \
                listed_as_loaded(view, load.model, probed[load.model], load.context_length):
            continue  # (a probe still listing the old copy of a reload is no sign of it)
        known = orphaned.get(load.model)
        if known is None or load.mib > known.mib:
            orphaned[load.model] = load
    if not orphaned:
        return merged
    kept = tuple(r for r in merged.residents if r.model not in orphaned)
    loading = tuple(Resident(load.model, load.mib, load.context_length, load.at, loading=True)
                    for load in orphaned.values())
    return replace(merged, residents=kept + loading)


def _beside_as_claimed(view: ProviderView, tickets: Iterable[Ticket]) -> ProviderView:
    """A copy whose load is still held counts what its ticket says was beside it, other
    loads in flight included (`_beside_later_loads`): the release records that, but the
    call runs on the copy, listed, before it."""
    beside: dict[tuple[str, int], int] = {}
    for t in tickets:
        if t.cold and t.beside_mib:
            key = (t.model, t.context)
            beside[key] = max(beside.get(key, 0), t.beside_mib)
    if not beside:
        return view
    out, changed = [], False
    for r in view.residents:
        held = max((mib for (model, ctx), mib in beside.items() if model == r.model and
                    listed_as_loaded(view, model, r.context_length, ctx)), default=0)
        if held > r.beside_mib:
            r = replace(r, beside_mib=held)
            changed = True
        out.append(r)
    return replace(view, residents=tuple(out)) if changed else view


def _as_recorded(view: ProviderView, probed: Resident, recorded: Residency | None
                 ) -> Resident:
    if recorded is None:
        return probed
    if recorded.leaving:  # asked to unload: counted, its keep-alive run out, until seen gone
        return replace(probed, expires_at=min(probed.expires_at, recorded.at), leaving=True)
    if not listed_as_loaded(view, probed.model, probed.context_length, recorded.context_length):
        return replace(probed, footprint_mib=recorded.mib,  # reloaded since the probe
                       context_length=recorded.context_length, spilled=False,
                       loading=recorded.loading, beside_mib=0,
                       expires_at=min(probed.expires_at, recorded.expires))
    if recorded.expires != math.inf:  # a call since the probe set its keep-alive
        return replace(probed, expires_at=recorded.expires)
    return probed
