"""When a wait for a slot loses to a load (docs/rules.md, "Late binding"): a call that cannot
wait (X-Kubemoot-Wait: false, role coordinator) takes a free slot or a load, never a busy
copy's queue; a call whose expected wait would outlast what is left of its wait limit takes a
load over it, even a dearer one. With no load possible, the call that may wait still waits
and the one that cannot gets "wait" (the scheduler's static endpoint or 503)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings

from proxy.core.lengths import NO_LENGTHS, CallSample
from proxy.core.placement import explain, place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import CallSpec, Snapshot
from tests.unit.builders import GIB16, GIB24, call, gpu, snapshot, ticket
from tests.unit.test_affinity import caches_after, loop, two_cards
from tests.unit.test_placement_lazy import calls, fleets

CALL_S = 1.5  # the 8b's calls, learned
LOAD_8B_S = 6000 / DEFAULT_POLICY.load_mib_per_s  # onto free room: ~5.9 s


def busy_8b_and_idle_card() -> Snapshot:
    """The 8b warm on "a" (one slot), a call 0.5 s in and one queued behind it: waiting for
    the slot costs 2.5 s + 1.5 s backlog - 1 s provider weight = 3.0 s; "b" has room for a
    copy (~5.9 s - 1 s)."""
    return snapshot(
        gpu("a", GIB24, ("qwen3:8b",)), gpu("b", GIB16),
        tickets=(ticket("a", "qwen3:8b", elapsed=0.5), ticket("a", "qwen3:8b")),
        lengths=NO_LENGTHS.observe("a", "qwen3:8b", CallSample(CALL_S)))


def busy_14b_and_idle_8b(call_s: float) -> Snapshot:
    """The 14b warm and busy on "a" (its call 1 s in); "b" holds an idle 8b and has no room
    for the 14b beside it: step 5, wait for a's slot (call_s - 1 s) or unload the 8b."""
    return snapshot(
        gpu("a", GIB16, ("qwen3:14b",)), gpu("b", GIB16, ("qwen3:8b",)),
        tickets=(ticket("a", "qwen3:14b", elapsed=1.0),),
        lengths=NO_LENGTHS.observe("a", "qwen3:14b", CallSample(call_s)))


def one_busy_card() -> Snapshot:
    """The 8b's only copy busy (1 s left), nothing to load or unload."""
    return snapshot(gpu("a", GIB16, ("qwen3:8b",)),
                    tickets=(ticket("a", "qwen3:8b", elapsed=0.5),),
                    lengths=NO_LENGTHS.observe("a", "qwen3:8b", CallSample(CALL_S)))


def where(spec: CallSpec, snap: Snapshot) -> tuple[str, str | None, str | None, int | None]:
    decision = place(spec, snap)
    p = decision.placement
    if p is None:
        return (decision.outcome, None, None, None)
    return (decision.outcome, p.provider, p.kind, p.step)


# -- a call that cannot wait -------------------------------------------------------------------

def test_a_call_that_cannot_wait_takes_a_free_slot() -> None:
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",)), gpu("b", GIB16))
    assert where(call("qwen3:8b", can_wait=False), snap) == ("placed", "a", "warm", 1)


def test_a_call_that_cannot_wait_takes_a_load_onto_free_room_over_a_cheaper_wait() -> None:
    snap = busy_8b_and_idle_card()
    assert where(call("qwen3:8b"), snap) == ("wait", None, None, None)
    assert where(call("qwen3:8b", can_wait=False), snap) == ("placed", "b", "cold", 4)


def test_a_call_that_cannot_wait_unloads_an_idle_model_rather_than_wait() -> None:
    """Waiting for a's slot (0.5 s) beats unloading the idle 8b for a 14b on b (~12 s); a call
    that may wait waits, one that cannot unloads."""
    snap = busy_14b_and_idle_8b(call_s=1.5)
    may = place(call("qwen3:14b"), snap)
    assert may.outcome == "wait" and may.queue_option_s == pytest.approx(0.5)
    cannot = place(call("qwen3:14b", can_wait=False), snap)
    assert cannot.placement is not None
    assert (cannot.placement.provider, cannot.placement.kind, cannot.placement.evicts) == (
        "b", "evict", {"qwen3:8b": 6000})
    assert "though waiting for a slot (0.5 s) is not for this call, which cannot wait" in \
        cannot.reason


def test_a_call_that_cannot_wait_gets_wait_when_only_a_slot_would_serve_it() -> None:
    decision = place(call("qwen3:8b", can_wait=False), one_busy_card())
    assert (decision.outcome, decision.placement) == ("wait", None)
    assert decision.reason.startswith("busy: the only option is waiting for a slot")


def test_a_call_that_cannot_wait_is_still_refused_a_model_no_card_holds() -> None:
    decision = place(call("qwen3:32b", can_wait=False), one_busy_card())
    assert decision.outcome == "model-too-large"


def test_a_call_that_cannot_wait_does_not_wait_for_the_copy_holding_its_history() -> None:
    """The busy holder "a" is 2 s from a slot, cheaper than reading the history again on
    "b": a call that may wait waits for it, one that cannot takes b's free slot."""
    nxt = loop(1, 5)
    snap = two_cards(caches_after(("a", loop(1, 4))), busy_a=1, elapsed=18.0)
    spec = call("qwen3:8b", tokens=nxt.tokens, conversation=nxt)
    assert place(spec, snap).outcome == "wait"
    assert where(replace(spec, can_wait=False), snap) == ("placed", "b", "warm", 1)


# -- a wait longer than what is left of the wait limit -----------------------------------------

@pytest.mark.parametrize(("left_s", "outcome", "provider"), [
    (None, "wait", None),  # no limit weighed (the cheaper: the wait)
    (10.0, "wait", None),  # the call's own 2.5 s wait fits in what is left
    (2.5, "wait", None),  # exactly what is left: it fits
    (2.44, "placed", "b"),  # it would outlast it; the dearer load (4.93 s) starts the call
    # within the wait plus the time left (4.94 s)
    (1.0, "wait", None),  # the load would start it later than that: a load that slow is no
    (0.0, "wait", None),  # better than the refusal the limit ends the wait with
])
def test_a_wait_that_would_outlast_the_limit_loses_to_a_load(
        left_s: float | None, outcome: str, provider: str | None) -> None:
    decision, verdicts = explain(call("qwen3:8b", wait_left_s=left_s), busy_8b_and_idle_card())
    costs = {v.provider: v.cost_s for v in verdicts}
    assert costs["a"] == pytest.approx(3.0) and costs["b"] > costs["a"]  # the wait is cheaper
    assert (decision.outcome, decision.placement and decision.placement.provider) == (
        outcome, provider)
    if outcome == "placed":
        assert decision.reason == (
            f"step 4: cold on b ({costs['b']:.1f} s): waiting for a slot of qwen3:8b on a "
            f"(2.5 s) would outlast the {left_s:.1f} s left of its wait limit")


@pytest.mark.parametrize(("left_s", "kind"), [(30.0, None), (5.0, "evict")])
def test_a_step_5_wait_that_would_outlast_the_limit_loses_to_an_unload(
        left_s: float, kind: str | None) -> None:
    """The 14b's call takes 10 s: a's slot is 9 s away, cheaper than unloading b's idle 8b
    and loading the 14b there (~12 s)."""
    snap = busy_14b_and_idle_8b(call_s=10.0)
    decision = place(call("qwen3:14b", wait_left_s=left_s), snap)
    assert decision.queue_option_s == pytest.approx(9.0)
    assert decision.unload_option_s is not None and decision.unload_option_s > 9.0
    assert (decision.placement and decision.placement.kind) == kind
    if kind:
        assert "would outlast the 5.0 s left of its wait limit" in decision.reason


def test_with_no_load_possible_a_wait_too_long_is_still_waited() -> None:
    """Nothing to load or unload: the call that may wait keeps waiting (it may still get the
    slot in time, or a load may become possible), and says it may not last."""
    decision = place(call("qwen3:8b", wait_left_s=0.5), one_busy_card())
    assert (decision.outcome, decision.placement) == ("wait", None)
    assert "though it would outlast the 0.5 s left of its wait limit" in decision.reason


# -- properties over random fleets -------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(fleets(), calls())
def test_a_load_that_fits_is_never_passed_over_for_a_wait_the_call_may_not_make(
        snap: Snapshot, spec: CallSpec) -> None:
    """When a load of the preferred model onto free room is feasible, a call that cannot
    wait is placed (no queue: never "queued"), and a call waits only for a slot expected
    within what is left of its limit, or where every load would start it later still than
    the wait plus what is left."""
    decision, verdicts = explain(spec, snap)
    assert decision.placement is None or decision.placement.kind != "queued"
    loads = [v for v in verdicts if v.model == spec.preferred.model and v.feasible
             and v.reason.startswith(("fits", "fit unknown"))]
    if not loads or decision.outcome != "wait":
        return
    assert spec.can_wait
    # a step 4 wait carries the call's own wait (a step 5 one has no load onto free room):
    # within what is left, or every load would start the call later than the wait plus that
    wait_s = decision.queue_option_s
    assert wait_s is not None
    left = spec.wait_left_s
    assert left is None or wait_s <= left or \
        min(v.cost_s for v in loads) > wait_s + left - 1e-9


def test_the_wait_weighed_against_the_limit_is_the_calls_own_not_its_run_or_the_line() -> None:
    """"a" also runs a 14b call about to end: what it adds to the 8b's run (contention) and
    the backlog are no part of the wait for the slot (2.5 s), which fits in the 3 s left."""
    base = busy_8b_and_idle_card()
    a = replace(base.providers[0], residents=(*base.providers[0].residents,
                                              *gpu("x", GIB24, ("qwen3:14b",)).residents))
    snap = replace(base, providers=(a, base.providers[1]),
                   tickets=(*base.tickets, ticket("a", "qwen3:14b", elapsed=29.5)))
    spec = replace(call("qwen3:8b"), wait_left_s=3.0)
    decision, verdicts = explain(spec, snap)
    waited = next(v for v in verdicts if v.provider == "a" and v.model == "qwen3:8b")
    assert waited.cost_s > 3.0 > waited.terms["queue"]
    assert decision.outcome == "wait", decision.reason
