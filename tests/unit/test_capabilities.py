"""A call a model cannot take (Ollama refuses it before loading anything) is never placed on
it: another candidate may serve, and when none can the answer is Ollama's own 400."""

from __future__ import annotations

import pytest

from proxy.api.capabilities import call_needs
from proxy.core.engines import THINK_LEVEL
from proxy.core.models import full_model_name
from proxy.core.placement import place
from proxy.core.types import ModelInfo
from proxy.service.codec import decode_model_info, encode_model_info
from tests.unit.builders import call, gpu, snapshot

CHAT = ModelInfo(capabilities=("completion", "tools"))
THINKS = ModelInfo(capabilities=("completion", "tools", "thinking"))
NO_TOOLS = ModelInfo(capabilities=("completion",))
EMBEDS = ModelInfo(capabilities=("embedding",))
THINK = (("thinking", '"phi3:mini" does not support thinking'),
         ("completion", '"phi3:mini" does not support chat'))
TOOLS = (("completion", '"phi3:mini" does not support chat'),
         ("tools", "registry.ollama.ai/library/phi3:mini does not support tools"))
INSERT = (("completion", '"qwen3:8b" does not support generate'),
          ("insert", "registry.ollama.ai/library/qwen3:8b does not support insert"))
CODER = ModelInfo(capabilities=("completion", "tools", "insert"))


def level(asked: str) -> tuple[str, str]:
    return (THINK_LEVEL, f'think value "{asked}" is not supported for this model')


@pytest.mark.parametrize(("path", "body", "model", "needs"), [
    ("/api/chat", {"think": True}, "phi3:mini", THINK),
    ("/api/chat", {"think": "low", "tools": [{"type": "function"}]}, "phi3:mini",
     (level("low"), *THINK, TOOLS[1])),
    ("/api/chat", {"think": False, "tools": []}, "phi3:mini", (TOOLS[0],)),
    ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "phi3:mini", TOOLS),
    ("/v1/messages", {"think": True}, "phi3:mini", (TOOLS[0],)),  # relaxed there
    ("/v1/chat/completions", {"reasoning_effort": "xhigh"}, "phi3:mini", THINK),
    ("/v1/chat/completions", {"reasoning_effort": "high"}, "phi3:mini", (level("high"), *THINK)),
    ("/v1/chat/completions", {"reasoning_effort": "none"}, "phi3:mini", (TOOLS[0],)),
    ("/v1/responses", {"reasoning": {"effort": "low"}}, "phi3:mini", THINK),
    ("/v1/responses", {"reasoning_effort": "low"}, "phi3:mini", (TOOLS[0],)),
    ("/api/generate", {}, "nomic-embed-text",
     (("completion", '"nomic-embed-text" does not support generate'),)),
    ("/v1/completions", {}, "m", (("completion", '"m" does not support generate'),)),
    ("/api/embed", {}, "qwen3:8b", ()),  # no capability: the card decides (embedding_rules)
    ("/api/generate", {"suffix": "return x"}, "qwen3:8b", INSERT),
    ("/v1/completions", {"suffix": "return x"}, "qwen3:8b", INSERT),
    ("/api/generate", {"suffix": ""}, "qwen3:8b", INSERT[:1]),  # empty: no insert
    ("/api/chat", {"suffix": "x"}, "qwen3:8b", (("completion", '"qwen3:8b" does not support '
                                                 "chat"),)),  # chat has no suffix
])
def test_what_a_call_needs_and_ollamas_words_when_it_is_missing(
        path: str, body: dict[str, object], model: str,
        needs: tuple[tuple[str, str], ...]) -> None:
    assert call_needs(path, body, model) == needs


@pytest.mark.parametrize(("path", "body", "version", "thinks"), [
    # the Responses API reads no effort before 0.22
    ("/v1/responses", {"reasoning": {"effort": "high"}}, (0, 21, 2), False),
    ("/v1/responses", {"reasoning": {"effort": "high"}}, (0, 22, 0), True),
    # "max" from 0.22; minimal, xhigh and ultra from 0.32.11 (before, Ollama's 400)
    ("/v1/chat/completions", {"reasoning_effort": "max"}, (0, 21, 2), False),
    ("/v1/chat/completions", {"reasoning_effort": "max"}, (0, 22, 0), True),
    ("/v1/chat/completions", {"reasoning_effort": "minimal"}, (0, 32, 10), False),
    ("/v1/chat/completions", {"reasoning_effort": "minimal"}, (0, 32, 11), True),
    # `reasoning` given wins over reasoning_effort, even with no effort in it
    ("/v1/chat/completions", {"reasoning": {}, "reasoning_effort": "high"}, (0, 30, 0), False),
    ("/v1/chat/completions", {"reasoning": None, "reasoning_effort": "high"}, (0, 30, 0),
     True),
])
def test_a_reasoning_effort_asks_for_thinking_as_the_version_reads_it(
        path: str, body: dict[str, object], version: tuple[int, int, int],
        thinks: bool) -> None:
    needs = call_needs(path, body, "phi3:mini", version)
    assert ("thinking" in dict(needs)) is thinks


@pytest.mark.parametrize(("name", "full"), [
    ("phi3:mini", "registry.ollama.ai/library/phi3:mini"),
    ("nomic-embed-text", "registry.ollama.ai/library/nomic-embed-text:latest"),
    ("me/mine:v1", "registry.ollama.ai/me/mine:v1"),
    ("hf.co/org/model:Q4", "hf.co/org/model:Q4"),
])
def test_ollamas_full_model_name(name: str, full: str) -> None:
    assert full_model_name(name) == full


def test_no_card_takes_a_call_its_model_cannot_and_none_is_loaded_or_evicted() -> None:
    # phi3 is warm and idle on a, the 8b loaded beside it: still refused, nothing unloaded
    card = gpu("a", residents=("phi3:mini", "qwen3:8b"),
               models={"phi3:mini": CHAT, "qwen3:8b": THINKS})
    decision = place(call("phi3:mini", needs=THINK), snapshot(card))
    assert (decision.outcome, decision.placement) == ("unsupported", None)
    assert decision.reason == '"phi3:mini" does not support thinking'


def test_an_in_tolerance_candidate_that_can_takes_the_call() -> None:
    card = gpu("a", residents=("phi3:mini",), models={"phi3:mini": CHAT, "qwen3:8b": THINKS})
    decision = place(call(("phi3:mini", 70), ("qwen3:8b", 65), needs=THINK), snapshot(card))
    assert decision.placement is not None and decision.placement.model == "qwen3:8b"
    warm = gpu("a", residents=("phi3:mini", "qwen3:8b"),
               models={"phi3:mini": CHAT, "qwen3:8b": THINKS})
    hit = place(call(("phi3:mini", 70), ("qwen3:8b", 65), needs=THINK), snapshot(warm))
    assert hit.placement is not None and (hit.placement.model, hit.placement.kind) == (
        "qwen3:8b", "warm")


QWEN3 = ModelInfo(capabilities=THINKS.capabilities, family="qwen3")
GPT_OSS = ModelInfo(capabilities=THINKS.capabilities, family="gptoss")


@pytest.mark.parametrize(("version", "info", "placed"), [
    ("0.12.6", QWEN3, False), ("0.17.6", QWEN3, False), ("0.17.7", QWEN3, True),
    ("0.24.0", QWEN3, True), ("0.12.6", GPT_OSS, True), ("", QWEN3, True)])
def test_a_think_level_before_0_17_7_is_refused_but_on_gpt_oss(
        version: str, info: ModelInfo, placed: bool) -> None:
    """Ollama refuses it before any load (v0.12.6 server/routes.go:323-327): placed there,
    the call would evict for nothing and miss a card or candidate that takes it."""
    needs = call_needs("/api/chat", {"think": "high"}, "qwen3:8b")
    card = gpu("a", residents=("phi3:mini",), version=version, models={"qwen3:8b": info})
    decision = place(call("qwen3:8b", needs=needs), snapshot(card))
    assert (decision.outcome == "placed") is placed
    if not placed:
        assert (decision.outcome, decision.reason) == (
            "unsupported", 'think value "high" is not supported for this model')


def test_a_think_level_goes_to_the_card_whose_version_takes_it() -> None:
    needs = call_needs("/api/chat", {"think": "high"}, "qwen3:8b")
    old = gpu("old", residents=("qwen3:8b",), version="0.12.6", models={"qwen3:8b": QWEN3})
    new = gpu("new", version="0.24.0", models={"qwen3:8b": QWEN3})
    decision = place(call("qwen3:8b", needs=needs), snapshot(old, new))
    assert decision.placement is not None
    assert (decision.placement.provider, decision.placement.kind) == ("new", "cold")


def test_tools_on_a_model_without_them_is_ollamas_scheduling_refusal() -> None:
    card = gpu("a", models={"phi3:mini": NO_TOOLS})
    decision = place(call("phi3:mini", needs=TOOLS), snapshot(card))
    assert (decision.outcome, decision.reason) == (
        "unsupported", "registry.ollama.ai/library/phi3:mini does not support tools")


def test_unknown_capabilities_refuse_nothing() -> None:
    """Not probed yet, or an Ollama whose /api/show lists none: the engine decides."""
    for models in ({}, {"phi3:mini": ModelInfo()}):
        card = gpu("a", residents=("phi3:mini",), models=models)
        decision = place(call("phi3:mini", needs=THINK), snapshot(card))
        assert decision.outcome == "placed"


def test_an_embedding_model_is_no_chat_model() -> None:
    card = gpu("a", models={"nomic-embed-text:latest": EMBEDS}, observed={
        "nomic-embed-text:latest": {0: 300}})
    needs = call_needs("/api/chat", {}, "nomic-embed-text")
    decision = place(call("nomic-embed-text:latest", needs=needs), snapshot(card))
    assert (decision.outcome, decision.reason) == (
        "unsupported", '"nomic-embed-text" does not support chat')


def test_capabilities_are_shared_with_the_provider_state_and_unknown_when_absent() -> None:
    assert decode_model_info(encode_model_info(THINKS)) == THINKS
    assert "capabilities" not in encode_model_info(ModelInfo())
    assert decode_model_info({"trainedContext": 4096}).capabilities is None  # older writer


def test_a_suffix_goes_to_a_candidate_that_can_insert_or_is_ollamas_refusal() -> None:
    """Ollama refuses a suffix on a model whose template has no `.Suffix` (server/routes.go:
    448-451, a scheduling error naming the model in full); an in-tolerance candidate that
    can insert takes the call instead, cold if need be, with nothing evicted for it."""
    card = gpu("a", residents=("qwen3:8b",),
               models={"qwen3:8b": THINKS, "qwen2.5-coder:1.5b": CODER})
    needs = call_needs("/api/generate", {"suffix": "return x"}, "qwen3:8b")
    served = place(call(("qwen3:8b", 70), ("qwen2.5-coder:1.5b", 65), needs=needs),
                   snapshot(card))
    assert served.placement is not None and served.placement.model == "qwen2.5-coder:1.5b"
    alone = place(call("qwen3:8b", needs=needs), snapshot(card))
    assert (alone.outcome, alone.reason) == (
        "unsupported", "registry.ollama.ai/library/qwen3:8b does not support insert")


def test_a_warm_candidate_that_lacks_a_capability_is_no_slot_to_wait_for() -> None:
    """phi3 (preferred) loads only once the idle qwen3:8b is unloaded, and qwen3:8b lacks
    the tools the call needs: its free slot is no wait, or the call would wait on it until
    its limit."""
    card = gpu("a", 8192, ("qwen3:8b",), models={"qwen3:8b": NO_TOOLS, "phi3:mini": CHAT})
    decision = place(call(("phi3:mini", 100), ("qwen3:8b", 95), needs=(TOOLS[1],)),
                     snapshot(card))
    placed = decision.placement
    assert placed is not None and (placed.model, placed.kind, set(placed.evicts)) == (
        "phi3:mini", "evict", {"qwen3:8b"}), decision
