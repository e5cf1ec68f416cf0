"""VRAM tickets: race-safe claims by compare-and-set on one key per provider.

Read the provider's ticket set, apply a transition to it (the core's pure
`proxy.core.tickets`: a claim checked against the budget, a renewal, a resident recorded),
write it back at the revision read; on a conflict, back off with jitter and try again, a
bounded number of times. One write per provider is in flight per process; changes that queue
up behind it go out together in the next one, each checked in order. Release
runs in `finally`; a dead holder's ticket stops counting at its expiry.

A release is owed to the store from the moment it is asked for: this process stops counting
the ticket at once, and the next write to that provider's set carries it (a claim's, or a
delayed write of its own, retried while the store is away). A ticket its holder still holds
goes back into a set that lacks it (`restore`, and each renewal): claimed while the store was
away, or lost with a store that came back without its storage.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from proxy.core import tickets as transition
from proxy.core.policy import Policy
from proxy.core.tickets import LOAD_GRACE_S, Mark, Refused, Residency, TicketSet
from proxy.core.types import ProviderView, Ticket
from proxy.observability.logging import get_logger
from proxy.ports import (
    PROVIDER_TICKETS,
    SYSTEM_CLOCK,
    CasConflict,
    Clock,
    Entry,
    StateStore,
    StoreUnavailable,
)
from proxy.service.codec import decode_ticket_set, encode_ticket_set, escape_key

log = get_logger("kubemoot.tickets")
T = TypeVar("T")

DEFAULT_TTL_S = 60.0
MAX_ATTEMPTS = 8
RELEASE_DELAY_S = 0.05  # how long a plain release may wait for a write to ride along with
SETTLE_RETRY_S = 5.0  # while the store is away, how often to try owed writes again
LET_GO_PRUNE_AT = 256  # released tickets remembered before the expired ones are dropped


# A transition of the set at `now`: the new set, the same set (nothing to write), or Refused.
Change = Callable[[TicketSet, float], "TicketSet | Refused"]


@dataclass(slots=True)
class _Queued:
    change: Change
    result: asyncio.Future[ClaimResult]


@dataclass(frozen=True)
class ClaimResult:
    ok: bool
    reason: str
    attempts: int = 1
    conflicts: int = 0


class TicketBook:
    def __init__(self, store: StateStore, policy: Policy, ttl_s: float = DEFAULT_TTL_S,
                 clock: Clock = SYSTEM_CLOCK,
                 release_delay_s: float = RELEASE_DELAY_S) -> None:
        self.store = store
        self.policy = policy
        self.ttl_s = ttl_s
        self.clock = clock
        self.release_delay_s = release_delay_s
        self._queued: dict[str, list[_Queued]] = {}  # changes waiting for the next write
        self._writing: set[str] = set()  # providers with a write in flight
        self._writers: set[asyncio.Task[None]] = set()
        self._flushing: set[str] = set()  # providers with a delayed write of owed releases
        # The newest ticket set known per provider, decoded: the watched mirror's or what
        # this process wrote last (read-your-writes before the watch delivers it), with the
        # store's generation then (a revision of another means nothing now). Decoding
        # once per revision matters: with 32 calls in flight a set holds 32 tickets.
        self._known: dict[str, tuple[int, int, TicketSet]] = {}
        # provider -> ticket id -> expiry: released here but not yet written to the store.
        self._owed: dict[str, dict[str, float]] = {}
        # provider -> model -> what a release whose write failed recorded of it: counted
        # here, and written with the next write, unless the set holds a newer record
        self._owed_records: dict[str, dict[str, Residency]] = {}
        self._owed_changes = 0  # bumped whenever any owed entry comes or goes
        # ticket id -> its expiry: released here, so never to be put back (`restore`), also
        # once the release is written
        self._let_go: dict[str, float] = {}
        self._prune_let_go_at = LET_GO_PRUNE_AT
        # provider -> (set filtered, _owed_changes then, the set without owed tickets): every
        # snapshot asks, and releases are owed most of the time under load.
        self._filtered: dict[str, tuple[TicketSet, int, TicketSet]] = {}

    def known(self, provider: str) -> tuple[TicketSet, int]:
        """The newest ticket set this process has seen for `provider` (owed releases left
        out), and its revision."""
        tickets, revision = self._newest(provider)
        return self._without_owed(provider, tickets), revision

    def _newest(self, provider: str) -> tuple[TicketSet, int]:
        entry = self.store.view(PROVIDER_TICKETS).get(escape_key(provider))
        cached = self._known.get(provider)
        if cached is not None and cached[0] == self.store.generation and (
                entry is None or cached[1] >= entry.revision):
            return cached[2], cached[1]
        return self._remember(provider, entry)

    def _owed_now(self, provider: str) -> dict[str, float]:
        owed = self._owed.get(provider)
        if not owed:
            return {}
        now = self.clock.now()
        # Expired, and past the grace of the load its claim may have recorded: gone from
        # every set by itself.
        for ticket_id in [k for k, expiry in owed.items() if expiry + LOAD_GRACE_S <= now]:
            del owed[ticket_id]
            self._owed_changes += 1
        return owed

    def _without_owed(self, provider: str, tickets: TicketSet) -> TicketSet:
        owed = self._owed_now(provider)
        records = self._owed_records.get(provider)
        if not owed and not records:
            return tickets
        cached = self._filtered.get(provider)
        if cached is not None and cached[0] is tickets and cached[1] == self._owed_changes:
            return cached[2]
        result = transition.without(tickets, owed)
        for model, record in (records or {}).items():
            known = result.residents.get(model)
            if known is None or known.at < record.at:
                result = transition.record_residency(result, model, record)
        self._filtered[provider] = (tickets, self._owed_changes, result)
        return result

    def owes(self, provider: str) -> bool:
        """Whether a release for `provider` still has to be written."""
        return bool(self._owed_now(provider))

    def _remember(self, provider: str, entry: Entry | None) -> tuple[TicketSet, int]:
        if entry is None:
            self._known.pop(provider, None)
            return TicketSet(), 0
        tickets = decode_ticket_set(provider, entry.value)
        self._known[provider] = (self.store.generation, entry.revision, tickets)
        return tickets, entry.revision

    async def _read(self, provider: str, stale: int | None) -> tuple[TicketSet, int]:
        """The ticket set and its revision: the newest known, unless a write at revision
        `stale` just conflicted and nothing newer has been watched since, or the view is not
        the store's yet (still replaying after a reconnect: its revisions may be of a server
        that has since lost them): then the server's."""
        tickets, revision = self._newest(provider)
        if self.store.connected and (stale is None or revision > stale):
            return tickets, revision  # the watch already brought the write we lost to
        entry = await self.store.get(PROVIDER_TICKETS, escape_key(provider))
        return self._remember(provider, entry)

    async def _mutate(self, provider: str, change: Change) -> ClaimResult:
        """Apply `change` to the live ticket set with compare-and-set, retrying conflicts.

        `change` returns the new set, the set it was given for "nothing to write", or
        Refused.
        Changes queued while a write is in flight go out together in the next one (group
        commit): a burst of claims and releases costs a few round trips, not one each.
        """
        mine = _Queued(change, asyncio.get_running_loop().create_future())
        queue = self._queued.setdefault(provider, [])
        queue.append(mine)
        if provider in self._writing:  # ours goes out with the next write; wait for it
            try:
                return await mine.result
            except asyncio.CancelledError:
                if mine in queue:
                    queue.remove(mine)
                raise
        self._writing.add(provider)  # nobody is writing: write now, on this task
        try:
            await self._write_queued(provider, queue, leader=mine)
        finally:
            if queue:  # queued meanwhile: a writer task takes them on
                self._spawn(self._drain(provider, queue))
            else:
                self._writing.discard(provider)
        return mine.result.result()

    async def _drain(self, provider: str, queue: list[_Queued]) -> None:
        try:
            while queue:
                await self._write_queued(provider, queue)
        finally:
            self._writing.discard(provider)

    async def _write_queued(self, provider: str, queue: list[_Queued],
                            leader: _Queued | None = None) -> None:
        batch = queue[:]
        queue.clear()
        try:
            await self._commit(provider, batch)
        except Exception as exc:  # the store is down (or worse): every change in it failed
            for item in batch:
                if not item.result.done():
                    item.result.set_exception(exc)
        except BaseException:
            # Cancelled mid-write: the others' changes go out with the next write.
            queue[:0] = [q for q in batch if q is not leader and not q.result.done()]
            raise

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._writers.add(task)
        task.add_done_callback(self._writers.discard)

    async def _commit(self, provider: str, batch: list[_Queued]) -> None:
        """Write `batch`, applied in order, in one compare-and-set; resolve each result."""
        conflicts = 0
        delay = 0.0005
        conflicted_at: int | None = None
        for attempt in range(1, MAX_ATTEMPTS + 1):
            # A stale read only costs a conflict: the server checks the revision.
            generation = self.store.generation
            current, revision = await self._read(provider, conflicted_at)
            now = self.clock.now()
            live = current.live(now)
            settled = set(self._owed.get(provider, ()))
            records = dict(self._owed_records.get(provider, {}))
            state = self._without_owed(provider, live)
            # owed releases to write (of a ticket, or of a load whose ticket expired), and
            # what they recorded
            dirty = (len(state.tickets), len(state.loads)) != (len(live.tickets),
                                                               len(live.loads)) or \
                (bool(records) and state.residents != live.residents)
            results: list[tuple[bool, str]] = []
            for item in batch:
                if item.result.done():  # its caller was cancelled before we got here
                    results.append((False, "cancelled"))
                    continue
                outcome = item.change(state, now)
                if isinstance(outcome, Refused):
                    results.append((False, outcome.reason))
                elif outcome is state:
                    results.append((True, "unchanged"))
                else:
                    state, dirty = outcome, True
                    results.append((True, "written"))
            if dirty:
                try:
                    new_revision = await self.store.cas(PROVIDER_TICKETS, escape_key(provider),
                                                        encode_ticket_set(state), revision)
                except CasConflict:
                    conflicts += 1
                    conflicted_at = revision
                    if attempt > 1:  # a real race, not just a lagging mirror: back off
                        await asyncio.sleep(random.uniform(0, delay))
                        delay = min(delay * 2, 0.004)
                    continue
                self._known[provider] = (generation, new_revision, state)
            self._settled(provider, settled, records)  # written now, or in no set any more
            for item, (ok, reason) in zip(batch, results, strict=True):
                if not item.result.done():  # done: its caller was cancelled
                    item.result.set_result(ClaimResult(ok, reason, attempt, conflicts))
            return
        for item in batch:
            if not item.result.done():
                item.result.set_result(ClaimResult(
                    False, f"gave up after {MAX_ATTEMPTS} conflicting writes", MAX_ATTEMPTS,
                    conflicts))

    def _settled(self, provider: str, ticket_ids: set[str],
                 records: Mapping[str, Residency] | None = None) -> None:
        owed = self._owed.get(provider)
        if owed and ticket_ids:
            for ticket_id in ticket_ids:
                owed.pop(ticket_id, None)
            self._owed_changes += 1
        kept = self._owed_records.get(provider)
        if kept and records:
            for model, record in records.items():
                if kept.get(model) == record:  # (a newer one owed since waits its write)
                    del kept[model]
            self._owed_changes += 1

    def new_ticket(self, ticket_id: str, provider: str, model: str, footprint_mib: int,
                   cold: bool, evicts: dict[str, int], holder: str, context: int = 0,
                   estimate_mib: int = 0, plan: bool = False, beside_mib: int = 0,
                   crew: str = "") -> Ticket:
        now = self.clock.now()
        return Ticket(ticket_id, provider, model, footprint_mib, now, now + self.ttl_s,
                      cold=cold, evicts=evicts, holder=holder, crew=crew, context=context,
                      estimate_mib=estimate_mib, plan=plan, beside_mib=beside_mib)

    async def claim(self, ticket: Ticket, view: ProviderView, needs_free_slot: bool = False
                    ) -> ClaimResult:
        """Claim-first: the ticket (with its planned victims) or a reason it does not fit."""

        def add(current: TicketSet, now: float) -> TicketSet | Refused:
            outcome = transition.claim(current, ticket, view, self.policy, self.ttl_s, now,
                                       needs_free_slot)
            if isinstance(outcome, Refused):
                return outcome
            if outcome.seen is not None:
                log.debug("budget", provider=ticket.provider, ticket=ticket.ticket_id,
                          model=ticket.model, mib=ticket.footprint_mib, cold=ticket.cold,
                          why=outcome.budget, residents=outcome.seen.residents,
                          live=len(current.tickets), tickets=_logged(outcome.tickets))
            return outcome.tickets

        try:
            return await self._mutate(ticket.provider, add)
        except asyncio.CancelledError:  # its write may have landed: nobody else releases it
            self._owe(ticket)
            self._write_soon(ticket.provider)
            raise

    async def release(self, ticket: Ticket, leave_resident: Residency | None = None
                      ) -> ClaimResult:
        """Remove the ticket; record the model it leaves loaded (or, `mib` 0, unloaded).

        A plain release stops counting here at once, and is written with the next write to
        the provider's set (a claim's, typically) or within `release_delay_s`, so it never
        holds up the claim that follows it. One that changes residents is written now, the
        ticket's removal with the record in one write: every set written holds one or the
        other (owed, a write in flight and retried after a conflict would drop the ticket
        first, and for that moment other sidecars would see neither).
        """
        if leave_resident is None:
            self._owe(ticket)
            self._write_soon(ticket.provider)
            return ClaimResult(True, "owed")
        self._let_go_of(ticket)  # (no renewal or restore puts it back while this writes)
        # its figure as the set holds it: its claim, and later claims of loads beside it,
        # raised it (Resident.beside_mib)
        known = self._newest(ticket.provider)[0].tickets.get(ticket.ticket_id)

        def remove(current: TicketSet, now: float) -> TicketSet:
            held = current.tickets.get(ticket.ticket_id, known)
            left = leave_resident
            if held is not None and held.beside_mib > left.beside:
                left = replace(left, beside=held.beside_mib)  # as its claim found it
            return transition.record_residency(
                transition.without(current, (ticket.ticket_id,)), ticket.model, left)

        try:
            result = await self._mutate(ticket.provider, remove)
        except BaseException:  # the store away, or the caller cancelled: owed, as a plain one
            self._owe(ticket, leave_resident)
            self._write_soon(ticket.provider)  # the ticket part, once the store is back
            raise
        if not result.ok:  # (gave up on conflicting writes)
            self._owe(ticket, leave_resident)
            self._write_soon(ticket.provider)
        return result

    def _owe(self, ticket: Ticket, record: Residency | None = None) -> None:
        """The ticket stops counting here at once; the next write to its set removes it, and
        writes `record` (what its call left of its model) unless the set has a newer one."""
        self._owed.setdefault(ticket.provider, {})[ticket.ticket_id] = \
            self._let_go_of(ticket)
        if record is not None:
            self._owed_records.setdefault(ticket.provider, {})[ticket.model] = record
        self._owed_changes += 1
        self.store.changes.bump()  # calls waiting for this room decide again

    def _let_go_of(self, ticket: Ticket) -> float:
        """Remember `ticket` as released here, so nothing puts it back (`_released`), until
        its expiry, which is returned."""
        expiry = self.clock.now() + self.ttl_s
        self._let_go[ticket.ticket_id] = expiry
        if len(self._let_go) >= self._prune_let_go_at:
            now = self.clock.now()
            self._let_go = {k: until for k, until in self._let_go.items() if until > now}
            self._prune_let_go_at = max(LET_GO_PRUNE_AT, 2 * len(self._let_go))
        return expiry

    async def release_to_unload(self, ticket: Ticket, loaded: Residency | None = None,
                                sharing: tuple[str, ...] = ()) -> bool:
        """Remove the ticket of a call that asked for its model to be unloaded as it ends
        (`keep_alive: 0`); True when its model may go now (the caller then asks Ollama).
        `loaded`: the copy the call loaded, recorded as left loaded if others keep it.
        The ticket's removal and the mark go in one write, as `release`'s with a record.
        `sharing`: the other models Ollama runs on that copy (`mark_leaving_unless_used`)."""
        return await self._release_marking(ticket, lambda mib: self.mark_leaving_unless_used(
            ticket.provider, ticket.model, mib, loaded, releasing=ticket.ticket_id,
            sharing=sharing))

    async def release_leaving(self, ticket: Ticket, sharing: tuple[str, ...] = ()) -> None:
        """Remove the ticket of a call whose copy must go (its engine failed the call and
        closed the runner, or may keep the call's slot), and mark the copy leaving in the
        same write, whoever else holds a ticket for it: no call the release wakes joins it.
        `sharing`: the copy's other names (`mark_leaving_unless_used`)."""
        def leaving(current: TicketSet, now: float, mib: int) -> TicketSet:
            return transition.mark_leaving(transition.without(current, (ticket.ticket_id,)),
                                           (ticket.model, *sharing), now, mib)

        await self._release_marking(ticket, lambda mib: self._mutate(
            ticket.provider, lambda current, now: leaving(current, now, mib)))

    async def _release_marking(self, ticket: Ticket,
                               write: Callable[[int], Coroutine[object, object, T]]) -> T:
        """`write(mib)`: the ticket's removal with its copy's leaving mark, `mib` the copy's
        size for views whose probe does not list it (a cold ticket's footprint is the copy it
        loaded). When it is not written, the removal is owed, as a plain release's."""
        self._let_go_of(ticket)
        try:
            result = await write(ticket.footprint_mib if ticket.cold else 1)
        except BaseException:  # the store away, or the caller cancelled
            self._owe(ticket)
            self._write_soon(ticket.provider)  # the ticket part, once the store is back
            raise
        if ticket.ticket_id in self._newest(ticket.provider)[0].tickets:  # (gave up)
            self._owe(ticket)
            self._write_soon(ticket.provider)
        return result

    async def mark_leaving_unless_used(self, provider: str, model: str, mib: int,
                                       loaded: Residency | None = None,
                                       releasing: str | None = None,
                                       sharing: tuple[str, ...] = ()) -> bool:
        """Record `model` as leaving `provider` unless a live ticket names it; True when
        recorded, and only then may Ollama be asked to unload it.

        A call claimed before this write holds a ticket, so the model stays for it. After
        it, no claim may join that copy (one would have Ollama reload it on memory no ticket
        holds), and its memory still counts until it is seen gone (`mark_unloaded`), so no
        other load is sent to land on it before Ollama has freed it. `mib` is the copy's
        size for views whose probe does not list it (a probe's own figure wins). When the
        model stays, `loaded` (a copy the caller loaded) is recorded as any release would.
        `releasing`: a ticket removed in the same write (it keeps nothing in use).
        `sharing`: other models of its weights file listed on the copy it runs on (Ollama
        unloads that copy by any of their names): a ticket for one keeps it, and all are
        marked leaving with it."""
        unused = False

        def leaving(current: TicketSet, now: float) -> TicketSet:
            nonlocal unused  # (a conflict runs this again on the newer set)
            if releasing is not None:
                current = transition.without(current, (releasing,))
            unused = not transition.in_use(current, model, now, sharing)
            return transition.leave_unless_used(current, model, mib, loaded, now, sharing)

        await self._mutate(provider, leaving)
        return unused

    def _write_soon(self, provider: str) -> None:
        if provider not in self._flushing:
            self._flushing.add(provider)
            self._spawn(self._write_owed(provider))

    async def _write_owed(self, provider: str) -> None:
        """Write what is owed for `provider` after a short delay (later writes may carry it
        first); while the store is away, again each time it may be back."""
        try:
            await asyncio.sleep(self.release_delay_s)
            while self.owes(provider):
                seen = self.store.changes.value
                if self.store.connected:
                    with contextlib.suppress(StoreUnavailable):
                        await self.settle(provider)
                        continue
                await self.store.changes.wait_past(seen, SETTLE_RETRY_S)
        finally:
            self._flushing.discard(provider)

    async def settle(self, provider: str) -> ClaimResult:
        """Write the releases owed for `provider` (a no-op when none are)."""
        return await self._mutate(provider, lambda current, now: current)

    async def close(self) -> None:
        """Write what is owed (best effort) and stop the background writers."""
        for provider in list(self._owed):
            if self.owes(provider) and self.store.connected:
                with contextlib.suppress(StoreUnavailable):
                    await self.settle(provider)
        for task in list(self._writers):
            task.cancel()

    async def renew(self, ticket: Ticket) -> ClaimResult:
        """Hold `ticket` another TTL; one the set lacks (unless released) is put back."""
        def hold(current: TicketSet, now: float) -> TicketSet:
            if self._released(ticket):
                return current
            return transition.renew(current, ticket, self.ttl_s, now)

        return await self._mutate(ticket.provider, hold)

    async def restore(self, ticket: Ticket, held: Callable[[], bool] = lambda: True
                      ) -> ClaimResult:
        """Write `ticket` into its set if the set lacks it, while `held()` (its holder has not
        let it go) and no release of it is owed: no budget check, its call runs already."""
        def back(current: TicketSet, now: float) -> TicketSet:
            if self._released(ticket) or not held():
                return current
            return transition.restore(current, ticket, self.ttl_s, now)

        return await self._mutate(ticket.provider, back)

    def _released(self, ticket: Ticket) -> bool:
        return ticket.ticket_id in self._let_go

    async def mark_leaving(self, provider: str, models: tuple[str, ...],
                           sizes: Mapping[str, int] | None = None,
                           marks: dict[str, Mark] | None = None) -> ClaimResult:
        """Record `models` as leaving whatever tickets name them (the engine unloads them
        itself, or a placement's victims): no claim joins them; their memory counts until
        they are seen gone. `sizes`: a model's size where no call recorded its copy.
        `marks`: filled with each mark and the record it replaced (`unmark_leaving`)."""
        def leaving(current: TicketSet, now: float) -> TicketSet:
            before = current.residents
            for model in models:
                current = transition.mark_leaving(current, (model,), now,
                                                  (sizes or {}).get(model, 1))
            if marks is not None:  # (as last applied: a conflict applies it again)
                marks.clear()
                marks.update({m: (current.residents[m], before.get(m)) for m in models})
            return current

        return await self._mutate(provider, leaving)

    async def unmark_leaving(self, provider: str, marks: Mapping[str, Mark],
                             keeping: str = "") -> ClaimResult:
        """Copies marked leaving (`mark_leaving`'s `marks`) whose unload was never asked:
        counted as before the mark, where nothing else marked or plans to unload them."""
        return await self._mutate(provider, lambda current, now: transition.unmark_leaving(
            current, marks, now, keeping))

    async def abandon_load(self, provider: str, model: str, loading_at: float, now: float
                           ) -> ClaimResult:
        """The load recorded loading at `loading_at` (a release's `Residency.loading`) was
        given up: recorded abandoned, so a probe past its grace drops it rather than one
        past LOAD_GRACE_S. A later record of the model (another call's) is left alone."""
        def abandoned(current: TicketSet, _: float) -> TicketSet:
            known = current.residents.get(model)
            if known is None or not known.loading or known.abandoned or known.at != loading_at:
                return current
            return transition.record_residency(current, model,
                                               replace(known, at=now, abandoned=True))

        return await self._mutate(provider, abandoned)

    async def mark_unloaded(self, provider: str, seen_gone: Mapping[str, float]
                            ) -> ClaimResult:
        """Record that models were unloaded, each when it was seen gone (wall-clock time),
        so every view drops them before the next probe does."""
        def gone(current: TicketSet, now: float) -> TicketSet:
            return transition.mark_unloaded(current, seen_gone, now)

        return await self._mutate(provider, gone)


def _logged(tickets: TicketSet) -> list[dict[str, object]]:
    """A set's tickets as the "budget" debug line shows them: what the admission check read
    of each (a load's estimate, victims and what it counts beside it)."""
    return [{"model": t.model, "mib": t.footprint_mib, "cold": t.cold,
             **({"estimate": t.estimate_mib, "evicts": dict(t.evicts), "beside": t.beside_mib}
                if t.cold else {})}
            for t in tickets.tickets.values()]
