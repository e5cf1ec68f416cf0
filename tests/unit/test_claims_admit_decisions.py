"""The claim admits what the decision chose, in the smallest cases where it once refused it
(found by tests/unit/test_core_invariants.py): each refusal cost the call its claim rounds,
then a wait, or a 503 for a call that cannot wait."""

from __future__ import annotations

from proxy.core.occupancy import ticket_budget_ok
from proxy.core.placement import place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.tickets import Refused, TicketSet, claim
from proxy.core.types import Decision, ModelInfo, ProviderView, Resident, Snapshot, Ticket
from tests.unit.builders import GIB24, NOW, SIZES, call, gpu, snapshot, ticket


def claim_admits(decision: Decision, snap: Snapshot, tickets: list[Ticket]) -> tuple[bool, str]:
    """What the claim's budget check (the compare-and-set's) says of the decision's ticket."""
    placement = decision.placement
    assert placement is not None, decision.reason
    view = next(v for v in snap.providers if v.name == placement.provider)
    new = Ticket("new", view.name, placement.model, placement.footprint_mib, NOW, NOW + 60,
                 cold=placement.loads, evicts=dict(placement.evicts),
                 context=placement.num_ctx, estimate_mib=placement.estimate_mib)
    return ticket_budget_ok([t for t in tickets if t.provider == view.name], new, view,
                            DEFAULT_POLICY, placement.needs_free_slot)


def test_a_free_slot_on_a_packed_card_is_claimable() -> None:
    # 14B + 8B + 3B = 21324 MiB, within the 21616 usable of a 24 GiB card: the sidecar itself
    # loads this. With 4 slots each, 12 calls fit the copies; the 7th claim is refused.
    card = gpu("gA", GIB24, ("qwen3:14b", "qwen3:8b", "llama3.2:3b"), parallel=4)
    running = [ticket("gA", m) for m in ("qwen3:14b", "qwen3:8b", "llama3.2:3b") * 2]
    snap = snapshot(card, tickets=tuple(running))
    decision = place(call("qwen3:14b"), snap)
    assert decision.placement is not None and decision.placement.kind == "warm"
    ok, why = claim_admits(decision, snap, running)
    assert ok, why


def test_a_copy_filling_its_card_can_be_joined() -> None:
    card = ProviderView("gA", GIB24, residents=(Resident("qwen3:32b", 24200),),
                        max_parallel=2)
    snap = snapshot(card)
    decision = place(call("qwen3:32b"), snap)
    assert decision.outcome == "placed", decision.reason
    ok, why = claim_admits(decision, snap, [])
    assert ok, why


def test_no_second_load_beside_a_load_making_room() -> None:
    card = gpu("gA", 49152, ("qwen3:8b",))
    loading = ticket("gA", "qwen3:14b", cold=True, evicts={"qwen3:8b": SIZES["qwen3:8b"]})
    snap = snapshot(card, tickets=(loading,))
    decision = place(call("qwen3:14b"), snap)
    if decision.outcome == "placed":
        ok, why = claim_admits(decision, snap, [loading])
        assert ok, (why, decision.reason)


def test_a_model_of_unknown_size_is_not_loaded_onto_a_full_card() -> None:
    # usable 14328 MiB, 14224 held: 104 MiB free; the model's size is known nowhere
    card = ProviderView("gA", 16376, residents=(Resident("qwen3:14b", 12224),
                                                 Resident("qwen3:1.7b", 2000)))
    decision = place(call("mystery:7b"), snapshot(card))
    assert decision.placement is None or not decision.placement.loads, decision.reason


def test_two_loads_ollama_admits_in_either_order_are_claimed() -> None:
    qwen3_8b = ModelInfo(trained_context=40960, kv_bytes_per_token=147456,
                         estimate_kv_bytes_per_token=147456, family="qwen3",
                         architecture="qwen3")
    card = ProviderView("gA", GIB24, residents=(Resident("llama3.2:3b", 3100),),
                        context_length=8192, version="0.30.0",
                        disk_mib={"qwen3:14b": 10186, "qwen3:8b": 5000, "llama3.2:3b": 2583},
                        models={"qwen3:8b": qwen3_8b})
    # a 14B load in flight beside the 3B: Ollama's estimate 10186 MiB
    first = Ticket("t1", "gA", "qwen3:14b", 10186, NOW, NOW + 60, cold=True,
                   estimate_mib=10186, beside_mib=3557)
    snap = snapshot(card, tickets=(first,))
    decision = place(call("qwen3:8b"), snap)
    placement = decision.placement
    assert placement is not None and placement.kind == "cold", decision.reason
    # Ollama's 80 % rule (runner overhead 457 MiB) admits them in either order:
    # 14B then 8B: 10186 <= (24563 - 3557) * 0.8; 6152 <= (24563 - 14200) * 0.8
    # 8B then 14B: 6152 <= (24563 - 3557) * 0.8; 10186 <= (24563 - 10934) * 0.8
    new = Ticket("t2", "gA", placement.model, placement.footprint_mib, NOW, NOW + 60,
                 cold=True, estimate_mib=placement.estimate_mib,
                 beside_mib=placement.beside_mib, context=placement.num_ctx)
    outcome = claim(TicketSet({"t1": first}), new, card, DEFAULT_POLICY, 60, NOW)
    assert not isinstance(outcome, Refused), outcome
