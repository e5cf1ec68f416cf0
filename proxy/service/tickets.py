"""VRAM tickets: race-safe claims by compare-and-set on one key per provider.

Read the provider's ticket set, check the budget (the core's pure rule), write it back at
the revision read; on a conflict, back off with jitter and try again, a bounded number of
times. A per-process lock per provider removes in-pod contention (NATS-KV.md §4). Release
runs in `finally`; a dead holder's ticket stops counting at its expiry.

A release that cannot be written (the store is down) is owed: this process stops counting
the ticket at once, and the next write to that provider's set, or `settle`, removes it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from proxy.core.occupancy import ticket_budget_ok
from proxy.core.policy import Policy
from proxy.core.types import ProviderView, Ticket
from proxy.ports import PROVIDER_TICKETS, CasConflict, Entry, StateStore, StoreUnavailable
from proxy.service.codec import Residency, TicketSet, merge_residency, token

DEFAULT_TTL_S = 60.0
MAX_ATTEMPTS = 8


@dataclass(frozen=True)
class ClaimResult:
    ok: bool
    reason: str
    attempts: int = 1
    conflicts: int = 0


class TicketBook:
    def __init__(self, store: StateStore, policy: Policy, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.policy = policy
        self.ttl_s = ttl_s
        self.clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        # The newest ticket set known per provider, decoded: the watched mirror's or what
        # this process wrote last (read-your-writes before the watch delivers it). Decoding
        # once per revision matters: with 32 calls in flight a set holds 32 tickets.
        self._known: dict[str, tuple[int, TicketSet]] = {}
        # provider -> ticket id -> expiry: released here but not yet written to the store.
        self._owed: dict[str, dict[str, float]] = {}

    def _lock(self, provider: str) -> asyncio.Lock:
        return self._locks.setdefault(provider, asyncio.Lock())

    def known(self, provider: str) -> tuple[TicketSet, int]:
        """The newest ticket set this process has seen for `provider` (owed releases left
        out), and its revision."""
        tickets, revision = self._newest(provider)
        return self._without_owed(provider, tickets), revision

    def _newest(self, provider: str) -> tuple[TicketSet, int]:
        entry = self.store.view(PROVIDER_TICKETS).get(token(provider))
        cached = self._known.get(provider)
        if cached is not None and (entry is None or cached[0] >= entry.revision):
            return cached[1], cached[0]
        return self._remember(provider, entry)

    def _owed_now(self, provider: str) -> dict[str, float]:
        owed = self._owed.get(provider)
        if not owed:
            return {}
        now = self.clock()
        for ticket_id in [k for k, expiry in owed.items() if expiry <= now]:
            del owed[ticket_id]  # expired: gone from every set by itself
        return owed

    def _without_owed(self, provider: str, tickets: TicketSet) -> TicketSet:
        owed = self._owed_now(provider)
        if not owed or not any(k in tickets.tickets for k in owed):
            return tickets
        return TicketSet({k: t for k, t in tickets.tickets.items() if k not in owed},
                         tickets.residents)

    def owes(self, provider: str) -> bool:
        """Whether a release for `provider` still has to be written."""
        return bool(self._owed_now(provider))

    def _remember(self, provider: str, entry: Entry | None) -> tuple[TicketSet, int]:
        if entry is None:
            return TicketSet(), 0
        tickets = TicketSet.decode(provider, entry.value)
        self._known[provider] = (entry.revision, tickets)
        return tickets, entry.revision

    async def _read(self, provider: str, fresh: bool) -> tuple[TicketSet, int]:
        """The ticket set and its revision: the newest known on a first attempt, the
        server's after a conflict."""
        if not fresh:
            return self._newest(provider)
        return self._remember(provider, await self.store.get(PROVIDER_TICKETS, token(provider)))

    async def _mutate(self, provider: str,
                      change: Callable[[TicketSet, float], TicketSet | str | None]
                      ) -> ClaimResult:
        """Apply `change` to the live ticket set with compare-and-set, retrying conflicts.

        `change` returns the new set, None for "nothing to write", or a refusal reason.
        """
        conflicts = 0
        delay = 0.0005
        async with self._lock(provider):
            for attempt in range(1, MAX_ATTEMPTS + 1):
                # A stale first read only costs a conflict: the server checks the revision.
                current, revision = await self._read(provider, fresh=attempt > 1)
                now = self.clock()
                live = current.live(now)
                settled = set(self._owed.get(provider, ()))
                base = self._without_owed(provider, live)
                outcome = change(base, now)
                if outcome is None:
                    if len(base.tickets) == len(live.tickets):
                        self._settled(provider, settled)  # none of them is in the set
                        return ClaimResult(True, "unchanged", attempt, conflicts)
                    outcome = base  # nothing new, but owed releases to write
                if isinstance(outcome, str):
                    return ClaimResult(False, outcome, attempt, conflicts)
                try:
                    new_revision = await self.store.cas(PROVIDER_TICKETS, token(provider),
                                                        outcome.encode(), revision)
                    self._known[provider] = (new_revision, outcome)
                    self._settled(provider, settled)
                    return ClaimResult(True, "written", attempt, conflicts)
                except CasConflict:
                    conflicts += 1
                    if attempt > 1:  # a real race, not just a lagging mirror: back off
                        await asyncio.sleep(random.uniform(0, delay))
                        delay = min(delay * 2, 0.004)
        return ClaimResult(False, f"gave up after {MAX_ATTEMPTS} conflicting writes",
                           MAX_ATTEMPTS, conflicts)

    def _settled(self, provider: str, ticket_ids: set[str]) -> None:
        owed = self._owed.get(provider)
        if owed:
            for ticket_id in ticket_ids:
                owed.pop(ticket_id, None)

    def new_ticket(self, ticket_id: str, provider: str, model: str, footprint_mib: int,
                   cold: bool, evicts: dict[str, int], holder: str) -> Ticket:
        now = self.clock()
        return Ticket(ticket_id, provider, model, footprint_mib, now, now + self.ttl_s,
                      cold=cold, evicts=evicts, holder=holder)

    async def claim(self, ticket: Ticket, view: ProviderView, needs_free_slot: bool = False
                    ) -> ClaimResult:
        """Claim-first: the ticket (with its planned victims) or a reason it does not fit."""

        def add(current: TicketSet, now: float) -> TicketSet | str | None:
            if ticket.ticket_id in current.tickets:
                return None  # an earlier attempt committed (ambiguous timeout)
            fresh = replace(ticket, started_at=now, expires_at=now + self.ttl_s)
            live = list(current.tickets.values())
            ok, why = ticket_budget_ok(live, fresh, _with_residency(view, current), self.policy,
                                       needs_free_slot)
            if not ok:
                return why
            return TicketSet({**current.tickets, ticket.ticket_id: fresh}, current.residents)

        return await self._mutate(ticket.provider, add)

    async def release(self, ticket: Ticket, leave_resident: Residency | None = None,
                      drop_residents: tuple[str, ...] = ()) -> ClaimResult:
        """Remove the ticket; record the model it leaves loaded; forget unloaded victims."""

        def remove(current: TicketSet, now: float) -> TicketSet | str | None:
            residents = {m: r for m, r in current.residents.items() if m not in drop_residents}
            if leave_resident is not None:
                residents[ticket.model] = leave_resident
            if ticket.ticket_id not in current.tickets and residents == current.residents:
                return None
            tickets = {k: t for k, t in current.tickets.items() if k != ticket.ticket_id}
            return TicketSet(tickets, residents)

        try:
            return await self._mutate(ticket.provider, remove)
        except StoreUnavailable:
            # Stop counting it here now; write it when the store is back (`settle`).
            owed = self._owed.setdefault(ticket.provider, {})
            owed[ticket.ticket_id] = self.clock() + self.ttl_s
            self.store.changes.bump()  # calls waiting for this room decide again
            raise

    async def settle(self, provider: str) -> ClaimResult:
        """Write the releases owed for `provider` (a no-op when none are)."""
        return await self._mutate(provider, lambda current, now: None)

    async def renew(self, ticket: Ticket) -> ClaimResult:
        def extend(current: TicketSet, now: float) -> TicketSet | str | None:
            held = current.tickets.get(ticket.ticket_id)
            if held is None:
                return "ticket expired before it was renewed"
            tickets = {**current.tickets,
                       ticket.ticket_id: replace(held, expires_at=now + self.ttl_s)}
            return TicketSet(tickets, current.residents)

        return await self._mutate(ticket.provider, extend)

    async def forget_residents(self, provider: str, models: tuple[str, ...]) -> ClaimResult:
        def drop(current: TicketSet, now: float) -> TicketSet | str | None:
            if not any(m in current.residents for m in models):
                return None
            return TicketSet(current.tickets, {m: r for m, r in current.residents.items()
                                               if m not in models})

        return await self._mutate(provider, drop)


def _with_residency(view: ProviderView, tickets: TicketSet) -> ProviderView:
    return merge_residency(view, tickets.residents)
