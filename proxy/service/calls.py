"""A call's life: its attempts, placed, claimed, re-placed and settled in one place.

The relay sends each attempt and reports how it ended; everything else about the call (the
held plan it may take, the retry on another provider, the re-placement of a prompt the
engine found too long, the ticket's release, what is learned, the metrics and the log line)
happens here.
"""

from __future__ import annotations

import time

from proxy.observability.logging import get_logger
from proxy.observability.metrics import Metrics
from proxy.service.plans import PlanBook
from proxy.service.routing import Attempt, CallOutcome, CallRequest, Refusal
from proxy.service.scheduler import Granted, Scheduler

log = get_logger("kubemoot.calls")
# A retry of a failed attempt only when the others could still take the call (after a wait).
RETRY_REFUSALS = ("gpu-busy", "client-gone")


class CallService:
    """Implements the `Calls` seam the API calls for every inference request."""

    def __init__(self, scheduler: Scheduler, plans: PlanBook, metrics: Metrics) -> None:
        self.scheduler = scheduler
        self.plans = plans
        self.metrics = metrics

    def attempts(self, call: CallRequest, started: float) -> CallAttempts:
        return CallAttempts(self, call, started)


class CallAttempts:
    """One call's attempts, one at a time: a first one, at most one more on another provider
    after a failure before the answer began, and at most one more sized at the engine's
    count after it refused the prompt as longer than its context."""

    def __init__(self, service: CallService, call: CallRequest, started: float) -> None:
        self.service = service
        self.call = call
        self.started = started
        self._current: Granted | None = None
        self._retried = False
        self._resized = False

    async def first(self) -> Attempt | Refusal:
        s = self.service
        granted = await s.plans.take(self.call) or await s.scheduler.route(self.call)
        if isinstance(granted, Refusal):
            s.metrics.refusals.labels(granted.reason).inc()
            log.info("call refused", path=self.call.path,
                     model=granted.model or self.call.model, reason=granted.reason)
            return granted
        return self._begin(granted)

    async def again(self, outcome: CallOutcome) -> Attempt | Refusal | None:
        failed = self._current
        await self.settle(outcome)
        if failed is None or failed.claimed is None:  # the static endpoint has no other
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
        placed = await self.service.scheduler.route(self.call, tokens)
        if isinstance(placed, Refusal):
            return placed
        log.info("placed again: the engine counted the prompt longer than its context",
                 failed=failed.attempt.provider, tokens=tokens,
                 provider=placed.attempt.provider)
        return self._begin(placed)

    async def _retry_elsewhere(self, failed: Granted, outcome: CallOutcome
                               ) -> Attempt | Refusal | None:
        """Placed again without the provider that failed, waiting for a GPU as a first
        attempt would; None when no other provider could take it at all."""
        scheduler = self.service.scheduler
        provider = failed.attempt.provider
        if self._retried or not scheduler.others_could_take(failed.spec, provider):
            return None
        self._retried = True
        placed = await scheduler.route(self.call, exclude=frozenset((provider,)))
        if isinstance(placed, Refusal):
            # Every other GPU stayed busy, or the agent left: that is the answer. Any other
            # refusal means no other could ever take it: the failure is the answer.
            return placed if placed.reason in RETRY_REFUSALS else None
        log.info("retrying on another provider", failed=provider, cause=outcome.error,
                 provider=placed.attempt.provider, model=placed.attempt.model)
        return self._begin(placed)

    def _begin(self, granted: Granted) -> Attempt:
        attempt = granted.attempt
        self._current = granted
        self.service.metrics.placements.labels(attempt.placement, attempt.provider,
                                               attempt.model).inc()
        self.service.metrics.in_flight.labels(attempt.provider).inc()
        return attempt

    async def settle(self, outcome: CallOutcome) -> None:
        current, self._current = self._current, None
        if current is None:
            return  # settled already
        attempt = current.attempt
        metrics = self.service.metrics
        metrics.in_flight.labels(attempt.provider).dec()
        metrics.upstream_seconds.labels(attempt.provider).observe(outcome.seconds)
        if not outcome.ok and not outcome.client_left:
            metrics.upstream_errors.labels(attempt.provider).inc()
        log.info("call", provider=attempt.provider, model=attempt.model,
                 placement=attempt.placement, evicted=list(attempt.evicted),
                 waited_ms=attempt.waited_ms, prompt_chars=self.call.prompt.chars,
                 estimated_prompt_tokens=attempt.estimated_tokens,
                 reported_prompt_tokens=outcome.prompt_eval_count, ok=outcome.ok,
                 error=outcome.error, seconds=round(time.perf_counter() - self.started, 4))
        if current.claimed is not None:
            await self.service.scheduler.finish(current.claimed, self.call,
                                                attempt.estimated_tokens, outcome)


def _too_long(failed: Granted | None, outcome: CallOutcome) -> Refusal:
    provider = failed.attempt.provider if failed else "?"
    model = failed.attempt.model if failed else None
    return Refusal("prompt-too-large", f"provider {provider} refused the prompt as "
                   f"longer than its context ({outcome.prompt_eval_count} tokens or more)",
                   model)
