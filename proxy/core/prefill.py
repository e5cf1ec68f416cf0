"""Prompt evaluation (prefill): how fast each copy reads a prompt, learned from the answers,
and how much of an answer's prompt the copy found in its cache (docs/affinity.md).

Ollama reports `prompt_eval_count` and `prompt_eval_duration`; the duration is always the
time spent evaluating, but the count differs by version (docs/engine.md): 0.30.0 counts only
the tokens it evaluated, every other version the whole prompt, cached part included. No
version reports the cached part apart, so it is read from the rate: an answer whose prompt
went much faster than the copy's learned rate found that much of it cached.

Deeper tokens are slower: each attends to every token before it (llama.cpp's compute, not an
Ollama rule), so a token's time is a line in its depth, a + b x depth, and evaluating from
depth d0 to d1 takes (d1 - d0) x (a + b x (d0 + d1) / 2). The line is fit per copy by least
squares over answers whose start depth is known (a miss starts at 0, or at the agent's shared
prefix when that was all the copy was expected to hold; an engine that reports its cached
count says it), forgetting old ones. Until the answers span enough depths to tell the slope,
it is taken as one that doubles a token's time at DEFAULT_DEPTH_SCALE.

Standard library only: the snapshot carries the learned rates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_TOKENS_PER_S = 2000.0  # until a copy's misses teach it (an 8B ~4-5k, a 32B ~1-1.5k)
# The depth at which a token costs twice its time at depth 0: the weights' FLOPs over the
# attention's per token of depth, parameters / (2 x layers x query width), for 8-32B models
# (qwen3:8b ~28k, qwen3:14b ~36k, qwen3:32b ~31k tokens)
DEFAULT_DEPTH_SCALE = 32768.0
FORGET = 0.1  # weight each new sample takes in the fit: about the last ten misses count
MIN_DEPTH_SPREAD = 2048.0  # tokens of spread in the samples' depths before a slope is fit
HIT_SPEEDUP = 3.0  # a prompt read this many times faster than the learned rate was cached
MIN_SAMPLE_TOKENS = 64  # shorter prompts say more about overhead than about the rate


@dataclass(frozen=True, slots=True)
class Observed:
    """What an answer says of its prompt: the tokens evaluated, those found cached (None:
    cannot tell), and the depth its evaluation started at when that is known (it may teach
    the rate)."""

    evaluated: int
    cached: int | None
    start: int | None = None


@dataclass(frozen=True, slots=True)
class PrefillSpeed:
    """A copy's prompt evaluation: seconds per token at depth 0, and per token per token of
    depth."""

    per_token_s: float
    per_token_per_depth_s: float

    @staticmethod
    def of(tokens_per_s: float, scale: float = DEFAULT_DEPTH_SCALE) -> PrefillSpeed:
        return PrefillSpeed(1 / tokens_per_s, 1 / tokens_per_s / scale)

    @property
    def tokens_per_s(self) -> float:
        """The rate at depth 0."""
        return 1 / self.per_token_s

    def seconds(self, start: int, end: int) -> float:
        """The time to evaluate a prompt's tokens from depth `start` to depth `end`."""
        evaluated = max(end - start, 0)
        return evaluated * (self.per_token_s + self.per_token_per_depth_s * (start + end) / 2)

    def evaluated_in(self, seconds: float, end: int) -> int:
        """How many tokens ending at depth `end` take `seconds`: the tail that
        seconds(end - n, end) = seconds solves for."""
        a, b = self.per_token_s, self.per_token_per_depth_s
        if b <= 0:
            return round(seconds / a)
        # n (a + b (end - n / 2)) = seconds: b/2 n^2 - (a + b end) n + seconds = 0
        slope = a + b * end
        root = slope * slope - 2 * b * seconds
        n = end if root < 0 else (slope - math.sqrt(root)) / b
        return round(min(n, end))


DEFAULT_SPEED = PrefillSpeed.of(DEFAULT_TOKENS_PER_S)


def read_answer(count: int | None, seconds: float | None, version: str,
                expected_tokens: int, speed: PrefillSpeed | None, expected_cached: int = 0,
                cached_count: int | None = None) -> Observed | None:
    """The evaluated and cached tokens of one answer (see the module's docstring)."""
    if not count or count <= 0 or seconds is None or seconds < 0:
        return None
    if cached_count is not None:  # an engine that says it
        return Observed(max(0, count - cached_count), cached_count, cached_count)
    if version.startswith("0.30.0"):  # llama-server's prompt_n: the tokens evaluated
        cached = max(0, expected_tokens - count)
        return Observed(count, cached, 0 if cached == 0 else None)
    if speed is None:  # nothing to compare with: a call expected to miss is taken as one
        return Observed(count, 0, 0) if expected_cached == 0 else Observed(count, None)
    whole = speed.seconds(0, count)
    if seconds * HIT_SPEEDUP < whole:
        evaluated = max(1, speed.evaluated_in(seconds, count))
        return Observed(evaluated, count - evaluated)
    # At about the whole prompt's time: it found nothing, or no more than a prefix too short
    # to tell from nothing; one the copy was expected to hold is taken as found.
    if 0 < expected_cached < count and \
            speed.seconds(expected_cached, count) * HIT_SPEEDUP >= whole:
        return Observed(count - expected_cached, expected_cached, expected_cached)
    return Observed(count, 0, 0)


@dataclass(frozen=True, slots=True)
class PrefillFit:
    """Per-token seconds as a line in depth, fit by least squares to samples (the mean depth
    of the tokens an answer evaluated; its seconds per token), each new one weighing FORGET
    and the older ones fading."""

    weight: float = 0.0
    depth: float = 0.0  # weighted sums: of x, y, x^2, x y
    per_token: float = 0.0
    depth2: float = 0.0
    cross: float = 0.0

    def observe(self, start: int, evaluated: int, seconds: float) -> PrefillFit:
        keep = 1 - FORGET
        x, y = start + evaluated / 2, seconds / evaluated
        return PrefillFit(self.weight * keep + 1, self.depth * keep + x,
                          self.per_token * keep + y, self.depth2 * keep + x * x,
                          self.cross * keep + x * y)

    def speed(self) -> PrefillSpeed:
        n = self.weight
        mean_x, mean_y = self.depth / n, self.per_token / n
        spread = self.depth2 / n - mean_x * mean_x
        if spread >= MIN_DEPTH_SPREAD ** 2:
            slope = (self.cross / n - mean_x * mean_y) / spread
            intercept = mean_y - slope * mean_x
            if slope >= 0 and intercept > 0:
                return PrefillSpeed(intercept, slope)
        # too narrow (or noisy) to tell the slope: the default one through the samples' mean
        at_zero = mean_y / (1 + mean_x / DEFAULT_DEPTH_SCALE)
        return PrefillSpeed(at_zero, at_zero / DEFAULT_DEPTH_SCALE)


@dataclass(frozen=True, slots=True)
class PrefillRates:
    """Each copy's prompt evaluation, learned from answers whose start depth is known; and
    how often answers found part of their prompt cached."""

    rates: Mapping[tuple[str, str], PrefillFit] = field(default_factory=dict)
    hits: int = 0
    calls: int = 0  # answers whose cached part could be told

    def speed(self, provider: str, model: str) -> PrefillSpeed:
        """The copy's learned speed; else the model's on other cards; else the default."""
        here = self.rates.get((provider, model))
        if here is not None:
            return here.speed()
        elsewhere = [f.speed() for (p, m), f in sorted(self.rates.items()) if m == model]
        if not elsewhere:
            return DEFAULT_SPEED
        return PrefillSpeed(sum(s.per_token_s for s in elsewhere) / len(elsewhere),
                            sum(s.per_token_per_depth_s for s in elsewhere) / len(elsewhere))

    def rate(self, provider: str, model: str) -> float:
        """Tokens per second at depth 0."""
        return self.speed(provider, model).tokens_per_s

    def known(self, provider: str, model: str) -> PrefillSpeed | None:
        fit = self.rates.get((provider, model))
        return None if fit is None else fit.speed()

    def observe(self, provider: str, model: str, observed: Observed, seconds: float
                ) -> PrefillRates:
        hits, calls = self.hits, self.calls
        if observed.cached is not None:
            calls += 1
            hits += observed.cached > 0
        rates = self.rates
        if observed.start is not None and observed.evaluated >= MIN_SAMPLE_TOKENS \
                and seconds > 0:
            fit = rates.get((provider, model), PrefillFit())
            rates = {**rates, (provider, model):
                     fit.observe(observed.start, observed.evaluated, seconds)}
        return PrefillRates(rates, hits, calls)


NO_RATES = PrefillRates()
