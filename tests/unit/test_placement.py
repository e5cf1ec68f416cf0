"""CallPlanner.place, one row per behaviour, with worked examples of queue against unload."""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxy.core.occupancy import Load, index_providers, ticket_budget_ok
from proxy.core.placement import (
    MAX_BACKED,
    NO_PROVIDER_REACHABLE,
    explain,
    place,
    runnable_alternatives,
)
from proxy.core.policy import DEFAULT_POLICY, Policy
from proxy.core.sizing import Sizer
from proxy.core.types import (
    CallSpec,
    Candidate,
    Circuit,
    ModelDemand,
    ModelInfo,
    ProviderView,
    Resident,
    Ticket,
)
from tests.unit.builders import GIB16, GIB24, GIB32, NOW, SIZES, call, gpu, snapshot, ticket


@pytest.mark.parametrize(("total", "usable"), [(32605, 28693), (24563, 21616), (8000, 5952)])
def test_reserve_and_usable_reference_figures(total: int, usable: int) -> None:
    # reserve = max(2048 MiB, 12 % of total)
    assert DEFAULT_POLICY.usable_mib(total) == usable


def test_a_provider_on_several_gpus_keeps_the_reserve_on_each() -> None:
    # 2 x 24 GiB: 12 % (5898 MiB) is more than 2 x 2048; 4 x 12 GiB: 4 x 2048 is more
    assert DEFAULT_POLICY.usable_mib(49152, gpus=2) == 49152 - 5898
    assert DEFAULT_POLICY.usable_mib(49152, gpus=4) == 49152 - 4 * 2048


def test_a_load_on_a_provider_of_four_small_gpus_leaves_each_its_reserve() -> None:
    """qwen3:32b-class weights of 41000 MiB fit a 48 GiB card (43254 usable), not four
    12 GiB GPUs, where a copy spread over them pays a runner's CUDA context and llama.cpp's
    fit margin on each (40960 usable)."""
    big = CallSpec((Candidate("big", 70, vram_mib=41000),))
    one = place(big, snapshot(ProviderView("a", 49152)))
    four = place(big, snapshot(ProviderView("a", 49152, gpus=4)))
    assert one.outcome == "placed"
    assert four.outcome == "model-too-large"


def test_without_an_architecture_the_footprint_is_seen_then_declared_then_disk() -> None:
    seen = gpu("a", observed={"m": {0: 7000}})
    bare = gpu("a", observed={})
    on_disk = ProviderView("a", 1000, disk_mib={"m": 5000})

    def total(view: ProviderView, declared: int | None = None) -> int | None:
        fp = Sizer((view,), DEFAULT_POLICY.disk_to_vram_factor).footprint("m", view, 8192,
                                                                          declared)
        return fp.total_mib if fp else None

    assert total(seen, declared=9000) == 7000
    assert total(bare, declared=9000) == 9000
    assert total(on_disk) == 6000  # x 1.2
    assert total(bare) is None


# --- worked examples: queue against unload -------------------------------------------------

def test_doc_example_queue_beats_a_26_second_unload() -> None:
    """qwen3:32b warm on the 5090 (use 1) costs ~26 s to unload for a qwen3:14b, while the
    4090's qwen3:14b copy with one call 5 s into a 20 s call frees in 15 s: queue."""
    snap = snapshot(
        gpu("5090", GIB32, ("qwen3:32b",)), gpu("4090", GIB24, ("qwen3:14b",)),
        tickets=(ticket("4090", "qwen3:14b", elapsed=5),),
        demand={"qwen3:32b": ModelDemand(recent_use=1)},
        latency={"4090": 20.0, "5090": 20.0})
    decision = place(call("qwen3:14b"), snap)
    assert decision.outcome == "wait" and decision.placement is None
    assert decision.queue_option_s == pytest.approx(15.0)
    assert decision.unload_option_s == pytest.approx(26.1, abs=0.05)  # 11.94 + 1 + 13.18


def test_doc_example_five_queued_calls_unload_an_idle_unwanted_8b() -> None:
    """Five calls queued at the 14b copy (95 s) against an idle, unwanted qwen3:8b (13 s)."""
    queued = tuple(ticket("4090", "qwen3:14b", elapsed=5 if i == 0 else 1) for i in range(5))
    snap = snapshot(
        gpu("4090", GIB24, ("qwen3:14b",)), gpu("4080", GIB16, ("qwen3:8b",)),
        tickets=queued, latency={"4090": 20.0})
    decision = place(call("qwen3:14b"), snap)
    assert decision.queue_option_s == pytest.approx(95.0)
    assert decision.unload_option_s == pytest.approx(12.94, abs=0.01)
    assert decision.outcome == "placed" and decision.placement is not None
    assert (decision.placement.provider, decision.placement.kind) == ("4080", "evict")
    assert dict(decision.placement.evicts) == {"qwen3:8b": 6000}
    assert decision.placement.footprint_mib == 12224


def test_doc_example_five_calls_waiting_in_the_sidecars_are_that_queue_too() -> None:
    """Late binding: the four calls behind the running one wait in the sidecars (on the
    demand board), not inside Ollama, and are counted as the queue all the same (95 s)."""
    snap = snapshot(
        gpu("4090", GIB24, ("qwen3:14b",)), gpu("4080", GIB16, ("qwen3:8b",)),
        tickets=(ticket("4090", "qwen3:14b", elapsed=5),), latency={"4090": 20.0},
        demand={"qwen3:14b": ModelDemand(waiters=4)})
    decision = place(call("qwen3:14b"), snap)
    assert decision.queue_option_s == pytest.approx(95.0)
    assert decision.placement is not None and decision.placement.kind == "evict"


# --- the five steps ------------------------------------------------------------------------

def test_step1_warm_with_free_slot_beats_any_cold_load() -> None:
    snap = snapshot(gpu("small", GIB16, ("qwen3:8b",)), gpu("big", GIB32))
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement and decision.placement.kind == "warm"
    assert (decision.placement.provider, decision.placement.step) == ("small", 1)
    assert decision.placement.footprint_mib == 512  # a shared copy claims scratch only


def test_step1_even_a_huge_warm_model_costs_nothing_more() -> None:
    snap = snapshot(gpu("a", GIB32, ("qwen3:32b",)), gpu("b", GIB32))
    decision = place(call("qwen3:32b"), snap)
    assert decision.placement and (decision.placement.provider, decision.placement.kind) == (
        "a", "warm")


def test_step1_of_two_copies_with_a_free_slot_the_idler_batch_wins() -> None:
    # "a" sorts first and has free slots, but its runner already decodes two calls of the
    # model: a third shares their decode steps, so the idle copy on "b" is the faster start
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",), parallel=4),
                    gpu("b", GIB24, ("qwen3:8b",), parallel=4),
                    tickets=(ticket("a", "qwen3:8b"), ticket("a", "qwen3:8b")))
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement and (decision.placement.provider, decision.placement.kind) == (
        "b", "warm")
    verdicts = {v.provider: v for v in explain(call("qwen3:8b"), snap)[1]}
    assert verdicts["a"].terms["batch"] == pytest.approx(
        2 * DEFAULT_POLICY.batch_share * DEFAULT_POLICY.default_call_s)
    assert "batch" not in verdicts["b"].terms


def test_of_two_warm_copies_the_card_no_other_model_decodes_on_wins() -> None:
    # both cards hold the 8B and the 14B; on "a" (first by name) a 14B call is running: the
    # card time-slices between the two runners, each 14B step about twice an 8B step
    snap = snapshot(gpu("a", GIB32, ("qwen3:8b", "qwen3:14b")),
                    gpu("b", GIB32, ("qwen3:8b", "qwen3:14b")),
                    tickets=(ticket("a", "qwen3:14b", elapsed=5),))
    decision, verdicts = explain(call("qwen3:8b"), snap)
    assert decision.placement and decision.placement.provider == "b"
    terms = {v.provider: v.terms for v in verdicts if v.model == "qwen3:8b"}
    # the 8B's 30 s (unknown) at 12224/6000 of its steps more, or the 14B's 25 s left if
    # that ends first: it does
    assert terms["a"]["contention"] == pytest.approx(25)
    assert "contention" not in terms["b"]


def test_a_call_about_to_end_on_the_card_costs_little() -> None:
    snap = snapshot(gpu("a", GIB32, ("qwen3:8b", "qwen3:14b")),
                    tickets=(ticket("a", "qwen3:14b", elapsed=29.5),))
    verdict = next(v for v in explain(call("qwen3:8b"), snap)[1] if v.model == "qwen3:8b")
    assert verdict.terms["contention"] == pytest.approx(0.5)


def test_a_model_with_calls_waiting_keeps_its_card_busy_past_its_running_call() -> None:
    # on "a" the 14B's call ends in 0.5 s, but three more wait in the sidecars for its one
    # slot (late binding keeps them out of Ollama's queue): its runner keeps decoding beside
    # an 8B call there for their 3 x 30 s, so the 8B pays its own steps (30 s at 12224/6000
    # more); on "b" a 3B call ends in 5 s and nothing waits for it
    snap = snapshot(gpu("a", GIB32, ("qwen3:8b", "qwen3:14b")),
                    gpu("b", GIB32, ("qwen3:8b", "llama3.2:3b")),
                    tickets=(ticket("a", "qwen3:14b", elapsed=29.5),
                             ticket("b", "llama3.2:3b", elapsed=25)),
                    demand={"qwen3:14b": ModelDemand(waiters=3, turns=(NOW, NOW, NOW))})
    decision, verdicts = explain(call("qwen3:8b"), snap)
    terms = {v.provider: v.terms for v in verdicts if v.model == "qwen3:8b"}
    assert terms["a"]["contention"] == pytest.approx(30 * 12224 / 6000)
    assert terms["b"]["contention"] == pytest.approx(5)
    assert decision.placement and decision.placement.provider == "b"


def test_the_line_of_a_model_whose_copy_leaves_the_card_does_not_keep_that_card_busy(
        ) -> None:
    # as above, but the 14B's copy on "a" is asked to unload: its three waiting calls
    # cannot take a slot there (no slot of theirs counts it), so its runner there stops with
    # its call in 0.5 s, and the 8B call pays those 0.5 s, not the line's 30 s of steps
    a = gpu("a", GIB32, ("qwen3:8b", "qwen3:14b"))
    a = replace(a, residents=tuple(replace(r, leaving=r.model == "qwen3:14b")
                                   for r in a.residents))
    snap = snapshot(a, gpu("b", GIB32, ("qwen3:8b",)),
                    tickets=(ticket("a", "qwen3:14b", elapsed=29.5),),
                    demand={"qwen3:14b": ModelDemand(waiters=3, turns=(NOW, NOW, NOW))})
    _, verdicts = explain(call("qwen3:8b"), snap)
    terms = {v.provider: v.terms for v in verdicts if v.model == "qwen3:8b"}
    assert terms["a"]["contention"] == pytest.approx(0.5)


def test_a_small_model_beside_a_call_ending_later_pays_its_steps_not_the_others_length(
        ) -> None:
    # a 3B call (30 s unknown) beside a 32B call just begun: each 3B token waits for a 32B
    # step (27000/3100 of its own), but the 3B call cannot be held longer than the 32B's
    # remaining 30 s
    snap = snapshot(gpu("a", GIB32, ("qwen3:32b", "llama3.2:3b")),
                    tickets=(ticket("a", "qwen3:32b"),))
    verdict = next(v for v in explain(call("llama3.2:3b"), snap)[1]
                   if v.model == "llama3.2:3b")
    assert verdict.terms["contention"] == pytest.approx(30)
    held = replace(snap, tickets=(replace(ticket("a", "qwen3:32b"), plan=True),))
    verdict = next(v for v in explain(call("llama3.2:3b"), held)[1]
                   if v.model == "llama3.2:3b")
    assert "contention" not in verdict.terms  # a plan held for a thread runs nothing yet


def test_a_single_slot_copy_has_no_batch_to_share() -> None:
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",)), tickets=(ticket("a", "qwen3:8b"),))
    verdict = explain(call("qwen3:8b"), snap)[1][0]
    assert "batch" not in verdict.terms and verdict.terms["queue"] > 0


def test_step2_warm_candidate_within_tolerance_beats_cold_preferred() -> None:
    snap = snapshot(gpu("a", GIB32, ("qwen3:14b",)), gpu("b", GIB32))
    decision = place(call(("qwen3:32b", 70), ("qwen3:14b", 60), ("qwen3:8b", 30)), snap)
    assert decision.placement and decision.placement.model == "qwen3:14b"
    assert decision.placement.step == 2


def test_step2_candidate_outside_tolerance_is_not_used() -> None:
    snap = snapshot(gpu("a", GIB32, ("qwen3:8b",)), gpu("b", GIB32))
    decision = place(call(("qwen3:32b", 70), ("qwen3:8b", 30)), snap)
    assert decision.placement and decision.placement.model == "qwen3:32b"
    assert decision.placement.kind == "cold"


def test_tolerance_zero_keeps_the_preferred_model() -> None:
    snap = snapshot(gpu("a", GIB32, ("qwen3:14b",)), gpu("b", GIB32))
    decision = place(call(("qwen3:32b", 70), ("qwen3:14b", 70), tolerance=0), snap)
    assert decision.placement and decision.placement.model == "qwen3:14b"  # equal score counts
    decision = place(call(("qwen3:32b", 70), ("qwen3:14b", 69), tolerance=-5), snap)
    assert decision.placement and decision.placement.model == "qwen3:32b"


def test_step1_shares_a_copy_being_loaded_when_it_has_a_free_slot() -> None:
    snap = snapshot(gpu("a", GIB32, parallel=2), gpu("b", GIB32),
                    tickets=(ticket("a", "qwen3:14b", cold=True, elapsed=2),))
    decision = place(call("qwen3:14b"), snap)
    assert decision.placement and decision.placement.provider == "a"
    assert (decision.placement.kind, decision.placement.step) == ("loading", 1)


def test_step3_joins_a_loading_copy_while_a_slot_is_not_bound() -> None:
    snap = snapshot(gpu("a", GIB32, parallel=2), gpu("b", GIB32),
                    tickets=(ticket("a", "qwen3:14b", cold=True, elapsed=2),))
    decision = place(call("qwen3:14b"), snap)
    assert decision.placement and (decision.placement.provider, decision.placement.kind) == (
        "a", "loading")


def test_a_loading_copy_whose_slots_are_bound_is_no_free_slot() -> None:
    """Its one slot belongs to the call loading it: a second call weighs waiting for that
    slot (the rest of the load and a call) against a load of its own."""
    loader = ticket("a", "qwen3:14b", cold=True, elapsed=2)
    two_cards = place(call("qwen3:14b"), snapshot(gpu("a", GIB32), gpu("b", GIB32),
                                                    tickets=(loader,)))
    assert two_cards.placement and (two_cards.placement.provider,
                                    two_cards.placement.kind) == ("b", "cold")
    one_card = place(call("qwen3:14b"), snapshot(gpu("a", GIB32), tickets=(loader,)))
    assert (one_card.outcome, one_card.placement) == ("wait", None)
    assert "slot of qwen3:14b on a" in one_card.reason


def test_step4_short_queue_does_not_duplicate_a_model() -> None:
    snap = snapshot(gpu("a", GIB32, ("qwen3:8b",)), gpu("b", GIB32),
                    tickets=(ticket("a", "qwen3:8b", elapsed=8),), latency={"a": 10.0})
    decision = place(call("qwen3:8b"), snap)  # 2 s wait < ~5.9 s load
    assert (decision.outcome, decision.placement) == ("wait", None)
    assert decision.queue_option_s is not None and decision.queue_option_s < 5.9
    assert "slot of qwen3:8b on a" in decision.reason


def test_step4_long_queue_makes_a_second_copy_on_an_idle_card() -> None:
    queue = tuple(ticket("a", "qwen3:8b", elapsed=1) for _ in range(4))
    snap = snapshot(gpu("a", GIB32, ("qwen3:8b",)), gpu("b", GIB32), tickets=queue,
                    latency={"a": 10.0})
    decision = place(call("qwen3:8b"), snap)  # 9 + 30 s wait > ~5.9 s load
    assert decision.placement and (decision.placement.provider, decision.placement.kind) == (
        "b", "cold")
    assert decision.placement.footprint_mib == 6000


def test_a_long_queue_loads_an_in_tolerance_candidate_where_only_it_fits() -> None:
    """The 14b's one copy is four calls deep and card b has room for an 8b beside its phi3,
    not for a 14b: a call that accepts the 8b gets it loaded there (~6 s) rather than wait
    ~39 s or unload the phi3 for a 14b (~13 s), which is what a call that accepts only the
    14b gets."""
    queue = tuple(ticket("a", "qwen3:14b", elapsed=1) for _ in range(4))
    snap = snapshot(gpu("a", GIB24, ("qwen3:14b",)), gpu("b", GIB16, ("phi3:mini",)),
                    tickets=queue, latency={"a": 10.0})
    decision = place(call(("qwen3:14b", 70), ("qwen3:8b", 65)), snap)
    assert decision.placement is not None, decision.reason
    assert (decision.placement.provider, decision.placement.model, decision.placement.kind) \
        == ("b", "qwen3:8b", "cold")
    assert "in tolerance" in decision.reason
    alone = place(call(("qwen3:14b", 70), ("qwen3:8b", 65), tolerance=0), snap).placement
    assert alone is not None and (alone.model, alone.kind) == ("qwen3:14b", "evict")


def test_the_head_of_the_line_counts_no_call_behind_it() -> None:
    """The 14b's slot frees in 1 s; six calls wait for it, all due after this one: it waits
    for that slot rather than unload the idle 8b for a second 14b. The last in line (121 s)
    unloads it."""
    behind = tuple(NOW + 100 + i for i in range(6))
    snap = snapshot(gpu("4090", GIB24, ("qwen3:14b",)), gpu("4080", GIB16, ("qwen3:8b",)),
                    tickets=(ticket("4090", "qwen3:14b", elapsed=19),), latency={"4090": 20.0},
                    demand={"qwen3:14b": ModelDemand(waiters=6, turns=behind)})
    decision = place(call("qwen3:14b", turn=NOW), snap)
    assert decision.outcome == "wait", decision.reason
    assert decision.queue_option_s == pytest.approx(1.0)
    last = place(call("qwen3:14b", turn=NOW + 200), snap)
    assert last.placement is not None and last.placement.kind == "evict"


def test_one_call_alone_waits_for_the_preferred_model_rather_than_load_a_candidate() -> None:
    """One call runs on the 14b (8 s left), room for an 8b on b: a load would serve this
    call alone, so it waits, as a call that accepts only the 14b does."""
    snap = snapshot(gpu("a", GIB24, ("qwen3:14b",)), gpu("b", GIB16),
                    tickets=(ticket("a", "qwen3:14b", elapsed=2),), latency={"a": 10.0})
    decision = place(call(("qwen3:14b", 70), ("qwen3:8b", 65)), snap)
    assert decision.outcome == "wait" and decision.placement is None, decision.reason


def test_room_is_kept_for_the_agents_recent_answers_unless_num_predict_says_otherwise() -> None:
    """A 7000-token prompt on 8192-token copies: with this agent's answers at 1500 tokens
    the engine would shift the context mid-answer (the prompt's start goes), so no copy
    holds it; its own num_predict of 500 does fit."""
    snap = snapshot(gpu("a", GIB32, ("qwen3:8b",), ctx=8192, resident_ctx=8192))
    assert place(call("qwen3:8b", tokens=7000), snap).outcome == "placed"
    learned = call("qwen3:8b", tokens=7000, expected_answer=1500)
    assert learned.answer_tokens == 1500
    assert place(learned, snap).outcome == "prompt-too-large"
    capped = replace(learned, num_predict=500)
    assert capped.answer_tokens == 500 and place(capped, snap).outcome == "placed"
    # a cap below the 256 an unknown answer keeps: the cap is kept, and a thirty-second of
    # the estimate (254 here) that it may fall short by, so 76 spare tokens are too few
    assert place(call("qwen3:8b", tokens=8100), snap).outcome == "prompt-too-large"
    assert place(call("qwen3:8b", tokens=8100, num_predict=16), snap).outcome == \
        "prompt-too-large"
    assert place(call("qwen3:8b", tokens=7850, num_predict=16), snap).outcome == "placed"


def test_cold_load_prefers_free_room_over_eviction() -> None:
    snap = snapshot(gpu("full", GIB16, ("qwen3:8b", "phi3:mini")), gpu("empty", GIB24))
    decision = place(call("qwen3:14b"), snap)
    assert decision.placement and (decision.placement.provider, decision.placement.kind) == (
        "empty", "cold")


def test_a_card_with_live_work_is_never_made_to_evict() -> None:
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b", "phi3:mini")),
                    tickets=(ticket("a", "qwen3:8b"), ticket("a", "phi3:mini")))
    decision = place(call("qwen3:14b"), snap)
    assert decision.outcome == "wait" and decision.unload_option_s is None


THREE_SMALL = ("qwen3:8b", "phi3:mini", "llama3.2:3b")  # 12700 MiB: a 14b fits beside them


def test_a_card_at_ollamas_model_count_limit_unloads_one_first_though_memory_would_fit() -> None:
    """Sent as a plain cold load, Ollama (OLLAMA_MAX_LOADED_MODELS 3) would unload a model
    of its own choosing, busy or not; the sidecar picks the victim, an idle one."""
    snap = snapshot(gpu("a", GIB32, THREE_SMALL, max_loaded=3))
    decision = place(call("qwen3:14b"), snap)
    assert decision.placement and decision.placement.kind == "evict"
    assert dict(decision.placement.evicts) == {"llama3.2:3b": 3100}  # least needed, by name
    verdict = next(v for v in decision.verdicts if v.provider == "a")
    assert "OLLAMA_MAX_LOADED_MODELS" in verdict.reason



def test_an_unset_model_count_limit_is_ollamas_three_per_gpu() -> None:
    """OLLAMA_MAX_LOADED_MODELS unset or 0 is not "no limit": Ollama keeps 3 x its GPUs
    (server/sched.go:86, 280-288)."""
    automatic = place(call("qwen3:14b"), snapshot(gpu("a", GIB32, THREE_SMALL)))
    assert automatic.placement and automatic.placement.kind == "evict"
    two_gpus = place(call("qwen3:14b"), snapshot(gpu("a", GIB32, THREE_SMALL, gpus=2)))
    assert two_gpus.placement and two_gpus.placement.kind == "cold"
    first, second = ticket("a", "qwen3:14b", cold=True), ticket("a", "qwen3:32b", cold=True)
    view = gpu("a", 2 * GIB32, THREE_SMALL, gpus=2)
    assert ticket_budget_ok([first], second, view, DEFAULT_POLICY)[0]  # models 4 and 5 of 6
    ok, why = ticket_budget_ok([first], second, replace(view, gpus=1), DEFAULT_POLICY)
    assert not ok and "(OLLAMA_MAX_LOADED_MODELS 3)" in why


def test_a_card_with_count_room_is_a_plain_cold_load_and_busy_residents_are_not_victims(
        ) -> None:
    snap = snapshot(gpu("a", GIB32, THREE_SMALL, max_loaded=3),
                    gpu("b", GIB24, ("qwen3:8b",), max_loaded=3))
    decision = place(call("qwen3:14b"), snap)
    assert decision.placement and (decision.placement.provider, decision.placement.kind) == (
        "b", "cold")
    busy = snapshot(gpu("a", GIB32, THREE_SMALL, max_loaded=3),
                    tickets=tuple(ticket("a", m) for m in THREE_SMALL))
    waiting = place(call("qwen3:14b"), busy)
    assert waiting.outcome == "wait" and waiting.unload_option_s is None


def test_loads_in_flight_count_toward_the_limit_and_planned_victims_count_as_gone() -> None:
    two = ("qwen3:8b", "phi3:mini")
    loading = snapshot(gpu("a", GIB32, two, max_loaded=3),
                       tickets=(ticket("a", "llama3.2:3b", cold=True),))
    decision = place(call("qwen3:14b"), loading)
    assert decision.placement and decision.placement.kind == "evict"
    making_way = snapshot(gpu("a", GIB32, two, max_loaded=3), tickets=(
        ticket("a", "llama3.2:3b", cold=True, evicts={"phi3:mini": 3600}),))
    assert index_providers(loading, DEFAULT_POLICY)["a"].models_over_limit("qwen3:14b") == 1
    assert index_providers(making_way, DEFAULT_POLICY)["a"].models_over_limit("qwen3:14b") == 0


def test_the_claim_rechecks_the_count_limit_against_the_live_tickets() -> None:
    view = gpu("a", GIB32, ("qwen3:8b", "phi3:mini"), max_loaded=3)
    first = ticket("a", "llama3.2:3b", cold=True)
    second = ticket("a", "qwen3:14b", cold=True)
    assert ticket_budget_ok([], first, view, DEFAULT_POLICY)[0]
    ok, why = ticket_budget_ok([first], second, view, DEFAULT_POLICY)
    assert not ok and "would be model 4 loaded here" in why
    evicting = ticket("a", "qwen3:14b", cold=True, evicts={"phi3:mini": 3600})
    assert ticket_budget_ok([first], evicting, view, DEFAULT_POLICY)[0]
    joining = ticket("a", "qwen3:8b")  # a call to a loaded copy adds no model
    assert ticket_budget_ok([first], joining, replace(view, max_loaded=2), DEFAULT_POLICY)[0]


def test_small_model_goes_to_the_smallest_card_that_fits() -> None:
    snap = snapshot(gpu("big", GIB32), gpu("mid", GIB24), gpu("small", GIB16))
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement and decision.placement.provider == "small"


def test_a_load_leaves_a_model_in_demand_room_when_another_card_can() -> None:
    """The 14B on the 16 GiB card would leave no room there for the 8B this call also
    accepts; the 24 GiB card holds the 14B with room for the 8B beside it."""
    snap = snapshot(gpu("big", GIB32), gpu("mid", GIB24), gpu("small", GIB16))
    decision, verdicts = explain(call("qwen3:14b", ("qwen3:8b", -5)), snap)
    assert decision.placement and decision.placement.provider == "mid"
    terms = {v.provider: v.terms for v in verdicts if v.model == "qwen3:14b"}
    assert terms["small"]["takes_room"] == DEFAULT_POLICY.unload_s
    assert "takes_room" not in terms["mid"] and "takes_room" not in terms["big"]


def test_a_model_on_the_demand_board_counts_as_in_demand() -> None:
    """The 14B is used elsewhere: the 8B's load keeps the 16 GiB card free for a 14B copy
    and goes beside the 14B on the 24 GiB card."""
    snap = snapshot(gpu("big", GIB32), gpu("mid", GIB24, ("qwen3:14b",)), gpu("small", GIB16),
                    demand={"qwen3:14b": ModelDemand(recent_use=2)})
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement and decision.placement.provider == "mid"
    assert decision.placement.kind == "cold"


def test_room_is_taken_freely_when_no_card_could_spare_it() -> None:
    """Every card the 8B fits leaves the 32B no room: best fit alone decides. A model
    nobody wants, or one already on the card, is no reason either."""
    shut_everywhere = snapshot(gpu("big", GIB32), gpu("other", GIB32),
                               demand={"qwen3:32b": ModelDemand(waiters=1)})
    decision = place(call("qwen3:8b"), shut_everywhere)
    assert decision.placement and decision.placement.provider == "big"
    assert all("takes_room" not in v.terms for v in decision.verdicts)
    unwanted = snapshot(gpu("big", GIB32), gpu("mid", GIB24), gpu("small", GIB16))
    decision = place(call("qwen3:14b"), unwanted)
    assert decision.placement and decision.placement.provider == "small"
    already_there = snapshot(gpu("big", GIB32), gpu("mid", GIB24, ("qwen3:8b",)),
                             demand={"qwen3:8b": ModelDemand(recent_use=2)})
    decision = place(call("qwen3:14b"), already_there)
    assert decision.placement and decision.placement.provider == "mid"
    assert all("takes_room" not in v.terms for v in decision.verdicts)


def test_distinct_models_spread_while_one_model_concentrates() -> None:
    busy_a = snapshot(gpu("a", GIB32, ("qwen3:8b",)), gpu("b", GIB32),
                      tickets=(ticket("a", "qwen3:8b"),))
    spread = place(call("llama3.2:3b"), busy_a)
    assert spread.placement and spread.placement.provider == "b"
    same = place(call("qwen3:8b"), snapshot(gpu("a", GIB32, ("qwen3:8b",)), gpu("b", GIB32)))
    assert same.placement and same.placement.provider == "a"


@pytest.mark.parametrize(("phase", "winner"), [("mulling", "heavy"), ("triage", "light")])
def test_provider_weight_is_phase_aware(phase: str, winner: str) -> None:
    snap = snapshot(gpu("heavy", GIB24, weight=100), gpu("light", GIB24, weight=25))
    decision = place(call("qwen3:8b", phase=phase), snap)
    assert decision.placement and decision.placement.provider == winner


# --- hard filters --------------------------------------------------------------------------

def test_not_ready_and_open_circuit_are_filtered_with_reasons() -> None:
    snap = snapshot(gpu("down", GIB32, ready=False), gpu("broken", GIB32), gpu("ok", GIB16),
                    circuits={"broken": Circuit.OPEN})
    decision, verdicts = explain(call("qwen3:8b"), snap)
    assert decision.placement and decision.placement.provider == "ok"
    reasons = {v.provider: v.reason for v in verdicts}
    assert reasons["down"] == "provider not ready"
    assert "circuit open" in reasons["broken"]


def test_a_call_with_every_provider_down_waits_saying_so_not_busy() -> None:
    snap = snapshot(gpu("down", GIB32, ready=False), gpu("broken", GIB32),
                    circuits={"broken": Circuit.OPEN})
    decision = place(call("qwen3:8b"), snap)
    assert decision.outcome == "wait"
    assert decision.reason.startswith(NO_PROVIDER_REACHABLE)
    assert "down: provider not ready" in decision.reason and "broken: circuit" in decision.reason
    # one reachable card that is merely full: busy, as before
    full = snapshot(gpu("down", GIB32, ready=False), gpu("ok", GIB16, ("qwen3:14b",)),
                    tickets=(ticket("ok", "qwen3:14b"),))
    assert place(call("qwen3:8b"), full).reason.startswith("busy")


def test_half_open_circuit_may_take_a_trial_call() -> None:
    snap = snapshot(gpu("a", GIB32), circuits={"a": Circuit.HALF_OPEN})
    assert place(call("qwen3:8b"), snap).outcome == "placed"


@pytest.mark.parametrize(("extra", "cold"), [(0, True), (1, False)])
def test_cold_fit_beside_residents_is_inclusive(extra: int, cold: bool) -> None:
    # usable 21616 on a 24563 MiB card; the 14b leaves exactly 9392 MiB
    snap = snapshot(gpu("a", GIB24, ("qwen3:14b",), observed={"qwen3:14b": {0: 12224},
                                                              "x": {0: 9392 + extra}}))
    decision = place(call("x"), snap)
    assert decision.placement is not None
    assert (decision.placement.kind == "cold") is cold  # one MiB more: unload the idle 14b


@pytest.mark.parametrize(("footprint", "outcome"), [(21616, "placed"),
                                                     (21617, "model-too-large")])
def test_usable_vram_bound_is_inclusive(footprint: int, outcome: str) -> None:
    snap = snapshot(gpu("a", GIB24, observed={"x": {0: footprint}}))
    assert place(call("x"), snap).outcome == outcome


def test_a_copy_being_unloaded_is_neither_joined_nor_loaded_again_until_gone() -> None:
    leaving = replace(gpu("a", GIB24, ("qwen3:8b",)), residents=(
        Resident("qwen3:8b", 6000, expires_at=NOW - 1, leaving=True),))
    decision = place(call("qwen3:8b"), snapshot(leaving))
    assert decision.outcome == "wait"  # woken when it is seen gone
    assert "being unloaded" in decision.verdicts[0].reason
    elsewhere = place(call("qwen3:8b"), snapshot(leaving, gpu("b", GIB24)))
    assert elsewhere.placement and elsewhere.placement.provider == "b"
    cold = ticket("a", "qwen3:8b", cold=True)
    ok, why = ticket_budget_ok([], cold, leaving, Policy())
    assert not ok and "being unloaded" in why


def test_planned_victim_is_not_warm() -> None:
    snap = snapshot(gpu("a", GIB32, ("qwen3:8b",)), gpu("b", GIB32),
                    tickets=(ticket("a", "qwen3:14b", cold=True, evicts={"qwen3:8b": 6000}),))
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement and decision.placement.provider == "b"


@pytest.mark.parametrize(
    ("total", "ctx", "resident_ctx", "tokens", "outcome"),
    [
        # a prompt fits with 256 tokens kept for the answer and the engine's own one
        (GIB32, 8192, 0, 8192 - 257, "cold"),
        (GIB32, 8192, 0, 8192 - 256, "prompt-too-large"),
        (None, 0, 0, 10**6, "cold"),  # an unknown context (no VRAM total) never refuses
        (GIB32, 0, 0, 32768 - 257, "cold"),  # unset: Ollama's default for a 32 GiB card
        (GIB32, 4096, 16384, 9000, "warm"),  # the loaded copy's context wins
        (GIB32, 4096, 0, 5000, "prompt-too-large"),
        # loaded idle with 4096; a copy loaded for this call gets the card's 32768: reload
        (GIB32, 32768, 4096, 9000, "evict"),
    ],
)
def test_context_window_is_a_hard_filter(total: int | None, ctx: int, resident_ctx: int,
                                         tokens: int, outcome: str) -> None:
    residents = ("qwen3:8b",) if resident_ctx else ()
    snap = snapshot(gpu("a", total, residents, ctx=ctx, resident_ctx=resident_ctx))
    decision = place(call("qwen3:8b", tokens=tokens), snap)
    kind = decision.placement.kind if decision.placement else decision.outcome
    assert kind == outcome, decision.reason
    if outcome == "evict":
        assert decision.placement is not None
        assert dict(decision.placement.evicts) == {"qwen3:8b": 6000}
        assert (decision.placement.num_ctx, decision.placement.context_length) == (32768, 32768)


def test_num_ctx_is_the_least_context_a_call_accepts_and_what_a_load_gets() -> None:
    small = gpu("small-ctx", GIB32, ("qwen3:8b",), ctx=4096, resident_ctx=4096)
    big = gpu("big-ctx", GIB32, ("qwen3:8b",), ctx=32768, resident_ctx=32768)
    decision = place(call("qwen3:8b", tokens=100, num_ctx=16384), snapshot(small, big))
    assert decision.placement and decision.placement.provider == "big-ctx"
    assert (decision.placement.kind, decision.placement.num_ctx) == ("warm", 32768)
    cold = place(call("qwen3:8b", tokens=100, num_ctx=16384), snapshot(gpu("a", GIB32)))
    assert cold.placement and cold.placement.kind == "cold"
    assert (cold.placement.num_ctx, cold.placement.context_length) == (16384, 16384)


# --- refusals ------------------------------------------------------------------------------

def test_model_too_large_for_every_card() -> None:
    snap = snapshot(gpu("a", GIB16), gpu("b", GIB24))
    decision = place(call("qwen3:32b"), snap)
    assert decision.outcome == "model-too-large"
    assert "qwen3:32b" in decision.reason and "21616" in decision.reason


def test_unknown_vram_never_proves_too_large() -> None:
    snap = snapshot(gpu("a", GIB16), gpu("unknown", None))
    assert place(call("qwen3:32b"), snap).outcome == "placed"


def test_too_large_is_reported_before_prompt_too_large() -> None:
    snap = snapshot(gpu("a", GIB16, ctx=1024))
    assert place(call("qwen3:32b", tokens=5000), snap).outcome == "model-too-large"


def test_prompt_too_large_names_the_fix() -> None:
    snap = snapshot(gpu("a", GIB32, ctx=4096), gpu("b", GIB24, ctx=8192))
    decision = place(call("qwen3:8b", tokens=9000), snap)
    assert decision.outcome == "prompt-too-large"
    assert "OLLAMA_CONTEXT_LENGTH" in decision.reason and "8192" in decision.reason


def test_prompt_too_large_for_the_calls_own_num_ctx_says_so() -> None:
    snap = snapshot(gpu("a", GIB24, ctx=8192))
    decision = place(call("qwen3:8b", tokens=900, num_ctx=1024), snap)
    assert decision.outcome == "prompt-too-large"
    assert "options.num_ctx (1024)" in decision.reason
    assert "OLLAMA_CONTEXT_LENGTH" not in decision.reason  # the card would give 8192


@pytest.mark.parametrize("num_ctx", [1, 3])
def test_a_num_ctx_under_ollamas_floor_is_named_as_the_limit(num_ctx: int) -> None:
    """Ollama raises a num_ctx under 4 to 4 (server/sched.go:170-172): still the call's."""
    snap = snapshot(gpu("a", GIB24, ctx=8192))
    decision = place(call("qwen3:8b", tokens=900, num_ctx=num_ctx), snap)
    assert decision.outcome == "prompt-too-large"
    assert f"options.num_ctx ({num_ctx}), which Ollama raises to 4," in decision.reason
    assert "OLLAMA_CONTEXT_LENGTH" not in decision.reason


def test_a_models_trained_context_caps_the_configured_one() -> None:
    # Ollama loads phi3:mini with at most its trained 4096 tokens, whatever the card allows.
    big = gpu("a", GIB24, ctx=8192, models={"phi3:mini": ModelInfo(trained_context=4096),
                                            "qwen3:8b": ModelInfo(trained_context=40960)})
    decision = place(call("phi3:mini", tokens=6000), snapshot(big))
    assert decision.outcome == "prompt-too-large"
    assert "trained" in decision.reason and "4096" in decision.reason
    placed = place(call(("phi3:mini", 40), ("qwen3:8b", 35), tokens=6000), snapshot(big))
    assert placed.placement and placed.placement.model == "qwen3:8b"
    assert placed.placement.context_length == 8192
    loaded = replace(big, residents=(Resident("phi3:mini", 3600, 4096),))
    assert place(call("phi3:mini", tokens=3800), snapshot(loaded)).outcome == "placed"


def test_prompt_too_large_only_when_no_acceptable_model_has_the_context() -> None:
    snap = snapshot(gpu("a", GIB32, ("qwen3:8b",), ctx=4096, resident_ctx=32768))
    decision = place(call(("qwen3:14b", 60), ("qwen3:8b", 55), tokens=9000), snap)
    assert decision.placement and decision.placement.model == "qwen3:8b"


def test_busy_card_that_could_hold_the_model_waits_for_memory() -> None:
    snap = snapshot(gpu("a", GIB16, ("qwen3:8b", "phi3:mini")),
                    tickets=(ticket("a", "qwen3:8b"), ticket("a", "phi3:mini")))
    decision = place(call("qwen3:14b"), snap)  # fits the card, not beside live work
    assert decision.outcome == "wait" and decision.placement is None
    assert decision.queue_option_s is None and decision.unload_option_s is None


# --- explain -------------------------------------------------------------------------------

def test_explain_gives_every_provider_a_verdict_and_terms() -> None:
    snap = snapshot(gpu("a", GIB32, ("qwen3:8b",)), gpu("b", GIB16, ready=False))
    decision, verdicts = explain(call(("qwen3:14b", 60), ("qwen3:8b", 55)), snap)
    assert decision.placement and decision.placement.model == "qwen3:8b"
    assert {(v.provider, v.model) for v in verdicts} == {
        ("a", "qwen3:14b"), ("b", "qwen3:14b"), ("a", "qwen3:8b"), ("b", "qwen3:8b")}
    feasible = [v for v in verdicts if v.feasible]
    assert all("load" in v.terms or "queue" in v.terms for v in feasible)


def test_same_inputs_same_decision() -> None:
    snap = snapshot(gpu("a", GIB32), gpu("b", GIB32), gpu("c", GIB32))
    assert place(call("qwen3:8b"), snap) == place(call("qwen3:8b"), snap)


def test_indexing_ignores_expired_tickets() -> None:
    snap = snapshot(gpu("a", GIB32, ("qwen3:8b",)),
                    tickets=(ticket("a", "qwen3:8b", elapsed=100, ttl=50),))
    assert index_providers(snap, Policy())["a"].active_calls == 0


def test_a_preferred_model_too_large_everywhere_falls_back_to_an_in_tolerance_candidate() -> None:
    snap = snapshot(gpu("a", GIB24), gpu("b", GIB16))
    decision = place(call(("qwen3:32b", 70), ("qwen3:14b", 60), ("qwen3:8b", 30)), snap)
    assert decision.placement and decision.placement.model == "qwen3:14b"
    assert decision.reason.startswith("qwen3:32b fits no GPU")
    # outside the tolerance, the answer stays model-too-large
    assert place(call(("qwen3:32b", 70), ("qwen3:8b", 30)), snap).outcome == "model-too-large"


# --- Ollama's own rules, planned for ------------------------------------------------------

# Its token table (151936 x 5120 at Q4_K) stays on the CPU, its logits for a batch of 512
QWEN3_14B = ModelInfo(trained_context=40960, kv_bytes_per_token=160 * 1024,
                      estimate_kv_bytes_per_token=160 * 1024,
                      cpu_table_bytes=151936 * 5120 // 256 * 144,
                      logits_bytes=4 * 512 * (5120 + 151936))


def _card_with_phi3(version: str) -> ProviderView:
    """16000 MiB (usable 13952), 4096 x 1, phi3 loaded (3903 MiB): a 14b (9300 - 418 + 307
    + 640 = 9829 MiB) fits the memory beside it, but its estimate (9300 + 640 = 9940) is over
    80 % of the 12097 MiB free."""
    return ProviderView("a", 16000, residents=(Resident("phi3:mini", 3903, 4096),),
                        context_length=4096, version=version,
                        disk_mib={"qwen3:14b": 9300, "phi3:mini": 2176},
                        models={"qwen3:14b": QWEN3_14B})


def test_a_load_ollama_would_not_admit_beside_others_is_planned_as_an_eviction() -> None:
    decision = place(call("qwen3:14b"), snapshot(_card_with_phi3("0.33.0")))
    assert decision.placement is not None and decision.placement.kind == "evict"
    assert dict(decision.placement.evicts) == {"phi3:mini": 3903}
    assert "80 %" in decision.verdicts[0].reason
    # Before 0.30 Ollama loads beside whatever fits: no such rule.
    older = place(call("qwen3:14b"), snapshot(_card_with_phi3("0.12.6")))
    assert older.placement is not None and older.placement.kind == "cold"


def test_the_claim_rechecks_ollamas_admission_against_the_live_tickets() -> None:
    card = replace(_card_with_phi3("0.33.0"), residents=())
    load = Ticket("t1", "a", "qwen3:14b", 9940, NOW, NOW + 60, cold=True, estimate_mib=9940)
    ok, _ = ticket_budget_ok([], load, card, Policy())
    assert ok  # alone on the card: no rule
    other = Ticket("t0", "a", "phi3:mini", 3903, NOW, NOW + 60, cold=True)
    ok, why = ticket_budget_ok([other], load, card, Policy())
    assert not ok and "80 %" in why  # phi3 is being loaded meanwhile


def test_a_call_over_the_openai_api_joins_only_a_copy_at_ollamas_default_context() -> None:
    card = gpu("a", GIB32, ("qwen3:8b",), ctx=8192, resident_ctx=16384)
    native = place(call("qwen3:8b"), snapshot(card))
    assert native.placement is not None and native.placement.kind == "warm"
    assert native.placement.num_ctx == 16384  # sent, so Ollama keeps the copy
    dialect = place(call("qwen3:8b", pins_context=False), snapshot(card))
    assert dialect.placement is not None and dialect.placement.kind == "evict"  # a reload
    assert dict(dialect.placement.evicts) == {"qwen3:8b": 6000}
    assert "OpenAI" in dialect.verdicts[0].reason


def test_a_copy_partly_in_cpu_memory_is_no_free_reuse() -> None:
    spilled = replace(gpu("a", GIB16), residents=(Resident("qwen3:14b", 15000, spilled=True),))
    decision = place(call("qwen3:14b"), snapshot(spilled, gpu("b", GIB32)))
    assert decision.placement is not None
    assert (decision.placement.provider, decision.placement.kind) == ("b", "cold")
    alone = place(call("qwen3:14b"), snapshot(spilled))
    assert alone.placement is not None and alone.placement.kind == "warm"
    assert alone.verdicts[0].terms["spill"] > 0


def test_an_embedding_model_has_one_slot_whatever_the_card_runs() -> None:
    card = gpu("a", GIB24, ("qwen3:8b",), parallel=4,
               models={"qwen3:8b": ModelInfo(embedding=True)})
    busy = snapshot(card, tickets=(ticket("a", "qwen3:8b"),))
    decision = place(call("qwen3:8b"), busy)
    assert decision.placement is None or decision.placement.kind != "warm"


def test_a_new_load_waits_behind_the_load_in_flight_on_its_card() -> None:
    loading = snapshot(gpu("a", GIB32), gpu("b", GIB32),
                       tickets=(ticket("a", "qwen3:14b", cold=True),))
    verdicts = {v.provider: v for v in explain(call("qwen3:8b"), loading)[1]}
    assert verdicts["a"].terms["loads_ahead"] == pytest.approx(12224 / 1024)
    assert "loads_ahead" not in verdicts["b"].terms


def test_a_load_queued_behind_another_starts_when_that_one_ends() -> None:
    """Ollama loads one model at a time: the 8b, asked for 2 s after the 14b began, waits for
    the 14b's 11.9 s before its own 5.9 s; a call joining the 8b's copy and a new load on the
    card both wait for both."""
    first, second = 12224 / 1024, 6000 / 1024
    loading = snapshot(gpu("a", GIB32), tickets=(
        ticket("a", "qwen3:14b", cold=True, elapsed=4.0),
        ticket("a", "qwen3:8b", cold=True, elapsed=2.0)))
    joins = explain(call("qwen3:8b"), loading)[1][0]
    assert joins.terms["load"] == pytest.approx(first - 4.0 + second)
    new = explain(call("phi3:mini"), loading)[1][0]
    assert new.terms["loads_ahead"] == pytest.approx(first - 4.0 + second)


def test_two_loads_in_flight_must_pass_ollamas_rule_in_either_order() -> None:
    """Ollama loads them one at a time, in the order the calls reach it: phi3 beside the
    32b's load passes the rule, but the 32b (estimate 25320) after phi3 would not."""
    card = ProviderView("a", 32768, version="0.33.0")
    big = Ticket("t1", "a", "qwen3:32b", 25320, NOW, NOW + 60, cold=True, estimate_mib=25320)
    small = Ticket("t2", "a", "phi3:mini", 3183, NOW, NOW + 60, cold=True, estimate_mib=3712)
    ok, why = ticket_budget_ok([big], small, card, Policy())
    assert not ok and "qwen3:32b" in why
    index = index_providers(snapshot(card, tickets=(replace(big, ticket_id="t9"),)),
                            DEFAULT_POLICY)["a"]
    assert not index.admits(Load("phi3:mini", 3183, 3712))
    # the same where phi3's own estimate is not known: the 32b's rule is still checked
    unknown = replace(small, estimate_mib=0)
    ok, why = ticket_budget_ok([big], unknown, card, Policy())
    assert not ok and "qwen3:32b" in why
    assert not index.admits(Load("phi3:mini", 3183, 0))


def test_a_load_beside_one_of_its_weights_file_still_making_room_waits() -> None:
    """qwen3:8b is being loaded (its victim phi3 still listed, so it is making room, not
    loading): a load of qwen3-16k, made FROM it, would have Ollama reload it, and the claim
    refuses one. The decision waits rather than choose what the claim refuses."""
    file = ModelInfo(weights="sha256-" + "ab" * 32)
    observed = {**{m: {0: mib} for m, mib in SIZES.items()}, "qwen3-16k": {0: 6500}}
    card = gpu("a", GIB24, ("phi3:mini",), observed=observed,
               models={"qwen3:8b": file, "qwen3-16k": file})
    loading = ticket("a", "qwen3:8b", cold=True, evicts={"phi3:mini": SIZES["phi3:mini"]})
    decision = place(call("qwen3-16k"), snapshot(card, tickets=(loading,)))
    assert decision.outcome == "wait", decision


def test_a_call_joins_the_copy_of_a_model_of_its_file_and_unloads_nothing() -> None:
    """qwen3-plain is made FROM qwen3:8b and asks the same context: Ollama has its call
    join the 8b's copy. It is placed there warm, its ticket naming that copy, and nothing
    is unloaded for it (planned as a load beside the copy, it unloaded phi3 to make room)."""
    file = ModelInfo(weights="sha256-" + "ab" * 32)
    observed = {**{m: {0: mib} for m, mib in SIZES.items()}, "qwen3-plain": {0: 6000}}
    card = gpu("a", 14500, ("qwen3:8b", "phi3:mini"), observed=observed,
               models={"qwen3:8b": file, "qwen3-plain": file})
    placed = place(call("qwen3-plain"), snapshot(card)).placement
    assert placed is not None, placed
    assert (placed.model, placed.copy, placed.copy_model, placed.kind, dict(placed.evicts)) \
        == ("qwen3-plain", "qwen3:8b", "qwen3:8b", "warm", {})
    full = snapshot(card, tickets=(ticket("a", "qwen3:8b"),))  # its one slot
    decision = place(call("qwen3-plain"), full)
    assert decision.outcome == "wait" and "qwen3-plain" in decision.reason, decision
    listed = place(call("qwen3-plain", "qwen3:8b"), snapshot(card)).placement
    assert listed is not None and (listed.model, listed.copy) == ("qwen3:8b", ""), listed


def test_a_model_of_one_file_with_an_adapter_of_its_own_is_planned_as_a_reload() -> None:
    """Ollama's needsReload compares a copy's adapters (and projectors, and runner options)
    besides its context: a call for the LoRA model finds the 8b's copy and reloads it."""
    file = "sha256-" + "ab" * 32
    observed = {**{m: {0: mib} for m, mib in SIZES.items()}, "qwen3-lora": {0: 6200}}
    card = gpu("a", GIB24, ("qwen3:8b",), observed=observed, resident_ctx=4096,
               ctx=4096, models={"qwen3:8b": ModelInfo(weights=file),
                                 "qwen3-lora": ModelInfo(weights=file,
                                                         runner="adapter=sha256-" + "cd" * 32)})
    placed = place(call("qwen3-lora"), snapshot(card)).placement
    assert placed is not None and placed.kind == "evict", placed
    assert dict(placed.evicts) == {"qwen3:8b": SIZES["qwen3:8b"]}
    same = replace(card, models={"qwen3:8b": ModelInfo(weights=file),
                                 "qwen3-lora": ModelInfo(weights=file)})
    joins = place(call("qwen3-lora"), snapshot(same)).placement
    assert joins is not None and (joins.kind, joins.copy) == ("warm", "qwen3:8b"), joins


def test_a_wait_entry_keeps_at_most_sixteen_alternatives_from_eviction_in_preference_order(
        ) -> None:
    """A wait entry is rewritten on every refresh: a long candidate list backs only its
    first MAX_BACKED runnable alternatives, in the call's order."""
    names = [f"m{i}:1b" for i in range(24)]
    card = gpu("a", observed={m: {0: 1000} for m in ["qwen3:32b", *names]} |
               {"qwen3:32b": {0: 40000}})
    spec = call("qwen3:32b", *names, tolerance=1000)
    backed = runnable_alternatives(spec, snapshot(card))
    assert backed == tuple(names[:MAX_BACKED])
