"""A call's life: its attempts, placed, claimed, re-placed and settled in one place.

The relay sends each attempt and reports how it ended; everything else about the call (the
held plan it may take, the retry on another provider, the re-placement of a prompt the
engine found too long, the ticket's release, what is learned, the metrics and the log line)
happens here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace

from proxy.core.context import could_run_in
from proxy.core.engine_errors import is_out_of_memory, runner_closed
from proxy.core.occupancy import copy_users, loaded_again
from proxy.core.tickets import Residency
from proxy.core.types import Circuit, Placement, ProviderView, WaitNeed
from proxy.observability.logging import get_logger
from proxy.observability.metrics import Metrics
from proxy.observability.recent import RecentCalls
from proxy.ports import StoreUnavailable
from proxy.service.claims import Claimed, Claims, left_loaded, load_state, recheck_after_s
from proxy.service.codec import ProviderState
from proxy.service.demand import ANY_COPY, DemandBoard
from proxy.service.evictions import Evictions
from proxy.service.experience import CacheCheck, Experience
from proxy.service.plans import PlanBook
from proxy.service.prober import Prober
from proxy.service.routing import (
    CLOUD,
    STATIC,
    Attempt,
    CallOutcome,
    CallRequest,
    Granted,
    Refusal,
)
from proxy.service.scheduler import Scheduler

# How long the answer to a call its card failed waits for that card's probe
FAILED_CARD_PROBE_WAIT_S = 1.0
# A keep-alive a call sets this short or shorter is recorded with its release: a probe may not
# see the copy's new expiry (Ollama sets it as the call ends) before the copy goes. A longer
# one leaves the view at the last probe's expiry, which is then the sooner (the safe side).
SHORT_KEEP_ALIVE_S = 60.0

log = get_logger("kubemoot.calls")
# How often a plan's preload left going on for other calls checks that one still wants its
# copy, besides on every change to the state or tickets seen (a waiter's line may move
# in another sidecar's demand entry first)
PRELOAD_RECHECK_S = 0.5
# A retry of a failed attempt only when the others could still take the call (after a wait).
RETRY_REFUSALS = ("gpu-busy", "client-gone")
# One prompt per call on these, so characters over the engine's count is a ratio.
LEARNS_RATIO = ("/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions",
                "/v1/responses", "/v1/messages")


class CallService:
    """Implements the `Calls` seam the API calls for every inference request."""

    def __init__(self, *, scheduler: Scheduler, plans: PlanBook, claims: Claims,
                 evictions: Evictions, experience: Experience, demand: DemandBoard,
                 prober: Prober, metrics: Metrics, recent: RecentCalls | None = None) -> None:
        self.scheduler = scheduler
        self.plans = plans
        self.claims = claims
        self.evictions = evictions
        self.experience = experience
        self.demand = demand
        self.prober = prober
        self.metrics = metrics
        self.recent = recent or RecentCalls()  # this sidecar's, for the status page
        self.clock = scheduler.clock
        self._background: set[asyncio.Task[None]] = set()
        prober.watchers.append(self._probed)
        evictions.wanted = self.copy_in_demand

    def _probed(self, state: ProviderState) -> None:
        """A card that failed its calls as it went down takes a trial call once it answers
        its probes again, not after the whole cooldown (core/health.py)."""
        moved = self.experience.probed(state.name, state.ready, state.last_probed_at)
        if moved and state.ready:
            log.info("provider back after an outage: its circuit lets a trial call through",
                     provider=state.name)

    def bound_model(self, phase: str, thread: str | None) -> str:
        """The model a call that names none runs: its phase's preferred candidate."""
        candidates = self.scheduler.candidates(phase, None, thread, ask=False)
        return candidates[0].model if candidates else ""

    def attempts(self, call: CallRequest, started: float, cloud: Granted | None
                 ) -> CallAttempts:
        return CallAttempts(self, call, started, cloud)

    def cloud_attempt(self, call: CallRequest) -> Granted | None:
        return self.scheduler.cloud_attempt(call)

    def cloud_gateway(self) -> str | None:
        return self.scheduler.cloud_gateway()

    async def settle(self, claimed: Claimed, call: CallRequest, estimated_tokens: int,
                     outcome: CallOutcome, preload: asyncio.Task[bool] | None = None) -> None:
        """A claimed attempt ended: release its ticket (recording what its load left), and
        learn from the outcome: the provider's health, the prompt's size, the load's speed,
        the call's length. `preload`: its plan's load, going on for other calls
        (copy_wanted) until they want the copy no more (`_watch_preload`)."""
        placement = claimed.placement
        self.claims.unhold(claimed)
        now = self.clock.now()
        circuit = self.experience.record(placement.provider, outcome, now,
                                         claimed.ticket.ticket_id)
        # Open and half-open both read 1; only a recorded outcome moves it to or from 0.
        self.metrics.circuit_open.labels(placement.provider).set(
            0 if circuit is Circuit.CLOSED else 1)
        state = load_state(outcome)
        if preload is not None and state == "abandoned":
            state = "loading"
        loaded = left_loaded(placement, now, state)
        kept = False  # the plan's preload goes on for others
        if preload is not None and state == "loading" and loaded is not None:
            kept = True
            self._spawn(self._watch_preload(claimed, preload, loaded))
        # keep_alive 0 is carried out by the sidecar itself (Evictions.release_to_unload);
        # not on a preload kept for others: the copy is theirs (Ollama loads it again for
        # the next caller, at its keep_alive, once the requester leaves)
        unloads = call.unloads_after and not kept
        # Read from the card before the ticket that stood for the copy goes, when what it
        # holds is not what the ticket says:
        # - a load failed: the engine may have loaded the copy before failing the call (its
        #   runner died, a parser's error), and counts it until it is unloaded;
        # - the copy joined left before the call reached Ollama, which loaded it again.
        probed = (placement.loads and state == "failed") or (
            not placement.loads and self._copy_left(claimed))
        if probed:
            await self._probe_first(placement.provider)
        # Copies a failure leaves unusable are marked leaving before or with the ticket's
        # release, so no call the release wakes joins one
        out_of_memory = is_out_of_memory(outcome.error or "")
        if out_of_memory:
            await self.evictions.after_out_of_memory(placement.provider)
        failed_copy = None if out_of_memory or not outcome.engine_failed else \
            self.evictions.why_failure_unloads(
                placement.provider, claimed.ticket.model,
                closed=runner_closed(outcome.error or ""), parsed=not call.embeds,
                loaded_it=placement.loads and state == "loaded")
        if not unloads and failed_copy is None:
            # (keeps the copy over an unload deferred by an outage before it)
            self.evictions.kept(placement.provider, placement.copy_model,
                                claimed.ticket.started_at)
            if not kept:
                loaded = self._with_keep_alive(placement, call.keep_alive_s, loaded, now)
        release: Coroutine[object, object, object]
        if failed_copy is not None:
            release = self.evictions.release_after_failure(claimed, failed_copy)
        elif unloads:
            release = self.evictions.release_to_unload(claimed, loaded)
        else:
            release = self.claims.book(claimed).release(claimed.ticket, loaded)
        try:
            # A plain release finishes without suspending; one that records residency
            # (left loaded, or leaving) writes at once and must survive a cancelled caller.
            writes_now = unloads or loaded is not None or failed_copy is not None
            await (asyncio.shield(release) if writes_now else release)
        except StoreUnavailable:
            log.warning("ticket release not written; no longer counted here, written "
                        "when the store is back", provider=placement.provider,
                        ticket=claimed.ticket.ticket_id)
        if not writes_now and self._others_wait_for(placement):
            # Another sidecar's call waits for this slot: it sees the slot free only once the
            # release is written, so it is written now, not with the next write.
            self._spawn_release(claimed)
        if outcome.healthy:
            learning = self.experience.learning
            if call.path in LEARNS_RATIO and estimated_tokens:  # 0: placed to be cut
                learning.observe_prompt(call, outcome.prompt_eval_count)
                if outcome.prompt_eval_count and estimated_tokens:
                    self.metrics.prompt_estimate_ratio.observe(
                        outcome.prompt_eval_count / estimated_tokens)
            if placement.loads:
                learning.observe_load(placement, outcome.load_seconds, self.scheduler.provider_view(
                    placement.provider).disk_mib.get(placement.model),
                    self.scheduler.policy.load_startup_s)
            if outcome.began and not outcome.prompt_too_long:
                learning.observe_call(placement.provider, placement.model, outcome)
            if call.ends_loop_unless_tool_called and outcome.called_tools is False:
                learning.finished(call.conversation)
                self.metrics.tool_loops_ended.labels(placement.provider).inc()
            self.demand.note_use(placement.model)  # (a copy's is its users': copy_demand)
            self.demand.note_held(self.experience.learning.take_unshared())
        check = self.experience.learning.observe_prefill(
            placement.provider, placement.copy_model, claimed.ticket.ticket_id,
            self.scheduler.provider_view(placement.provider).version, outcome)
        if check is not None:
            self._count_cache(placement.provider, check)
        if outcome.model_missing:
            # Its listing is read again before the call is placed again or answered (and
            # published: every sidecar stops placing the model there at once)
            try:
                await self.prober.refresh(placement.provider)
            except Exception:  # (an odd answer, as a probe round survives: not the call's)
                log.exception("listing not read again after a 404",
                              provider=placement.provider)
        elif not outcome.healthy and not outcome.client_left:
            if not probed:
                await self._probe_first(placement.provider)
        elif placement.loads or not outcome.healthy:
            self._spawn(self.prober.refresh(placement.provider, after_s=recheck_after_s(
                placement, state)))

    def _with_keep_alive(self, placement: Placement, keep_alive_s: float | None,
                         loaded: Residency | None, now: float) -> Residency | None:
        """What the release records of the copy when the call set a short keep-alive: Ollama
        unloads the copy that long after the call ends (unless another call comes), sooner
        than the last probe may say; every view takes it so before the next probe."""
        if keep_alive_s is None or not 0 < keep_alive_s <= SHORT_KEEP_ALIVE_S:
            return loaded
        if loaded is not None:
            return replace(loaded, expires=now + keep_alive_s)
        view = self.scheduler.provider_view(placement.provider)
        copy = next((r for r in view.residents if r.model == placement.copy_model and
                     not r.leaving and not r.loading), None)
        return None if copy is None else Residency(
            copy.footprint_mib, copy.context_length, now, expires=now + keep_alive_s)

    def _copy_left(self, claimed: Claimed) -> bool:
        """Whether the copy a call joined is counted neither loaded nor being loaded on its
        card: Ollama loaded it again for the call (core `loaded_again`)."""
        provider = claimed.placement.provider
        view = self.scheduler.provider_view(provider)
        live = self.scheduler.view.ticket_set(provider, self.clock.now()).tickets.values()
        return loaded_again(view, claimed.ticket, live, {r.model for r in view.residents})

    async def _probe_first(self, provider: str) -> None:
        """What the card holds now is read before the call's end is told: after a failure
        (gone, restarted with nothing loaded, hung) the client's next call, often sent the
        moment it hears of it, must be placed on that, not on copies the card may have
        lost; after a copy Ollama loaded again unclaimed, or one a failed load may have
        left, no claim may count the card without it. For up to FAILED_CARD_PROBE_WAIT_S
        (a card that does not answer at all: the probe goes on unwaited)."""
        probe = self._spawn(self.prober.refresh(provider))
        # (too slow: it goes on unwaited; failed: the next probe round reads the card again)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(probe), FAILED_CARD_PROBE_WAIT_S)

    def _spawn(self, work: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _watch_preload(self, claimed: Claimed, preload: asyncio.Task[bool],
                             loading: Residency) -> None:
        """A plan's preload going on past its call (`loading` recorded in its release):
        stopped once no call waits for or holds the copy any more (they left too: Ollama
        aborts the load then, rather than hold the copy for nobody for its keep-alive).
        Ended unloaded, the copy is recorded abandoned, not counted loading for
        LOAD_GRACE_S; either way the card is probed."""
        changes = self.scheduler.changes
        try:
            while not preload.done():
                seen = changes.value
                if not self.copy_wanted(claimed):
                    preload.cancel()
                    break
                moved = asyncio.ensure_future(changes.wait_past(seen, PRELOAD_RECHECK_S))
                await asyncio.wait({preload, moved}, return_when=asyncio.FIRST_COMPLETED)
                moved.cancel()
        except asyncio.CancelledError:
            preload.cancel()  # (shutting down: no load goes on for nobody)
            raise
        provider = claimed.placement.provider
        if preload.done() and not preload.cancelled() and preload.exception() is None and \
                preload.result():
            await self.prober.refresh(provider)
            return
        with contextlib.suppress(StoreUnavailable):
            await self.claims.book(claimed).abandon_load(provider, claimed.ticket.model,
                                                         loading.at, self.clock.now())
        await self.prober.refresh(provider, after_s=recheck_after_s(claimed.placement,
                                                                    "abandoned"))

    def copy_wanted(self, claimed: Claimed) -> bool:
        """Whether a call besides `claimed`'s waits for the copy its placement loads (or for
        another model, with this one as a candidate) and could run on it, or holds a ticket
        on it: that call's request joins the load in Ollama, which aborts the load with the
        request that started it (server/sched.go:733-739). A waiter kept off the card (a
        retry's), or whose num_ctx or prompt the copy's context cannot hold, would have it
        unloaded or go elsewhere; a ticket that reloads the copy at another context is no
        call on it."""
        placement = claimed.placement
        snapshot = self.scheduler.snapshot(self.clock.now())
        view = self.scheduler.provider_view(placement.provider)
        users = set(copy_users(view, placement.copy_model))
        could_run = _could_run_on(placement, view)
        if any(could_run(m, need) for m in users
               if (d := snapshot.demand.get(m)) is not None
               for need in (*(d.needs or (ANY_COPY,) if d.waiters else ()), *d.backing)):
            return True
        return any(t.provider == placement.provider and t.model in users and
                   t.ticket_id != claimed.ticket.ticket_id and
                   placement.copy_model not in t.evicts for t in snapshot.tickets)

    def copy_in_demand(self, provider: str, copy: str) -> bool:
        """Whether a call waits for `copy`'s copy on `provider` (one of a model Ollama runs
        on it, not kept off the card) or holds a ticket on it that does not evict it: any
        sidecar's the views count, and this one's in-process. Unlike copy_wanted, a waiter
        whose context the copy may not hold counts too: keeping a copy is the safe side."""
        snapshot = self.scheduler.snapshot(self.clock.now())
        users = set(copy_users(self.scheduler.provider_view(provider), copy))
        if any(provider not in need.excludes for m in users
               if (d := snapshot.demand.get(m)) is not None
               for need in (*(d.needs or (ANY_COPY,) if d.waiters else ()), *d.backing)):
            return True
        return any(t.provider == provider and t.model in users and copy not in t.evicts
                   for t in snapshot.tickets)

    def _others_wait_for(self, placement: Placement) -> bool:
        """Whether another sidecar's call waits for the slot the placement held and could
        run on its copy (as copy_wanted has it): one of its model, or of any model Ollama
        runs on the copy (core/occupancy.py copy_users)."""
        view = self.scheduler.provider_view(placement.provider)
        could_run = _could_run_on(placement, view)
        return any(self.demand.others_waiting(m, functools.partial(could_run, m))
                   for m in (placement.model, *(u for u in copy_users(
                       view, placement.copy_model) if u != placement.model)))

    def _count_cache(self, provider: str, check: CacheCheck) -> None:
        metrics = self.metrics
        metrics.prompt_cache_expected_tokens.labels(provider).inc(check.expected)
        metrics.prompt_tokens.labels(provider, "evaluated").inc(check.evaluated)
        if check.found is not None:
            metrics.prompt_tokens.labels(provider, "cached").inc(check.found)
        if check.lost:
            metrics.prompt_cache_lost.labels(provider).inc()

    def _spawn_release(self, claimed: Claimed) -> None:
        async def write() -> None:
            with contextlib.suppress(StoreUnavailable):
                await self.claims.book(claimed).settle(claimed.placement.provider)

        self._spawn(write())


class CallAttempts:
    """One call's attempts, one at a time: a first one, at most one more on another provider
    after a failure before the answer began, and at most one more sized at the engine's
    count after it refused the prompt as longer than its context."""

    def __init__(self, service: CallService, call: CallRequest, started: float,
                 cloud: Granted | None) -> None:
        self.service = service
        self.call = call
        self.started = started
        self.cloud = cloud  # the call sent on to Ollama's cloud (asked once, by the API)
        self._current: Granted | None = None
        self._retried = False
        self._resized = False
        # Of the call's limit: its time before the first placement and what the failed
        # attempts waited for a GPU
        self._waited_s = 0.0

    async def first(self) -> Attempt | Refusal:
        s = self.service
        cloud = self.cloud
        if cloud is not None:
            if self.call.thread and await s.plans.release(self.call.thread):
                log.info("plan released: its thread's call went to the cloud",
                         thread=self.call.thread)
            return self._begin(cloud)
        # The limit runs from the request's arrival, as the client's clock does: reading
        # and checking its body (seconds for a large one on a busy core) count
        if self.call.arrived is not None:
            self._waited_s = max(0.0, s.clock.monotonic() - self.call.arrived)
        granted = await s.plans.take(self.call) or await s.scheduler.place_call(
            self.call, wait_limit_s=s.scheduler.settings.wait_limit_s - self._waited_s)
        if isinstance(granted, Refusal):
            s.metrics.refusals.labels(granted.reason).inc()
            log.info("call refused", path=self.call.path,
                     model=granted.model or self.call.model, reason=granted.reason)
            s.recent.add_refusal(granted.model or self.call.model, granted.reason,
                                 granted.message)
            return granted
        return self._begin(granted)

    def answering(self) -> None:
        """A stream's first bytes prove its card serves: a half-open circuit whose trial
        this is closes now, not when the answer ends (minutes for a long one)."""
        current = self._current
        if current is not None and current.claimed is not None and \
                self.service.experience.answering(current.attempt.provider,
                                                  current.claimed.ticket.ticket_id):
            self.service.scheduler.changes.bump()  # the calls waiting for the card go now

    async def again(self, outcome: CallOutcome) -> Attempt | Refusal | None:
        failed = self._current
        if failed is None:
            return None  # settled already: nothing failed here
        await self.settle(outcome)
        if failed.claimed is None:  # the static endpoint has no other
            return _too_long(failed, outcome) if outcome.prompt_too_long else None
        if outcome.prompt_too_long:
            return await self._resize(failed, outcome)
        return await self._retry_elsewhere(failed, outcome)

    async def _resize(self, failed: Granted, outcome: CallOutcome) -> Attempt | Refusal:
        """Placed again, sized at what the engine counted (at least the context)."""
        if self._resized:
            return _too_long(failed, outcome)
        self._resized = True
        tokens = outcome.prompt_eval_count or 0
        placed = await self.service.scheduler.place_call(self.call, tokens,
                                                         wait_limit_s=self._wait_left_s(failed))
        if isinstance(placed, Refusal):
            return placed
        log.info("placed again: the engine counted the prompt longer than its context",
                 failed=failed.attempt.provider, tokens=tokens,
                 provider=placed.attempt.provider)
        return self._begin(placed)

    async def _retry_elsewhere(self, failed: Granted, outcome: CallOutcome
                               ) -> Attempt | Refusal | None:
        """Placed again without the provider that failed, waiting for a GPU as a first
        attempt would, within what is left of the call's wait limit; None (the failure is
        the answer) when no other provider could take it at all, however long it waited."""
        scheduler = self.service.scheduler
        provider = failed.attempt.provider
        if self._retried or not scheduler.others_could_take(failed.spec, provider):
            return None
        self._retried = True
        placed = await scheduler.place_call(self.call, exclude=frozenset((provider,)),
                                            wait_limit_s=self._wait_left_s(failed))
        if isinstance(placed, Refusal):
            # Every other GPU stayed busy, or the agent left: that is the answer. Any other
            # refusal means no other could ever take it: the failure is the answer.
            if placed.reason not in RETRY_REFUSALS:
                return None
            return replace(placed, message=f"provider {provider} failed before answering "
                           f"({outcome.error}); {placed.message}")
        log.info("retrying on another provider", failed=provider, cause=outcome.error,
                 provider=placed.attempt.provider, model=placed.attempt.model)
        return self._begin(placed)

    def _wait_left_s(self, failed: Granted) -> float:
        """What is left of the call's wait limit: its time before the first placement and what
        its attempts waited for a GPU count, their time at the provider does not."""
        self._waited_s += failed.attempt.waited_ms / 1000
        return self.service.scheduler.settings.wait_limit_s - self._waited_s

    def _begin(self, granted: Granted) -> Attempt:
        attempt = granted.attempt
        self._current = granted
        # (a provider's placement runs a model it lists; the static endpoint and the cloud,
        # any name sent)
        model = self.service.scheduler.model_label(attempt.model) \
            if attempt.placement in (STATIC, CLOUD) else attempt.model
        self.service.metrics.placements.labels(attempt.placement, attempt.provider,
                                               model).inc()
        self.service.metrics.in_flight.labels(attempt.provider).inc()
        return attempt

    async def settle(self, outcome: CallOutcome) -> None:
        current, self._current = self._current, None
        if current is None:
            return  # settled already
        preload = None
        if current.preload is not None and not current.preload.done():
            # its load is unwanted (the agent left, the attempt failed): its request closes,
            # and Ollama aborts the load; unless another call waits for that copy or joined it
            if current.claimed is not None and outcome.client_left and \
                    self.service.copy_wanted(current.claimed):
                preload = current.preload
            else:
                current.preload.cancel()
        attempt = current.attempt
        metrics = self.service.metrics
        metrics.in_flight.labels(attempt.provider).dec()
        metrics.upstream_seconds.labels(attempt.provider).observe(outcome.seconds)
        if not outcome.healthy and not outcome.client_left:
            metrics.upstream_errors.labels(attempt.provider).inc()
        seconds = round(time.perf_counter() - self.started, 4)
        # (a call that joined another model's copy of its weights file names that copy)
        joined = current.claimed.placement.copy if current.claimed is not None else ""
        log.info("call", provider=attempt.provider, model=attempt.model,
                 **({"copy": joined} if joined else {}),
                 placement=attempt.placement, evicted=list(attempt.evicted),
                 waited_ms=attempt.waited_ms, prompt_chars=self.call.prompt.chars,
                 estimated_prompt_tokens=attempt.estimated_tokens,
                 reported_prompt_tokens=outcome.prompt_eval_count,
                 answered=outcome.answered, healthy=outcome.healthy,
                 error=outcome.error, seconds=seconds, binding=attempt.binding)
        self.service.recent.add_call(attempt.model, attempt.provider, attempt.placement,
                                     attempt.evicted, attempt.waited_ms, seconds, outcome.answered,
                                     outcome.error)
        if current.claimed is not None:
            await self.service.settle(current.claimed, self.call, attempt.estimated_tokens,
                                      outcome, preload)


def _could_run_on(placement: Placement, view: ProviderView
                  ) -> Callable[[str, WaitNeed], bool]:
    """Whether a call of a model waiting with `need` could run on the placement's copy: not
    kept off its card (a retry's), its num_ctx and prompt within the copy's context."""
    def could_run(model: str, need: WaitNeed) -> bool:
        info = view.models.get(model)
        return placement.provider not in need.excludes and could_run_in(
            placement.context_length, need.num_ctx, need.prompt_tokens,
            info.trained_context if info is not None else 0)
    return could_run


def _too_long(failed: Granted, outcome: CallOutcome) -> Refusal:
    return Refusal("prompt-too-large", f"provider {failed.attempt.provider} refused the "
                   f"prompt as longer than its context ({outcome.prompt_eval_count} tokens or "
                   "more)", failed.attempt.model)
