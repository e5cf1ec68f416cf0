"""Late binding's waiting line: a free slot is due to the waiting calls with the soonest
turns, a turn being the arrival plus a slack of the call's expected length."""

from __future__ import annotations

from proxy.core.lengths import NO_LENGTHS, CallLength, CallSample
from proxy.core.placement import place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import ModelDemand, Placement
from proxy.core.waitline import (
    MAX_SLACK_S,
    SLACK_LENGTHS,
    free_slots,
    slack_s,
    waiters_ahead,
    yields_to_sooner,
)
from tests.unit.builders import GIB24, NOW, call, gpu, snapshot, ticket


def waiting(*turns: float) -> dict[str, ModelDemand]:
    return {"qwen3:8b": ModelDemand(waiters=len(turns), turns=tuple(sorted(turns)))}


def test_only_calls_with_sooner_turns_are_ahead() -> None:
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",)), demand=waiting(NOW - 5, NOW - 2, NOW + 1))
    assert waiters_ahead(snap, "qwen3:8b", NOW) == 2
    assert waiters_ahead(snap, "qwen3:8b", NOW - 10) == 0
    assert waiters_ahead(snap, "qwen3:14b", NOW) == 0


def test_a_free_slot_goes_to_a_waiting_call_with_a_sooner_turn_first() -> None:
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",)), demand=waiting(NOW - 3))
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement is not None and decision.placement.kind == "warm"
    assert yields_to_sooner(decision.placement, snap, DEFAULT_POLICY, NOW) == 1
    # the older call itself (its own entry is not in what it sees) takes it
    alone = snapshot(gpu("a", GIB24, ("qwen3:8b",)))
    assert yields_to_sooner(decision.placement, alone, DEFAULT_POLICY, NOW - 3) == 0


def test_more_free_slots_than_sooner_calls_leave_one_for_a_later_call() -> None:
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",), parallel=2), demand=waiting(NOW - 3))
    assert free_slots(snap, DEFAULT_POLICY, "qwen3:8b") == 2
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement is not None
    assert yields_to_sooner(decision.placement, snap, DEFAULT_POLICY, NOW) == 0


def test_a_load_is_never_yielded() -> None:
    load = Placement("b", "qwen3:8b", "cold", 4, 6000)
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",)), gpu("b", GIB24), demand=waiting(NOW - 3))
    assert yields_to_sooner(load, snap, DEFAULT_POLICY, NOW) == 0


def test_a_loading_copy_counts_its_slots_less_the_calls_bound_to_it() -> None:
    loader = ticket("a", "qwen3:8b", cold=True, elapsed=1)
    one_slot = snapshot(gpu("a", GIB24), tickets=(loader,))
    assert free_slots(one_slot, DEFAULT_POLICY, "qwen3:8b") == 0
    two_slots = snapshot(gpu("a", GIB24, parallel=2), tickets=(loader,))
    assert free_slots(two_slots, DEFAULT_POLICY, "qwen3:8b") == 1


def test_a_call_of_unknown_length_is_due_at_its_arrival() -> None:
    assert slack_s(None) == 0.0


def test_the_slack_is_a_share_of_the_expected_length_and_bounded() -> None:
    assert slack_s(CallLength(4.0, "x")) == SLACK_LENGTHS * 4.0
    assert slack_s(CallLength(10_000.0, "x")) == MAX_SLACK_S


def test_a_short_call_passes_a_long_one_only_if_it_arrived_within_its_slack() -> None:
    long_turn = 10.0 + slack_s(CallLength(8.0, "long"))  # arrived at 10 s
    short = slack_s(CallLength(0.5, "short"))
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",)), demand=waiting(long_turn))
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement is not None
    # arrived a second after the long call: its turn comes first
    assert yields_to_sooner(decision.placement, snap, DEFAULT_POLICY, 11.0 + short) == 0
    # arrived at the long call's turn: after it
    assert yields_to_sooner(decision.placement, snap, DEFAULT_POLICY, long_turn + short) == 1


def test_a_calls_work_is_its_answer_at_the_models_rate_plus_its_prompt() -> None:
    assert NO_LENGTHS.work("qwen3:8b", num_predict=100) is None  # no rate seen yet
    seen = NO_LENGTHS.observe("a", "qwen3:8b", CallSample(2.5, 200, 2.0, 1000, 0.5))
    assert seen.work("qwen3:14b") is None  # another model: nothing known of it
    typical = seen.work("qwen3:8b", prompt_tokens=2000)
    assert typical is not None and typical.seconds == 1.0 + 2.0  # 200 tokens at 100/s
    capped = seen.work("qwen3:8b", num_predict=50)
    assert capped is not None and capped.seconds == 0.5
    assert capped.source == "num_predict at qwen3:8b's token rate"
