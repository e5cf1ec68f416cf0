"""Prompt evaluation (prefill): how fast each copy reads a prompt, learned from the answers,
and how much of an answer's prompt the copy found in its cache (docs/affinity.md).

Ollama reports `prompt_eval_count` and `prompt_eval_duration`; the duration is always the
time spent evaluating, but the count differs by version (docs/engine.md): 0.30.0 counts only
the tokens it evaluated, every other version the whole prompt, cached part included. No
version reports the cached part apart, so it is read from the rate: an answer whose prompt
went much faster than the copy's learned rate found that much of it cached. Only answers
that evaluated their whole prompt teach the rate.

Standard library only: the snapshot carries the learned rates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_TOKENS_PER_S = 2000.0  # until a copy's misses teach it (an 8B ~4-5k, a 32B ~1-1.5k)
ALPHA = 0.3
HIT_SPEEDUP = 3.0  # a prompt read this many times faster than the learned rate was cached
MIN_SAMPLE_TOKENS = 64  # shorter prompts say more about overhead than about the rate


@dataclass(frozen=True, slots=True)
class Observed:
    """What an answer says of its prompt: the tokens evaluated, and those found cached
    (None: cannot tell)."""

    evaluated: int
    cached: int | None


def read_answer(count: int | None, seconds: float | None, version: str,
                expected_tokens: int, rate: float | None, expected_cached: int = 0,
                cached_count: int | None = None) -> Observed | None:
    """The evaluated and cached tokens of one answer (see the module's docstring)."""
    if not count or count <= 0 or seconds is None or seconds < 0:
        return None
    if cached_count is not None:  # an engine that says it
        return Observed(max(0, count - cached_count), cached_count)
    if version.startswith("0.30.0"):  # llama-server's prompt_n: the tokens evaluated
        return Observed(count, max(0, expected_tokens - count))
    if rate is None:  # nothing to compare with: a call expected to miss is taken as one
        return Observed(count, 0 if expected_cached == 0 else None)
    read_at_rate = seconds * rate
    if read_at_rate * HIT_SPEEDUP < count:
        evaluated = max(1, round(read_at_rate))
        return Observed(evaluated, count - evaluated)
    return Observed(count, 0)


@dataclass(frozen=True, slots=True)
class PrefillRates:
    """Tokens per second of prompt evaluation per copy, learned from cache misses; and how
    often answers found part of their prompt cached."""

    rates: Mapping[tuple[str, str], float] = field(default_factory=dict)
    hits: int = 0
    calls: int = 0  # answers whose cached part could be told

    def rate(self, provider: str, model: str) -> float:
        """The copy's learned rate; else the model's on other cards; else the default."""
        here = self.rates.get((provider, model))
        if here is not None:
            return here
        elsewhere = [r for (p, m), r in sorted(self.rates.items()) if m == model]
        return sum(elsewhere) / len(elsewhere) if elsewhere else DEFAULT_TOKENS_PER_S

    def known(self, provider: str, model: str) -> float | None:
        return self.rates.get((provider, model))

    def observe(self, provider: str, model: str, observed: Observed, seconds: float
                ) -> PrefillRates:
        hits, calls = self.hits, self.calls
        if observed.cached is not None:
            calls += 1
            hits += observed.cached > 0
        rates = self.rates
        if observed.cached == 0 and observed.evaluated >= MIN_SAMPLE_TOKENS and seconds > 0:
            sample = observed.evaluated / seconds
            old = rates.get((provider, model))
            rates = {**rates, (provider, model):
                     sample if old is None else ALPHA * sample + (1 - ALPHA) * old}
        return PrefillRates(rates, hits, calls)


NO_RATES = PrefillRates()
