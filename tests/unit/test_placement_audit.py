"""Placement cases a fleet audit found: each row is what a real fleet did wrong once."""

from __future__ import annotations

from proxy.core.placement import place
from proxy.core.types import ModelInfo, ProviderView, Resident
from tests.unit.builders import call, snapshot, ticket

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
