"""What the sidecar learns from the calls it relays: each provider's health (latency, success
rate, circuit breaker), the prompt's characters per token, how fast models load, and how long
calls of each model take on each card."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from proxy.core.affinity import seen_loads
from proxy.core.conversations import (
    NO_CACHES,
    Conversation,
    Copy,
    Held,
    PromptCaches,
    cache_slots,
)
from proxy.core.health import ProviderStats
from proxy.core.lengths import NO_LENGTHS, CallLengths, CallSample
from proxy.core.load_times import NO_LOAD_TIMES, LoadTimes
from proxy.core.prefill import NO_RATES, PrefillRates, read_answer
from proxy.core.sizing import model_slots
from proxy.core.token_ratio import TokenRatio
from proxy.core.tokens import Anchor, ConversationMemory, estimate_tokens
from proxy.core.types import Circuit, Placement, ProviderHealth, ProviderView, Snapshot
from proxy.service.routing import CallOutcome, CallRequest


@dataclass(frozen=True, slots=True)
class CacheCheck:
    """A conversation call's prompt tokens: expected held, found held (None: the answer
    cannot tell), evaluated; and whether the copy held less than half of the expectation."""

    expected: int
    found: int | None
    evaluated: int
    lost: bool


MAX_IN_FLIGHT = 4096  # calls remembered between placement and answer, or until shared


@dataclass
class Learning:
    """What the sidecar learns from responses: chars per token, load and unload times, call
    lengths."""

    ratio: TokenRatio = field(default_factory=TokenRatio)
    loads: LoadTimes = NO_LOAD_TIMES
    conversations: ConversationMemory = field(default_factory=ConversationMemory)
    lengths: CallLengths = NO_LENGTHS
    # Conversation cache affinity (docs/affinity.md): what this sidecar sent to each copy,
    # merged with what other sidecars report; each copy's prefill rate; and per call in
    # flight (its ticket) the tokens its copy was expected to hold
    caches: PromptCaches = NO_CACHES
    shared_caches: Mapping[Copy, tuple[Held, ...]] = field(default_factory=dict)
    prefill: PrefillRates = NO_RATES
    expected_cached: dict[str, tuple[Conversation, int]] = field(default_factory=dict)
    unshared: list[tuple[Copy, Held]] = field(default_factory=list)  # for the next flush
    # The last merge of this sidecar's prompts with the shared ones, by the identity of both:
    # every decision asks, and with many sidecars a merge sorts thousands of entries
    _merged: tuple[object, object, PromptCaches] | None = field(default=None, repr=False)

    def conversation(self, call: CallRequest, prompt_tokens: int) -> Conversation | None:
        if not call.conversation:
            return None
        shared = estimate_tokens(call.shared_prompt, self.ratio, None)
        return Conversation(call.conversation, prompt_tokens, min(shared, prompt_tokens))

    def with_caches(self, snapshot: Snapshot,
                    shared: Mapping[Copy, tuple[Held, ...]] | None = None) -> Snapshot:
        """The snapshot with the copies' expected prompt caches (this sidecar's, and
        `shared`: the other sidecars', less what any sidecar's loads wiped) and the learned
        prefill rates."""
        if shared is not None:
            self.shared_caches = shared
        self.caches = seen_loads(self.caches, snapshot, self.shared_caches)
        return replace(snapshot, caches=self.merged_caches(), prefill=self.prefill)

    def merged_caches(self) -> PromptCaches:
        """This sidecar's expected prompt caches with the other sidecars' merged in."""
        if not self.shared_caches:
            return self.caches
        memo = self._merged
        if memo is None or memo[0] is not self.caches.held or memo[1] is not self.shared_caches:
            memo = (self.caches.held, self.shared_caches,
                    self.caches.merged(self.shared_caches))
            self._merged = memo
        return replace(self.caches, held=memo[2].held)

    def take_unshared(self) -> list[tuple[Copy, Held]]:
        taken, self.unshared = self.unshared, []
        return taken

    def sent(self, placement: Placement, conversation: Conversation | None,
             view: ProviderView, ticket: str, now: float) -> None:
        """A call goes to a copy: a load empties its slots; its prompt is the newest there
        (a copy is known by the name its card lists it under: `Placement.copy_model`)."""
        provider, model = placement.provider, placement.copy_model
        if placement.loads:
            self.caches = self.caches.loaded(provider, model, now)
        if conversation is None or not conversation.digests:
            return
        slots = cache_slots(model_slots(view, model), view.version)
        expected = 0 if placement.loads else self.merged_caches() \
            .expected_cached(provider, model, conversation, slots)
        self.expected_cached[ticket] = (conversation, expected)
        if len(self.expected_cached) > MAX_IN_FLIGHT:  # an attempt never settled
            del self.expected_cached[next(iter(self.expected_cached))]
        self.caches = self.caches.sent(provider, model, conversation, now)
        newest = self.caches.held[(provider, model)][0]  # with its conversation's cadence
        self.unshared.append(((provider, model), newest))
        del self.unshared[:-MAX_IN_FLIGHT]

    def finished(self, digests: tuple[int, ...]) -> None:
        """A call's answer ended its tool loop: the slots holding it are free to the next
        conversation, here and, with the next share, on every sidecar."""
        self.caches = self.caches.finished(digests)
        self.unshared += [(key, h) for key, kept in self.caches.held.items() for h in kept
                          if h.finished and h.leads_to(digests)]
        del self.unshared[:-MAX_IN_FLIGHT]

    def observe_prefill(self, provider: str, model: str, ticket: str, version: str,
                        outcome: CallOutcome) -> CacheCheck | None:
        """What the answer says of the prompt cache: the copy's prefill rate from a miss,
        and, when the copy held less than expected, that it holds only this prompt now.
        None: the call carried no conversation, or its answer tells nothing of it."""
        found = self.expected_cached.pop(ticket, None)
        if found is None or not outcome.healthy:
            return None
        conversation, expected = found
        observed = read_answer(outcome.prompt_eval_count, outcome.prompt_seconds, version,
                               conversation.tokens, self.prefill.known(provider, model),
                               expected, outcome.prompt_cached_count)
        if observed is None or outcome.prompt_seconds is None:
            return None
        self.prefill = self.prefill.observe(provider, model, observed, outcome.prompt_seconds)
        lost = observed.cached is not None and observed.cached < expected // 2
        if lost:
            self.caches = self.caches.lost(provider, model, conversation)
        return CacheCheck(expected, observed.cached, observed.evaluated, lost)

    def prompt_tokens(self, call: CallRequest) -> int:
        anchor = self.conversations.longest_known(call.conversation)
        return estimate_tokens(call.prompt, self.ratio, anchor, call.generates) + \
            call.tokens_apart

    def expected_answer(self, model: str) -> int:
        """This agent's recent answers of `model`, in tokens; 0 before the first."""
        answers = self.lengths.answers.get(model)
        return round(answers.value) if answers is not None else 0

    def observe_prompt(self, call: CallRequest, prompt_eval_count: int | None) -> None:
        if prompt_eval_count is not None:  # the ratio is of the text (and template) alone
            prompt_eval_count -= call.tokens_apart
            self.conversations.record(call.conversation, Anchor(call.prompt, prompt_eval_count))
        self.ratio = self.ratio.observe(call.prompt.chars, prompt_eval_count, call.prompt.dense)

    def observe_call(self, provider: str, model: str, outcome: CallOutcome) -> None:
        """An answer's length on the engine: its reading and generating time when the engine
        reports them (time queued inside Ollama is no part of a call's length), else the
        relay's time less the load."""
        if outcome.prompt_seconds is not None and outcome.answer_seconds is not None:
            seconds = outcome.prompt_seconds + outcome.answer_seconds
        else:
            seconds = max(0.0, outcome.seconds - (outcome.load_seconds or 0.0))
        self.lengths = self.lengths.observe(provider, model, CallSample(
            seconds, outcome.answer_tokens, outcome.answer_seconds,
            outcome.prompt_eval_count, outcome.prompt_seconds))

    def observe_load(self, placement: Placement, seconds: float | None, file_mib: int | None,
                     startup_s: float) -> None:
        """A load this sidecar sent, of a `file_mib` weights file (/api/tags); one queued
        behind other loads in Ollama's one-at-a-time loader also timed theirs, and teaches
        nothing."""
        if not placement.loads_ahead:
            self.loads = self.loads.observe_load(placement.provider, placement.model,
                                                 file_mib or placement.footprint_mib, seconds,
                                                 startup_s)

    def observe_unload(self, placement: Placement, departures: tuple[float, ...] | None
                       ) -> None:
        if departures is not None:
            self.loads = self.loads.observe_unload(placement.provider, departures)


class Experience:
    def __init__(self, providers: Iterable[str]) -> None:
        self.stats: dict[str, ProviderStats] = {n: ProviderStats() for n in providers}
        self.learning = Learning()

    def health(self, now: float) -> dict[str, ProviderHealth]:
        out = {}
        for name, stats in self.stats.items():
            circuit = stats.breaker.state(now)
            if circuit is Circuit.HALF_OPEN and not stats.breaker.allows(now):
                circuit = Circuit.OPEN  # a trial call is out already
            out[name] = ProviderHealth(circuit, stats.latency.value, stats.success_rate)
        return out

    def start_trial(self, provider: str, now: float, ticket: str) -> None:
        """The call holding `ticket` goes to the provider: a half-open circuit lets no other
        through meanwhile."""
        stats = self.stats[provider]
        self.stats[provider] = replace(stats, breaker=stats.breaker.start_trial(now, ticket))

    def end_trial(self, provider: str, ticket: str) -> None:
        """The call holding `ticket` will not go after all (its claim refused, its victims
        not unloaded): if it was the trial, another may go."""
        stats = self.stats[provider]
        self.stats[provider] = replace(stats, breaker=stats.breaker.without_trial(ticket))

    def answering(self, provider: str, ticket: str) -> bool:
        """The call holding `ticket` began its answer (core/health.py: its trial's proof);
        True when that closed the provider's circuit."""
        stats = self.stats.get(provider)
        if stats is None:
            return False
        breaker = stats.breaker.answering(ticket)
        self.stats[provider] = replace(stats, breaker=breaker)
        return breaker is not stats.breaker

    def next_half_open(self, now: float) -> float | None:
        """The soonest moment, after `now`, a circuit half-opens by its cooldown."""
        return min((at for stats in self.stats.values()
                    if (at := stats.breaker.half_opens_at()) is not None and at > now),
                   default=None)

    def probed(self, provider: str, ready: bool, at: float) -> bool:
        """What a probe started at `at` found of the provider (core/health.py: a card seen
        down and then ready again half-opens its circuit); True when its circuit moved."""
        stats = self.stats.get(provider)
        if stats is None or stats.breaker.opened_at is None:
            return False
        moved = stats.probed(ready, at)
        self.stats[provider] = moved
        return moved is not stats

    def record(self, provider: str, outcome: CallOutcome, now: float, ticket: str
               ) -> Circuit:
        """The provider's health after the outcome of the call holding `ticket`; its
        circuit's state now."""
        stats = self.stats[provider]
        # An agent leaving (Ctrl-C, a cancelled tool call), or a prompt the engine refused
        # as too long, says nothing of the GPU.
        stats = stats.abandoned(ticket) if outcome.client_left or outcome.prompt_too_long \
            else stats.record(outcome.healthy, outcome.seconds if outcome.began else None, now)
        self.stats[provider] = stats
        return stats.breaker.state(now)
