"""Load and unload times learned per card (core/load_times.py) and what placement does with
them: a card whose disk is slow loses a cold load to one whose disk is fast, and victims are
priced at the unloads their card was seen to take, one at a time."""

from __future__ import annotations

import pytest

from proxy.core import load_times
from proxy.core.load_times import NO_LOAD_TIMES, SOURCES, LoadEstimate, LoadTimes
from proxy.core.placement import explain, place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.queueing import victims_cost_s
from proxy.core.types import ModelDemand, Resident
from tests.unit.builders import GIB24, SIZES, call, gpu, snapshot

SPEED = DEFAULT_POLICY.load_mib_per_s
UP = DEFAULT_POLICY.load_startup_s  # 1 s


def test_the_most_specific_figure_is_taken() -> None:
    times = NO_LOAD_TIMES
    # nothing learned: the start-up and the file at 1 GiB/s; with no file size known, the
    # footprint at 1 GiB/s, as the design doc has it
    assert times.load("a", "m", 2048, 3000, SPEED, UP) == LoadEstimate(3.0, SOURCES[3])
    assert times.load("a", "m", None, 3072, SPEED, UP) == LoadEstimate(3.0, SOURCES[3])
    times = times.observe_load("a", "m", 6000, 13.0, UP)  # 6000 MiB read in 12 s: 500 MiB/s
    assert times.load("a", "m", 9999, 9999, SPEED, UP) == LoadEstimate(13.0, SOURCES[0])
    assert times.load("a", "n", 1000, 2048, SPEED, UP) == LoadEstimate(3.0, SOURCES[1])
    assert times.load("b", "m", 1000, 2048, SPEED, UP) == LoadEstimate(3.0, SOURCES[2])


def test_a_copy_load_time_does_not_grow_with_its_context() -> None:
    """Ollama reads the weights file; a bigger KV cache is allocated, not read."""
    times = NO_LOAD_TIMES.observe_load("a", "m", 5000, 6.0, UP)
    assert times.load("a", "m", 5000, 12000, SPEED, UP).seconds == pytest.approx(6.0)
    assert times.load("a", "n", 2000, 30000, SPEED, UP).seconds == pytest.approx(3.0)


def test_a_speed_learned_on_a_small_model_prices_a_large_one() -> None:
    """The simulator's figures (start-up 1 s, 1024 MiB/s, the 250 ms poll): llama3.2:3b
    (1926 MiB) loads in 3.0 s, qwen3:32b (20200 MiB) in 20.75 s. Through zero (file / 3 s)
    the 32b would be taken at 31.5 s; with the start-up apart, within 6 %."""
    times = NO_LOAD_TIMES.observe_load("a", "llama3.2:3b", 1926, 3.0, UP)
    estimate = times.load("a", "qwen3:32b", 20200, 27000, SPEED, UP).seconds
    assert estimate == pytest.approx(20.75, rel=0.06)


def test_a_figure_falls_at_once_and_rises_slowly() -> None:
    """A delay only adds to a load (one queued ahead, Ollama's own eviction before it)."""
    times = NO_LOAD_TIMES.observe_load("a", "m", 6000, 10.0, UP)
    slower = times.observe_load("a", "m", 6000, 20.0, UP)
    assert slower.copies[("a", "m")] == pytest.approx(0.9 * 10 + 0.1 * 20)
    quicker = times.observe_load("a", "m", 6000, 6.0, UP)
    assert quicker.copies[("a", "m")] == pytest.approx(0.5 * 10 + 0.5 * 6)
    assert quicker.cards["a"] > times.cards["a"] > slower.cards["a"]
    assert NO_LOAD_TIMES.observe_load("a", "m", 6000, 0.01, UP) == NO_LOAD_TIMES
    assert NO_LOAD_TIMES.observe_load("a", "m", 6000, None, UP) == NO_LOAD_TIMES


def test_unloads_are_the_first_victim_then_a_gap_per_victim() -> None:
    """Ollama unloads the first victim at once and each next one after the last one's
    memory came back (up to 5 s)."""
    times = NO_LOAD_TIMES.observe_unload("a", (10.05, 0.05, 5.05, 15.05))
    assert times.unloads_s("a", 1, 1.0) == pytest.approx(0.05)
    assert times.unloads_s("a", 4, 1.0) == pytest.approx(0.05 + 3 * 5.0)
    assert times.unloads_s("b", 2, 1.0) == 2.0  # nothing seen there: the policy's 1 s each
    one = NO_LOAD_TIMES.observe_unload("a", (0.1,))
    assert one.unloads_s("a", 2, 1.0) == pytest.approx(0.1 + 1.0)  # no gap seen yet
    stalled = NO_LOAD_TIMES.observe_unload("a", (30.0,))
    assert stalled.unloads_s("a", 1, 1.0) == load_times.MAX_UNLOAD_SAMPLE_S


def test_what_is_remembered_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load_times, "MAX_CARDS_REMEMBERED", 3)
    times = LoadTimes()
    for i in range(5):
        times = times.observe_load(f"card{i}", "m", 6000, 6.0, UP)
    assert len(times.copies) == 3 and len(times.cards) == 3
    assert ("card0", "m") not in times.copies and ("card4", "m") in times.copies


def test_a_cold_load_goes_to_the_card_that_loads_it_sooner() -> None:
    """Two empty cards alike but for their disks: the 8B took 20 s on "a" and the 14B 3 s
    on "b". With one fleet-wide speed they would tie (and "a" sort first)."""
    times = NO_LOAD_TIMES.observe_load("a", "qwen3:8b", SIZES["qwen3:8b"], 20.0, UP) \
        .observe_load("b", "qwen3:14b", SIZES["qwen3:14b"], 3.0, UP)
    snap = snapshot(gpu("a", GIB24), gpu("b", GIB24), loads=times)
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement is not None and decision.placement.provider == "b"
    verdicts = {v.provider: v for v in explain(call("qwen3:8b"), snap)[1]}
    assert verdicts["a"].terms["load"] == pytest.approx(20.0)
    assert verdicts["a"].sizing["loadSource"] == SOURCES[0]
    # (no file size on these cards: the footprint read at the card's speed)
    assert verdicts["b"].terms["load"] == pytest.approx(UP + SIZES["qwen3:8b"] / (
        SIZES["qwen3:14b"] / 2.0))
    assert verdicts["b"].sizing["loadSource"] == SOURCES[1]


def test_victims_cost_the_unloads_and_reloads_their_card_was_seen_to_take() -> None:
    times = NO_LOAD_TIMES.observe_load("a", "v", 6000, 30.0, UP) \
        .observe_unload("a", (0.2, 4.2))
    snap = snapshot(gpu("a"), demand={"v": ModelDemand(recent_use=1.0)}, loads=times)
    victims = [Resident("v", 6000), Resident("w", 3000)]
    assert victims_cost_s(gpu("a"), victims, snap, DEFAULT_POLICY) == pytest.approx(
        0.2 + 4.0 + 30.0 * 0.5)
