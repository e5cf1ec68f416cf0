"""place() weighs `takes_room` only where it can decide; explain() weighs it on every verdict.
Both must reach the same decision (docs/rules.md, "A load leaves room for the models in
demand")."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.conversations import NO_CACHES, Conversation
from proxy.core.placement import explain, place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import CallSpec, Candidate, Decision, ModelDemand, Snapshot
from tests.unit.builders import GIB16, GIB24, GIB32, SIZES, call, gpu, snapshot, ticket

MODELS = sorted(SIZES)
ASKED = Conversation((1, 2, 3), 9000, shared_tokens=2000)  # the call's prompt
LIVE = Conversation((1, 7, 8, 9), 12000, shared_tokens=2000)  # another conversation's


@st.composite
def fleets(draw: st.DrawFn) -> Snapshot:
    """Cards of a few equal sizes and provider weights a fraction of `unload_s` apart (so
    cold loads tie or come within it), some residents and calls, a demand board, and live
    histories on some copies."""
    views = []
    count = draw(st.integers(2, 6))
    # names out of the cards' order, so that a tie broken by name is not broken by order
    for name in draw(st.permutations([f"p{i}" for i in range(count)])):
        total = draw(st.sampled_from([GIB16, GIB24, GIB32]))
        residents: list[str] = []
        for model in draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=1)):
            if sum(SIZES[m] for m in (*residents, model)) <= total - 4000:
                residents.append(model)
        views.append(gpu(name, total, tuple(residents), parallel=draw(st.integers(1, 2)),
                         weight=draw(st.sampled_from([100.0, 130.0, 170.0]))))
    tickets = tuple(ticket(view.name, resident.model, elapsed=draw(st.floats(0, 30)))
                    for view in views for resident in view.residents if draw(st.booleans()))
    demand = {model: ModelDemand(waiters=draw(st.integers(0, 1)),
                                 recent_use=draw(st.sampled_from([0.0, 1.0])))
              for model in draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=4))}
    caches = NO_CACHES
    for view in views:
        for resident in view.residents:
            if draw(st.booleans()):
                caches = caches.sent(view.name, resident.model, LIVE, 900.0)
    return snapshot(*views, tickets=tickets, demand=demand, caches=caches)


@st.composite
def calls(draw: st.DrawFn) -> CallSpec:
    models = draw(st.lists(st.sampled_from(MODELS), unique=True, min_size=1, max_size=3))
    scores = sorted(draw(st.lists(st.integers(70, 100), min_size=len(models),
                                  max_size=len(models))), reverse=True)
    conversation = ASKED if draw(st.booleans()) else None
    return CallSpec(tuple(Candidate(m, s) for m, s in zip(models, scores, strict=True)),
                    prompt_tokens=9000, tolerance=draw(st.sampled_from([0, 10, 30])),
                    conversation=conversation, can_wait=draw(st.booleans()),
                    wait_left_s=draw(st.sampled_from([None, 0.0, 2.0, 10.0])))


def without_verdicts(decision: Decision) -> tuple[object, ...]:
    return (decision.outcome, decision.placement, decision.reason,
            decision.queue_option_s, decision.unload_option_s)


@settings(max_examples=500, deadline=None)
@given(fleets(), calls(), st.sampled_from([0.0, 0.3, 1.0, 5.0, 30.0]))
def test_weighing_the_room_lazily_decides_as_weighing_it_everywhere(
        snap: Snapshot, spec: CallSpec, unload_s: float) -> None:
    policy = replace(DEFAULT_POLICY, unload_s=unload_s)  # the term's size
    lazy = place(spec, snap, policy)
    every, _ = explain(spec, snap, policy)
    assert without_verdicts(lazy) == without_verdicts(every)
    complete = {(v.provider, v.model): v.terms for v in every.verdicts}
    for verdict in lazy.verdicts:  # a term left out is takes_room, and only that
        terms = dict(complete[verdict.provider, verdict.model])
        if "takes_room" not in verdict.terms:
            terms.pop("takes_room", None)
        assert verdict.terms == terms


@settings(max_examples=500, deadline=None)
@given(fleets(), calls(), st.sampled_from([0.0, 0.3, 1.0, 5.0, 30.0]))
def test_a_card_place_passes_over_could_neither_win_nor_tie(
        snap: Snapshot, spec: CallSpec, unload_s: float) -> None:
    assert_passed_over_cost_more(snap, spec, unload_s)


def assert_passed_over_cost_more(snap: Snapshot, spec: CallSpec, unload_s: float) -> None:
    """place() leaves out of its verdicts a card whose load costs at least more than the
    cheapest load or copy found; explain() weighs it, every term: it costs more."""
    policy = replace(DEFAULT_POLICY, unload_s=unload_s)
    lazy = place(spec, snap, policy)
    _, verdicts = explain(spec, snap, policy)
    if not lazy.verdicts:
        return  # steps 1-3 decided: no card was weighed
    weighed = {v.provider for v in lazy.verdicts}
    passed_over = [v for v in verdicts if v.model == spec.preferred.model
                   and v.provider not in weighed]
    if passed_over:
        # A wait's queue_option_s is the call's own wait, without the shared terms (provider
        # weight) its slot's verdict carries: the bar was that verdict, the cheapest weighed
        chosen = lazy.placement.cost_s if lazy.placement else min(
            [v.cost_s for v in lazy.verdicts if v.feasible], default=lazy.queue_option_s)
        assert chosen is not None
        assert all(v.cost_s > chosen for v in passed_over if v.feasible)


def test_a_load_too_dear_to_win_is_not_weighed_by_place() -> None:
    """The 14B on the 16 GiB card shuts the 8B out while the 24 GiB card would not; the
    24 GiB card's provider weight makes it cheaper by more than the unload already
    (0.01 s x 200 points), so place() passes the 16 GiB card over (what a load there costs
    at least is above the 24 GiB card's load) and explain() shows its verdict, the room it
    takes charged."""
    snap = snapshot(gpu("mid", GIB24, weight=300), gpu("small", GIB16))
    spec = call("qwen3:14b", ("qwen3:8b", -5))
    lazy = place(spec, snap)
    decision, verdicts = explain(spec, snap)
    assert lazy.placement and lazy.placement.provider == "mid"
    assert without_verdicts(lazy) == without_verdicts(decision)
    assert [v.provider for v in lazy.verdicts] == ["mid"]
    explained = next(v for v in verdicts if (v.provider, v.model) == ("small", "qwen3:14b"))
    assert explained.terms["takes_room"] == DEFAULT_POLICY.unload_s
    assert explained.cost_s - DEFAULT_POLICY.unload_s > lazy.placement.cost_s


def test_of_two_loads_that_tie_the_one_that_takes_room_loses_though_its_name_comes_first(
) -> None:
    """Two 24 GiB cards, "b" listed first: the 14B costs the same on both, but beside the
    3.6 GiB phi3 on "a" it leaves 5792 MiB, too little for the 8B the call also accepts, so
    "a" pays the unload and the tie it would win by name goes to "b"."""
    snap = snapshot(gpu("b", GIB24), gpu("a", GIB24, ("phi3:mini",)))
    decision = place(call("qwen3:14b", ("qwen3:8b", -5)), snap)
    assert decision.placement and decision.placement.provider == "b"
    terms = {v.provider: v.terms for v in decision.verdicts}
    assert terms["a"]["takes_room"] == DEFAULT_POLICY.unload_s
    assert {k: v for k, v in terms["a"].items() if k != "takes_room"} == terms["b"]


def test_a_wait_for_a_slot_passes_over_a_load_dearer_than_its_verdict() -> None:
    """A wait's bar is its slot's verdict (2.0 s: a 3 s wait less the provider weight's
    second), not the call's own wait (3.0 s): a load costing 2.3 s is passed over."""
    snap = snapshot(gpu("p2", GIB24), gpu("p3", GIB16, ("llama3.2:3b",)), gpu("p4", GIB24),
                    tickets=(ticket("p3", "llama3.2:3b", elapsed=27),))
    spec = call("llama3.2:3b", tokens=9000, tolerance=0)
    policy = replace(DEFAULT_POLICY, unload_s=0.0)
    assert_passed_over_cost_more(snap, spec, 0.0)
    decision = place(spec, snap, policy)
    assert decision.outcome == "wait" and decision.queue_option_s == 3.0
    assert {v.provider for v in decision.verdicts} == {"p2", "p3"}  # p4 passed over
