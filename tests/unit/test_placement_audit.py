"""Placement cases a fleet audit found: each row is what a real fleet did wrong once."""

from __future__ import annotations

from dataclasses import replace

from proxy.core.lengths import NO_LENGTHS, CallLengths, CallSample
from proxy.core.placement import NO_PROVIDER_REACHABLE, place
from proxy.core.types import Circuit, ModelInfo, ProviderView, Resident
from tests.unit.builders import GIB16, GIB24, GIB32, call, gpu, snapshot, ticket

# qwen3:32b as the simulator's catalog has it (loadtest/sim_model.py): 64 layers x 8 KV heads
# x (128 + 128) x 2 bytes per token of context
QWEN3_32B = ModelInfo(trained_context=40960, kv_bytes_per_token=64 * 8 * 256 * 2,
                      estimate_kv_bytes_per_token=64 * 8 * 80 * 2 * 2)


def _card_with_a_small_context_32b() -> ProviderView:
    """A 24 GiB card on Ollama 0.33 (default context 32768: a 32b copy at that context is
    larger than the card), where an agent loaded qwen3:32b with num_ctx 4096."""
    return ProviderView("g24", 24564, version="0.33.0",
                        residents=(Resident("qwen3:32b", 20874, 4096),),
                        disk_mib={"qwen3:32b": 20200}, models={"qwen3:32b": QWEN3_32B})


def test_a_copy_the_call_cannot_join_does_not_hide_that_no_card_can_load_it() -> None:
    card = _card_with_a_small_context_32b()
    small = place(call("qwen3:32b", num_ctx=4096), snapshot(card))
    assert small.placement is not None and small.placement.kind == "warm"
    for label, spec in (("OpenAI API: Ollama's default context",
                         call("qwen3:32b", pins_context=False)),
                        ("num_ctx 32768", call("qwen3:32b", num_ctx=32768))):
        idle = place(spec, snapshot(card))
        assert idle.outcome == "model-too-large", (label, idle.reason)
        assert "32768" in idle.reason
        busy = place(spec, snapshot(card, tickets=(ticket("g24", "qwen3:32b"),)))
        assert busy.outcome == "model-too-large", (label, busy.reason)


def test_a_copy_the_call_can_join_is_never_too_large() -> None:
    card = _card_with_a_small_context_32b()
    busy = place(call("qwen3:32b", num_ctx=2048), snapshot(card, tickets=(
        ticket("g24", "qwen3:32b"),)))
    assert busy.outcome == "wait"  # for the copy's slot


def _fleet_without_mistral(*residents: str) -> tuple[ProviderView, ...]:
    disk = {"qwen3:14b": 9300, "gemma3:4b": 3300, "qwen3:8b": 5200}
    return tuple(replace(gpu(name, GIB24, residents if name == "a" else ()), disk_mib=disk)
                 for name in ("a", "b"))


AUDIT_CANDIDATES = (("mistral:7b", 60), ("qwen3:14b", 58), ("gemma3:4b", 56), ("qwen3:8b", 52))


def test_a_preferred_model_on_no_disk_falls_back_whether_or_not_a_candidate_is_loaded() -> None:
    cold = place(call(*AUDIT_CANDIDATES), snapshot(*_fleet_without_mistral()))
    assert cold.placement is not None and cold.placement.model == "qwen3:14b", cold.reason
    assert cold.reason.startswith("mistral:7b is on no provider's disk")
    warm = place(call(*AUDIT_CANDIDATES), snapshot(*_fleet_without_mistral("qwen3:14b")))
    assert warm.placement is not None and warm.placement.model == "qwen3:14b"
    # the best candidate on a disk, not the best loaded one
    other = place(call(*AUDIT_CANDIDATES[:1], *AUDIT_CANDIDATES[2:]),
                  snapshot(*_fleet_without_mistral()))
    assert other.placement is not None and other.placement.model == "gemma3:4b"


def test_model_not_found_only_when_no_acceptable_candidate_is_on_any_disk() -> None:
    alone = place(call("mistral:7b"), snapshot(*_fleet_without_mistral()))
    assert alone.outcome == "model-not-found"
    assert alone.reason == "model 'mistral:7b' not found"  # Ollama's own message
    outside = place(call(("mistral:7b", 60), ("qwen3:8b", 40)), snapshot(*_fleet_without_mistral()))
    assert outside.outcome == "model-not-found"  # the 8b is outside the tolerance
    nowhere = place(call(("mistral:7b", 60), ("llava:7b", 58)), snapshot(*_fleet_without_mistral()))
    assert nowhere.outcome == "model-not-found" and "mistral:7b" in nowhere.reason


def test_a_wait_names_the_unreachable_cards_when_only_they_could_hold_the_model() -> None:
    snap = snapshot(gpu("big", GIB32, ready=False), gpu("small", GIB24, ("qwen3:8b",)),
                    gpu("tiny", GIB16), circuits={"tiny": Circuit.OPEN})
    decision = place(call("qwen3:32b"), snap)  # 27000 MiB: only the 32 GiB card holds it
    assert decision.outcome == "wait"
    assert decision.reason.startswith(NO_PROVIDER_REACHABLE), decision.reason
    assert "big: provider not ready" in decision.reason
    assert "small" not in decision.reason and "tiny" not in decision.reason
    assert "capacity" not in decision.reason
    # a reachable card that could hold it, busy: that is the wait's reason
    busy = snapshot(gpu("big", GIB32, ready=False), gpu("other", GIB32, ("qwen3:14b",)),
                    tickets=(ticket("other", "qwen3:14b"),))
    assert place(call("qwen3:32b"), busy).reason.startswith("busy")


def test_a_wait_names_the_open_circuit_when_the_only_card_with_room_for_the_prompt_is_behind_it(
        ) -> None:
    """A card up and idle whose context cannot hold the prompt does not make the wait a busy
    one: the call waits for the card whose circuit is open, and says so (at the wait limit
    the agent is told to check the providers, not that the cluster is at capacity)."""
    snap = snapshot(gpu("short", GIB32, ctx=2048), gpu("failing", GIB24, ctx=8192),
                    circuits={"failing": Circuit.OPEN})
    decision = place(call("qwen3:8b", tokens=3000), snap)
    assert decision.outcome == "wait", decision
    assert decision.reason.startswith(NO_PROVIDER_REACHABLE), decision.reason
    assert "failing: circuit open" in decision.reason and "short" not in decision.reason
    # a prompt the up card holds: that card serves it
    fits = place(call("qwen3:8b", tokens=1000), snap)
    assert fits.placement is not None and fits.placement.provider == "short"


def test_a_card_down_goes_by_what_it_listed_last_and_only_one_never_listed_may_have_any() -> None:
    down = gpu("big", GIB32, ready=False, last_listed=frozenset({"qwen3:32b", "qwen3:8b"}))
    up = gpu("small", GIB24, disk_mib={"qwen3:8b": 5200})
    typo = place(call("qwen3:8bb"), snapshot(down, up))
    assert (typo.outcome, typo.reason) == ("model-not-found", "model 'qwen3:8bb' not found")
    there = place(call("Qwen3:32B"), snapshot(down, up))  # Ollama's names ignore case
    assert there.outcome == "wait" and "big: provider not ready" in there.reason
    never = place(call("qwen3:8bb"), snapshot(gpu("big", GIB32, ready=False), up))
    assert never.outcome == "wait" and never.reason.startswith(NO_PROVIDER_REACHABLE)


def _three_warm_cards_one_slow() -> list[ProviderView]:
    return [gpu(name, GIB24, ("qwen3:8b",)) for name in ("a-slow", "b-fast", "c-fast")]


def _lengths(seconds: dict[str, float]) -> CallLengths:
    lengths = NO_LENGTHS
    for provider, s in seconds.items():
        lengths = lengths.observe(provider, "qwen3:8b", CallSample(s))
    return lengths


def test_among_free_copies_equal_in_cost_the_call_goes_where_it_runs_sooner() -> None:
    cards = _three_warm_cards_one_slow()
    lengths = _lengths({"a-slow": 1.0, "b-fast": 0.051, "c-fast": 0.051})
    decision = place(call("qwen3:8b"), snapshot(*cards, lengths=lengths))
    assert decision.placement is not None
    assert (decision.placement.provider, decision.placement.kind) == ("b-fast", "warm")
    # the slow card's copy is still taken when it is the one with a free slot
    busy = snapshot(*cards, tickets=(ticket("b-fast", "qwen3:8b"), ticket("c-fast", "qwen3:8b")),
                    lengths=lengths)
    taken = place(call("qwen3:8b"), busy)
    assert taken.placement is not None and taken.placement.provider == "a-slow"
    # with no lengths known, the name decides, as before
    unknown = place(call("qwen3:8b"), snapshot(*cards))
    assert unknown.placement is not None and unknown.placement.provider == "a-slow"
