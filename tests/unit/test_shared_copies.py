"""A call placed on the copy of another model made from its weights file
(core/shared_copies.py): joined where Ollama would join it, never where Ollama would reload
it, and put back in the card's own names."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.core.conversations import NO_CACHES
from proxy.core.lengths import NO_LENGTHS, CallSample
from proxy.core.occupancy import copy_users, ticket_budget_ok
from proxy.core.placement import explain, place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import ModelDemand, ModelInfo, ProviderView, Resident, Ticket
from tests.unit.builders import GIB24, NOW, SIZES, call, gpu, snapshot, ticket
from tests.unit.test_affinity import loop, rates

FILE = ModelInfo(weights="sha256-" + "ab" * 32)
OBSERVED = {**{m: {0: mib} for m, mib in SIZES.items()}, "qwen3-plain": {0: 6000}}
TOOLS = (("tools", "does not support tools"),)


def card(total: int = GIB24, residents: tuple[str, ...] = ("qwen3:8b",), **extra: Any
         ) -> ProviderView:
    extra.setdefault("models", {"qwen3:8b": FILE, "qwen3-plain": FILE})
    return gpu("a", total, residents, observed=OBSERVED, **extra)


def test_a_copy_being_loaded_is_joined_as_a_loading_copy() -> None:
    loading = ticket("a", "qwen3:8b", cold=True, elapsed=1.0)
    snap = snapshot(card(residents=(), parallel=2), tickets=(loading,))
    placed = place(call("qwen3-plain"), snap).placement
    assert placed is not None and (placed.kind, placed.copy) == ("loading", "qwen3:8b"), placed
    join = replace(loading, ticket_id="new", cold=False, footprint_mib=512)
    assert ticket_budget_ok([loading], join, snap.providers[0], DEFAULT_POLICY, True)[0]


def test_a_copy_at_another_context_is_joined_only_by_a_call_that_can_carry_it() -> None:
    """Over the OpenAI or Anthropic API the call gets its Modelfile's num_ctx, and Ollama
    would reload the copy (needsReload compares num_ctx): planned as its eviction. Over
    Ollama's own API it carries the copy's num_ctx, which holds it: joined."""
    own_ctx = {"qwen3:8b": FILE, "qwen3-plain": replace(FILE, modelfile_num_ctx=16384)}
    snap = snapshot(card(models=own_ctx, resident_ctx=4096, ctx=4096))
    placed = place(call("qwen3-plain", pins_context=False), snap).placement
    assert placed is not None and placed.copy == "", placed
    assert placed.kind == "evict" and set(placed.evicts) == {"qwen3:8b"}, placed
    joins = place(call("qwen3-plain"), snap).placement
    assert joins is not None and (joins.copy, joins.num_ctx) == ("qwen3:8b", 4096), joins


def test_a_copy_with_other_runner_options_or_leaving_is_not_joined() -> None:
    adapter = {"qwen3:8b": FILE, "qwen3-plain": replace(FILE, runner="adapter=x")}
    placed = place(call("qwen3-plain"), snapshot(card(models=adapter))).placement
    assert placed is not None and placed.copy == "", placed
    leaving = card(residents=())
    leaving = replace(leaving, residents=(Resident("qwen3:8b", 6000, leaving=True),))
    placed = place(call("qwen3-plain"), snapshot(leaving)).placement
    assert placed is None or placed.copy == "", placed


def test_a_load_that_unloads_a_joined_copy_names_it_by_the_cards_name() -> None:
    """The call's in-tolerance qwen3-plain sees the idle 8b's copy as its own, but lacks the
    tools the call needs; phi3 loads only once that copy is unloaded. The victim is named as
    the card lists it, or nothing would unload it."""
    models = {"qwen3:8b": FILE, "qwen3-plain": replace(FILE, capabilities=("completion",))}
    snap = snapshot(card(total=8192, models=models))
    decision = place(call(("phi3:mini", 100), ("qwen3-plain", 95), needs=TOOLS), snap)
    placed = decision.placement
    assert placed is not None, decision
    assert (placed.model, placed.kind, dict(placed.evicts), placed.copy) == (
        "phi3:mini", "evict", {"qwen3:8b": SIZES["qwen3:8b"]}, ""), decision


def test_a_join_on_a_shared_copy_leaves_no_second_load_in_the_claim() -> None:
    """Two calls joined in turn on a copy of one slot: the second waits (the first's
    ticket names the copy, so the copy's slot is seen taken)."""
    first = place(call("qwen3-plain"), snapshot(card())).placement
    assert first is not None and first.copy_model == "qwen3:8b"
    taken = replace(ticket("a", "qwen3:8b"), ticket_id="first")
    second = place(call("qwen3-plain"), snapshot(card(), tickets=(taken,)))
    assert second.outcome == "wait", second


def test_a_conversation_goes_back_to_the_joined_copy_holding_its_history() -> None:
    """The copy's prompt cache is kept under the name the card lists it by: the next call
    of a conversation that ran there as qwen3-plain finds its history there."""
    history, nxt = loop(1, 4), loop(1, 5)
    caches = NO_CACHES.sent("b", "qwen3:8b", history, NOW - 10)
    fleet = snapshot(card(), replace(card(), name="b"), caches=caches, prefill=rates(),
                     lengths=NO_LENGTHS.observe("a", "qwen3:8b", CallSample(20.0))
                     .observe("b", "qwen3:8b", CallSample(20.0)))
    decision, verdicts = explain(call("qwen3-plain", tokens=nxt.tokens, conversation=nxt),
                                 fleet)
    placed = decision.placement
    assert placed is not None and (placed.provider, placed.copy) == ("b", "qwen3:8b"), decision
    prefill = {v.provider: v.terms["prefill"] for v in verdicts}
    assert prefill["b"] < prefill["a"]


def test_a_call_without_a_num_gpu_of_its_own_joins_a_copy_loaded_with_one() -> None:
    """needsReload gives a call whose num_gpu is Ollama's default the copy's: a call for the
    8b joins the copy its num_gpu 99 sibling loaded; that sibling's call reloads the 8b's."""
    models = {"qwen3:8b": FILE, "qwen3-plain": replace(FILE, runner="num_gpu=99")}
    sibling_loaded = replace(card(models=models), residents=(Resident("qwen3-plain", 6000),))
    joins = place(call("qwen3:8b"), snapshot(sibling_loaded))
    placed = joins.placement
    assert placed is not None and (placed.kind, placed.copy) == ("warm", "qwen3-plain"), joins
    reloads = place(call("qwen3-plain"), snapshot(card(models=models))).placement
    assert reloads is not None and (reloads.kind, set(reloads.evicts)) == (
        "evict", {"qwen3:8b"}), reloads


def test_a_copy_with_another_draft_is_joined_one_without_a_draft_is_not() -> None:
    """needsReload compares draft_num_predict (4 for a model with a DRAFT unless its
    Modelfile sets one, 0 for one without), never the DRAFT file (server/sched.go:
    1422-1424): a copy loaded with another draft is joined, one with none is reloaded unless
    the call's model sets draft_num_predict 0."""
    draft_a, draft_b = "draft=sha256-" + "a" * 64, "draft=sha256-" + "b" * 64
    for plain, joined in ((draft_b, True), ("", False), (f"draft_num_predict=0;{draft_b}", False),
                          ("draft_num_predict=4", True)):
        models = {"qwen3:8b": replace(FILE, runner=draft_a),
                  "qwen3-plain": replace(FILE, runner=plain)}
        placed = place(call("qwen3-plain"), snapshot(card(models=models))).placement
        assert placed is not None, plain
        assert (placed.kind, placed.copy) == (("warm", "qwen3:8b") if joined else
                                              ("evict", "")), (plain, placed)
    models = {"qwen3:8b": FILE, "qwen3-plain": replace(FILE, runner=f"draft_num_predict=0;"
                                                                   f"{draft_b}")}
    placed = place(call("qwen3-plain"), snapshot(card(models=models))).placement
    assert placed is not None and (placed.kind, placed.copy) == ("warm", "qwen3:8b"), placed


def test_the_users_of_a_copy_are_the_models_ollama_runs_on_it() -> None:
    """A release there is written at once when another sidecar's call for any of them
    waits (service/calls.py)."""
    models = {"qwen3:8b": FILE, "qwen3-plain": FILE,
              "qwen3-lora": replace(FILE, runner="adapter=x"), "phi3:mini": ModelInfo()}
    view = card(models=models)
    assert copy_users(view, "qwen3:8b") == ("qwen3:8b", "qwen3-plain")
    assert copy_users(view, "phi3:mini") == ("phi3:mini",)


def test_a_model_in_demand_that_runs_on_another_models_copy_is_not_shut_out_by_a_load() -> None:
    """qwen3-plain, in demand, has no copy of its own but runs on the 8b's: a load of the
    14b beside that copy takes no room it needs."""
    fleet = snapshot(card(), replace(card(residents=()), name="b"),
                     demand={"qwen3-plain": ModelDemand(recent_use=3.0)})
    verdicts = {v.provider: v for v in explain(call("qwen3:14b"), fleet)[1]}
    assert "takes_room" not in verdicts["a"].terms, verdicts["a"]


def test_no_load_goes_beside_a_copy_of_the_file_being_unloaded() -> None:
    """Ollama keeps a copy asked to unload until its calls end, and a call for another
    model of its file finds it there and reloads it: the load waits until it is gone, and
    the claim refuses one."""
    own_ctx = {"qwen3:8b": FILE, "qwen3-16k": replace(FILE, modelfile_num_ctx=16384)}
    leaving = replace(card(models=own_ctx, ctx=4096),
                      residents=(Resident("qwen3:8b", 6000, 4096, leaving=True),))
    decision = place(call("qwen3-16k", pins_context=False), snapshot(leaving))
    assert decision.outcome == "wait" and decision.placement is None, decision
    load = Ticket("t", "a", "qwen3-16k", 6500, NOW, NOW + 60, cold=True)
    ok, why = ticket_budget_ok([], load, leaving, DEFAULT_POLICY)
    assert not ok and "being unloaded" in why, why


def test_no_load_of_a_weights_file_while_another_name_of_it_is_being_unloaded() -> None:
    """qwen3:8b's copy is leaving; whatever else of its file is here (a copy of another name
    at another context, listed first, or the model's own copy at a context too small), a
    load of qwen3-plain waits for it to go, as the claim's budget does: Ollama keeps the
    leaving copy until its calls end and would serve or reload it from there."""
    models = {"qwen3:8b": FILE, "qwen3-plain": FILE,
              "qwen3-16k": replace(FILE, modelfile_num_ctx=16384)}
    leaving = Resident("qwen3:8b", 6000, leaving=True)
    for other in (Resident("qwen3-16k", 6500, context_length=16384),
                  Resident("qwen3-plain", 6000, context_length=2048)):
        view = replace(card(total=2 * GIB24, residents=(), models=models),
                       residents=(leaving, other))
        # (over the OpenAI API: the call gets its Modelfile's context, no join at 16384)
        decision = place(call("qwen3-plain", num_ctx=4096, pins_context=False),
                         snapshot(view))
        assert decision.placement is None, (other.model, decision)
