"""Calls on another model's copy of their weights file (core/shared_copies.py): what they
count in the accounting around the placement, as Ollama runs them: the copy's demand as a
victim, the waiting line of its slots, its prompt cache, and which runner options make two
models of one file share a copy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxy.core.placement import place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import ModelDemand, Resident
from proxy.core.waitline import yields_to_sooner
from proxy.service.experience import Learning
from proxy.service.prober import runner_files, weights_file
from tests.unit.builders import GIB16, GIB24, NOW, call, gpu, snapshot, ticket
from tests.unit.test_affinity import loop
from tests.unit.test_shared_copies import FILE, OBSERVED, TOOLS

MODELS = {"qwen3:8b": FILE, "qwen3-plain": FILE}


def test_a_busy_copy_of_a_candidate_is_no_room_for_a_load_beside_it() -> None:
    full = gpu("a", GIB16, ("qwen3:8b", "llama3.2:3b", "phi3:mini"), observed=OBSERVED,
               models=MODELS)
    busy = ticket("a", "qwen3:8b")
    decision = place(call("qwen3-plain", ("qwen3:8b", 95)), snapshot(full, tickets=(busy,)))
    placed = decision.placement
    assert placed is None or not placed.loads, decision


def test_a_copy_renamed_for_an_alternative_keeps_its_own_models_demand_as_a_victim() -> None:
    models = {"qwen3:8b": FILE, "qwen3-plain": replace(FILE, capabilities=("completion",))}
    card = gpu("a", 12000, observed=OBSERVED, models=models)
    card = replace(card, residents=(Resident("qwen3:8b", 6000, expires_at=NOW + 100),
                                    Resident("llama3.2:3b", 3100, expires_at=NOW + 200)))
    demand = {"qwen3:8b": ModelDemand(recent_use=5.0, predicted=2.0, last_used_at=NOW - 1)}
    alone = place(call("phi3:mini", needs=TOOLS), snapshot(card, demand=demand)).placement
    assert alone is not None and dict(alone.evicts) == {"llama3.2:3b": 3100}, alone
    # qwen3-plain cannot take the call (no tools) yet its presence moves the victim
    decision = place(call("phi3:mini", ("qwen3-plain", 95), needs=TOOLS),
                     snapshot(card, demand=demand))
    placed = decision.placement
    assert placed is not None and dict(placed.evicts) == {"llama3.2:3b": 3100}, decision
    assert "qwen3-plain" not in decision.reason, decision.reason


def test_a_call_joining_another_models_copy_yields_to_that_models_sooner_waiters() -> None:
    card = gpu("a", GIB24, ("qwen3:8b",), observed=OBSERVED, models=MODELS)
    waiting = {"qwen3:8b": ModelDemand(waiters=1, turns=(NOW - 5,))}
    snap = snapshot(card, demand=waiting)
    placed = place(call("qwen3-plain"), snap).placement
    assert placed is not None and (placed.kind, placed.copy) == ("warm", "qwen3:8b"), placed
    assert yields_to_sooner(placed, snap, DEFAULT_POLICY, NOW) == 1


def test_an_idle_copy_at_a_larger_context_is_joined_by_a_call_that_pins_its_context() -> None:
    card = gpu("a", GIB24, ("qwen3:8b",), observed=OBSERVED, models=MODELS,
               resident_ctx=8192, ctx=4096)
    decision = place(call("qwen3-plain"), snapshot(card))
    placed = decision.placement
    assert placed is not None and (placed.kind, placed.copy, dict(placed.evicts)) == (
        "warm", "qwen3:8b", {}), decision


def test_a_copy_other_models_calls_run_on_keeps_their_demand_as_a_victim() -> None:
    card = gpu("a", 12000, observed=OBSERVED, models=MODELS)
    card = replace(card, residents=(Resident("qwen3:8b", 6000, expires_at=NOW + 200),
                                    Resident("llama3.2:3b", 3100, expires_at=NOW + 100)))
    demand = {"qwen3-plain": ModelDemand(recent_use=5.0, predicted=2.0, last_used_at=NOW - 1),
              "llama3.2:3b": ModelDemand(recent_use=0.5, last_used_at=NOW - 50)}
    decision = place(call("phi3:mini"), snapshot(card, demand=demand))
    placed = decision.placement
    assert placed is not None and dict(placed.evicts) == {"llama3.2:3b": 3100}, decision


def test_free_slots_of_the_joined_models_copies_the_call_cannot_join_are_not_its() -> None:
    joinable = gpu("a", GIB24, ("qwen3:8b",), observed=OBSERVED, models=MODELS)
    adapter = {"qwen3:8b": FILE, "qwen3-plain": replace(FILE, runner="adapter=x")}
    other = gpu("b", GIB24, ("qwen3:8b",), observed=OBSERVED, models=adapter)
    waiting = {"qwen3-plain": ModelDemand(waiters=1, turns=(NOW - 5,))}
    snap = snapshot(joinable, other, demand=waiting)
    placed = place(call("qwen3-plain"), snap).placement
    assert placed is not None and (placed.provider, placed.copy) == ("a", "qwen3:8b"), placed
    assert yields_to_sooner(placed, snap, DEFAULT_POLICY, NOW) == 1


def test_a_copy_of_a_candidate_that_cannot_take_the_call_is_joined_under_the_calls_model(
        ) -> None:
    """qwen3-plain (tools) is made FROM qwen3:8b (listed without tools): Ollama runs a
    tools call for qwen3-plain on the 8b's idle copy. The 8b in tolerance cannot take it."""
    models = {"qwen3:8b": replace(FILE, capabilities=("completion",)),
              "qwen3-plain": replace(FILE, capabilities=("completion", "tools"))}
    card = gpu("a", GIB24, ("qwen3:8b",), observed=OBSERVED, models=models)
    decision = place(call("qwen3-plain", ("qwen3:8b", 95), needs=TOOLS), snapshot(card))
    placed = decision.placement
    assert placed is not None and (placed.kind, placed.model, placed.copy) == (
        "warm", "qwen3-plain", "qwen3:8b"), decision


@pytest.mark.parametrize(("copy", "own"), [
    # a negative num_gpu (Ollama's default) takes the copy's
    ("num_gpu=99", "num_gpu=-1"),
    # /api/show lists PARAMETERs in a Go map's order
    ("num_batch=1024;num_thread=8", "num_thread=8;num_batch=1024"),
])
def test_runner_options_ollama_takes_as_the_same_join_the_copy(copy: str, own: str) -> None:
    models = {"qwen3:8b": replace(FILE, runner=copy), "qwen3-plain": replace(FILE, runner=own)}
    card = gpu("a", GIB24, ("qwen3:8b",), observed=OBSERVED, models=models)
    placed = place(call("qwen3-plain"), snapshot(card)).placement
    assert placed is not None and (placed.kind, placed.copy) == ("warm", "qwen3:8b"), placed


def test_a_call_does_not_yield_to_fewer_waiters_than_free_slots_of_their_model() -> None:
    """Two free 8b slots, one 8b call waiting ahead: a plain 8b call on card a (where a
    model made FROM the 8b is pulled too) takes one and leaves it the other."""
    with_plain = gpu("a", GIB24, ("qwen3:8b",), observed=OBSERVED,
                     models={"qwen3:8b": FILE, "qwen3-plain": FILE})
    without = gpu("b", GIB24, ("qwen3:8b",), observed=OBSERVED, models={"qwen3:8b": FILE})
    waiting = {"qwen3:8b": ModelDemand(waiters=1, turns=(NOW - 5,))}
    placed = place(call("qwen3:8b"), snapshot(with_plain)).placement
    assert placed is not None and (placed.provider, placed.kind) == ("a", "warm"), placed
    fleet = snapshot(with_plain, without, demand=waiting)
    assert yields_to_sooner(placed, fleet, DEFAULT_POLICY, NOW) == 0


def test_a_model_with_a_draft_is_no_runner_of_the_copy_of_its_weights_without_one() -> None:
    blob = "/root/.ollama/models/blobs/sha256-" + "ab" * 32
    draft = "/root/.ollama/models/blobs/sha256-" + "cd" * 32
    base = {"modelfile": f"FROM {blob}\nTEMPLATE {{{{ .Prompt }}}}\n", "parameters": ""}
    with_draft = {"modelfile": f"FROM {blob}\nDRAFT {draft}\nTEMPLATE {{{{ .Prompt }}}}\n",
                  "parameters": ""}
    assert weights_file(base) == weights_file(with_draft)
    assert runner_files(base) != runner_files(with_draft)


def test_a_call_on_another_models_copy_is_held_in_that_copys_prompt_cache() -> None:
    card = gpu("a", GIB24, ("qwen3:8b",), observed=OBSERVED,
               models={"qwen3:8b": FILE, "qwen3-plain": FILE})
    conversation = loop(1, 4)
    placed = place(call("qwen3-plain", tokens=conversation.tokens, conversation=conversation),
                   snapshot(card)).placement
    assert placed is not None and placed.copy == "qwen3:8b", placed
    learning = Learning()
    learning.sent(placed, conversation, card, "t1", NOW)
    assert set(learning.caches.held) == {("a", "qwen3:8b")}
    assert [key for key, _ in learning.take_unshared()] == [("a", "qwen3:8b")]
