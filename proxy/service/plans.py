"""Planning at selection: place a thread's first call early, hold the ticket, start the load.

The first call carrying the thread id takes the held plan when its provider is still ready
and its context holds the real prompt; otherwise the plan is released and the call placed
afresh. Unused plans are released after three minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.core.context import fits
from proxy.core.placement import in_tolerance
from proxy.core.tokens import PromptSize
from proxy.core.types import CallSpec, Circuit, Placement, Snapshot
from proxy.observability.logging import get_logger
from proxy.ports import SYSTEM_CLOCK, Clock, StoreUnavailable, UpstreamError
from proxy.service.claims import Claimed, LoadState, recheck_after_s
from proxy.service.routing import CallRequest, Granted
from proxy.service.scheduler import Scheduler

log = get_logger("kubemoot.plans")
PLAN_TTL_S = 180.0
# A plan made without promptChars is sized for a typical first mulling prompt (the design
# doc's "assumed prompt size"); the call that takes the plan is checked with its real one.
ASSUMED_PROMPT_CHARS = 16000


@dataclass(frozen=True)
class PlanLimits:
    max_plans: int  # held at once by this agent
    memory_share: float  # of the fleet's usable memory that every agent's plans may hold


@dataclass
class HeldPlan:
    thread: str
    claimed: Claimed
    spec: CallSpec
    created: float
    intents: tuple[str, ...]
    loader: asyncio.Task[bool] | None = None
    # set once the loader's victims are gone (or it gave up on them): until then a call
    # sent to the card would have Ollama unload what is still there itself
    room_made: asyncio.Event = field(default_factory=asyncio.Event)


class PlanBook:
    """Plans held for threads; a thread's first call takes its plan (`take`)."""

    def __init__(self, scheduler: Scheduler, limits: PlanLimits, ttl_s: float = PLAN_TTL_S,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.scheduler = scheduler
        self.limits = limits
        self.ttl_s = ttl_s
        self.clock = clock
        self.plans: dict[str, HeldPlan] = {}
        self._reaper: asyncio.Task[None] | None = None
        # a thread's create, take and release run one at a time: a plan made while another
        # was being made for the thread would replace it unreleased, its ticket renewed on
        self._thread_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._creating = 0  # plans past the limit check, not yet in `plans`

    @contextlib.asynccontextmanager
    async def _serialised(self, thread: str) -> AsyncIterator[None]:
        lock, users = self._thread_locks.get(thread) or (asyncio.Lock(), 0)
        self._thread_locks[thread] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._thread_locks[thread]
            if users == 1:
                del self._thread_locks[thread]
            else:
                self._thread_locks[thread] = (lock, users - 1)

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for thread in list(self.plans):
            await self.release(thread)

    async def _reap(self) -> None:
        while True:  # a safety net for plans nobody used or released
            await asyncio.sleep(min(5.0, self.ttl_s / 4))
            now = self.clock.monotonic()
            for thread, plan in list(self.plans.items()):
                if now - plan.created > self.ttl_s:
                    log.info("held plan expired unused", thread=thread)
                    await self.release(thread)

    async def create(self, thread: str, phase: str, model: str | None,
                     prompt_chars: int | None) -> dict[str, Any]:
        async with self._serialised(thread):
            await self._release(thread)  # a thread holds one plan: a new one replaces it
            limit = self.limits.max_plans
            held = len(self.plans) + self._creating
            if held >= limit:
                return {"thread": thread, "planned": False, "refusal": "plan-limit",
                        "reason": f"this agent holds {held} plans already, the most it may "
                                  f"(KUBEMOOT_MAX_PLANS {limit}); release one first"}
            self._creating += 1
            try:
                return await self._create(thread, phase, model, prompt_chars)
            finally:
                self._creating -= 1

    async def _create(self, thread: str, phase: str, model: str | None,
                      prompt_chars: int | None) -> dict[str, Any]:
        s = self.scheduler
        candidates = s.candidates(phase, model)
        if not candidates:
            return {"thread": thread, "planned": False, "reason": "no model to plan for"}
        chars = prompt_chars if prompt_chars is not None else ASSUMED_PROMPT_CHARS
        call = CallRequest("/api/chat", model, phase, thread, prompt=PromptSize(chars))
        spec = s.spec(call, candidates)
        acceptable = tuple(c.model for c in (spec.preferred, *in_tolerance(spec)))
        await s.demand.selected(acceptable)
        for m in acceptable:
            await s.demand.intend(m)
        reserved = await s.decide_and_reserve(spec, plan=True)
        decision = reserved.decision
        over = self._over_share(decision.placement, reserved.snapshot)
        claimed = None
        if over is not None:
            s.unreserve(reserved)
        elif reserved.ticket is not None:
            claimed = await s.claim_reserved(reserved)
        if claimed is None:
            for m in acceptable:
                await s.demand.drop_intent(m)
            if over is not None:
                return {"thread": thread, "planned": False, "refusal": "plan-memory",
                        "reason": over}
            reason = decision.reason
            if prompt_chars is None and decision.outcome == "prompt-too-large":
                reason += (f" (no promptChars was given: a prompt of {ASSUMED_PROMPT_CHARS} "
                           "characters was assumed; send the thread's promptChars)")
            return {"thread": thread, "planned": False, "outcome": decision.outcome,
                    "reason": reason}
        placement = claimed.placement
        plan = HeldPlan(thread, claimed, spec, self.clock.monotonic(), acceptable)
        s.claims.hold(claimed)
        if placement.loads:
            plan.loader = asyncio.create_task(self._load(claimed, plan.room_made))
            plan.loader.add_done_callback(lambda _: plan.room_made.set())  # (however it ends)
        else:
            plan.room_made.set()
        self.plans[thread] = plan
        return {"thread": thread, "planned": True, "provider": placement.provider,
                "model": placement.model, "placement": placement.kind,
                "evicts": list(placement.evicts), "reason": decision.reason}

    def _over_share(self, placement: Placement | None, snapshot: Snapshot) -> str | None:
        """Loads held for plans (every agent's, as the shared tickets show them) may take at
        most KUBEMOOT_PLAN_MEMORY_SHARE of the fleet's usable memory, though one alone may
        always be held; why this one may not, or None."""
        if placement is None or not placement.loads:
            return None
        share = self.limits.memory_share
        usable = sum(self.scheduler.policy.usable_mib(v.total_vram_mib, v.gpus)
                     for v in snapshot.providers if v.total_vram_mib)
        held = sum(t.footprint_mib for t in snapshot.tickets
                   if t.plan and t.cold and t.expires_at > snapshot.now)
        if usable and held and held + placement.footprint_mib > share * usable:
            return (f"plans hold {held} MiB already; {placement.footprint_mib} MiB more would "
                    f"pass {share:.0%} of the fleet's {usable} MiB usable "
                    "(KUBEMOOT_PLAN_MEMORY_SHARE)")
        return None

    async def _load(self, claimed: Claimed, room_made: asyncio.Event) -> bool:
        """Unload the victims (`room_made` set once they are gone) and start loading, so the
        load overlaps prompt building; True once the model is loaded."""
        placement = claimed.placement
        client = self.scheduler.pool.clients[placement.provider]
        try:
            learning = self.scheduler.learning
            if placement.evicts:
                learning.observe_unload(placement,
                                        await self.scheduler.evictions.make_room(claimed))
            room_made.set()
            view = self.scheduler.provider_view(placement.provider)
            info = view.models.get(placement.model)
            started = self.clock.monotonic()
            await client.load(view.own_name(placement.model), placement.num_ctx,
                              embedding=info is not None and info.embedding)
            # a preload's answer carries no load_duration: it returns once the copy is ready
            learning.observe_load(placement, self.clock.monotonic() - started,
                                  view.disk_mib.get(placement.model),
                                  self.scheduler.policy.load_startup_s)
        except (UpstreamError, StoreUnavailable) as exc:
            log.warning("plan preload failed", provider=placement.provider, error=str(exc))
            return False
        return True

    async def release(self, thread: str) -> bool:
        async with self._serialised(thread):
            return await self._release(thread)

    async def _release(self, thread: str) -> bool:
        plan = self.plans.pop(thread, None)
        if plan is None:
            return False
        loader = plan.loader
        # a load under way is cancelled: its connection closes and Ollama aborts it
        state: LoadState = "abandoned"
        if loader is not None and loader.done() and not loader.cancelled():
            state = "loaded" if loader.result() else "failed"
        if loader is not None:
            loader.cancel()
        with contextlib.suppress(Exception):
            await self.scheduler.claims.release_plan(plan.claimed, state)
        if after_s := recheck_after_s(plan.claimed.placement, state):
            self.scheduler.spawn(self.scheduler.claims.prober.refresh(
                plan.claimed.placement.provider, after_s=after_s))
        for m in plan.intents:
            await self.scheduler.demand.drop_intent(m)
        return True

    def _still_good(self, plan: HeldPlan, call: CallRequest) -> bool:
        s = self.scheduler
        placement = plan.claimed.placement
        candidates = s.candidates(call.phase, call.model) or ()
        if placement.model not in {c.model for c in candidates}:
            return False
        view = s.provider_view(placement.provider)
        if not view.ready:
            return False
        if s.experience.health(s.clock.now())[placement.provider].circuit is Circuit.OPEN:
            return False  # failing (or its one trial call is out): placed afresh, elsewhere
        if not placement.loads and placement.copy_model not in {
                r.model for r in view.residents if not r.leaving}:
            return False  # its ticket holds a call's share of a copy that has gone since
        if call.num_ctx and placement.context_length and \
                call.num_ctx > placement.context_length:
            return False
        if not call.pins_context and placement.num_ctx and placement.num_ctx not in \
                s.automatic_context(placement.provider, placement.model):
            return False  # sent without num_ctx, it would make Ollama reload the copy
        return fits(s.learning.prompt_tokens(call), placement.context_length,
                    call.num_predict or s.learning.expected_answer(placement.model),
                    call.generates, capped=call.num_predict > 0)

    async def take(self, call: CallRequest) -> Granted | None:
        """The call's thread's held plan as its first attempt, when the plan still suits
        the call; otherwise the plan is released and None says to place the call afresh."""
        if not call.thread or (call.thread not in self.plans
                               and call.thread not in self._thread_locks):
            return None  # (no plan held or being made: no lock to take)
        async with self._serialised(call.thread):
            plan = self.plans.get(call.thread)
            if plan is None:
                return None
            await plan.room_made.wait()  # (its ticket plans the victims gone meanwhile)
            if not self._still_good(plan, call):
                await self._release(plan.thread)
                return None
            del self.plans[call.thread]
        for m in plan.intents:
            await self.scheduler.demand.drop_intent(m)
        spec = self.scheduler.spec(call, plan.spec.candidates)
        granted = await self.scheduler.start_claimed(plan.claimed, call, spec, 0,
                                                     held_plan=True)
        return replace(granted, preload=plan.loader)
