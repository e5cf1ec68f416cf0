"""Placement policies for the simulation: kubemoot (the shipped `proxy.core`, imported, not
copied) and the baselines it is measured against."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from loadtest.fleet_model import Gpu, SimCall
from loadtest.scenarios import MODELS
from proxy.core.conversations import NO_CACHES, PromptCaches, cache_slots
from proxy.core.lengths import NO_LENGTHS, CallLengths, CallSample
from proxy.core.load_times import NO_LOAD_TIMES, LoadTimes
from proxy.core.placement import place, runnable_alternatives
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.prefill import NO_RATES, PrefillRates, read_answer
from proxy.core.types import (
    CallSpec,
    Candidate,
    ModelDemand,
    ProviderHealth,
    ProviderView,
    Resident,
    Snapshot,
    Ticket,
    WaitNeed,
)
from proxy.core.waitline import YIELD_S, slack_s, yields_to_sooner


@dataclass(frozen=True)
class Choice:
    """placed (gpu, model, placement, evicts), wait, or a refusal reason."""

    outcome: str  # placed | wait | model-too-large | prompt-too-large
    gpu: str = ""
    model: str = ""
    placement: str = ""
    evicts: tuple[str, ...] = ()
    footprint_mib: int = 0
    cold: bool = False
    retry_in_s: float = 0.0  # a wait with a deadline of its own: place it again by then
    loads_ahead: int = 0  # a load: loads in flight on its card when it was placed


class PlacementPolicy(Protocol):
    name: str

    def choose(self, call: SimCall, gpus: Mapping[str, Gpu], now: float) -> Choice: ...

    def started(self, call: SimCall, choice: Choice, now: float) -> None: ...

    def finished(self, call: SimCall, now: float) -> None: ...


class _Baseline:
    """Baselines place the preferred model and never refuse or wait."""

    name = "baseline"

    def pick(self, call: SimCall, gpus: Mapping[str, Gpu]) -> str:
        raise NotImplementedError

    def choose(self, call: SimCall, gpus: Mapping[str, Gpu], now: float) -> Choice:
        return Choice("placed", self.pick(call, gpus), call.preferred, "routed")

    def started(self, call: SimCall, choice: Choice, now: float) -> None:
        return None

    def finished(self, call: SimCall, now: float) -> None:
        return None


class RoundRobin(_Baseline):
    name = "round-robin"

    def __init__(self) -> None:
        self.next = 0

    def pick(self, call: SimCall, gpus: Mapping[str, Gpu]) -> str:
        names = list(gpus)
        self.next = (self.next + 1) % len(names)
        return names[self.next]


class RandomChoice(_Baseline):
    name = "random"

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)

    def pick(self, call: SimCall, gpus: Mapping[str, Gpu]) -> str:
        return self.rng.choice(list(gpus))


class LeastBusy(_Baseline):
    """LiteLLM's least-busy routing: the deployment with the fewest requests in flight."""

    name = "least-busy"

    def pick(self, call: SimCall, gpus: Mapping[str, Gpu]) -> str:
        return min(gpus, key=lambda n: (gpus[n].in_flight(), n))


class ModelAffinity(_Baseline):
    """What the Ollama load balancers do: a node that has the model, else the least busy."""

    name = "model-affinity"

    def pick(self, call: SimCall, gpus: Mapping[str, Gpu]) -> str:
        blob = MODELS[call.preferred].weights
        holders = [n for n, g in gpus.items() if blob in g.residents]
        pool = holders or list(gpus)
        return min(pool, key=lambda n: (gpus[n].in_flight(), n))


class StaticBinding(_Baseline):
    """Today's practice: each agent pinned to one endpoint at deploy time."""

    name = "static"

    def __init__(self) -> None:
        self.binding: dict[str, str] = {}

    def pick(self, call: SimCall, gpus: Mapping[str, Gpu]) -> str:
        if call.agent not in self.binding:
            names = list(gpus)
            self.binding[call.agent] = names[len(self.binding) % len(names)]
        return self.binding[call.agent]


# The virtual fleet's models take the same memory at every context: seen at that size.
SEEN = {m: {0: s.footprint_mib} for m, s in MODELS.items()}


@dataclass
class Kubemoot:
    """The sidecar's decision: a Snapshot of the simulated fleet into `proxy.core.place`."""

    tolerance: float = 10.0
    name: str = "kubemoot"
    tickets: dict[int, Ticket] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)
    waiting: dict[int, tuple[str, float]] = field(default_factory=dict)  # call -> model, turn
    # call -> the other models it could run on, found when it first waits (its entry's `also`)
    also: dict[int, tuple[str, ...]] = field(default_factory=dict)
    turns: dict[int, float] = field(default_factory=dict)  # call -> its turn (waitline.py)
    yielding: dict[int, float] = field(default_factory=dict)  # call -> since when it yields
    use: dict[str, tuple[float, float]] = field(default_factory=dict)  # model -> (rate, at)
    # agent -> what its sidecar learned of call lengths from its own answers
    lengths: dict[str, CallLengths] = field(default_factory=dict)
    loads: dict[str, LoadTimes] = field(default_factory=dict)  # per agent, as each sidecar's
    clean_loads: set[int] = field(default_factory=set)  # calls whose load nothing delayed
    # Conversation cache affinity (core/affinity.py): what each copy is expected to hold,
    # kept as the sidecar keeps it, and each copy's prefill rate learned from the answers
    affinity: bool = True
    caches: PromptCaches = NO_CACHES
    prefill: PrefillRates = NO_RATES
    expected: dict[int, int] = field(default_factory=dict)  # call -> tokens expected cached

    def _also(self, ident: int, spec: CallSpec, snapshot: Snapshot) -> None:
        """The models a call about to wait could run on, as its wait entry gives them."""
        if ident not in self.waiting and ident not in self.also:
            self.also[ident] = runnable_alternatives(spec, snapshot, DEFAULT_POLICY)

    def wait(self, call: SimCall, waits: bool) -> None:
        """The call's wait entry comes (it waits) or goes (placed, refused or given up)."""
        if waits:
            self.waiting[call.ident] = (call.preferred, self.turns[call.ident])
        else:
            self.waiting.pop(call.ident, None)
            self.also.pop(call.ident, None)
            self.yielding.pop(call.ident, None)
            self.turns.pop(call.ident, None)

    def snapshot(self, gpus: Mapping[str, Gpu], now: float, for_call: SimCall | None = None
                 ) -> Snapshot:
        views = []
        for name, gpu in gpus.items():
            residents = tuple(Resident(r.model.name, r.model.footprint_mib, gpu.spec.context,
                                       r.last_used)
                              for r in gpu.residents.values() if r.ready)
            views.append(ProviderView(name, gpu.spec.total_mib, True, residents,
                                      gpu.spec.context, gpu.spec.slots,
                                      disk_mib={m: s.read_mib for m, s in MODELS.items()},
                                      observed=SEEN))
        turns: dict[str, list[float]] = {}
        backing: dict[str, int] = {}
        for ident, (model, due) in self.waiting.items():
            if for_call is None or ident != for_call.ident:  # not weighing its own entry
                turns.setdefault(model, []).append(due)
                for other in self.also.get(ident, ()):
                    backing[other] = backing.get(other, 0) + 1
        demand = {}
        for model in set(turns) | set(self.use) | set(backing):
            rate, at = self.use.get(model, (0.0, now))
            waiting = tuple(sorted(turns.get(model, ())))
            demand[model] = ModelDemand(waiters=len(waiting),
                                        recent_use=rate * 0.5 ** ((now - at) / 600.0),
                                        last_used_at=at, turns=waiting,
                                        backing=(WaitNeed(),) * backing.get(model, 0))
        health = {n: ProviderHealth(latency_ema_s=self.latency.get(n)) for n in gpus}
        lengths = NO_LENGTHS if for_call is None else \
            self.lengths.get(for_call.agent, NO_LENGTHS)
        loads = NO_LOAD_TIMES if for_call is None else \
            self.loads.get(for_call.agent, NO_LOAD_TIMES)
        return Snapshot(now, tuple(views), tuple(self.tickets.values()), demand, health,
                        loads=loads, lengths=lengths, caches=self.caches, prefill=self.prefill)

    def choose(self, call: SimCall, gpus: Mapping[str, Gpu], now: float) -> Choice:
        answers = self.lengths.get(call.agent, NO_LENGTHS).answers.get(call.preferred)
        spec = CallSpec(tuple(Candidate(m, s) for m, s in call.candidates),
                        prompt_tokens=call.prompt_tokens, tolerance=self.tolerance,
                        expected_answer=round(answers.value) if answers else 0,
                        conversation=call.conversation if self.affinity else None)
        snapshot = self.snapshot(gpus, now, call)
        due = self.turns.setdefault(call.ident, call.arrived + slack_s(snapshot.lengths.work(
            call.preferred, prompt_tokens=call.prompt_tokens)))
        decision = place(replace(spec, turn=due), snapshot, DEFAULT_POLICY)
        p = decision.placement
        if p is None:
            self.yielding.pop(call.ident, None)  # a yield lasts YIELD_S in a row, as there
            if decision.outcome == "wait":
                self._also(call.ident, spec, snapshot)
            return Choice(decision.outcome)
        # The service's waiting line: the slot is due to sooner turns first, for YIELD_S
        if yields_to_sooner(p, snapshot, DEFAULT_POLICY, due):
            since = self.yielding.setdefault(call.ident, now)
            if now - since < YIELD_S:
                self._also(call.ident, spec, snapshot)
                return Choice("wait", retry_in_s=YIELD_S - (now - since))
        if spec.conversation is not None:
            self.expected[call.ident] = 0 if p.loads else self.caches.expected_cached(
                p.provider, p.model, spec.conversation,
                cache_slots(gpus[p.provider].spec.slots, ""))
        return Choice("placed", p.provider, p.model, p.kind, tuple(p.evicts), p.footprint_mib,
                      p.loads, loads_ahead=p.loads_ahead)

    def started(self, call: SimCall, choice: Choice, now: float) -> None:
        self.tickets[call.ident] = Ticket(
            str(call.ident), choice.gpu, choice.model, choice.footprint_mib, now, math.inf,
            cold=choice.cold, evicts={v: MODELS[v].footprint_mib for v in choice.evicts})
        if choice.cold and not choice.loads_ahead:
            self.clean_loads.add(call.ident)
        rate, at = self.use.get(choice.model, (0.0, now))
        self.use[choice.model] = (rate * 0.5 ** ((now - at) / 600.0) + 1.0, now)
        if self.affinity:
            if choice.cold:
                self.caches = self.caches.loaded(choice.gpu, choice.model, now)
            if call.conversation is not None:
                self.caches = self.caches.sent(choice.gpu, choice.model, call.conversation,
                                               now)

    def finished(self, call: SimCall, now: float) -> None:
        ticket = self.tickets.pop(call.ident, None)
        if ticket is not None and not call.failed:
            seconds = now - ticket.started_at
            previous = self.latency.get(ticket.provider)
            self.latency[ticket.provider] = seconds if previous is None else \
                0.4 * seconds + 0.6 * previous
            self.lengths[call.agent] = self.lengths.get(call.agent, NO_LENGTHS).observe(
                ticket.provider, ticket.model, _sample(call))
            if call.ident in self.clean_loads:  # load_duration: from placed to running
                self.loads[call.agent] = self.loads.get(call.agent, NO_LOAD_TIMES).observe_load(
                    ticket.provider, ticket.model, MODELS[ticket.model].read_mib,
                    call.started - ticket.started_at, DEFAULT_POLICY.load_startup_s)
            if self.affinity and call.conversation is not None:
                self._learn_prefill(call, ticket.provider, ticket.model)
                # as the sidecar reads it: a tool's result answered, no tool called
                if call.ends_loop:
                    self.caches = self.caches.finished(call.conversation.digests)
        self.clean_loads.discard(call.ident)

    def _learn_prefill(self, call: SimCall, provider: str, model: str) -> None:
        """As the sidecar learns it: the answer's count (whole prompt, as 0.30.1+ reports
        it) and its prefill time tell the tokens found cached; less than expected, and the
        copy is taken to hold only this prompt now."""
        assert call.conversation is not None
        expected = self.expected.pop(call.ident, 0)
        observed = read_answer(call.prompt_tokens, call.prefill_s, "", call.prompt_tokens,
                               self.prefill.known(provider, model), expected)
        if observed is None:
            return
        self.prefill = self.prefill.observe(provider, model, observed, call.prefill_s)
        if observed.cached is not None and observed.cached < expected // 2:
            self.caches = self.caches.lost(provider, model, call.conversation)


def _sample(call: SimCall) -> CallSample:
    """What Ollama's closing figures say of a finished call: the time it ran (not its queue
    or load) and its counts and durations, the answer's as long as the decode took on a card
    it shared (eval_duration is wall time)."""
    ran_s = call.finished - call.started
    return CallSample(ran_s, call.output_tokens, max(ran_s - call.prefill_s, 1e-6),
                      call.prompt_tokens, max(call.prefill_s, 1e-6))


class StickySession(_Baseline):
    """Session affinity as a load balancer does it: a conversation's calls always go back to
    the card its first call went to (that one chosen as model-affinity does), whatever its
    queue."""

    name = "sticky"

    def __init__(self) -> None:
        self.binding: dict[int, str] = {}

    def pick(self, call: SimCall, gpus: Mapping[str, Gpu]) -> str:
        if call.conversation is None:
            return ModelAffinity().pick(call, gpus)
        ident = call.conversation.digests[min(1, len(call.conversation.digests) - 1)]
        if ident not in self.binding:
            self.binding[ident] = ModelAffinity().pick(call, gpus)
        return self.binding[ident]


@dataclass
class KubemootWithoutAffinity(Kubemoot):
    """The shipped placement, blind to what copies hold in their prompt caches."""

    name: str = "kubemoot-no-affinity"
    affinity: bool = False


POLICIES = {
    "kubemoot": Kubemoot,
    "round-robin": RoundRobin,
    "random": RandomChoice,
    "least-busy": LeastBusy,
    "model-affinity": ModelAffinity,
    "static": StaticBinding,
    "sticky": StickySession,
    "kubemoot-no-affinity": KubemootWithoutAffinity,
}
