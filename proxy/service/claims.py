"""This sidecar's tickets: reserved while their claim is on its way, claimed in the shared
book (or in-process while the shared store is unreachable), held and renewed while their
call or plan lives, written to the shared book again once it is back (claimed in-process,
or lost with a store that came back without its storage), released with what their load
left on the GPU."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from proxy.core.tickets import ABANDONED_GRACE_S, Residency
from proxy.core.types import Placement, Snapshot, Ticket
from proxy.observability.logging import get_logger
from proxy.observability.metrics import Metrics
from proxy.ports import PROVIDER_TICKETS, Clock, StoreUnavailable
from proxy.service.codec import unescape_key
from proxy.service.prober import Prober
from proxy.service.routing import CallOutcome
from proxy.service.snapshot import StateView
from proxy.service.tickets import TicketBook
from proxy.settings import ProviderConfig

log = get_logger("kubemoot.claims")
REJOIN_CHECK_S = 0.5  # how often held tickets are looked for outside the shared book
# During an outage a join goes on a look at the card no older than this: an eviction by
# another sidecar, unheard, shows in /api/ps as soon as Ollama takes the unload
OUTAGE_LOOK_S = 0.25
OUTAGE_LOOK_WAIT_S = 1.0  # what a join waits for that look, at most
LOOKED_AGAIN = "the card looked at again: the shared state (NATS) is unreachable"
LOADS_PAUSED = ("no load while the shared state (NATS) is unreachable: other sidecars may "
                "be loading into the same room unseen")


@dataclass
class Claimed:
    placement: Placement
    ticket: Ticket
    local: bool  # claimed in the in-process book because the shared store was unreachable


# ("loading": its call ended before the answer, but the load goes on for another call)
LoadState = Literal["loaded", "loading", "abandoned", "failed"]


def load_state(outcome: CallOutcome) -> LoadState:
    """What a call that loaded its model left: the copy (it was answered, or its answer began
    and broke off: Ollama answers only once the model is loaded, so the copy is there unless
    the runner or Ollama died with the answer, which the next probe shows), a load abandoned
    (its agent left before the answer began: its connection closed, Ollama aborts the load
    unless it had just finished), or nothing (the engine refused or failed before
    answering)."""
    if outcome.prompt_too_long or (outcome.healthy and outcome.error is None) or outcome.began:
        return "loaded"
    return "abandoned" if outcome.client_left else "failed"


def left_loaded(placement: Placement, now: float, state: LoadState = "loaded"
                ) -> Residency | None:
    """What a finished load leaves on the GPU, to count at once rather than at the next
    probe (at what Ollama will list it at, where that is more); None when the call shared a
    copy (nothing changed) or its load failed. An abandoned load counts until a probe shows
    whether it finished (Residency.abandoned)."""
    if not placement.loads or state == "failed":
        return None
    return Residency(max(placement.footprint_mib, placement.listed_mib), placement.num_ctx, now,
                     loading=state != "loaded", abandoned=state == "abandoned",
                     beside=placement.beside_mib)


def recheck_after_s(placement: Placement, state: LoadState) -> float:
    """When to probe the card after a call or plan ends: an abandoned load shows as gone (or
    as finished) only to a probe started past its grace, so that probe is not left to the
    probe interval."""
    return ABANDONED_GRACE_S + 0.2 if placement.loads and state == "abandoned" else 0.0


class Claims:
    def __init__(self, *, tickets: TicketBook, local_tickets: TicketBook, view: StateView,
                 providers: tuple[ProviderConfig, ...], prober: Prober, metrics: Metrics,
                 holder: str, clock: Clock, crew: str = "") -> None:
        self.tickets = tickets
        self.local_tickets = local_tickets
        self.view = view
        self.providers = {c.name: c for c in providers}
        self.prober = prober
        self._looks: dict[str, asyncio.Future[None]] = {}  # provider -> its probe in flight
        self.metrics = metrics
        self.holder = holder
        self.crew = crew
        self.clock = clock
        # Ticket ids: a random per-process prefix and a counter, unique across sidecars
        # without a getrandom() call per ticket.
        prefix = secrets.token_hex(8)
        self._ticket_ids = (f"{prefix}-{n:x}" for n in itertools.count(1))
        self._pending: dict[str, Ticket] = {}
        self._held: dict[str, Claimed] = {}  # tickets of calls and plans in progress
        # Tickets whose shared claim failed unanswered and were claimed in-process instead:
        # the write may have landed all the same (the server's answer lost with its leader).
        self._unanswered: dict[str, Ticket] = {}
        self._renewing: asyncio.Task[None] | None = None
        self._rejoining: asyncio.Task[None] | None = None

    # -- reserved: counted by this sidecar's next decisions --------------------------------
    def reserve(self, placement: Placement, plan: bool = False) -> Ticket:
        ticket = self.tickets.new_ticket(
            next(self._ticket_ids), placement.provider, placement.copy_model,
            placement.footprint_mib,
            cold=placement.loads, evicts=dict(placement.evicts), holder=self.holder,
            context=placement.num_ctx, estimate_mib=placement.estimate_mib, plan=plan,
            beside_mib=placement.beside_mib, crew=self.crew)
        self._pending[ticket.ticket_id] = ticket
        return ticket

    def unreserve(self, ticket: Ticket) -> None:
        self._pending.pop(ticket.ticket_id, None)

    def uncounted(self, now: float) -> tuple[Ticket, ...]:
        """This sidecar's tickets that the shared book's view does not count: claimed
        in-process while the store was unreachable, held but missing from the view (lost
        with a store that came back empty, or expired there while renewals could not be
        written) until written again, or reserved and not yet written."""
        return (*self._unseen_held(now), *self._claims_in_flight())

    def _unseen_held(self, now: float) -> list[Ticket]:
        """The in-process book's live tickets and the held ones that the shared book's view
        does not count live (a held ticket counts: its call runs)."""
        mine = {t.ticket_id: t for t in self._local_live(now)}
        for claimed in self._held.values():
            mine.setdefault(claimed.ticket.ticket_id, replace(
                claimed.ticket, expires_at=max(claimed.ticket.expires_at,
                                               now + self.tickets.ttl_s)))
        if not mine:
            return []
        known: dict[str, Mapping[str, Ticket]] = {}
        out = []
        for ticket in mine.values():
            if ticket.provider not in known:
                known[ticket.provider] = self.tickets.known(ticket.provider)[0].tickets
            seen = known[ticket.provider].get(ticket.ticket_id)
            if seen is None or seen.expires_at <= now:
                out.append(ticket)
        return out

    def _claims_in_flight(self) -> list[Ticket]:
        """Reserved tickets whose claim has not come back (or whose write is not yet in the
        book: those are counted there)."""
        if not self._pending:
            return []
        known: dict[str, Mapping[str, Ticket]] = {}
        out = []
        for ticket in self._pending.values():
            if ticket.provider not in known:
                known[ticket.provider] = self.tickets.known(ticket.provider)[0].tickets
            if ticket.ticket_id not in known[ticket.provider]:
                out.append(ticket)
        return out

    def _local_live(self, now: float) -> list[Ticket]:
        out: list[Ticket] = []
        for key in self.local_tickets.store.view(PROVIDER_TICKETS):  # (released: not counted)
            out.extend(self.local_tickets.known(unescape_key(key))[0].live(now).tickets.values())
        return out

    # -- claimed ---------------------------------------------------------------------------
    async def claim(self, placement: Placement, snapshot: Snapshot, ticket: Ticket
                    ) -> Claimed | None:
        """Claim a reserved ticket in the shared book (in-process when the store is
        unreachable); None when the book refuses it. It stops being reserved either way."""
        try:
            return await self._claim(placement, snapshot, ticket)
        finally:
            self.unreserve(ticket)

    async def _claim(self, placement: Placement, snapshot: Snapshot, ticket: Ticket
                     ) -> Claimed | None:
        view = next(v for v in snapshot.providers if v.name == placement.provider)
        local = False
        sent = self.tickets.store.connected  # (else it fails before anything is written)
        try:
            result = await self.tickets.claim(ticket, view, placement.needs_free_slot)
        except StoreUnavailable:
            local = True
            if sent:
                self._unanswered[ticket.ticket_id] = ticket
            if ticket.cold:
                # Not in-process: other sidecars may be loading into the same room unseen
                # (a load shows in /api/ps only once loaded), and Ollama would evict for
                # whichever comes second. It waits for the shared book instead.
                log.info("claim refused", provider=placement.provider, model=placement.model,
                         reason=LOADS_PAUSED)
                self.metrics.ticket_claims.labels("refused").inc()
                return None
            if self.clock.now() - view.probed_at > OUTAGE_LOOK_S:
                # Another sidecar may have evicted the copy since that look, unheard: Ollama
                # would load it again for this call, unclaimed. The call decides again on
                # what the card holds now.
                await self._look_again(placement.provider)
                log.info("claim refused", provider=placement.provider, model=placement.model,
                         reason=LOOKED_AGAIN)
                self.metrics.ticket_claims.labels("refused").inc()
                return None
            result = await self.local_tickets.claim(ticket, view, placement.needs_free_slot)
        self.metrics.ticket_conflicts.inc(result.conflicts)
        self.metrics.ticket_claims.labels("won" if result.ok else "refused").inc()
        if not result.ok:
            log.info("claim refused", provider=placement.provider, model=placement.model,
                     reason=result.reason)
            return None
        # (The budget arithmetic is the ticket book's "budget" line.)
        log.debug("ticket claimed", provider=placement.provider, model=placement.model,
                  ticket=ticket.ticket_id, kind=placement.kind, evicts=placement.evicts,
                  local=local)
        return Claimed(placement, ticket, local)

    async def _look_again(self, provider: str) -> None:
        """The card probed now (one probe for the joins that ask together), waited for up
        to OUTAGE_LOOK_WAIT_S (a card that does not answer: the next decision goes on the
        look it has)."""
        look = self._looks.get(provider)
        if look is None:
            look = self._looks[provider] = asyncio.ensure_future(self.prober.refresh(provider))
            look.add_done_callback(lambda _: self._looks.pop(provider, None))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(look), OUTAGE_LOOK_WAIT_S)

    def may_load(self) -> bool:
        """Whether a load may be claimed now: only in the shared book, whose views are the
        store's (an in-process book cannot see what other sidecars load meanwhile)."""
        return self.tickets.store.connected

    def book(self, claimed: Claimed) -> TicketBook:
        return self.local_tickets if claimed.local else self.tickets

    # -- held: renewed while their call or plan lives --------------------------------------
    def hold(self, claimed: Claimed) -> None:
        self._held[claimed.ticket.ticket_id] = claimed

    def unhold(self, claimed: Claimed) -> None:
        self._held.pop(claimed.ticket.ticket_id, None)

    def start(self) -> None:
        self._renewing = asyncio.create_task(self._renew_held())
        self._rejoining = asyncio.create_task(self._rejoin())

    async def close(self) -> None:
        for task in (self._renewing, self._rejoining, *self._looks.values()):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _renew_held(self) -> None:
        """Every third of the TTL, renew every held ticket: one task for all of them, and
        the renewals of one GPU share a write."""
        period = self.tickets.ttl_s / 3
        while True:
            await asyncio.sleep(period)
            held = list(self._held.values())
            await asyncio.gather(*(self.book(c).renew(c.ticket) for c in held),
                                 return_exceptions=True)  # unreachable store: next sweep

    async def _rejoin(self) -> None:
        """Each time the shared store's views are replayed anew (NATS back, maybe without
        its storage), write every held ticket into the shared book, and move there the ones
        claimed in-process; while connected, also those claimed in-process since."""
        store = self.tickets.store
        written = -1  # the generation whose views hold every held ticket
        while True:
            if store.connected and (store.generation != written or self._unanswered or any(
                    c.local for c in self._held.values())):
                generation = store.generation
                if await self._write_held():
                    written = generation
            await asyncio.sleep(REJOIN_CHECK_S)

    async def _write_held(self) -> bool:
        """Every held ticket written into the shared book (where it lacks it); False when
        some could not be (the store went away again: the next replay tries again)."""
        held = list(self._held.values())
        results = await asyncio.gather(*(self._write_back(c) for c in held),
                                       return_exceptions=True)
        now = self.clock.now()
        for ticket_id, ticket in list(self._unanswered.items()):
            if not self._in_process(ticket, now):  # its call is over: in no book from now
                del self._unanswered[ticket_id]
                await self.tickets.release(ticket)  # (owed: a no-op where it never landed)
        return all(r is True for r in results)

    def _in_process(self, ticket: Ticket, now: float) -> bool:
        """Whether this process still counts `ticket`: reserved for a claim, held by its
        call, or claimed in-process and not released (a call whose victims are leaving
        holds it only from when it is sent)."""
        return ticket.ticket_id in self._held or ticket.ticket_id in self._pending or \
            ticket.ticket_id in self.local_tickets.known(ticket.provider)[0].live(now).tickets

    async def _write_back(self, claimed: Claimed) -> bool:
        ticket = claimed.ticket
        result = await self.tickets.restore(ticket, lambda: ticket.ticket_id in self._held)
        if not result.ok:
            return False
        if not claimed.local:
            return True
        if ticket.ticket_id not in self._held:  # released in-process meanwhile
            await self.tickets.release(ticket)  # (no-op unless this write put it back)
            return True
        claimed.local = False  # its release and renewals go to the shared book from now
        self._unanswered.pop(ticket.ticket_id, None)
        await self.local_tickets.release(ticket)
        log.info("ticket claimed during the outage written to the shared book",
                 provider=ticket.provider, model=ticket.model, ticket=ticket.ticket_id)
        return True

    # -- released --------------------------------------------------------------------------
    async def release_plan(self, claimed: Claimed, state: LoadState) -> None:
        """An unused held plan: its ticket goes, the model its load left stays counted (a
        load it abandoned, until a probe shows whether it finished)."""
        self.unhold(claimed)
        stays = left_loaded(claimed.placement, self.clock.now(), state)
        await self.book(claimed).release(claimed.ticket, stays)
