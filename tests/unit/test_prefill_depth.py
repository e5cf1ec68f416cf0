"""Prefill slows with depth: the learned line of per-token time in depth, the estimate of a
call's prefill from where its evaluation starts and ends, and the simulators' timing."""

from __future__ import annotations

import pytest

from loadtest.sim_cache import depth_scale, prefill_seconds
from loadtest.sim_model import CATALOG
from proxy.core import affinity
from proxy.core.conversations import NO_CACHES, Conversation
from proxy.core.occupancy import index_providers
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.prefill import (
    DEFAULT_DEPTH_SCALE,
    MIN_DEPTH_SPREAD,
    NO_RATES,
    Observed,
    PrefillRates,
    PrefillSpeed,
    read_answer,
)
from tests.unit.builders import GIB24, NOW, call, gpu, snapshot

R0, SCALE = 3000.0, 20000.0  # the "engine": 3000 tokens/s at depth 0, twice as slow at 20k


def engine(start: int, end: int) -> float:
    return prefill_seconds(start, end, R0, SCALE)


def taught(samples: list[tuple[int, int]]) -> PrefillRates:
    """The rates learned from misses that evaluated from `start` to `end`."""
    rates = NO_RATES
    for start, end in samples:
        rates = rates.observe("a", "m", Observed(end - start, 0 if start == 0 else start, start),
                              engine(start, end))
    return rates


def test_misses_at_several_depths_teach_the_rate_and_its_slowing() -> None:
    speed = taught([(0, 2000), (0, 30000), (0, 12000), (4000, 20000), (0, 6000)]) \
        .speed("a", "m")
    assert speed.tokens_per_s == pytest.approx(R0, rel=1e-6)
    assert speed.per_token_s / speed.per_token_per_depth_s == pytest.approx(SCALE, rel=1e-6)
    assert speed.seconds(28000, 30000) == pytest.approx(engine(28000, 30000), rel=1e-6)


def test_misses_at_one_depth_take_the_default_slowing_through_their_mean() -> None:
    speed = taught([(0, 10000)] * 3).speed("a", "m")
    assert speed.per_token_s / speed.per_token_per_depth_s == pytest.approx(DEFAULT_DEPTH_SCALE)
    # it reproduces what it saw
    assert speed.seconds(0, 10000) == pytest.approx(engine(0, 10000))
    narrow = taught([(0, 10000), (0, 10000 + int(MIN_DEPTH_SPREAD))]).speed("a", "m")
    assert narrow.per_token_s / narrow.per_token_per_depth_s == \
        pytest.approx(DEFAULT_DEPTH_SCALE)


def test_the_newest_misses_weigh_most() -> None:
    old = taught([(0, 2000), (0, 30000)] * 10)
    faster = old
    for start, end in [(0, 2000), (0, 30000)] * 10:  # the copy is now twice as fast
        faster = faster.observe("a", "m", Observed(end - start, 0, start),
                                engine(start, end) / 2)
    assert faster.rate("a", "m") > 1.8 * old.rate("a", "m")


def test_a_tail_deep_in_the_prompt_is_slower_per_token_than_a_shallow_one() -> None:
    speed = taught([(0, 2000), (0, 30000), (0, 16000)]).speed("a", "m")
    shallow = speed.seconds(1000, 3000) / 2000  # a 2k tail ending at depth 3k
    deep = speed.seconds(27000, 29000) / 2000  # the same tail at depth 28k
    assert deep > 1.5 * shallow
    assert deep == pytest.approx(engine(27000, 29000) / 2000, rel=1e-6)


def test_the_prefill_term_counts_the_depth_its_tail_is_read_at() -> None:
    """Two copies expected to hold the same share of a prompt cost more where the tail sits
    deeper, and the term is the learned seconds from the held prefix to the prompt's end."""
    rates = taught([(0, 2000), (0, 30000), (0, 16000)])
    rates = PrefillRates({("b", "qwen3:8b"): rates.rates[("a", "m")],
                          ("a", "qwen3:8b"): rates.rates[("a", "m")]})
    short = Conversation((1, 2, 3), 4000, shared_tokens=500)
    long = Conversation((1, 9, 10), 30000, shared_tokens=500)
    caches = NO_CACHES.sent("a", "qwen3:8b", Conversation((1, 2), 2000, 500), NOW - 5) \
        .sent("b", "qwen3:8b", Conversation((1, 9), 28000, 500), NOW - 5)
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",), parallel=2, resident_ctx=32768),
                    gpu("b", GIB24, ("qwen3:8b",), parallel=2, resident_ctx=32768),
                    caches=caches, prefill=rates)
    indexes = index_providers(snap, DEFAULT_POLICY)
    on_a = affinity.prefill_terms(indexes["a"], "qwen3:8b",
                                  call("qwen3:8b", tokens=4000, conversation=short), snap)
    on_b = affinity.prefill_terms(indexes["b"], "qwen3:8b",
                                  call("qwen3:8b", tokens=30000, conversation=long), snap)
    speed = rates.speed("a", "qwen3:8b")
    assert on_a["prefill"] == pytest.approx(speed.seconds(2000, 4000))
    assert on_b["prefill"] == pytest.approx(speed.seconds(28000, 30000))
    assert on_b["prefill"] > 1.5 * on_a["prefill"]  # 2000 tokens each


def test_a_hit_is_told_by_the_time_its_tail_takes_at_its_depth() -> None:
    speed = PrefillSpeed.of(R0, SCALE)
    # 2000 tokens evaluated at the end of a 30000-token prompt: found 28000 cached
    observed = read_answer(30000, engine(28000, 30000), "0.33.0", 30000, speed, 28000)
    assert observed == Observed(2000, 28000)  # no start depth: the rate told it, not a miss
    # a miss that found the agent's 1000-token prefix, as expected: it starts there
    observed = read_answer(30000, engine(1000, 30000), "0.33.0", 30000, speed, 1000)
    assert observed == Observed(29000, 1000, 1000)
    # a miss where the whole history was expected: the copy lost it; it started at 0
    observed = read_answer(30000, engine(0, 30000), "0.33.0", 30000, speed, 28000)
    assert observed == Observed(30000, 0, 0)


def test_hits_and_unknown_starts_do_not_teach_the_rate() -> None:
    rates = NO_RATES.observe("a", "m", Observed(2000, 28000), 0.1)
    rates = rates.observe("a", "m", Observed(2000, None), 0.1)
    assert rates.known("a", "m") is None
    assert (rates.hits, rates.calls) == (1, 1)


def test_the_simulators_depth_scale_comes_from_each_models_architecture() -> None:
    scales = {m.name: depth_scale(m) for m in CATALOG}
    # parameters / (2 x layers x heads x key width): qwen3:8b 8.2e9 / (2 x 36 x 32 x 128)
    assert scales["qwen3:8b"] == pytest.approx(8.2e9 / (2 * 36 * 32 * 128))
    assert min(scales["qwen3:8b"], scales["qwen3:14b"], scales["qwen3:32b"]) > 15000 and \
        max(scales["qwen3:8b"], scales["qwen3:14b"], scales["qwen3:32b"]) < 40000
    assert prefill_seconds(0, 2000, 2000.0, 20000.0) == pytest.approx(1.05)
    assert prefill_seconds(28000, 30000, 2000.0, 20000.0) == pytest.approx(2.45)
    assert prefill_seconds(5000, 5000, 2000.0, 20000.0) == 0.0
