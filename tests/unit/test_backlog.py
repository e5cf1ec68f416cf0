"""Queueing against a load onto free room (step 4): the queue is charged what it adds to the
model's backlog, so a model whose calls outrun its copies gets another copy, and one queued
call of a model nobody else waits for still queues."""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxy.core.cost import Backlog, backlog
from proxy.core.lengths import NO_LENGTHS, CallSample
from proxy.core.occupancy import index_providers
from proxy.core.placement import explain, place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import ModelDemand, Snapshot
from tests.unit.builders import GIB16, GIB24, call, gpu, snapshot, ticket

CALL_S = 1.5  # the 8b's calls on "a", learned
LOAD_S = 6000 / DEFAULT_POLICY.load_mib_per_s  # the 8b onto "b"'s free room: ~5.9 s


def busy_copy(waiters: int) -> Snapshot:
    """The 8b warm on "a" (one slot) with a call 0.5 s in and one queued behind it; "b" has
    room for another copy."""
    return snapshot(
        gpu("a", GIB24, ("qwen3:8b",)), gpu("b", GIB16),
        tickets=(ticket("a", "qwen3:8b", elapsed=0.5), ticket("a", "qwen3:8b")),
        demand={"qwen3:8b": ModelDemand(waiters=waiters)} if waiters else None,
        lengths=NO_LENGTHS.observe("a", "qwen3:8b", CallSample(CALL_S)))


def test_the_backlog_counts_calls_beyond_the_slots_and_the_waiters() -> None:
    snap = busy_copy(waiters=3)
    found = backlog(index_providers(snap, DEFAULT_POLICY).values(), "qwen3:8b", snap)
    assert found == Backlog(calls=1 + 3, slots=1)
    assert found.delay_s(CALL_S) == pytest.approx(4 * CALL_S)


def test_a_model_nobody_else_waits_for_queues_behind_one_call() -> None:
    decision, verdicts = explain(call("qwen3:8b"), busy_copy(waiters=0))
    warm = next(v for v in verdicts if v.provider == "a")
    # 1 s left of the running call, one call queued: 2.5 s; the queued call is the backlog
    assert warm.terms["queue"] == pytest.approx(1.0 + CALL_S)
    assert warm.terms["backlog"] == pytest.approx(CALL_S)
    assert warm.terms["queue"] + warm.terms["backlog"] < LOAD_S
    # Late binding: it waits in the sidecar for a's slot rather than queueing inside a
    assert (decision.outcome, decision.placement) == ("wait", None)
    assert "slot of qwen3:8b on a" in decision.reason


def test_a_call_that_cannot_wait_takes_the_load_over_a_cheaper_wait() -> None:
    """Waiting for a's slot is cheaper than loading on b (~5.9 s), but a call that
    cannot wait (X-Kubemoot-Wait: false) is not queued inside a's engine: queueing there is
    waiting. It takes the load."""
    decision = place(replace(call("qwen3:8b"), can_wait=False), busy_copy(waiters=0))
    assert decision.outcome == "placed" and decision.placement is not None
    assert (decision.placement.provider, decision.placement.kind,
            decision.placement.step) == ("b", "cold", 4)
    assert "waiting for a slot of qwen3:8b on a (2.5 s) is not for this call" in \
        decision.reason


def test_a_call_that_cannot_wait_is_not_queued_where_only_a_wait_is_left() -> None:
    """No other card to load on, nothing to unload: step 5's wait for a slot is the only
    option. A call that cannot wait gets "wait", which the scheduler turns into the static
    endpoint or a 503 gpu-busy, never queued at the busy copy (CONTRACT.md)."""
    snap = snapshot(gpu("a", GIB16, ("qwen3:8b",)),
                    tickets=(ticket("a", "qwen3:8b", elapsed=0.5),),
                    lengths=NO_LENGTHS.observe("a", "qwen3:8b", CallSample(CALL_S)))
    assert place(call("qwen3:8b"), snap).outcome == "wait"
    decision = place(replace(call("qwen3:8b"), can_wait=False), snap)
    assert (decision.outcome, decision.placement) == ("wait", None)
    assert "the only option is waiting for a slot of qwen3:8b on a (1.0 s)" in decision.reason


def test_a_hot_model_with_waiters_gets_a_second_copy() -> None:
    decision = place(call("qwen3:8b"), busy_copy(waiters=3))
    # queueing: 2.5 s for this call and 1.5 s more for each of the 4 calls behind > ~5.9 s
    assert decision.placement is not None
    assert (decision.placement.provider, decision.placement.kind) == ("b", "cold")


def test_a_free_slot_adds_nothing_to_the_backlog() -> None:
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",), parallel=2), gpu("b", GIB16),
                    tickets=(ticket("a", "qwen3:8b", elapsed=0.5),),
                    demand={"qwen3:8b": ModelDemand(waiters=5)})
    decision, verdicts = explain(call("qwen3:8b"), snap)
    warm = next(v for v in verdicts if v.provider == "a")
    assert "backlog" not in warm.terms
    assert decision.placement is not None
    assert (decision.placement.provider, decision.placement.kind) == ("a", "warm")
