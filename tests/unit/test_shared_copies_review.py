"""Review of core/shared_copies.py (ee16979): cases where a call for a model created FROM
another is still planned otherwise than Ollama runs it, or where the rename of the copy
leaks into decisions about other calls. Each is expected to fail until fixed."""

from __future__ import annotations

from dataclasses import replace

from proxy.core.placement import place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import ModelDemand, ModelInfo, Resident
from proxy.core.waitline import yields_to_sooner
from tests.unit.builders import GIB16, GIB24, NOW, SIZES, call, gpu, snapshot, ticket

FILE = ModelInfo(weights="sha256-" + "ab" * 32)
OBSERVED = {**{m: {0: mib} for m, mib in SIZES.items()}, "qwen3-plain": {0: 6000}}
MODELS = {"qwen3:8b": FILE, "qwen3-plain": FILE}
TOOLS = (("tools", "does not support tools"),)


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
