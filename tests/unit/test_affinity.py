"""Conversation cache affinity: what a copy is expected to hold, the prefill it spares, and
how answers tell a hit (docs/affinity.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxy.core import affinity
from proxy.core.conversations import NO_CACHES, Conversation, PromptCaches, cache_slots
from proxy.core.lengths import NO_LENGTHS, CallSample
from proxy.core.occupancy import index_providers
from proxy.core.placement import explain, place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.prefill import (
    DEFAULT_DEPTH_SCALE,
    NO_RATES,
    Observed,
    PrefillRates,
    PrefillSpeed,
    read_answer,
)
from proxy.core.types import ModelDemand, Snapshot
from tests.unit.builders import GIB16, GIB24, NOW, call, gpu, snapshot, ticket

RATE = 1000.0  # tokens/s, learned on both cards


def loop(name: int, turns: int, per_turn: int = 4000) -> Conversation:
    """A tool loop's prompt after `turns` calls: the agent's prefix (digest 1), its task
    (digest 100 + name), then a digest per turn."""
    digests = (1, 100 + name, *(1000 * name + t for t in range(turns)))
    return Conversation(digests, 2000 + per_turn * turns, shared_tokens=2000)


def caches_after(*sent: tuple[str, Conversation], start: float = NOW - 100) -> PromptCaches:
    caches = NO_CACHES
    for i, (provider, conversation) in enumerate(sent):
        caches = caches.sent(provider, "qwen3:8b", conversation, start + i)
    return caches


def rates() -> PrefillRates:
    out = NO_RATES
    for provider in ("a", "b"):
        out = out.observe(provider, "qwen3:8b", Observed(10_000, 0, 0), 10_000 / RATE)
    return out


def two_cards(caches: PromptCaches, busy_a: int = 0, elapsed: float = 0.0,
              parallel: int = 1, version: str = "") -> Snapshot:
    return snapshot(
        gpu("a", GIB24, ("qwen3:8b",), parallel=parallel, version=version),
        gpu("b", GIB24, ("qwen3:8b",), parallel=parallel, version=version),
        tickets=tuple(ticket("a", "qwen3:8b", elapsed=elapsed) for _ in range(busy_a)),
        caches=caches, prefill=rates(),
        lengths=NO_LENGTHS.observe("a", "qwen3:8b", CallSample(20.0))
        .observe("b", "qwen3:8b", CallSample(20.0)))


def test_the_next_call_goes_back_to_the_copy_holding_its_history() -> None:
    nxt = loop(1, 5)
    decision, verdicts = explain(call("qwen3:8b", tokens=nxt.tokens, conversation=nxt),
                                 two_cards(caches_after(("a", loop(1, 4)))))
    assert decision.placement is not None and decision.placement.provider == "a"
    prefill = {v.provider: v.terms["prefill"] for v in verdicts}
    # a holds 2000 + 4 x 4000 of the 22000 tokens: it reads the last turn; b reads them all
    speed = rates().speed("a", "qwen3:8b")
    assert prefill == pytest.approx({"a": speed.seconds(18000, 22000),
                                     "b": speed.seconds(0, 22000)})


def test_a_busy_holder_is_waited_for_when_that_is_cheaper() -> None:
    # the call on "a" has 2 s left: waiting beats reading 22000 tokens again (22 s); late
    # binding waits in the sidecar for a's slot instead of queueing inside its engine
    nxt = loop(1, 5)
    decision = place(call("qwen3:8b", tokens=nxt.tokens, conversation=nxt),
                     two_cards(caches_after(("a", loop(1, 4))), busy_a=1, elapsed=18.0))
    assert decision.outcome == "wait" and decision.placement is None
    assert "on a, which holds the conversation" in decision.reason


def test_a_busy_holder_is_passed_over_when_reading_again_is_sooner() -> None:
    # the call on "a" has just begun (20 s left): the free copy reads the history sooner
    nxt = loop(1, 5)
    decision = place(call("qwen3:8b", tokens=nxt.tokens, conversation=nxt),
                     two_cards(caches_after(("a", loop(1, 4))), busy_a=1, elapsed=0.0))
    assert decision.placement is not None
    assert (decision.placement.provider, decision.placement.kind) == ("b", "warm")


@pytest.mark.parametrize(("others", "parallel", "version", "survives"), [
    (0, 1, "", True),
    (1, 1, "", False),  # another conversation took the only slot
    (1, 2, "", True),
    (2, 2, "", False),
    (1, 4, "0.12.6", False),  # Ollama 0.12 keeps one conversation per copy
    (1, 4, "0.33.0", True),
])
def test_a_prefix_survives_while_fewer_other_conversations_than_slots_came_since(
        others: int, parallel: int, version: str, survives: bool) -> None:
    sent = [("a", loop(1, 4)), *(("a", loop(10 + i, 1)) for i in range(others))]
    # the other conversations are another agent's: no shared prefix
    sent = [sent[0], *((p, Conversation((2, *c.digests[1:]), c.tokens, 2000))
                       for p, c in sent[1:])]
    nxt = loop(1, 5)
    slots = cache_slots(parallel, version)
    cached = caches_after(*sent).expected_cached("a", "qwen3:8b", nxt, slots)
    assert cached == (18000 if survives else 0)


def test_the_same_conversation_again_does_not_count_as_another() -> None:
    caches = caches_after(("a", loop(1, 1)), ("a", loop(2, 1)), ("a", loop(2, 2)),
                          ("a", loop(2, 3)))
    assert caches.expected_cached("a", "qwen3:8b", loop(1, 2), 2) == 6000


def test_a_reload_wipes_what_the_copy_held() -> None:
    caches = caches_after(("a", loop(1, 4))).loaded("a", "qwen3:8b", NOW)
    assert caches.expected_cached("a", "qwen3:8b", loop(1, 5), 4) == 0


def test_a_new_conversation_of_the_agent_finds_its_shared_prefix() -> None:
    caches = caches_after(("a", loop(1, 4)))
    assert caches.expected_cached("a", "qwen3:8b", loop(2, 0), 1) == 2000


def test_a_prompt_longer_than_the_copys_context_is_cut_and_finds_nothing() -> None:
    nxt = loop(1, 5)
    caches = caches_after(("a", loop(1, 4)))
    for context, cached in ((32768, 18000), (16384, 0)):
        snap = snapshot(gpu("a", GIB24, ("qwen3:8b",), resident_ctx=context), caches=caches)
        index = index_providers(snap, DEFAULT_POLICY)["a"]
        spec = call("qwen3:8b", tokens=nxt.tokens, conversation=nxt)
        assert affinity.expected_cached(index, "qwen3:8b", spec, snap) == cached


def test_other_sidecars_prompts_interleave_by_time() -> None:
    mine = caches_after(("a", loop(1, 4)))
    theirs = caches_after(("a", loop(2, 1)), ("a", loop(3, 1)), start=NOW - 50)
    merged = mine.merged(theirs.held)
    # theirs came after mine: with 2 slots, conversation 1 is gone but for the agent's prefix
    assert merged.expected_cached("a", "qwen3:8b", loop(1, 5), 2) == 2000
    assert merged.expected_cached("a", "qwen3:8b", loop(1, 5), 3) == 18000


@pytest.mark.parametrize(("count", "seconds", "version", "expected"), [
    (20000, 20.0, "0.33.0", Observed(20000, 0, 0)),  # at the learned rate: a miss
    (20000, 1.0, "0.33.0", Observed(1000, 19000)),  # 20x faster: 19000 were cached
    (20000, 1.0, "0.12.6", Observed(1000, 19000)),
    (1000, 1.0, "0.30.0", Observed(1000, 19000)),  # 0.30.0 counts only what it evaluated
])
def test_an_answer_tells_its_cached_tokens_by_version(count: int, seconds: float,
                                                      version: str, expected: Observed
                                                      ) -> None:
    flat = PrefillSpeed(1 / RATE, 0.0)  # no slowing with depth: the counts are exact
    assert read_answer(count, seconds, version, 20000, flat) == expected


def test_only_misses_teach_the_prefill_rate() -> None:
    learned = NO_RATES.observe("a", "m", Observed(4000, 0, 0), 2.0)
    learned = learned.observe("a", "m", Observed(100, 3900), 0.05)
    # one sample at a mean depth of 2000: the default slope through it
    assert learned.rate("a", "m") == pytest.approx(2000.0 * (1 + 2000 / DEFAULT_DEPTH_SCALE))
    assert (learned.hits, learned.calls) == (1, 2)
    assert learned.rate("b", "m") == learned.rate("a", "m")  # the model's on another card


def test_a_call_that_would_push_a_live_history_out_of_a_full_copy_is_charged_for_it() -> None:
    # "a" (one slot) holds conversation 1's 18000 tokens; conversation 2 is new everywhere
    new = loop(2, 0)
    _, verdicts = explain(call("qwen3:8b", tokens=new.tokens, conversation=new),
                          two_cards(caches_after(("a", loop(1, 4)))))
    terms = {v.provider: v.terms for v in verdicts}
    assert terms["a"]["cache_eviction"] == pytest.approx(
        rates().speed("a", "qwen3:8b").seconds(0, 18000))
    assert "cache_eviction" not in terms["b"]
    placed = place(call("qwen3:8b", tokens=new.tokens, conversation=new),
                   two_cards(caches_after(("a", loop(1, 4))))).placement
    assert placed is not None and placed.provider == "b"


def sent_at(*sent: tuple[str, Conversation, float]) -> PromptCaches:
    """The caches after each (card, prompt, seconds before NOW) in turn."""
    caches = NO_CACHES
    for provider, conversation, ago in sent:
        caches = caches.sent(provider, "qwen3:8b", conversation, NOW - ago)
    return caches


def test_a_conversation_remembers_its_longest_pause_between_calls() -> None:
    caches = sent_at(("a", loop(1, 1), 100), ("b", loop(1, 2), 70), ("b", loop(1, 3), 60))
    held = caches.held[("b", "qwen3:8b")][0]
    assert held.pause == 30  # between its calls, wherever they went
    assert held == replace(held, pause=0.0)  # the same entry as one shared without it


def test_a_conversation_idle_past_the_copys_cadence_has_ended_and_costs_nothing_to_displace(
) -> None:
    # a (one slot) holds conversation 1, which came every 20 s and has not come for 60 s:
    # ended; b holds conversation 2, which came every 20 s and last 10 s ago: live
    caches = sent_at(("a", loop(1, 4), 80), ("a", loop(1, 5), 60),
                     ("b", loop(2, 1), 30), ("b", loop(2, 2), 10))
    new = loop(3, 0)
    assert caches.displaced("a", "qwen3:8b", new, 1, NOW) == 0
    assert caches.displaced("b", "qwen3:8b", new, 1, NOW) == 10000
    # the new conversation takes the ended one's slot, though its history is the longer
    decision, verdicts = explain(call("qwen3:8b", tokens=new.tokens, conversation=new),
                                 two_cards(caches))
    assert "cache_eviction" not in {v.provider: v.terms for v in verdicts}["a"]
    assert decision.placement is not None and decision.placement.provider == "a"


def test_a_conversation_is_not_taken_as_ended_while_no_pause_is_known() -> None:
    caches = sent_at(("a", loop(1, 4), 600))  # one call: its cadence is unknown
    assert caches.displaced("a", "qwen3:8b", loop(3, 0), 1, NOW) == 18000


def test_a_loop_whose_answer_called_no_tool_has_ended_at_once() -> None:
    # a (one slot) holds conversation 1, which came every 20 s and last 10 s ago: live by its
    # cadence, but its last call answered a tool's result without calling a tool
    caches = sent_at(("a", loop(1, 4), 30), ("a", loop(1, 5), 10))
    assert caches.displaced("a", "qwen3:8b", loop(3, 0), 1, NOW) == 22000
    finished = caches.finished(loop(1, 5).digests)
    assert finished.displaced("a", "qwen3:8b", loop(3, 0), 1, NOW) == 0
    assert finished.held[("a", "qwen3:8b")][0] == caches.held[("a", "qwen3:8b")][0]
    # another conversation is not marked
    assert not caches.finished(loop(2, 5).digests).held[("a", "qwen3:8b")][0].finished


def test_a_loops_end_marks_its_earlier_prompts_on_every_copy_but_not_a_later_call() -> None:
    # the loop moved from b to a; its call with five turns ends it
    caches = sent_at(("b", loop(1, 3), 50), ("a", loop(1, 4), 30), ("a", loop(2, 1), 20))
    finished = caches.finished(loop(1, 5).digests)
    assert finished.held[("b", "qwen3:8b")][0].finished  # left behind on b: over too
    assert finished.held[("a", "qwen3:8b")][1].finished
    assert not finished.held[("a", "qwen3:8b")][0].finished  # conversation 2
    # a call of the loop sent before the end came back (six turns) stays live
    later = caches.sent("a", "qwen3:8b", loop(1, 6), NOW - 5).finished(loop(1, 5).digests)
    assert not later.held[("a", "qwen3:8b")][0].finished
    assert later.displaced("a", "qwen3:8b", loop(3, 0), 1, NOW) == 26000


def test_a_loop_resumed_after_its_final_answer_does_not_count_the_gap_as_its_cadence(
) -> None:
    caches = sent_at(("a", loop(1, 4), 300), ("a", loop(1, 5), 280))
    resumed = caches.finished(loop(1, 5).digests).sent("a", "qwen3:8b", loop(1, 6), NOW)
    held = resumed.held[("a", "qwen3:8b")][0]
    assert held.pause == 20 and not held.finished  # live again; its cadence stays 20 s
    assert caches.sent("a", "qwen3:8b", loop(1, 6), NOW).held[("a", "qwen3:8b")][0].pause == 280


def held_on(caches: PromptCaches, snap: Snapshot, provider: str = "a") -> int:
    """What copy `provider` is expected to hold of conversation 1's next call, with four
    slots, after the loads `snap` shows."""
    return affinity.seen_loads(caches, snap).expected_cached(provider, "qwen3:8b", loop(1, 5),
                                                             4)


def test_another_sidecars_load_of_a_copy_wipes_what_was_sent_there_before() -> None:
    caches = caches_after(("a", loop(1, 4)))  # sent at NOW - 100
    warm = gpu("a", GIB24, ("qwen3:8b",), resident_ctx=16384)
    assert held_on(caches, snapshot(warm)) == 18000
    # a claim that loads the copy (another sidecar's cold call) started after it: wiped
    reload = ticket("a", "qwen3:8b", cold=True, evicts={"qwen3:8b": 5000}, elapsed=10)
    assert held_on(caches, snapshot(warm, tickets=(reload,))) == 0
    # one that started before it: what was sent after the load stays
    early = ticket("a", "qwen3:8b", cold=True, elapsed=200)
    assert held_on(caches, snapshot(warm, tickets=(early,))) == 18000
    # a claim that evicts the copy to load another model
    evicts = ticket("a", "qwen3:14b", cold=True, evicts={"qwen3:8b": 5000}, elapsed=10)
    assert held_on(caches, snapshot(warm, tickets=(evicts,))) == 0
    # a plan loads nothing yet
    plan = replace(reload, plan=True)
    assert held_on(caches, snapshot(warm, tickets=(plan,))) == 18000


def test_a_copy_seen_gone_or_with_another_context_was_reloaded() -> None:
    caches = affinity.seen_loads(caches_after(("a", loop(1, 4))),
                                 snapshot(gpu("a", GIB24, ("qwen3:8b",), resident_ctx=16384)))
    # the copy's context changed since it was seen: reloaded since
    other_ctx = gpu("a", GIB24, ("qwen3:8b",), resident_ctx=8192)
    assert held_on(caches, snapshot(other_ctx)) == 0
    # gone from a reachable provider: nothing is held, even once it is back
    gone = affinity.seen_loads(caches, snapshot(gpu("a", GIB24, ())))
    assert held_on(gone, snapshot(gpu("a", GIB24, ("qwen3:8b",), resident_ctx=16384))) == 0
    # an unreachable provider says nothing of its copies
    unknown = affinity.seen_loads(caches, snapshot(gpu("a", GIB24, (), ready=False)))
    assert held_on(unknown, snapshot(gpu("a", GIB24, ("qwen3:8b",), resident_ctx=16384))) \
        == 18000
    # nor does a copy gone while a load of it is under way (its claim marks the wipe)
    loading = ticket("a", "qwen3:8b", cold=True, elapsed=200)
    assert held_on(affinity.seen_loads(caches, snapshot(gpu("a", GIB24, ()),
                                                        tickets=(loading,))),
                   snapshot(gpu("a", GIB24, ("qwen3:8b",), resident_ctx=16384))) == 18000


def test_another_sidecars_prompts_are_wiped_by_a_load_after_them() -> None:
    theirs = caches_after(("a", loop(1, 4)))
    mine = affinity.seen_loads(NO_CACHES, snapshot(
        gpu("a", GIB24, ("qwen3:8b",), resident_ctx=16384),
        tickets=(ticket("a", "qwen3:8b", cold=True, elapsed=10),)))
    assert mine.merged(theirs.held).expected_cached("a", "qwen3:8b", loop(1, 5), 4) == 0
    absent = affinity.seen_loads(NO_CACHES, snapshot(gpu("a", GIB24, ())),
                                 shared=theirs.held)
    assert absent.merged(theirs.held).expected_cached("a", "qwen3:8b", loop(1, 5), 4) == 0


def room_test_cards(caches: PromptCaches, b_total: int = GIB24, busy_b: int = 0,
                    demand: dict[str, ModelDemand] | None = None) -> Snapshot:
    """"a" (16 GiB, one slot) runs qwen3:8b; "b" is empty, or runs it busy with `busy_b`."""
    return snapshot(
        gpu("a", GIB16, ("qwen3:8b",)),
        gpu("b", b_total, ("qwen3:8b",) if busy_b else ()),
        tickets=tuple(ticket("b", "qwen3:8b", elapsed=18.0) for _ in range(busy_b)),
        caches=caches, prefill=rates(), demand=demand or {},
        lengths=NO_LENGTHS.observe("a", "qwen3:8b", CallSample(20.0))
        .observe("b", "qwen3:8b", CallSample(20.0)))


def test_a_new_conversation_loads_onto_free_room_rather_than_push_a_live_history_out() -> None:
    # a's one cache slot holds conversation 1 (18000 tokens, live); its call slot is free.
    # Taking it would make conversation 1 read 18000 tokens again (18 s); loading a copy on
    # b costs about 6 s
    new = loop(2, 0)
    decision = place(call("qwen3:8b", tokens=new.tokens, conversation=new),
                     room_test_cards(caches_after(("a", loop(1, 4)))))
    assert decision.placement is not None
    assert (decision.placement.provider, decision.placement.kind) == ("b", "cold")
    assert "pushing a live history out of a" in decision.reason
    # a call without a conversation takes the warm copy, as before
    plain = place(call("qwen3:8b", tokens=new.tokens),
                  room_test_cards(caches_after(("a", loop(1, 4))))).placement
    assert plain is not None and (plain.provider, plain.kind) == ("a", "warm")


@pytest.mark.parametrize(("demand", "provider"), [
    ({}, "b"),
    # qwen3:14b was used lately, has no copy, and b is the only card with room for it: a
    # load of qwen3:8b there would leave it none
    ({"qwen3:14b": ModelDemand(recent_use=1.0)}, "a"),
    ({"qwen3:14b": ModelDemand(waiters=1)}, "a"),
])
def test_the_load_leaves_the_room_a_model_in_demand_has_nowhere_else(
        demand: dict[str, ModelDemand], provider: str) -> None:
    new = loop(2, 0)
    decision = place(call("qwen3:8b", tokens=new.tokens, conversation=new),
                     room_test_cards(caches_after(("a", loop(1, 4))), b_total=GIB16,
                                     demand=demand))
    assert decision.placement is not None and decision.placement.provider == provider


def test_a_busy_copy_with_a_cache_slot_to_spare_is_waited_for_rather_than_push_one_out(
) -> None:
    # b's one call has 2 s left and b holds no conversation; no card has room for a load
    new = loop(2, 0)
    decision = place(call("qwen3:8b", tokens=new.tokens, conversation=new),
                     room_test_cards(caches_after(("a", loop(1, 4))), b_total=GIB16,
                                     busy_b=1))
    assert decision.outcome == "wait" and decision.placement is None
    assert "a slot of qwen3:8b on b, which has a free cache slot" in decision.reason
