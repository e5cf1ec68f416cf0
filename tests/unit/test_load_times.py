"""Load and unload times learned per card (core/load_times.py) and what placement does with
them: a card whose disk is slow loses a cold load to one whose disk is fast, and a victim is
priced at the unload its card was seen to take."""

from __future__ import annotations

import pytest

from proxy.core import load_times
from proxy.core.load_times import NO_LOAD_TIMES, SOURCES, LoadTimes
from proxy.core.placement import explain, place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.queueing import victims_cost_s
from proxy.core.types import ModelDemand, Resident
from tests.unit.builders import GIB24, SIZES, call, gpu, snapshot

DEFAULT = DEFAULT_POLICY.load_mib_per_s


def test_the_most_specific_figure_is_taken() -> None:
    times = NO_LOAD_TIMES
    # nothing learned: the footprint at the default speed, as the design doc has it
    assert times.load("a", "m", 1000, 2048, DEFAULT) == load_times.LoadEstimate(
        2048 / DEFAULT, SOURCES[3])
    times = times.observe_load("a", "m", 6000, 12.0)  # a 6000 MiB file: 500 MiB/s on card a
    assert times.load("a", "m", 9999, 9999, DEFAULT) == load_times.LoadEstimate(12.0, SOURCES[0])
    assert times.load("a", "n", 1000, 2048, DEFAULT) == load_times.LoadEstimate(2.0, SOURCES[1])
    assert times.load("b", "m", 1000, 2048, DEFAULT) == load_times.LoadEstimate(2.0, SOURCES[2])


def test_a_copy_load_time_does_not_grow_with_its_context() -> None:
    """Ollama reads the weights file; a bigger KV cache is allocated, not read: the same
    model on the same card is taken at the time it took, and a learned speed reads the
    file, whatever the footprint."""
    times = NO_LOAD_TIMES.observe_load("a", "m", 5000, 5.0)
    assert times.load("a", "m", 5000, 12000, DEFAULT).seconds == pytest.approx(5.0)
    assert times.load("a", "n", 2000, 30000, DEFAULT).seconds == pytest.approx(2.0)


def test_samples_fade_and_copies_of_a_load_already_there_teach_nothing() -> None:
    times = NO_LOAD_TIMES.observe_load("a", "m", 6000, 10.0).observe_load("a", "m", 6000, 20.0)
    assert times.load("a", "m", 6000, 6000, DEFAULT).seconds == pytest.approx(
        load_times.ALPHA * 20 + (1 - load_times.ALPHA) * 10)
    assert NO_LOAD_TIMES.observe_load("a", "m", 6000, 0.01) == NO_LOAD_TIMES
    assert NO_LOAD_TIMES.observe_load("a", "m", 6000, None) == NO_LOAD_TIMES


def test_unloads_are_per_victim_and_per_card() -> None:
    times = NO_LOAD_TIMES.observe_unload("a", 2, 5.5)
    assert times.unload_s("a", 1.0) == pytest.approx(2.75)
    assert times.unload_s("b", 1.0) == 1.0


def test_what_is_remembered_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load_times, "MAX_CARDS_REMEMBERED", 3)
    times = LoadTimes()
    for i in range(5):
        times = times.observe_load(f"card{i}", "m", 6000, 6.0)
    assert len(times.copies) == 3 and len(times.cards) == 3
    assert ("card0", "m") not in times.copies and ("card4", "m") in times.copies


def test_a_cold_load_goes_to_the_card_that_loads_it_sooner() -> None:
    """Two empty cards alike but for their disks: the 8B took 20 s on "a" and the 14B 3 s
    on "b". With one fleet-wide speed they would tie (and "a" sort first)."""
    times = NO_LOAD_TIMES.observe_load("a", "qwen3:8b", SIZES["qwen3:8b"], 20.0) \
        .observe_load("b", "qwen3:14b", SIZES["qwen3:14b"], 3.0)
    snap = snapshot(gpu("a", GIB24), gpu("b", GIB24), loads=times)
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement is not None and decision.placement.provider == "b"
    verdicts = {v.provider: v for v in explain(call("qwen3:8b"), snap)[1]}
    assert verdicts["a"].terms["load"] == pytest.approx(20.0)
    assert verdicts["a"].sizing["loadSource"] == SOURCES[0]
    assert verdicts["b"].terms["load"] == pytest.approx(SIZES["qwen3:8b"] / (
        SIZES["qwen3:14b"] / 3.0))
    assert verdicts["b"].sizing["loadSource"] == SOURCES[1]


def test_a_victim_costs_the_unload_and_reloads_its_card_was_seen_to_take() -> None:
    times = NO_LOAD_TIMES.observe_load("a", "v", 6000, 30.0).observe_unload("a", 1, 5.0)
    snap = snapshot(gpu("a"), demand={"v": ModelDemand(recent_use=1.0)}, loads=times)
    assert victims_cost_s(gpu("a"), [Resident("v", 6000)], snap, DEFAULT_POLICY) == pytest.approx(
        5.0 + 30.0 * 0.5)
