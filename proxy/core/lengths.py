"""How long a call holds a slot: learned from the answers the sidecar relays.

A frozen value the service replaces after each answer and the snapshot carries to the core.
The estimate for a call of model M on card C takes the first figure known of:

1. M's calls on C (an average of their engine time);
2. M's calls on another card, scaled by how fast C answers against it (their token rates
   on the models both have answered);
3. the call's own `num_predict` at C's token rate, plus its prompt at C's prompt rate;
4. this agent's recent answers for M (their token counts) at C's token rate, plus the prompt;
5. C's calls of any model (the provider's latency average);
6. the policy's default (docs/rules.md, "How long a call is expected to take").

Standard library only: the core's types import it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

ALPHA = 0.4  # weight of the newest answer: recent lengths matter, one odd answer does not rule
# The figures worked out per model are kept until the next answer replaces the lengths; a
# sidecar whose calls name models nothing answers (names no provider has) would otherwise
# keep one per name asked in the meantime.
WORKED_OUT_KEPT = 1024


@dataclass(frozen=True, slots=True)
class CallSample:
    """What one answer tells: its engine time and, when the engine reports them, its counts
    and their durations."""

    seconds: float  # the engine's time on the call (prompt and answer), without the load
    answer_tokens: int | None = None
    answer_s: float | None = None  # generating them (Ollama's eval_duration)
    prompt_tokens: int | None = None
    prompt_s: float | None = None  # reading the prompt (prompt_eval_duration)


@dataclass(frozen=True, slots=True)
class CallLength:
    seconds: float
    source: str  # where the figure comes from, for explain


@dataclass(frozen=True, slots=True)
class Average:
    value: float
    samples: int = 1

    def add(self, sample: float) -> Average:
        return Average(ALPHA * sample + (1 - ALPHA) * self.value, self.samples + 1)


def _added(averages: Mapping[str, Average], key: str, sample: float) -> dict[str, Average]:
    out = dict(averages)
    old = out.get(key)
    out[key] = Average(sample) if old is None else old.add(sample)
    return out


def _rate(tokens: int | None, seconds: float | None) -> float | None:
    if not tokens or not seconds or seconds <= 0:
        return None
    return tokens / seconds


@dataclass(frozen=True, slots=True)
class CallLengths:
    # provider -> model -> engine seconds per call
    seconds: Mapping[str, Mapping[str, Average]] = field(default_factory=dict)
    # provider -> model -> answer tokens per second
    rates: Mapping[str, Mapping[str, Average]] = field(default_factory=dict)
    card_rates: Mapping[str, Average] = field(default_factory=dict)  # any model
    prompt_rates: Mapping[str, Average] = field(default_factory=dict)  # prompt tokens/s
    answers: Mapping[str, Average] = field(default_factory=dict)  # model -> answer tokens
    # model -> the two cards that answered it most (see _most_seen): every call weighed on
    # a card asks of each model the card has not answered
    _most: dict[str, tuple[tuple[int, str, float], ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    _speedups: dict[tuple[str, str], float | None] = field(
        default_factory=dict, init=False, repr=False, compare=False)  # see _speedup

    def observe(self, provider: str, model: str, sample: CallSample) -> CallLengths:
        seconds = dict(self.seconds)
        seconds[provider] = _added(seconds.get(provider, {}), model, sample.seconds)
        rates, card_rates = self.rates, self.card_rates
        answer_rate = _rate(sample.answer_tokens, sample.answer_s)
        if answer_rate is not None:
            rates = {**rates, provider: _added(rates.get(provider, {}), model, answer_rate)}
            card_rates = _added(card_rates, provider, answer_rate)
        prompt_rates = self.prompt_rates
        prompt_rate = _rate(sample.prompt_tokens, sample.prompt_s)
        if prompt_rate is not None:
            prompt_rates = _added(prompt_rates, provider, prompt_rate)
        answers = self.answers if sample.answer_tokens is None else \
            _added(self.answers, model, sample.answer_tokens)
        return CallLengths(seconds, rates, card_rates, prompt_rates, answers)

    def estimate(self, provider: str, model: str, *, num_predict: int = 0,
                 prompt_tokens: int = 0, provider_latency_s: float | None = None,
                 default_s: float) -> CallLength:
        """The expected seconds of a call of `model` on `provider` and where they come from
        (the precedence of the module's docstring)."""
        here = self.seconds.get(provider, {}).get(model)
        if here is not None:
            return CallLength(here.value, f"{model} on {provider}")
        elsewhere = self._elsewhere(provider, model)
        if elsewhere is not None:
            return elsewhere
        card_rate = self.card_rates.get(provider)
        if card_rate is not None:
            prompt_s = self._prompt_s(provider, prompt_tokens)
            if num_predict > 0:
                return CallLength(prompt_s + num_predict / card_rate.value,
                                  f"num_predict at {provider}'s token rate")
            answers = self.answers.get(model)
            if answers is not None:
                return CallLength(prompt_s + answers.value / card_rate.value,
                                  f"this agent's {model} answers at {provider}'s token rate")
        if provider_latency_s:
            return CallLength(provider_latency_s, f"{provider}'s calls, any model")
        return CallLength(default_s, "default")

    def work(self, model: str, *, prompt_tokens: int = 0, num_predict: int = 0
             ) -> CallLength | None:
        """A call's expected seconds on `model` wherever it runs, to order the calls waiting
        for it (core/waitline.py): its answer (`num_predict`, else this agent's recent
        answers for the model) at the model's token rate over the cards that answered it,
        plus its prompt at their prompt rate. None while either is unknown."""
        if num_predict > 0:
            tokens, source = float(num_predict), "num_predict"
        elif model in self.answers:
            tokens, source = self.answers[model].value, f"this agent's {model} answers"
        else:
            return None
        rates = [seen[model].value for seen in self.rates.values() if model in seen]
        if not rates:
            return None
        prompt_rates = [rate.value for rate in self.prompt_rates.values()]
        prompt_s = prompt_tokens / statistics.fmean(prompt_rates) \
            if prompt_rates and prompt_tokens else 0.0
        return CallLength(prompt_s + tokens / statistics.fmean(rates),
                          f"{source} at {model}'s token rate")

    def _elsewhere(self, provider: str, model: str) -> CallLength | None:
        """The model's calls on the card that answered it most, scaled to this card."""
        best = self._most_seen(provider, model) if self.seconds else None
        if best is None:
            return None
        other, seconds = best
        speedup = self._speedup(provider, other)
        if speedup is None:
            return CallLength(seconds, f"{model} on {other}")
        return CallLength(seconds / speedup, f"{model} on {other}, scaled by token rate")

    def _most_seen(self, provider: str, model: str) -> tuple[str, float] | None:
        """The card other than `provider` that answered `model` most (by name among equals),
        and its seconds per call."""
        most = self._most.get(model)
        if most is None:
            if len(self._most) >= WORKED_OUT_KEPT:
                self._most.clear()
            seen = ((-models[model].samples, other, models[model].value)
                    for other, models in self.seconds.items() if model in models)
            most = self._most[model] = tuple(sorted(seen)[:2])
        for _, other, value in most:
            if other != provider:
                return other, value
        return None

    def _speedup(self, provider: str, other: str) -> float | None:
        """How many times faster `provider` answers than `other`: the geometric mean of
        their token rates' ratio over the models both answered (a card's rate over all its
        models would mostly say which models it ran); None when they share none."""
        key = (provider, other)
        if key in self._speedups:  # (asked for every card a call is weighed on)
            return self._speedups[key]
        mine, theirs = self.rates.get(provider, {}), self.rates.get(other, {})
        shared = sorted(mine.keys() & theirs.keys())  # sorted: the same sum every time
        logs = [math.log(mine[m].value / theirs[m].value) for m in shared]
        speedup = self._speedups[key] = math.exp(sum(logs) / len(logs)) if logs else None
        return speedup

    def _prompt_s(self, provider: str, prompt_tokens: int) -> float:
        rate = self.prompt_rates.get(provider)
        return prompt_tokens / rate.value if rate is not None and prompt_tokens else 0.0


NO_LENGTHS = CallLengths()
