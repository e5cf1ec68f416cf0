"""The scheduled call: snapshot -> core.place -> claim -> unload victims -> route -> release.

This is the imperative shell around `proxy.core`. It implements the `Router` seam the API
calls for every inference request, and waits for capacity (woken by the store's change
counter, never by polling) when the core says the GPUs are busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from proxy.adapters.ollama import UpstreamError, is_out_of_memory, model_name, normalise_model
from proxy.core import context
from proxy.core.context import parse_version
from proxy.core.health import ProviderStats
from proxy.core.placement import explain, place
from proxy.core.policy import Policy
from proxy.core.tickets import Residency
from proxy.core.tokens import (
    Anchor,
    ConversationMemory,
    PromptSize,
    TokenRatio,
    estimate_tokens,
)
from proxy.core.types import (
    CallSpec,
    Candidate,
    Circuit,
    Decision,
    Placement,
    ProviderHealth,
    Snapshot,
    Ticket,
    Verdict,
)
from proxy.observability.logging import get_logger
from proxy.observability.metrics import Metrics
from proxy.ports import PROVIDER_TICKETS, StateStore, StoreUnavailable
from proxy.service.codec import decode_ticket_set, unescape_key
from proxy.service.demand import DemandBoard
from proxy.service.prober import Prober
from proxy.service.routing import STATIC, CallOutcome, CallRequest, ProviderPool, Refusal, Route
from proxy.service.snapshot import StateView
from proxy.service.tickets import TicketBook
from proxy.settings import CandidateModel, Settings

log = get_logger("kubemoot.scheduler")
MAX_CLAIM_ROUNDS = 5
LEARNS_RATIO = ("/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions",
                "/v1/responses", "/v1/messages")
LOAD_SPEED_ALPHA = 0.3
UNLOAD_WAIT_S = 10.0  # how long a call waits for its victims to leave before going anyway
UNLOAD_POLL_S = 0.05
RUNTIME_OOM_UNLOADS_SINCE = (0, 30, 0)


@dataclass
class Claimed:
    placement: Placement
    ticket: Ticket
    local: bool  # claimed in the in-process book because the shared store was unreachable


@dataclass
class Learning:
    """What the sidecar learns from responses: chars per token and load speed."""

    ratio: TokenRatio = field(default_factory=TokenRatio)
    load_mib_per_s: float | None = None
    conversations: ConversationMemory = field(default_factory=ConversationMemory)

    def prompt_tokens(self, call: CallRequest) -> int:
        anchor = self.conversations.longest_known(call.conversation)
        return estimate_tokens(call.prompt, self.ratio, anchor) + call.tokens_apart

    def observe_prompt(self, call: CallRequest, prompt_eval_count: int | None) -> None:
        if prompt_eval_count is not None:  # the ratio is of the text (and template) alone
            prompt_eval_count -= call.tokens_apart
            self.conversations.record(call.conversation, Anchor(call.prompt, prompt_eval_count))
        self.ratio = self.ratio.observe(call.prompt.chars, prompt_eval_count, call.prompt.dense)

    def observe_load(self, mib: int, seconds: float | None) -> None:
        if not seconds or seconds < 0.05 or mib <= 0:
            return
        sample = mib / seconds
        self.load_mib_per_s = sample if self.load_mib_per_s is None else \
            LOAD_SPEED_ALPHA * sample + (1 - LOAD_SPEED_ALPHA) * self.load_mib_per_s


LoadState = Literal["loaded", "loading", "failed"]


def load_state(outcome: CallOutcome) -> LoadState:
    """What a call that loaded its model left: the copy (it was answered), maybe a copy still
    loading (its agent left first, or the answer broke off), or nothing (the engine refused
    or failed before answering)."""
    if outcome.prompt_too_long or (outcome.ok and outcome.error is None):
        return "loaded"
    return "loading" if outcome.client_left or outcome.began else "failed"


def left_loaded(placement: Placement, now: float, state: LoadState = "loaded"
                ) -> Residency | None:
    """What a finished load leaves on the GPU, to count at once rather than at the next
    probe; None when the call shared a copy (nothing changed) or its load failed."""
    if placement.kind not in ("cold", "evict") or state == "failed":
        return None
    return Residency(placement.footprint_mib, placement.num_ctx, now,
                     loading=state == "loading")


class Scheduler:
    def __init__(self, *, settings: Settings, pool: ProviderPool, store: StateStore,
                 tickets: TicketBook, local_tickets: TicketBook, view: StateView,
                 prober: Prober, demand: DemandBoard, metrics: Metrics, policy: Policy,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.pool = pool
        self.store = store
        self.tickets = tickets
        self.local_tickets = local_tickets
        self.view = view
        self.prober = prober
        self.demand = demand
        self.metrics = metrics
        self.policy = policy
        self.clock = clock
        self.stats: dict[str, ProviderStats] = {n: ProviderStats() for n in pool.clients}
        self.learning = Learning()
        self.holder = f"{settings.namespace}/{settings.agent_name}"
        # Ticket ids: a random per-process prefix and a counter, unique across sidecars
        # without a getrandom() call per ticket.
        prefix = secrets.token_hex(8)
        self._ticket_ids = (f"{prefix}-{n:x}" for n in itertools.count(1))
        self._background: set[asyncio.Task[object]] = set()
        # Decisions run one at a time in this process; each reserves its ticket before the
        # next one decides, so concurrent calls see each other's claims while those are on
        # their way to the store. Other sidecars are kept honest by compare-and-set.
        # (See _done_placing for when the next one may start.)
        self._placing = asyncio.Lock()
        self._pending: dict[str, Ticket] = {}
        self._held: dict[str, Claimed] = {}  # tickets of calls and plans in progress
        self._renewing: asyncio.Task[None] | None = None

    # -- inputs ----------------------------------------------------------------------------
    def candidates(self, phase: str, model: str | None) -> tuple[Candidate, ...] | None:
        s = self.settings
        if phase == "triage":
            bound = model or s.triage_model
            return (Candidate(normalise_model(bound)),) if bound else None
        listed = [self._candidate(c) for c in s.model_candidates_mulling]
        if not listed and s.model_model:
            listed = [Candidate(normalise_model(s.model_model))]
        if model is None:
            return tuple(listed) or None
        wanted = normalise_model(model)
        mine = next((c for c in listed if c.model == wanted), None)
        if mine is None:
            return (Candidate(wanted),)
        return (mine, *(c for c in listed if c.model != wanted))

    @staticmethod
    def _candidate(c: CandidateModel) -> Candidate:
        return Candidate(normalise_model(c.model), c.score, c.vram_mib)

    def health(self, now: float) -> dict[str, ProviderHealth]:
        out = {}
        for name, stats in self.stats.items():
            circuit = stats.breaker.state(now)
            if circuit is Circuit.HALF_OPEN and not stats.breaker.allows(now):
                circuit = Circuit.OPEN  # a trial call is out already
            out[name] = ProviderHealth(circuit, stats.latency.value, stats.success_rate)
        return out

    def snapshot(self, now: float, exclude: frozenset[str] = frozenset()) -> Snapshot:
        local = (*self._local_live(now), *self._claims_in_flight())
        snapshot = self.view.snapshot(now, self.health(now), self.demand.view(),
                                      self.learning.load_mib_per_s, local)
        if not exclude:
            return snapshot
        return replace(snapshot, providers=tuple(
            replace(v, ready=False) if v.name in exclude else v for v in snapshot.providers))

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
        """Tickets claimed in-process while the shared store was unreachable."""
        mirror = self.local_tickets.store.view(PROVIDER_TICKETS)
        out: list[Ticket] = []
        for key, entry in mirror.items():
            out.extend(decode_ticket_set(unescape_key(key), entry.value).live(now).tickets.values())
        return out

    def spec(self, call: CallRequest, candidates: tuple[Candidate, ...], at_least: int = 0
             ) -> CallSpec:
        return CallSpec(candidates,
                        prompt_tokens=max(at_least, self.learning.prompt_tokens(call)),
                        num_ctx=call.num_ctx or 0, num_predict=call.num_predict,
                        pins_context=call.pins_context, generates=call.generates,
                        tolerance=self.settings.tolerance,
                        phase="triage" if call.phase == "triage" else "mulling")

    # -- the call path ---------------------------------------------------------------------
    async def route(self, call: CallRequest, at_least_tokens: int = 0,
                    exclude: frozenset[str] = frozenset()) -> Route | Refusal:
        """Place the call (waiting for capacity if need be); `at_least_tokens`: what the
        engine counted of its prompt after refusing it as longer than a context; `exclude`:
        providers that failed it."""
        candidates = self.candidates(call.phase, call.model)
        if not candidates:
            return Refusal(400, "bad-request", "field 'model': a model is required (none in "
                           "the request and KUBEMOOT_MODEL_MODEL is not set)")
        spec = self.spec(call, candidates, at_least_tokens)
        if not self.pool.clients:  # no provider is known at all: the static endpoint
            return self._static_or_busy(call, spec, Decision("wait", None, "no providers"))
        started = time.monotonic()
        deadline = started + self.settings.wait_limit_seconds
        waiting_for: str | None = None
        waited = 0.0  # time blocked waiting for capacity (not claim round trips)
        claim_rounds = 0
        gone: asyncio.Future[None] | None = None
        try:
            while True:
                seen = self.store.changes.value
                await self._placing.acquire()
                try:
                    decided_at = time.perf_counter()
                    now = self.clock()
                    snapshot = self.snapshot(now, exclude)
                    decision = place(spec, snapshot, self.policy)
                    self.metrics.decision_seconds.observe(time.perf_counter() - decided_at)
                    ticket = self._reserve(decision.placement) if decision.placement else None
                finally:
                    self._done_placing()
                if decision.placement is not None and ticket is not None:
                    try:
                        claimed = await self.claim(decision.placement, snapshot, ticket)
                    finally:
                        del self._pending[ticket.ticket_id]
                    if claimed is not None:
                        if waiting_for:
                            self.metrics.wait_seconds.observe(waited)
                        return await self.start_claimed(claimed, call, spec, int(waited * 1000))
                    claim_rounds += 1
                    if claim_rounds < MAX_CLAIM_ROUNDS:
                        continue  # the state moved under us: decide again on fresh state
                    # The claims keep refusing what the decisions choose: wait for a change,
                    # like a busy call, within the same limits.
                    claim_rounds = 0
                    decision = replace(decision, outcome="wait", placement=None,
                                       reason="the GPUs' ticket sets refused "
                                              f"{MAX_CLAIM_ROUNDS} claims in a row")
                refusal = self._refusal(decision, call, spec)
                if refusal is not None:
                    return refusal
                # Busy: those who cannot wait go to the static endpoint.
                if not call.can_wait:
                    return self._static_or_busy(call, spec, decision)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return Refusal(503, "gpu-busy", (
                        f"Every GPU that can run {spec.preferred.model} stayed busy for "
                        f"{self.settings.wait_limit_seconds:.0f} s ({decision.reason}); "
                        "this is the cluster's capacity, ask again in a moment."),
                        spec.preferred.model, retry_after_s=5)
                if waiting_for is None:
                    waiting_for = spec.preferred.model
                    self.metrics.placements.labels("waiting", "-", waiting_for).inc()
                    await self.demand.waiting(waiting_for)
                    log.info("waiting for a GPU", model=waiting_for, reason=decision.reason)
                if gone is None and call.disconnected is not None:
                    gone = asyncio.ensure_future(call.disconnected())
                blocked_at = time.monotonic()
                changed = asyncio.ensure_future(self.store.changes.wait_past(
                    seen, self._wake_in(snapshot, remaining)))
                await asyncio.wait({changed, *((gone,) if gone else ())},
                                   return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                waited += time.monotonic() - blocked_at
                if gone is not None and gone.done():
                    log.info("client went away while waiting", model=waiting_for)
                    return Refusal(499, "client-gone", "the client went away while "
                                   "waiting for a GPU", spec.preferred.model)
        finally:
            if gone is not None:
                gone.cancel()  # before the response: the relay listens for disconnects too
            if waiting_for:
                self._spawn(self.demand.done_waiting(waiting_for))

    def _done_placing(self) -> None:
        """Let the next decision run on the loop's next turn, not this one. A burst of calls
        that arrive together would otherwise all decide in one turn, and each would wait for
        the whole burst's work: with NATS, not even the first claim leaves before the last
        decision (nats-py writes on the next turn); in-process, no answer is read or relayed
        meanwhile. At 32 concurrent in lock-step: NATS +12.0 -> +0.6 ms p50, embedded p99
        +12.5 -> +1.4..3.5 ms."""
        asyncio.get_running_loop().call_soon(self._placing.release)

    def _wake_in(self, snapshot: Snapshot, remaining: float) -> float:
        """Until the earliest ticket expiry (expiry is silent), the deadline at the latest."""
        expiries = [t.expires_at - snapshot.now for t in snapshot.tickets]
        soonest = min((e for e in expiries if e > 0), default=remaining)
        return max(0.01, min(remaining, soonest + 0.01))

    def _refusal(self, decision: Decision, call: CallRequest, spec: CallSpec) -> Refusal | None:
        model = spec.preferred.model
        if decision.outcome == "model-not-found":
            return Refusal(404, "model-not-found", decision.reason, model)
        if decision.outcome == "prompt-too-large":
            return Refusal(413, "prompt-too-large", decision.reason, model)
        if decision.outcome == "model-too-large":
            if not call.can_wait and self.pool.static is not None:
                return None  # cannot wait: the static endpoint takes it
            return Refusal(507, "model-too-large", decision.reason, model)
        return None

    def _static_or_busy(self, call: CallRequest, spec: CallSpec, decision: Decision
                        ) -> Route | Refusal:
        static = self.pool.static_triage if call.phase == "triage" else self.pool.static
        if static is None:
            return Refusal(503, "gpu-busy", (
                f"No GPU has room for {spec.preferred.model} now ({decision.reason}) and this "
                "call cannot wait; set KUBEMOOT_MODEL_ENDPOINT for such calls or retry."),
                spec.preferred.model, retry_after_s=5)
        return Route(STATIC, static, spec.preferred.model, STATIC)

    def _new_ticket(self, placement: Placement, plan: bool = False) -> Ticket:
        return self.tickets.new_ticket(
            next(self._ticket_ids), placement.provider, placement.model, placement.footprint_mib,
            cold=placement.kind in ("cold", "evict"), evicts=dict(placement.evicts),
            holder=self.holder, context=placement.num_ctx,
            estimate_mib=placement.estimate_mib, plan=plan)

    def _reserve(self, placement: Placement) -> Ticket:
        """A ticket the next decisions count while its claim is on its way to the store."""
        ticket = self._new_ticket(placement)
        self._pending[ticket.ticket_id] = ticket
        return ticket

    async def claim(self, placement: Placement, snapshot: Snapshot,
                    ticket: Ticket | None = None, plan: bool = False) -> Claimed | None:
        view = next(v for v in snapshot.providers if v.name == placement.provider)
        ticket = ticket or self._new_ticket(placement, plan)
        local = False
        needs_slot = placement.kind in ("warm", "loading") and placement.step in (1, 2)
        try:
            result = await self.tickets.claim(ticket, view, needs_slot)
        except StoreUnavailable:
            local = True
            if ticket.cold:  # other sidecars' loads reach this view only by probe: probe now
                await self.prober.refresh(placement.provider)
                config = next(c for c in self.settings.providers if c.name == view.name)
                view = self.view.provider_view(config, self.clock())
            result = await self.local_tickets.claim(ticket, view, needs_slot)
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

    async def start_claimed(self, claimed: Claimed, call: CallRequest, spec: CallSpec,
                            waited_ms: int, unload: bool = True) -> Route:
        placement = claimed.placement
        client = self.pool.clients[placement.provider]
        if unload and placement.evicts:
            await self.make_room(claimed)
        stats = self.stats[placement.provider]
        self.stats[placement.provider] = replace(
            stats, breaker=stats.breaker.start_trial(self.clock()))
        self.hold(claimed)
        route = Route(placement.provider, client, placement.model, placement.kind,
                      evicted=tuple(placement.evicts), waited_ms=waited_ms,
                      num_ctx=placement.num_ctx if call.pins_context else 0,
                      strip_keep_alive=call.unloads_after,
                      estimated_tokens=spec.prompt_tokens,
                      context_length=placement.context_length)
        route.on_done = self._finisher(claimed, call, route)
        route.retry = self._retry_elsewhere(call, spec, placement.provider)
        route.reroute = lambda tokens: self.route(call, tokens)
        return route

    async def make_room(self, claimed: Claimed) -> None:
        """Unload the planned victims, wait until `/api/ps` no longer lists them, and record
        them as gone. Ollama answers `keep_alive: 0` at once but unloads a copy only when its
        last call ends (one may be finishing as its ticket goes); a load sent before then
        would find them still there."""
        placement = claimed.placement
        victims = tuple(placement.evicts)
        for victim in victims:
            await self._ask_unload(placement.provider, victim)
        if not await self._seen_gone(placement.provider, victims):
            log.warning("victims still loaded; sending the call anyway",
                        provider=placement.provider, victims=victims)
        await self.book(claimed).mark_unloaded(placement.provider, victims)

    async def _seen_gone(self, provider: str, models: tuple[str, ...]) -> bool:
        """Poll `/api/ps` until it lists none of `models` (True), for at most 10 s."""
        client = self.pool.clients[provider]
        deadline = time.monotonic() + UNLOAD_WAIT_S
        while True:
            try:
                ps = await client.get_json("/api/ps", client.timeouts.connect_s)
            except UpstreamError:
                return False
            listed = ps.get("models") if isinstance(ps, dict) else None
            if {model_name(m) for m in listed or ()}.isdisjoint(models):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(UNLOAD_POLL_S)

    async def _release_to_unload(self, claimed: Claimed, loaded: Residency | None) -> None:
        """A call sent with `keep_alive: 0` ends: its model is unloaded unless another call
        holds a ticket for it (one may be on its way to Ollama, which would reload it). So
        the call went to Ollama without `keep_alive`, and the unload is asked for here,
        after the write that marks the copy leaving."""
        placement = claimed.placement
        if await self.book(claimed).release_to_unload(claimed.ticket, loaded):
            self._spawn(self._unload_leaving(self.book(claimed), placement.provider,
                                             placement.model))

    async def _unload_leaving(self, book: TicketBook, provider: str, model: str) -> None:
        """Unload a copy marked leaving; once `/api/ps` no longer lists it, every view frees
        its memory (until then it counts, so no load is sent to land on it)."""
        if await self._ask_unload(provider, model) and await self._seen_gone(provider, (model,)):
            with contextlib.suppress(StoreUnavailable):
                await book.mark_unloaded(provider, (model,))

    async def _ask_unload(self, provider: str, model: str) -> bool:
        """`keep_alive: 0` to one provider; False (and a warning) when it cannot be asked."""
        log.debug("unloading", provider=provider, model=model)
        try:
            await self.pool.clients[provider].unload(model)
        except UpstreamError as exc:
            log.warning("unload failed", provider=provider, model=model, error=str(exc))
            return False
        self.metrics.evictions.labels(provider, model).inc()
        return True

    async def unload_everywhere(self, model: str) -> list[str]:
        """A client's explicit unload (`keep_alive: 0` and nothing to run, as `ollama stop`
        sends): every provider with the model loaded and no call holding a ticket for it
        unloads it, after every view has been told it is leaving (as for a call's keep_alive
        0).
        Where calls hold tickets for it, it stays: they are running, or on their way to it.
        Nothing is placed, claimed or loaded."""
        model = normalise_model(model)
        snapshot = self.snapshot(self.clock())
        unloaded, in_use = [], []
        for view in snapshot.providers:
            copy = next((r for r in view.residents if r.model == model), None)
            if copy is None:
                continue
            try:
                unused = await self.tickets.mark_leaving_unless_used(view.name, model,
                                                                     copy.footprint_mib)
            except StoreUnavailable:
                unused = False  # the others could not be told: leave it loaded
            if unused:
                unloaded.append(view.name)
                self._spawn(self._unload_leaving(self.tickets, view.name, model))
            else:
                in_use.append(view.name)
        log.info("unloaded on request", model=model, providers=unloaded, in_use=in_use)
        return unloaded

    def book(self, claimed: Claimed) -> TicketBook:
        return self.local_tickets if claimed.local else self.tickets

    def hold(self, claimed: Claimed) -> None:
        """Keep a ticket counted while its call (or plan) lives: the renewal sweep renews it."""
        self._held[claimed.ticket.ticket_id] = claimed

    def unhold(self, claimed: Claimed) -> None:
        self._held.pop(claimed.ticket.ticket_id, None)

    def start(self) -> None:
        self._renewing = asyncio.create_task(self._renew_held())

    async def close(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing

    async def _renew_held(self) -> None:
        """Every third of the TTL, renew every held ticket: one task for all of them, and
        the renewals of one GPU share a write."""
        period = self.tickets.ttl_s / 3
        while True:
            await asyncio.sleep(period)
            held = list(self._held.values())
            await asyncio.gather(*(self.book(c).renew(c.ticket) for c in held),
                                 return_exceptions=True)  # unreachable store: next sweep

    async def release_plan(self, claimed: Claimed, state: LoadState) -> None:
        """An unused held plan: its ticket goes, the model its load left (or may still be
        loading) stays counted."""
        self.unhold(claimed)
        stays = left_loaded(claimed.placement, self.clock(), state)
        await self.book(claimed).release(claimed.ticket, stays)

    def _finisher(self, claimed: Claimed, call: CallRequest, route: Route
                  ) -> Callable[[CallOutcome], Awaitable[None]]:
        placement = claimed.placement

        async def done(outcome: CallOutcome) -> None:
            self.unhold(claimed)
            now = self.clock()
            stats = self.stats[placement.provider]
            # An agent leaving (Ctrl-C, a cancelled tool call), or a prompt the engine refused
            # as too long, says nothing of the GPU.
            stats = stats.abandoned() if outcome.client_left or outcome.prompt_too_long else \
                stats.record(outcome.ok, outcome.seconds, now)
            self.stats[placement.provider] = stats
            # Open and half-open both read 1; only a recorded outcome moves it to or from 0.
            self.metrics.circuit_open.labels(placement.provider).set(
                0 if stats.breaker.state(now) is Circuit.CLOSED else 1)
            loaded = left_loaded(placement, now, load_state(outcome))
            # keep_alive 0 is carried out by the sidecar itself (see _release_to_unload).
            release = self._release_to_unload(claimed, loaded) if call.unloads_after else \
                self.book(claimed).release(claimed.ticket, loaded)
            try:
                # A plain release finishes without suspending; one that records residency
                # (left loaded, or leaving) writes at once and must survive a cancelled caller.
                writes_now = call.unloads_after or loaded is not None
                await (asyncio.shield(release) if writes_now else release)
            except StoreUnavailable:
                log.warning("ticket release not written; no longer counted here, written "
                            "when the store is back", provider=placement.provider,
                            ticket=claimed.ticket.ticket_id)
            if outcome.error and is_out_of_memory(outcome.error):
                await self._after_out_of_memory(placement.provider)
            if outcome.ok:
                if call.path in LEARNS_RATIO:  # one prompt per call, so chars/tokens is a ratio
                    self.learning.observe_prompt(call, outcome.prompt_eval_count)
                    if outcome.prompt_eval_count and route.estimated_tokens:
                        self.metrics.prompt_estimate_ratio.observe(
                            outcome.prompt_eval_count / route.estimated_tokens)
                if placement.kind in ("cold", "evict"):
                    self.learning.observe_load(placement.footprint_mib, outcome.load_seconds)
                self.demand.note_use(placement.model)
            if placement.kind in ("cold", "evict") or not outcome.ok:
                self._spawn(self.prober.refresh(placement.provider))

        return done

    async def _after_out_of_memory(self, provider: str) -> None:
        """An engine that ran out of memory unloads every model it holds (Ollama >= 0.30
        expires them all, sched.go:1632-1661): every copy there is marked leaving, so nothing
        joins one that is about to go, and unloaded."""
        view = self.view.provider_view(
            next(c for c in self.settings.providers if c.name == provider), self.clock())
        if parse_version(view.version) < RUNTIME_OOM_UNLOADS_SINCE:
            return  # older engines keep their models; the probe after the failure tells
        models = tuple(r.model for r in view.residents if not r.leaving)
        log.warning("provider ran out of memory; its models are treated as unloading",
                    provider=provider, models=models)
        try:
            await self.tickets.mark_leaving(provider, models)
        except StoreUnavailable:
            return  # the probe after this failure tells the truth soon enough
        for model in models:
            self._spawn(self._unload_leaving(self.tickets, provider, model))

    def _retry_elsewhere(self, call: CallRequest, spec: CallSpec, failed: str
                         ) -> Callable[[], Awaitable[Route | Refusal | None]]:
        """The call placed again without the provider that failed it, waiting for a GPU as
        a first attempt would; None when no other provider could take it at all."""
        async def retry() -> Route | Refusal | None:
            excluded = frozenset((failed,))
            snapshot = self.snapshot(self.clock(), excluded)
            if place(spec, snapshot, self.policy).outcome not in ("placed", "wait"):
                return None
            wanted = {c.model for c in spec.candidates}
            if not any(v.ready and v.name != failed and (not v.disk_mib or wanted & set(
                    v.disk_mib)) for v in snapshot.providers):
                return None  # nobody else is up with the model: nothing to wait for
            placed = await self.route(call, exclude=excluded)
            if isinstance(placed, Refusal) and placed.reason not in ("gpu-busy",
                                                                     "client-gone"):
                return None  # no other could ever take it: the failure is the answer
            return placed

        return retry

    def _spawn(self, coro: Coroutine[object, object, object]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- what the API asks besides routing ------------------------------------------------
    def providers_with(self, model: str) -> list[str]:
        """Providers whose last probe lists the model on disk or loaded."""
        now = self.clock()
        wanted = normalise_model(model)
        out = []
        for config in self.settings.providers:
            state = self.view.provider_state(config.name, now)
            if state is not None and state.ready and (
                    wanted in state.available_mib or wanted in state.loaded_mib):
                out.append(config.name)
        return out

    def ready(self) -> bool:
        """Can place calls: a static endpoint, or at least one provider with fresh state."""
        if self.pool.static is not None:
            return True
        now = self.clock()
        return any((s := self.view.provider_state(c.name, now)) is not None and s.ready
                   for c in self.settings.providers)

    def automatic_context(self, provider: str, model: str) -> tuple[int, int]:
        """num_ctx as Ollama records it, and the context, of a copy it loads for a call that
        sets none (all a call over the OpenAI or Anthropic API can join)."""
        config = next(c for c in self.settings.providers if c.name == provider)
        view = self.view.provider_view(config, self.clock())
        resolved = context.for_card(view, view.models.get(model), 0)
        return resolved.requested, resolved.context

    # -- dry run ---------------------------------------------------------------------------
    def explain(self, phase: str, model: str | None, prompt_chars: int, num_ctx: int | None
                ) -> tuple[Decision, tuple[Verdict, ...], CallSpec] | None:
        candidates = self.candidates(phase, model)
        if not candidates:
            return None
        call = CallRequest("/api/chat", model, phase, prompt=PromptSize(prompt_chars),
                           num_ctx=num_ctx)
        spec = self.spec(call, candidates)
        decision, verdicts = explain(spec, self.snapshot(self.clock()), self.policy)
        return decision, verdicts, spec

