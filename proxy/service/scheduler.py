"""Placing one attempt: snapshot -> core.place -> reserve -> claim -> unload victims.

This is the imperative shell around `proxy.core`. A call's attempts (service/calls.py) ask it
for each placement; it waits for capacity (woken by the store's change counter, never by
polling) when the core says the GPUs are busy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace

from proxy.core import context
from proxy.core.cloud import cloud_provider, gateway
from proxy.core.lengths import CallLength
from proxy.core.models import (
    ANY_SPELLING_SINCE,
    CLOUD_SOURCE,
    LOCAL_SOURCE,
    SOURCE_SUFFIXES_SINCE,
    CallModels,
    model_key,
    not_found,
    resolve_model,
    split_source,
)
from proxy.core.placement import NO_PROVIDER_REACHABLE, explain, place, runnable_alternatives
from proxy.core.policy import Policy
from proxy.core.tokens import PromptSize
from proxy.core.types import (
    CallSpec,
    Candidate,
    Circuit,
    Decision,
    ProviderHealth,
    ProviderView,
    Snapshot,
    Ticket,
    Verdict,
    WaitNeed,
)
from proxy.core.waitline import YIELD_S, slack_s, yields_to_sooner
from proxy.observability.logging import get_logger
from proxy.observability.metrics import Metrics
from proxy.ports import SYSTEM_CLOCK, ChangeCounter, Clock, ModelServer
from proxy.service.bindings import Bindings
from proxy.service.claims import LOADS_PAUSED, Claimed, Claims
from proxy.service.demand import DemandBoard, WaitEntry, without_waiter
from proxy.service.evictions import Evictions
from proxy.service.experience import Experience
from proxy.service.routing import (
    CLOUD,
    STATIC,
    Attempt,
    CallRequest,
    Granted,
    ProviderPool,
    Refusal,
)
from proxy.service.snapshot import StateView
from proxy.settings import ProviderConfig

log = get_logger("kubemoot.scheduler")
MAX_CLAIM_ROUNDS = 5
CLAIM_GRACE_S = 0.5  # how long past its wait limit a call's claim may still take


@dataclass(frozen=True)
class Reserved:
    """A decision, the state it was made on, and its placement's ticket (None when it
    placed nothing), counted by the next decisions until its claim comes back."""

    decision: Decision
    snapshot: Snapshot
    ticket: Ticket | None


@dataclass(frozen=True)
class PlacementSettings:
    models: CallModels
    tolerance: float  # how far below the preferred score a fallback candidate may be
    wait_limit_s: float  # how long a call may wait for a GPU
    providers: tuple[ProviderConfig, ...]


class Scheduler:
    bindings: Bindings | None = None  # the binder's live bindings (shared state), set by app

    def __init__(self, *, settings: PlacementSettings, pool: ProviderPool,
                 changes: ChangeCounter,
                 view: StateView, demand: DemandBoard, claims: Claims, evictions: Evictions,
                 experience: Experience, metrics: Metrics, policy: Policy,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.settings = settings
        self.providers = {c.name: c for c in settings.providers}
        self.pool = pool
        self.changes = changes  # every write to state or tickets seen moves it
        self.view = view
        self.demand = demand
        self.claims = claims
        self.evictions = evictions
        self.experience = experience
        self.learning = experience.learning
        self.metrics = metrics
        self.policy = policy
        self.clock = clock
        self._background: set[asyncio.Task[object]] = set()
        self._placing = asyncio.Lock()  # see decide_and_reserve
        # This sidecar's waiting retries and the providers they left: no slot there is due
        # to them (see _line_at)
        self._retries_waiting: dict[WaitEntry, frozenset[str]] = {}

    # -- inputs ----------------------------------------------------------------------------
    def candidates(self, phase: str, model: str | None, thread: str | None = None,
                   ask: bool = True) -> tuple[Candidate, ...] | None:
        found = self._configured(phase, model, thread, ask)
        if not found:
            return found
        known, canonical = self._names()
        # (a configured `x:local` is x, as a call names it: core/models.py split_source)
        return tuple(replace(c, model=_placed(split_source(c.model)[0], known, canonical))
                     for c in found)

    def _configured(self, phase: str, model: str | None, thread: str | None, ask: bool
                    ) -> tuple[Candidate, ...] | None:
        """The call's candidates as the binding (else the env) names them."""
        return self.bindings.for_call(phase, model, thread, ask) if self.bindings is not None \
            else self.settings.models.for_call(phase, model)

    def resolve(self, model: str) -> str:
        """The spelling of `model` the providers list (Ollama's own case-insensitive match),
        and of the names of one model the one it is placed under (core/aliases.py)."""
        return _placed(model, *self._names())

    def _names(self) -> tuple[set[str], Mapping[str, str]]:
        """The names the providers list, and the names of one model (StateView.canonical)."""
        now = self.clock.now()
        return self.view.known_models(now), self.view.canonical(now)

    def model_label(self, model: str) -> str:
        """`model` as a metrics label when a provider lists it, else "-": a series for every
        name a client may send would grow /metrics without bound."""
        return model if model in self.view.known_models(self.clock.now()) else "-"

    def binding_label(self, call: CallRequest) -> str:
        """Where the candidates just resolved for `call` came from (source@revision)."""
        return self.bindings.used(call.phase, call.thread).label() if self.bindings else "env"

    def snapshot(self, now: float, exclude: frozenset[str] = frozenset(),
                 waiter: WaitEntry | None = None) -> Snapshot:
        """The state a decision reads; a waiting call's (`waiter`) without its own wait
        entry among the demand it weighs."""
        demand = self.demand.view()
        if waiter is not None:
            demand = without_waiter(demand, waiter.model, waiter.turn, waiter.also,
                                    waiter.need)
        snapshot = self.view.snapshot(now, self.experience.health(now), demand,
                                      self.learning.loads, self.claims.uncounted(now),
                                      self.learning.lengths)
        if self._saw_probes(snapshot.providers):  # (before any exclusion marks a card down)
            snapshot = replace(snapshot, health=self.experience.health(now))
        snapshot = self.learning.with_caches(snapshot, self.demand.shared_caches())
        if not exclude:
            return snapshot
        # Left out, not marked down: the call never goes back to a card that failed it, so
        # nothing of its should be waited for (others_could_take asks the same fleet).
        return replace(snapshot, providers=tuple(
            v for v in snapshot.providers if v.name not in exclude))

    def _saw_probes(self, views: tuple[ProviderView, ...]) -> bool:
        """Tell each open circuit what the latest probe of its card found (published by
        another process when the state is shared); True when a circuit moved."""
        moved = False
        for view in views:
            if view.probed_at:
                moved = self.experience.probed(view.name, view.ready, view.probed_at) or moved
        return moved

    def spec(self, call: CallRequest, candidates: tuple[Candidate, ...], at_least: int = 0
             ) -> CallSpec:
        tokens = max(at_least, self.learning.prompt_tokens(call))
        return CallSpec(candidates, prompt_tokens=tokens,
                        num_ctx=call.num_ctx or 0, num_predict=call.num_predict,
                        expected_answer=self.learning.expected_answer(candidates[0].model),
                        pins_context=call.pins_context, generates=call.generates,
                        tolerance=self.bindings.tolerance(call.phase, call.thread)
                        if self.bindings else self.settings.tolerance,
                        phase="triage" if call.phase == "triage" else "mulling",
                        can_wait=call.can_wait, wait_left_s=self.settings.wait_limit_s,
                        conversation=self.learning.conversation(call, tokens),
                        needs=call.needs, embeds=call.embeds, served=call.served,
                        path=call.path, refused_by=call.refused_by,
                        body_check=call.body_check)

    def work(self, spec: CallSpec) -> CallLength | None:
        """The call's expected length, wherever it runs: what orders it among the calls
        waiting for its model (core/waitline.py)."""
        return self.learning.lengths.work(spec.preferred.model, prompt_tokens=spec.prompt_tokens,
                                          num_predict=spec.num_predict)

    # -- the call path ---------------------------------------------------------------------
    async def place_call(self, call: CallRequest, at_least_tokens: int = 0,
                         exclude: frozenset[str] = frozenset(),
                         wait_limit_s: float | None = None) -> Granted | Refusal:
        """Place the call (waiting for capacity if need be); `at_least_tokens`: what the
        engine counted of its prompt after refusing it as longer than a context; `exclude`:
        providers that failed it; `wait_limit_s`: what is left of the call's wait limit
        (the whole limit when None).

        Late binding: a call that must wait for a slot stays here, not in an engine's queue,
        as a wait entry carrying its turn; every change places it again, so it takes the
        first slot that frees on any card (or a load once cheaper, or once the wait is
        expected to outlast what is left of the limit). A slot is due to the model's waiting
        calls with sooner turns first, on any sidecar (core/waitline.py), for at most YIELD_S.
        A call that cannot wait is never queued at a busy copy: when the decision is to wait,
        it goes to the static endpoint, or is refused gpu-busy with Retry-After at once."""
        candidates = self.candidates(call.phase, call.model, call.thread)
        binding = self.binding_label(call)  # now: the binding may move while the call waits
        if not candidates:
            return Refusal("bad-request", "field 'model': a model is required (none in "
                           "the request and KUBEMOOT_MODEL_MODEL is not set)")
        spec = self.spec(call, candidates, at_least_tokens)
        if not self.pool.clients:  # no provider is known at all: the static endpoint
            return self._static_or_busy(call, spec, Decision("wait", None, "no providers"))
        started = self.clock.monotonic()
        arrived = self.clock.now()
        due = arrived + slack_s(self.work(spec))
        spec = replace(spec, turn=due)
        limit_s = self.settings.wait_limit_s if wait_limit_s is None else max(0.0, wait_limit_s)
        deadline = started + limit_s
        wait: WaitEntry | None = None
        waited = 0.0  # time blocked waiting for capacity (not claim round trips)
        ended = "cancelled"  # how a wait ended (kubemoot_wait_seconds' outcome)
        claim_rounds = 0
        yielding_since: float | None = None
        gone: asyncio.Future[None] | None = None
        try:
            while True:
                seen = self.changes.value
                # Each decision weighs what is left of the limit: a wait that would outlast
                # it loses to a load (at the deadline, any wait does)
                spec = replace(spec, wait_left_s=max(0.0, deadline - self.clock.monotonic()))
                reserved = await self.decide_and_reserve(spec, exclude, waiter=wait)
                decision = reserved.decision
                hold_s: float | None = None
                if reserved.ticket is not None:
                    placement = decision.placement
                    assert placement is not None
                    ahead = yields_to_sooner(placement, self._line_at(
                        placement.provider, reserved.snapshot, wait), self.policy, due)
                    now = self.clock.monotonic()
                    # a call that cannot wait and has no static endpoint to go to takes the
                    # slot: the calls due it can wait for the next, a refusal cannot
                    if ahead and not call.can_wait and self._static_for(call) is None:
                        ahead = 0
                    if ahead and (yielding_since is None or now - yielding_since < YIELD_S):
                        yielding_since = now if yielding_since is None else yielding_since
                        hold_s = YIELD_S - (now - yielding_since)
                        self.unreserve(reserved)
                        decision = replace(decision, outcome="wait", placement=None, reason=(
                            f"{ahead} call(s) waiting for {placement.model} are due its "
                            "free slot(s) first"))
                    elif placement.loads and not self.claims.may_load():
                        # queued rather than loaded in-process: Claims._claim
                        self.unreserve(reserved)
                        decision = replace(decision, outcome="wait", placement=None,
                                           reason=LOADS_PAUSED)
                    else:
                        if ahead:
                            log.info("taking a slot the calls due it first left unused",
                                     model=placement.model, older=ahead)
                        claimed = await self._claim_by(reserved, deadline)
                        if claimed is not None:
                            if wait is not None and self.demand.stop_waiting(wait):
                                self.changes.bump()  # our next waiter is next in line
                            ended = "placed"
                            return await self.start_claimed(claimed, call, spec,
                                                            int(waited * 1000), binding=binding)
                        claim_rounds += 1
                        if claim_rounds < MAX_CLAIM_ROUNDS and \
                                self.clock.monotonic() < deadline:
                            continue  # the state moved under us: decide again on fresh state
                        # The claims keep refusing what the decisions choose: wait for a
                        # change, like a busy call, within the same limits.
                        decision = replace(decision, outcome="wait", placement=None,
                                           reason="the GPUs' ticket sets refused "
                                                  f"{claim_rounds} claim(s) in a row")
                        claim_rounds = 0
                else:
                    yielding_since = None
                refusal = self._refusal(decision, call, spec)
                if refusal is not None and refusal.reason == "prompt-too-large" and \
                        call.cut_allowed and spec.prompt_tokens:
                    # The agent asked Ollama to cut what does not fit: placed as a prompt
                    # that fits anywhere (0 tokens: nothing of its count is learned).
                    log.info("placed to be cut, as the agent asked (truncate: true)",
                             model=spec.preferred.model, tokens=spec.prompt_tokens)
                    spec = replace(spec, prompt_tokens=0)
                    continue
                if refusal is not None:
                    ended = refusal.reason
                    return refusal
                # Busy: those who cannot wait go to the static endpoint, or get gpu-busy, now.
                if not call.can_wait:
                    return self._static_or_busy(call, spec, decision)
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    ended = "gpu-busy"
                    limit = f"{self.settings.wait_limit_s:g} s"  # the call's, in all: 1.5, not 2
                    return Refusal("gpu-busy", (
                        f"No GPU that can run {spec.preferred.model} came back within {limit}"
                        f" ({decision.reason}); check the providers."
                        if decision.reason.startswith(NO_PROVIDER_REACHABLE) else
                        # (the GPUs may be idle: it is the outage, not the capacity)
                        f"{spec.preferred.model} could not be loaded within {limit} "
                        f"({decision.reason}); check KUBEMOOT_NATS_URL's server."
                        if decision.reason == LOADS_PAUSED else
                        f"Every GPU that can run {spec.preferred.model} stayed busy for "
                        f"{limit} ({decision.reason}); "
                        "this is the cluster's capacity, ask again in a moment."),
                        spec.preferred.model, retry_after_s=5)
                if wait is None:
                    self.metrics.placements.labels(
                        "waiting", "-", self.model_label(spec.preferred.model)).inc()
                    # in its preferred model's line; the copies of the others it could run on
                    # are kept from eviction for it too (`also`)
                    try:  # (its write is awaited: a slow store must not outlast the limit)
                        async with asyncio.timeout(remaining):
                            wait = await self.demand.waiting(
                                spec.preferred.model, arrived, due,
                                WaitNeed(spec.num_ctx, spec.prompt_tokens, exclude),
                                runnable_alternatives(spec, reserved.snapshot, self.policy))
                    except TimeoutError:
                        continue  # (no entry left behind: waiting() ends its own)
                    if exclude:
                        self._retries_waiting[wait] = exclude
                    log.info("waiting for a GPU", model=wait.model, reason=decision.reason)
                if gone is None and call.disconnected is not None:
                    gone = asyncio.ensure_future(call.disconnected())
                blocked_at = self.clock.monotonic()
                wake_in = self._wake_in(reserved.snapshot, remaining)
                if hold_s is not None:  # the older calls' turn lasts YIELD_S at most
                    wake_in = max(0.001, min(wake_in, hold_s))
                changed = asyncio.ensure_future(self.changes.wait_past(seen, wake_in))
                await asyncio.wait({changed, *((gone,) if gone else ())},
                                   return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                waited += self.clock.monotonic() - blocked_at
                if gone is not None and gone.done():
                    log.info("client went away while waiting", model=wait.model)
                    ended = "client-gone"
                    return Refusal("client-gone", "the client went away while "
                                   "waiting for a GPU", spec.preferred.model)
        finally:
            if gone is not None:
                gone.cancel()  # before the response: the relay listens for disconnects too
            if wait is not None:
                self.metrics.wait_seconds.labels(ended).observe(waited)
                self._retries_waiting.pop(wait, None)
                if self.demand.stop_waiting(wait):
                    self.changes.bump()  # it left the line: the next call in it goes now
                self._spawn(self.demand.done_waiting(wait))

    def _line_at(self, provider: str, snapshot: Snapshot, waiter: WaitEntry | None
                 ) -> Snapshot:
        """The snapshot whose waiting line a slot on `provider` is due to: without this
        sidecar's retries that left that provider (they cannot take the slot, and a call must
        not stand aside for them)."""
        demand = snapshot.demand
        for entry, excluded in self._retries_waiting.items():
            if entry is not waiter and provider in excluded:
                demand = without_waiter(demand, entry.model, entry.turn)
        return snapshot if demand is snapshot.demand else replace(snapshot, demand=demand)

    async def decide_and_reserve(self, spec: CallSpec, exclude: frozenset[str] = frozenset(),
                                 plan: bool = False, waiter: WaitEntry | None = None
                                 ) -> Reserved:
        """Decide on fresh state and reserve the placement's ticket, one decision at a time
        in this process: each decision counts the tickets reserved before it, also those
        whose claim is still on its way to the store. Other sidecars are kept honest by the
        claim's compare-and-set."""
        await self._placing.acquire()
        try:
            decided_at = time.perf_counter()
            snapshot = self.snapshot(self.clock.now(), exclude, waiter)
            decision = place(spec, snapshot, self.policy)
            self.metrics.decision_seconds.observe(time.perf_counter() - decided_at)
            ticket = None
            if decision.placement is not None:
                ticket = self.claims.reserve(decision.placement, plan)
                if not plan:  # (a plan's call takes the trial once it goes: start_claimed)
                    # the trial of a half-open card from the decision on: the next decision
                    # runs before this claim's write returns
                    self.experience.start_trial(decision.placement.provider, self.clock.now(),
                                                ticket.ticket_id)
        finally:
            self._done_placing()
        return Reserved(decision, snapshot, ticket)

    def unreserve(self, reserved: Reserved) -> None:
        if reserved.ticket is not None:
            self.claims.unreserve(reserved.ticket)
            self.experience.end_trial(reserved.ticket.provider, reserved.ticket.ticket_id)

    async def claim_reserved(self, reserved: Reserved) -> Claimed | None:
        """Claim a reserved ticket in the store; None when the store refuses it."""
        assert reserved.decision.placement is not None and reserved.ticket is not None
        claimed = await self.claims.claim(reserved.decision.placement, reserved.snapshot,
                                          reserved.ticket)
        if claimed is None:
            self.experience.end_trial(reserved.ticket.provider, reserved.ticket.ticket_id)
        return claimed

    async def _claim_by(self, reserved: Reserved, deadline: float) -> Claimed | None:
        """claim_reserved, given up (as refused) once the call's wait limit has passed and
        CLAIM_GRACE_S more: a slow or failing store's round trips must not keep a call
        waiting past its limit. A claim made at the deadline still has its grace (a load
        that beats the wait is placed then: core/placement.py wait_loses)."""
        left = max(deadline - self.clock.monotonic(), 0.0) + CLAIM_GRACE_S
        try:
            async with asyncio.timeout(left):  # (on this task: the claim's write leaves now)
                return await self.claim_reserved(reserved)
        except TimeoutError:
            # (its write may still land: TicketBook.claim owes its release when cancelled)
            assert reserved.ticket is not None
            self.experience.end_trial(reserved.ticket.provider, reserved.ticket.ticket_id)
            log.info("claim given up at the wait limit", provider=reserved.ticket.provider,
                     model=reserved.ticket.model)
            return None

    def _done_placing(self) -> None:
        """Let the next decision run on the loop's next turn, not this one. A burst of calls
        that arrive together would otherwise all decide in one turn, and each would wait for
        the whole burst's work: with NATS, not even the first claim leaves before the last
        decision (nats-py writes on the next turn); in-process, no answer is read or relayed
        meanwhile."""
        asyncio.get_running_loop().call_soon(self._placing.release)

    def _wake_in(self, snapshot: Snapshot, remaining: float) -> float:
        """Until the earliest ticket expiry or circuit half-opening (both silent), the
        deadline at the latest."""
        expiries = [t.expires_at - snapshot.now for t in snapshot.tickets]
        half_open = self.experience.next_half_open(snapshot.now)
        if half_open is not None:
            expiries.append(half_open - snapshot.now)
        soonest = min((e for e in expiries if e > 0), default=remaining)
        return max(0.01, min(remaining, soonest + 0.01))

    def _refusal(self, decision: Decision, call: CallRequest, spec: CallSpec) -> Refusal | None:
        model = spec.preferred.model
        if call.model and model_key(call.model) == model_key(model):
            model = call.model  # the refusal names the model as the call did, as Ollama's does
            if call.source == LOCAL_SOURCE:
                model = f"{model}:{LOCAL_SOURCE}"
        if decision.outcome == "model-not-found":  # Ollama's words name it as the call did
            # (or the bound model that runs for the deployed one's name, and is missing)
            return Refusal("model-not-found", not_found(model, not call.generates), model)
        if decision.outcome == "unsupported":  # Ollama's own refusal, without its load
            return Refusal("not-found" if decision.status == 404 else "bad-request",
                           decision.reason, model, status=decision.status or None)
        if decision.outcome == "prompt-too-large":
            return Refusal("prompt-too-large", decision.reason, model)
        if decision.outcome == "model-too-large":
            if not call.can_wait and self._static_for(call) is not None:
                return None  # cannot wait: the static endpoint takes it
            return Refusal("model-too-large", decision.reason, model)
        return None

    def _static_or_busy(self, call: CallRequest, spec: CallSpec, decision: Decision
                        ) -> Granted | Refusal:
        static = self._static_for(call)
        if static is None:
            return Refusal("gpu-busy", (
                f"No GPU has room for {spec.preferred.model} now ({decision.reason}) and this "
                "call cannot wait; set KUBEMOOT_MODEL_ENDPOINT for such calls or retry."),
                spec.preferred.model, retry_after_s=5)
        return Granted(Attempt(STATIC, static, spec.preferred.model, STATIC), None, spec)

    def cloud_attempt(self, call: CallRequest) -> Granted | None:
        """A call that a provider's Ollama sends on to its cloud (core/cloud.py) goes there as
        it came: no GPU, ticket or wait, nothing to size; None: the call is placed. The model
        is the one the call runs first: the one it names, or its binding's in its place (a
        deployed model's name the binding moved), or the phase's bound one."""
        if call.source == LOCAL_SOURCE:
            return None
        runs = self._configured(call.phase, call.model, call.thread, ask=False)
        if not runs:
            return None
        model, source = split_source(runs[0].model)  # (as configured: `x:local` is local)
        if source == LOCAL_SOURCE:
            return None
        now = self.clock.now()
        views = {c.name: self.view.provider_view(c, now) for c in self.settings.providers}
        if source != CLOUD_SOURCE and not any(v.remote for v in views.values()):
            return None  # (every call asks: the common answer costs no health or parsing)
        provider = cloud_provider(model, source, list(views.values()), self._reachable(views,
                                                                                  now))
        if provider is None:
            return None
        spec = CallSpec((Candidate(model),), prompt_tokens=0, generates=call.generates,
                        phase="triage" if call.phase == "triage" else "mulling")
        reads_source = context.parse_version(views[provider].version) >= SOURCE_SUFFIXES_SINCE
        return Granted(Attempt(provider, self.pool.clients[provider], model, CLOUD,
                               any_spelling=True, reads_source=reads_source,
                               binding=self.binding_label(call)), None, spec)

    def cloud_gateway(self) -> str | None:
        """The provider whose Ollama the sidecar reaches the cloud through, as for a cloud
        call: whose account is signed in, whose web search answers (core/cloud.py)."""
        now = self.clock.now()
        views = {c.name: self.view.provider_view(c, now) for c in self.settings.providers}
        return gateway(list(views.values()), self._reachable(views, now))

    def _reachable(self, views: dict[str, ProviderView], now: float) -> Callable[[str], bool]:
        """Whether a provider is up: ready, and its circuit not open."""
        health = self.experience.health(now)
        return lambda name: views[name].ready and \
            health.get(name, ProviderHealth()).circuit is not Circuit.OPEN

    def _static_for(self, call: CallRequest) -> ModelServer | None:
        return self.pool.static_triage if call.phase == "triage" else self.pool.static

    async def start_claimed(self, claimed: Claimed, call: CallRequest, spec: CallSpec,
                            waited_ms: int, held_plan: bool = False,
                            binding: str | None = None) -> Granted:
        """The claimed call's attempt, once its victims are gone (a held plan's went when
        the plan was made)."""
        placement = claimed.placement
        client = self.pool.clients[placement.provider]
        if not held_plan and placement.evicts:
            try:
                self.learning.observe_unload(placement, await self.evictions.make_room(claimed))
            except BaseException:  # failed or cancelled: the call never reaches its GPU
                self.experience.end_trial(placement.provider, claimed.ticket.ticket_id)
                self._spawn(self.claims.book(claimed).release(claimed.ticket))
                raise
        self.experience.start_trial(placement.provider, self.clock.now(),
                                    claimed.ticket.ticket_id)
        view = self.provider_view(placement.provider)
        version = context.parse_version(view.version)
        self.learning.sent(placement, spec.conversation, view, claimed.ticket.ticket_id,
                           self.clock.now())
        self.claims.hold(claimed)
        attempt = Attempt(placement.provider, client, placement.model,
                          "held" if held_plan else placement.kind,
                          evicted=tuple(placement.evicts), waited_ms=waited_ms,
                          num_ctx=placement.num_ctx if call.pins_context else 0,
                          strip_keep_alive=call.unloads_after,
                          shift_at_load=version >= context.SHIFT_AT_LOAD_SINCE,
                          any_spelling=version >= ANY_SPELLING_SINCE,
                          reads_source=version >= SOURCE_SUFFIXES_SINCE,
                          estimated_tokens=spec.prompt_tokens,
                          context_length=placement.context_length,
                          names_here=view.aliases.get(placement.model, ()),
                          binding=self.binding_label(call) if binding is None else binding,
                          watches_tool_calls=call.ends_loop_unless_tool_called)
        return Granted(attempt, claimed, spec)

    def others_could_take(self, spec: CallSpec, failed: str) -> bool:
        """Whether a provider other than the one that failed the call could take it, now or
        by waiting for a slot or a load there: the fleet of the other cards that are up
        (ready, circuit not open) places the call or waits for one of them. The failed card
        and those down are left out of that fleet, not only marked down: for them the
        placement waits for a card to come back, which no retry should."""
        snapshot = self.snapshot(self.clock.now())
        up = tuple(v for v in snapshot.providers if v.name != failed and v.ready and
                   snapshot.health.get(v.name, ProviderHealth()).circuit is not Circuit.OPEN)
        if not up:
            return False
        decision = place(spec, replace(snapshot, providers=up), self.policy)
        return decision.outcome in ("placed", "wait")

    async def unload_everywhere(self, model: str) -> list[str]:
        """A client's explicit unload: see Evictions.unload_everywhere."""
        return await self.evictions.unload_everywhere(self.resolve(model),
                                                      self.snapshot(self.clock.now()))

    def spawn(self, coro: Coroutine[object, object, object]) -> None:
        """Run `coro` in the background, kept until it ends."""
        self._spawn(coro)

    def _spawn(self, coro: Coroutine[object, object, object]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- what the API asks besides routing ------------------------------------------------
    def providers_with(self, model: str) -> list[str]:
        """Providers whose fresh state lists the model on disk or loaded, under this name
        (a request passed on names it as the agent did)."""
        now = self.clock.now()
        return self.view.providers_with(resolve_model(model, self.view.known_models(now)), now)

    def ready(self) -> bool:
        """Can place calls: a static endpoint, or at least one provider with fresh state."""
        return self.pool.static is not None or self.view.any_ready(self.clock.now())

    def unreachable(self) -> set[str]:
        """Providers known not to answer now (their last probe failed)."""
        return self.view.unreachable(self.clock.now())

    def provider_view(self, provider: str) -> ProviderView:
        """One provider as the state shows it now (no health, demand or local tickets)."""
        return self.view.provider_view(self.providers[provider], self.clock.now())

    def automatic_context(self, provider: str, model: str) -> tuple[int, int]:
        """num_ctx as Ollama records it, and the context, of a copy it loads for a call that
        sets none (all a call over the OpenAI or Anthropic API can join)."""
        view = self.provider_view(provider)
        resolved = context.for_card(view, view.models.get(model), 0)
        return resolved.requested, resolved.context

    # -- dry run ---------------------------------------------------------------------------
    def explain(self, phase: str, model: str | None, prompt_chars: int, num_ctx: int | None,
                thread: str | None = None, can_wait: bool = True
                ) -> tuple[Decision, tuple[Verdict, ...], CallSpec] | None:
        candidates = self.candidates(phase, model, thread, ask=False)  # looking only
        if not candidates:
            return None
        call = CallRequest("/api/chat", model, phase, thread, can_wait=can_wait,
                           prompt=PromptSize(prompt_chars), num_ctx=num_ctx)
        spec = self.spec(call, candidates)
        decision, verdicts = explain(spec, self.snapshot(self.clock.now()), self.policy)
        return decision, verdicts, spec


def _placed(model: str, known: set[str], canonical: Mapping[str, str]) -> str:
    listed = resolve_model(model, known)
    return canonical.get(listed, listed)
