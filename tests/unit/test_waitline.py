"""Late binding's arrival order: a free slot is due to the model's older waiting calls."""

from __future__ import annotations

from proxy.core.placement import place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import ModelDemand, Placement
from proxy.core.waitline import free_slots, waiters_ahead, yields_to_older
from tests.unit.builders import GIB24, NOW, call, gpu, snapshot, ticket


def waiting(*arrivals: float) -> dict[str, ModelDemand]:
    return {"qwen3:8b": ModelDemand(waiters=len(arrivals), arrivals=tuple(sorted(arrivals)))}


def test_only_calls_that_arrived_earlier_are_ahead() -> None:
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",)), demand=waiting(NOW - 5, NOW - 2, NOW + 1))
    assert waiters_ahead(snap, "qwen3:8b", NOW) == 2
    assert waiters_ahead(snap, "qwen3:8b", NOW - 10) == 0
    assert waiters_ahead(snap, "qwen3:14b", NOW) == 0


def test_a_free_slot_goes_to_an_older_waiting_call_first() -> None:
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",)), demand=waiting(NOW - 3))
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement is not None and decision.placement.kind == "warm"
    assert yields_to_older(decision.placement, snap, DEFAULT_POLICY, NOW) == 1
    # the older call itself (its own entry is not in what it sees) takes it
    alone = snapshot(gpu("a", GIB24, ("qwen3:8b",)))
    assert yields_to_older(decision.placement, alone, DEFAULT_POLICY, NOW - 3) == 0


def test_more_free_slots_than_older_calls_leave_one_for_a_younger_call() -> None:
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",), parallel=2), demand=waiting(NOW - 3))
    assert free_slots(snap, DEFAULT_POLICY, "qwen3:8b") == 2
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement is not None
    assert yields_to_older(decision.placement, snap, DEFAULT_POLICY, NOW) == 0


def test_a_load_is_never_yielded() -> None:
    load = Placement("b", "qwen3:8b", "cold", 4, 6000)
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",)), gpu("b", GIB24), demand=waiting(NOW - 3))
    assert yields_to_older(load, snap, DEFAULT_POLICY, NOW) == 0


def test_a_loading_copy_counts_its_slots_less_the_calls_bound_to_it() -> None:
    loader = ticket("a", "qwen3:8b", cold=True, elapsed=1)
    one_slot = snapshot(gpu("a", GIB24), tickets=(loader,))
    assert free_slots(one_slot, DEFAULT_POLICY, "qwen3:8b") == 0
    two_slots = snapshot(gpu("a", GIB24, parallel=2), tickets=(loader,))
    assert free_slots(two_slots, DEFAULT_POLICY, "qwen3:8b") == 1
