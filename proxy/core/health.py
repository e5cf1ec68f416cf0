"""Small pure state machines per provider: a circuit breaker and latency/success averages.

Each `record` returns the next state; the clock's "now" is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from proxy.core.types import Circuit

FAILURES_TO_OPEN = 3
FAILURE_WINDOW_S = 120.0
OPEN_FOR_S = 60.0
# A probe that saw the card down this long before its first failure of the episode still
# saw the same outage: it was in flight as the calls failed.
DOWN_BEFORE_FAILURE_S = 5.0
LATENCY_ALPHA = 0.4
SUCCESS_ALPHA = 0.3
SUCCESS_MIN_SAMPLES = 5


@dataclass(frozen=True, slots=True)
class Breaker:
    """closed --3 failures in 120 s--> open --60 s, or the prober saw the card down and then
    ready again--> half-open --ok--> closed / --fail--> open."""

    failures: tuple[float, ...] = ()
    opened_at: float | None = None
    trial: str | None = None  # half-open: the ticket of the trial call that is out
    seen_down_at: float | None = None  # open: when a probe last found the card down
    back: bool = False  # open: a probe found it ready after that (a restart)
    # a trial after such a restart failed: the cooldown runs its course until the circuit
    # closes again (a card in a crash loop gets one early trial, not one per restart)
    early_spent: bool = False

    def state(self, now: float) -> Circuit:
        if self.opened_at is None:
            return Circuit.CLOSED
        if now - self.opened_at < OPEN_FOR_S and not self.back:
            return Circuit.OPEN
        return Circuit.HALF_OPEN

    def half_opens_at(self) -> float | None:
        """When an open circuit half-opens by its cooldown (silent: nothing is written then,
        so calls waiting for the card set a timer for it); None when it is not waiting."""
        if self.opened_at is None or self.back:
            return None
        return self.opened_at + OPEN_FOR_S

    def probed(self, ready: bool, at: float) -> Breaker:
        """What a probe started at `at` found. A card that failed its calls as it went down
        (a crash, a restart) is worth a trial call as soon as it answers its probes again; a
        card that fails calls while answering its probes all along waits out the cooldown."""
        if self.opened_at is None or self.back or self.early_spent:
            return self
        if not ready:
            if at >= self.failures[0] - DOWN_BEFORE_FAILURE_S and \
                    (self.seen_down_at is None or at > self.seen_down_at):
                return replace(self, seen_down_at=at)
            return self
        if self.seen_down_at is not None and at > self.seen_down_at:
            return replace(self, back=True)
        return self

    def allows(self, now: float) -> bool:
        """Closed, or half-open with no trial call out yet."""
        state = self.state(now)
        return state is Circuit.CLOSED or (state is Circuit.HALF_OPEN and self.trial is None)

    def start_trial(self, now: float, ticket: str = "trial") -> Breaker:
        """The call holding `ticket` goes to a half-open card: the one trial, unless
        another is out already."""
        if self.state(now) is Circuit.HALF_OPEN and self.trial is None:
            return replace(self, trial=ticket)
        return self

    def without_trial(self, ticket: str = "trial") -> Breaker:
        """The trial call holding `ticket` ended telling nothing (its client left, or it
        never went): another may go. Any other call's end leaves the trial out."""
        return replace(self, trial=None) if self.trial == ticket else self

    def answering(self, ticket: str) -> Breaker:
        """The trial call holding `ticket` began its answer: the card serves again, and
        its circuit closes (its end, a failure mid-answer, counts as a closed one's)."""
        return Breaker() if self.trial is not None and self.trial == ticket else self

    def record(self, ok: bool, now: float) -> Breaker:
        state = self.state(now)
        if ok:
            if state is Circuit.CLOSED:
                return self
            return Breaker()  # half-open success clears
        if state is Circuit.HALF_OPEN:  # one more failure reopens
            return Breaker((now,), opened_at=now, early_spent=self.back or self.early_spent)
        if state is Circuit.OPEN:
            return self
        recent = (*(t for t in self.failures if now - t < FAILURE_WINDOW_S), now)
        if len(recent) >= FAILURES_TO_OPEN:
            return Breaker(recent, opened_at=now)
        return Breaker(recent)


@dataclass(frozen=True, slots=True)
class Ema:
    value: float | None = None
    samples: int = 0

    def add(self, sample: float, alpha: float) -> Ema:
        if self.value is None:
            return Ema(sample, 1)
        return Ema(alpha * sample + (1 - alpha) * self.value, self.samples + 1)


@dataclass(frozen=True, slots=True)
class ProviderStats:
    breaker: Breaker = Breaker()
    latency: Ema = Ema()
    success: Ema = Ema()

    def record(self, ok: bool, seconds: float | None, now: float) -> ProviderStats:
        """A call's outcome; `seconds` None for one the provider refused before it began (a
        404 for a model it lacks in milliseconds says nothing of how long its calls take)."""
        latency = self.latency.add(seconds, LATENCY_ALPHA) if ok and seconds is not None \
            else self.latency
        return ProviderStats(self.breaker.record(ok, now), latency,
                             self.success.add(1.0 if ok else 0.0, SUCCESS_ALPHA))

    def abandoned(self, ticket: str = "trial") -> ProviderStats:
        """A call its client left: neither a success nor a failure of the provider."""
        return ProviderStats(self.breaker.without_trial(ticket), self.latency, self.success)

    def probed(self, ready: bool, at: float) -> ProviderStats:
        breaker = self.breaker.probed(ready, at)
        return self if breaker is self.breaker else \
            ProviderStats(breaker, self.latency, self.success)

    @property
    def success_rate(self) -> float | None:
        if self.success.samples < SUCCESS_MIN_SAMPLES:
            return None
        return self.success.value
