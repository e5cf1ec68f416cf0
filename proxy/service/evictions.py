"""Unloading copies: a placement's victims, a call's `keep_alive: 0`, a client's explicit
unload, and every copy of an engine that ran out of memory. Each unload is told to every
view (the copy marked leaving) before it is asked for, and each copy counts until
`/api/ps` no longer lists it. A `keep_alive: 0` or an explicit unload while the shared state
is unreachable is carried out once it answers again, unless the copy is wanted by then."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass

from proxy.core.context import parse_version
from proxy.core.models import model_name
from proxy.core.occupancy import copy_counted, copy_sharers, same_weights
from proxy.core.tickets import Mark, Residency
from proxy.core.types import Snapshot
from proxy.observability.logging import get_logger
from proxy.observability.metrics import Metrics
from proxy.ports import Clock, ModelServer, StoreUnavailable, UpstreamError
from proxy.service.claims import Claimed, Claims
from proxy.service.codec import parse_rfc3339
from proxy.service.snapshot import StateView
from proxy.service.tickets import TicketBook
from proxy.settings import ProviderConfig

log = get_logger("kubemoot.evictions")
UNLOAD_WAIT_S = 10.0  # how long a call waits for its victims to leave before going anyway
# Ollama unloads one copy at a time and, before the next, waits up to 5 s for the card's
# memory to come back (server/sched.go:101, 458-466; v0.12.6 :358-366)
RECOVERY_WAIT_S = 5.0
UNLOAD_POLL_S = 0.05
RUNTIME_OOM_UNLOADS_SINCE = (0, 30, 0)
# Before it, a built-in parser's error mid-answer left the call's llama-server slot taken for
# good (Ollama e0c95a5ff, issue 17825): the copy's next calls there wait forever
FAILED_CALLS_FREE_THEIR_SLOT_SINCE = (0, 32, 15)
# An unload asked during an outage waits this long once the shared state answers again: the
# other sidecars write the tickets they claimed meanwhile back within it (every 0.5 s,
# Claims._rejoin), so a copy their calls still run on is seen in use.
DEFERRED_UNLOAD_S = 1.0
DEFERRED_CHECK_S = 0.25
# Ollama sets a copy's expiry (/api/ps expires_at) as its last call's request ends, just
# after the answer's last byte: read this long after the call that deferred the unload (a
# call of another sidecar's that ends within it is not told apart from that one)
EXPIRY_SETTLE_S = 0.1
# A moved expiry: more than the rounding of its time stamp (the call that moved it ended
# later, or set another keep-alive)
EXPIRY_MOVED_S = 0.05


@dataclass
class _Deferred:
    asked_at: float  # the keep_alive-0 call's start, or the explicit unload's time
    # /api/ps expires_at just after it: one that moved since means some call (another
    # sidecar's, unseen during the outage) ran on the copy and set its keep-alive again
    expiry: float | None = None


class Evictions:
    def __init__(self, *, clients: Mapping[str, ModelServer], claims: Claims,
                 view: StateView, providers: tuple[ProviderConfig, ...], metrics: Metrics,
                 clock: Clock) -> None:
        self.clients = clients
        self.claims = claims
        self.tickets = claims.tickets
        self.view = view
        self.providers = {c.name: c for c in providers}
        self.metrics = metrics
        self.clock = clock
        self._background: set[asyncio.Task[object]] = set()
        # Whether a call waits for a copy (provider, model), as the demand board says, or
        # holds a ticket on it; set by the service that sees both (CallService).
        self.wanted: Callable[[str, str], bool] = lambda provider, model: False
        # Unloads asked while the shared state was unreachable, by (provider, copy)
        self._deferred: dict[tuple[str, str], _Deferred] = {}
        self._after_outage: asyncio.Task[None] | None = None

    async def make_room(self, claimed: Claimed) -> tuple[float, ...] | None:
        """Unload the planned victims, wait until `/api/ps` no longer lists them, and record
        them as gone. Ollama answers `keep_alive: 0` at once but unloads a copy only when its
        last call ends (one may be finishing as its ticket goes), and one copy at a time; a
        load sent before then would find them still there. When each victim was seen gone,
        in seconds from the first unload asked; None when some were still listed at the end
        of the wait.

        The victims are marked leaving before the first is asked to go: the claim's ticket
        keeps every view off them only while it lives, and a call that goes first (its plan
        released, a shutdown) would leave copies Ollama is unloading counted warm, for
        others to join and have reloaded. When it does go, the unloads asked for finish
        here; a victim not yet asked is kept (`_keep_unasked`)."""
        placement = claimed.placement
        victims = tuple(placement.evicts)
        book = self.claims.book(claimed)
        marks: dict[str, Mark] = {}
        asked = 0  # victims whose unload was asked, or is on its way
        try:
            await self._mark_victims(book, claimed, marks)
            started = self.clock.monotonic()
            for victim in victims:
                asked += 1
                await self._ask_unload(placement.provider, victim)
            gone_at = await self._seen_gone(placement.provider, victims)
        except BaseException:
            for ahead, victim in enumerate(victims[:asked]):
                self._spawn(self._unload_unless_used(book, claimed, victim, ahead))
            if unasked := {v: marks[v] for v in victims[asked:] if v in marks}:
                self._spawn(self._keep_unasked(book, claimed, unasked))
            raise
        departures = None if gone_at is None else tuple(t - started for t in gone_at.values())
        if departures is None:
            log.warning("victims still loaded; sending the call anyway",
                        provider=placement.provider, victims=victims)
        try:
            # only those seen gone: one still listed counts, leaving, until a probe says
            await book.mark_unloaded(placement.provider, self._when(gone_at))
        except StoreUnavailable:  # the next probe shows them gone; counting them is safe
            log.warning("victims' unload not recorded: shared state unreachable",
                        provider=placement.provider, victims=victims)
            # (in-process claims meanwhile must not join a victim gone on the last probe's word)
            await self.claims.local_tickets.mark_unloaded(placement.provider,
                                                          self._when(gone_at))
        return departures

    async def _mark_victims(self, book: TicketBook, claimed: Claimed,
                            marks: dict[str, Mark]) -> None:
        """A placement's victims marked leaving (`marks` filled); when the shared state
        cannot take it the others cannot be told, but this sidecar's own calls, claimed
        in-process until it is back, are (its own book)."""
        placement = claimed.placement
        try:
            await book.mark_leaving(placement.provider, tuple(placement.evicts),
                                    placement.evicts, marks)
        except StoreUnavailable:
            await self.claims.local_tickets.mark_leaving(
                placement.provider, tuple(placement.evicts), placement.evicts)

    async def release_to_unload(self, claimed: Claimed, loaded: Residency | None) -> None:
        """A call sent with `keep_alive: 0` ends: its model is unloaded unless another call
        holds a ticket for it (one may be on its way to Ollama, which would reload it). So
        the call went to Ollama without `keep_alive`, and the unload is asked for here,
        after the write that marks the copy leaving."""
        placement = claimed.placement
        book = self.claims.book(claimed)
        if claimed.local or not self.claims.may_load():
            # The others could not be told it is leaving (as for unload_everywhere): their
            # calls would make Ollama load it again, maybe before the driver gave its memory
            # back, evicting another copy on its own. It stays loaded until they can be.
            self._defer(placement.provider, claimed.ticket.model, claimed.ticket.started_at)
            await book.release(claimed.ticket, loaded)
            return
        view = self.view.provider_view(self.providers[placement.provider], self.clock.now())
        copy = claimed.ticket.model  # (another model's, when the call joined its copy)
        sharing = copy_sharers(view, copy)
        try:
            unused = await book.release_to_unload(claimed.ticket, loaded, sharing)
        except StoreUnavailable:  # it went away as the call ended: as asked during an outage
            self._defer(placement.provider, copy, claimed.ticket.started_at)
            raise
        if unused:
            self._spawn(self._unload_leaving(book, placement.provider, copy, sharing=sharing))

    async def unload_everywhere(self, model: str, snapshot: Snapshot) -> list[str]:
        """A client's explicit unload (`keep_alive: 0` and nothing to run, as `ollama stop`
        sends): every provider with the model loaded and no call holding a ticket for it
        unloads it, after every view has been told it is leaving (as for a call's keep_alive
        0).
        Where calls hold tickets for it, it stays: they are running, or on their way to it.
        Nothing is placed, claimed or loaded."""
        unloaded, in_use = [], []
        outage = not self.claims.may_load()
        for view in snapshot.providers:
            # Ollama finds the copy by its weights file (sched.go expireRunner): another
            # model's copy of it, when a model created FROM it is named
            copy = next((r for r in view.residents if r.model == model), None) or next(
                (r for r in view.residents if same_weights(view, model, r.model)), None)
            if copy is None or copy.loading:
                # Still loading: while llama.Load runs keep_alive 0 finds nothing to expire
                # (server/sched.go:627, 726, 1713-1731; 0.12-0.24's own engine: it waits
                # for the load, v0.12.6 :470-487), and recorded unloaded the copy about to
                # be there would be uncounted. It stays, for its keep-alive.
                continue
            if outage:  # the others could not be told: it stays until they can be
                self._defer(view.name, copy.model, self.clock.now())
                in_use.append(view.name)
                continue
            try:
                unused = await self.tickets.mark_leaving_unless_used(view.name, copy.model,
                                                                     copy.footprint_mib)
            except StoreUnavailable:
                unused = False
                self._defer(view.name, copy.model, self.clock.now())
            if unused:
                unloaded.append(view.name)
                self._spawn(self._unload_leaving(self.tickets, view.name, copy.model))
            else:
                in_use.append(view.name)
        log.info("unloaded on request", model=model, providers=unloaded, in_use=in_use,
                 deferred=outage)
        return unloaded

    # -- asked during an outage: carried out once the shared state answers ----------------
    def _defer(self, provider: str, model: str, asked_at: float) -> None:
        key = (provider, model)
        before = self._deferred.get(key)
        deferred = self._deferred[key] = _Deferred(
            max(asked_at, before.asked_at if before else asked_at))
        log.info("unload deferred until the shared state (NATS) answers", provider=provider,
                 model=model)
        self._spawn(self._note_expiry(provider, model, deferred))
        if self._after_outage is None:
            self._after_outage = asyncio.create_task(self._unload_after_outage())

    async def _note_expiry(self, provider: str, model: str, deferred: _Deferred) -> None:
        await asyncio.sleep(EXPIRY_SETTLE_S)
        deferred.expiry = await self._expiry(provider, model)

    async def _expiry(self, provider: str, model: str) -> float | None:
        """The copy's expires_at in a fresh /api/ps; None when unlisted or unknown."""
        client = self.clients[provider]
        try:
            listed = await client.ps(client.timeouts.connect_s)
        except UpstreamError:
            return None
        view = self.view.provider_view(self.providers[provider], self.clock.now())
        for m in listed:
            name = self.view.placed_name(model_name(m))
            expires = m.get("expires_at")
            if (name == model or same_weights(view, model, name)) and isinstance(expires, str):
                with contextlib.suppress(ValueError):
                    return parse_rfc3339(expires)
        return None

    def kept(self, provider: str, model: str, started_at: float) -> None:
        """A call that did not ask to unload ran on the copy (`model`'s, on `provider`): one
        begun after an unload deferred for it keeps it, as Ollama keeps a copy at the
        keep_alive of the last call sent to it."""
        deferred = self._deferred.get((provider, model))
        if deferred is not None and started_at > deferred.asked_at:
            del self._deferred[(provider, model)]
            log.info("deferred unload dropped: a later call kept the copy", provider=provider,
                     model=model)

    async def _unload_after_outage(self) -> None:
        """Once the shared state has answered for DEFERRED_UNLOAD_S, carry out the unloads
        deferred during the outage (a new outage starts the wait again)."""
        try:
            answering_since: float | None = None
            while self._deferred:
                now = self.clock.monotonic()
                if not self.claims.may_load():
                    answering_since = None
                elif answering_since is None:
                    answering_since = now
                elif now - answering_since >= DEFERRED_UNLOAD_S:
                    await self._unload_deferred()
                    answering_since = None  # (any left: the store went away again)
                    continue
                await asyncio.sleep(DEFERRED_CHECK_S)
        finally:
            self._after_outage = None

    async def _unload_deferred(self) -> None:
        """Each deferred unload, unless its copy is gone, still loading or leaving, waited
        for or held by a call (any sidecar's, in the shared book's check); the others are
        told it leaves before it is asked to, as for any keep_alive 0."""
        for (provider, model), deferred in list(self._deferred.items()):
            view = self.view.provider_view(self.providers[provider], self.clock.now())
            copy = next((r for r in view.residents if r.model == model), None)
            if copy is None or copy.loading or copy.leaving:
                del self._deferred[(provider, model)]
                continue
            if self.wanted(provider, model):
                del self._deferred[(provider, model)]
                log.info("deferred unload dropped: a call waits for or holds the copy",
                         provider=provider, model=model)
                continue
            expiry = None if deferred.expiry is None else await self._expiry(provider, model)
            if deferred.expiry is not None and (
                    expiry is None or abs(expiry - deferred.expiry) > EXPIRY_MOVED_S):
                self._deferred.pop((provider, model), None)
                log.info("deferred unload dropped: the copy's expiry in /api/ps moved (a "
                         "call ran on it since) or it is gone", provider=provider, model=model)
                continue
            sharing = copy_sharers(view, model)
            try:
                unused = await self.tickets.mark_leaving_unless_used(
                    provider, model, copy.footprint_mib, sharing=sharing)
            except StoreUnavailable:
                return  # away again: tried once it answers
            # (marked leaving, it goes even if a call ended meanwhile: none can join it now)
            self._deferred.pop((provider, model), None)
            if unused:
                log.info("unloaded after the outage, as asked during it", provider=provider,
                         model=model,
                         asked_s_ago=round(self.clock.now() - deferred.asked_at, 1))
                self._spawn(self._unload_leaving(self.tickets, provider, model,
                                                 sharing=sharing))
            else:
                log.info("deferred unload dropped: a call holds the copy", provider=provider,
                         model=model)

    async def close(self) -> None:
        task, self._after_outage = self._after_outage, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def after_out_of_memory(self, provider: str) -> None:
        """An engine that ran out of memory unloads every model it holds (Ollama >= 0.30
        expires them all, sched.go:1632-1661): every copy there is marked leaving, so nothing
        joins one that is about to go, and unloaded."""
        view = self.view.provider_view(self.providers[provider], self.clock.now())
        if parse_version(view.version) < RUNTIME_OOM_UNLOADS_SINCE:
            return  # older engines keep their models; the probe after the failure tells
        # (A copy still loading is not in Ollama's scheduler: its unload would do nothing.)
        models = tuple(r.model for r in view.residents if not r.leaving and not r.loading)
        log.warning("provider ran out of memory; its models are treated as unloading",
                    provider=provider, models=models)
        try:
            await self.tickets.mark_leaving(provider, models)
        except StoreUnavailable:
            return  # the probe after this failure tells the truth soon enough
        for ahead, model in enumerate(models):
            self._spawn(self._unload_leaving(self.tickets, provider, model, ahead))

    def why_failure_unloads(self, provider: str, copy: str, *, closed: bool, parsed: bool,
                            loaded_it: bool) -> str | None:
        """Why a copy whose engine failed a call must be unloaded, so the next call loads it
        as planned (None: it stays): Ollama closed its runner (`closed`: it reloads it for
        the next call, fitted beside runners that may still count it), or an engine before
        0.32.15 may keep the call's slot (`parsed`: a parser ran, whose error the sidecar
        cannot tell from the others) and the next call would wait for good. Only a copy
        there and not leaving already: counted on the card, or loaded by the call itself
        (`loaded_it`: its answer began; its ticket still stands for it)."""
        view = self.view.provider_view(self.providers[provider], self.clock.now())
        if not loaded_it and not any(r.model == copy and not r.leaving
                                     for r in view.residents):
            return None
        if closed:
            return "runner closed"
        if parsed and parse_version(view.version) < FAILED_CALLS_FREE_THEIR_SLOT_SINCE:
            return "the version may keep the call's slot"
        return None

    async def release_after_failure(self, claimed: Claimed, why: str) -> None:
        """The failed call's ticket goes and its copy is marked leaving in one write, then
        the copy is unloaded (once the calls still on it end, as Ollama unloads any copy).
        With the shared state away it is unloaded all the same: a copy that cannot serve
        is worse than one the others may load again."""
        provider = claimed.placement.provider
        book = self.claims.book(claimed)
        copy = claimed.ticket.model  # (another model's, when the call joined its copy)
        view = self.view.provider_view(self.providers[provider], self.clock.now())
        sharing = copy_sharers(view, copy)
        log.warning("engine failed a call; unloading the copy", provider=provider, model=copy,
                    version=view.version, why=why)
        try:
            await book.release_leaving(claimed.ticket, sharing)
        finally:
            self._spawn(self._unload_leaving(book, provider, copy, sharing=sharing))

    async def _keep_unasked(self, book: TicketBook, claimed: Claimed,
                            marks: Mapping[str, Mark]) -> None:
        """Victims whose call went before their unload was asked: Ollama never heard of it,
        and nobody else wants their memory (a call that does is placed afresh and evicts
        for itself), so they stay, warm for their next call, not unloaded for nobody."""
        provider = claimed.placement.provider
        log.info("victims kept: their call went before their unload was asked",
                 provider=provider, victims=list(marks))
        with contextlib.suppress(StoreUnavailable):
            await book.unmark_leaving(provider, marks, claimed.ticket.ticket_id)

    async def _unload_unless_used(self, book: TicketBook, claimed: Claimed, victim: str,
                                  ahead: int) -> None:
        """A victim whose call went before it was seen gone: unloaded, as asked, unless a
        call joined it meanwhile (possible only if its mark never reached the store). The
        call's own ticket goes in the same write: a copy it was to reload at another
        context is its victim too, and must not stay marked leaving, in use by it."""
        provider = claimed.placement.provider
        with contextlib.suppress(StoreUnavailable):
            if await book.mark_leaving_unless_used(provider, victim,
                                                   claimed.placement.evicts[victim],
                                                   releasing=claimed.ticket.ticket_id):
                await self._unload_leaving(book, provider, victim, ahead)

    async def _unload_leaving(self, book: TicketBook, provider: str, model: str,
                              ahead: int = 0, sharing: tuple[str, ...] = ()) -> None:
        """Unload a copy marked leaving; once `/api/ps` no longer lists it, every view frees
        its memory (until then it counts, so no load is sent to land on it). `ahead`: copies
        of the card unloaded before it (Ollama goes one at a time). `sharing`: the copy's
        other names (`copy_sharers`), gone with it."""
        gone = (model, *sharing)
        if await self._ask_unload(provider, model) and \
                (seen := await self._seen_gone(provider, gone, ahead)) is not None:
            with contextlib.suppress(StoreUnavailable):
                await book.mark_unloaded(provider, self._when(seen))

    def _when(self, seen_gone: Mapping[str, float] | None) -> dict[str, float]:
        """`_seen_gone`'s times (the monotonic clock) as wall-clock times, the records'."""
        offset = self.clock.now() - self.clock.monotonic()
        return {m: at + offset for m, at in (seen_gone or {}).items()}

    async def _ask_unload(self, provider: str, model: str) -> bool:
        """`keep_alive: 0` to one provider; False (and a warning) when it cannot be asked."""
        log.debug("unloading", provider=provider, model=model)
        view = self.view.provider_view(self.providers[provider], self.clock.now())
        try:
            await self.clients[provider].unload(view.own_name(model))
        except UpstreamError as exc:
            log.warning("unload failed", provider=provider, model=model, error=str(exc))
            return False
        self.metrics.evictions.labels(provider, model).inc()
        return True

    async def _seen_gone(self, provider: str, models: tuple[str, ...], ahead: int = 0
                         ) -> dict[str, float] | None:
        """Poll `/api/ps` until it lists none of `models`: when each was first seen gone
        (the clock's monotonic time); None when some were still listed after 10 s and 5 s
        more for each copy unloaded before the last (or `/api/ps` did not answer)."""
        client = self.clients[provider]
        deadline = self.clock.monotonic() + UNLOAD_WAIT_S + \
            RECOVERY_WAIT_S * (max(0, len(models) - 1) + ahead)
        gone_at: dict[str, float] = {}
        view = self.view.provider_view(self.providers[provider], self.clock.now())
        while True:
            try:
                listed = await client.ps(client.timeouts.connect_s)
            except UpstreamError:
                return None
            now = self.clock.monotonic()
            # (a copy is listed under the name that loaded it: another of its names, or of
            # its weights file, as Ollama runs one copy of the file whoever loaded it)
            names = {self.view.placed_name(model_name(m)) for m in listed}
            for model in models:
                if not copy_counted(view, model, names):
                    gone_at.setdefault(model, now)
            if len(gone_at) == len(models):
                return gone_at
            if now >= deadline:
                return None
            await asyncio.sleep(UNLOAD_POLL_S)

    def _spawn(self, coro: Coroutine[object, object, object]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
