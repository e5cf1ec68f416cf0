"""Victims, the ticket budget, health state machines and prompt sizing: one row each."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import orjson
import pytest

from proxy.core.eviction import choose_victims, idle_residents
from proxy.core.health import Breaker, Ema, ProviderStats
from proxy.core.occupancy import index_providers, ticket_budget_ok
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.queueing import victims_cost_s
from proxy.core.token_ratio import PIECE_TOKENS, TokenRatio
from proxy.core.tokens import (
    WEB_SEARCH_FUNCTION,
    Anchor,
    ConversationMemory,
    PromptSize,
    answers_tool_result,
    conversation_digests,
    longest_input_size,
    prompt_size,
)
from proxy.core.types import Circuit, ModelDemand, ModelInfo, Resident, Ticket
from proxy.service.experience import Learning
from proxy.service.routing import CallRequest
from tests.unit.builders import GIB32, NOW, gpu, snapshot, ticket


def _index(*residents: str, tickets: tuple[Ticket, ...] = ()):  # type: ignore[no-untyped-def]
    snap = snapshot(gpu("a", GIB32, residents), tickets=tickets)
    return index_providers(snap, DEFAULT_POLICY)["a"], snap


# --- victims -------------------------------------------------------------------------------

def frees(mib: int):  # type: ignore[no-untyped-def]
    return lambda victims: sum(v.footprint_mib for v in victims) >= mib


def test_victims_only_idle_residents() -> None:
    index, _ = _index("qwen3:8b", "phi3:mini", tickets=(ticket("a", "qwen3:8b"),))
    chosen = choose_victims(index, frees(3000), {})
    assert chosen is not None and [r.model for r in chosen] == ["phi3:mini"]
    assert choose_victims(index, frees(5000), {}) is None  # the 8b has live work


def test_victims_never_one_planned_by_another_ticket() -> None:
    plan = ticket("a", "qwen3:14b", cold=True, evicts={"phi3:mini": 3600})
    index, _ = _index("qwen3:8b", "phi3:mini", tickets=(plan,))
    chosen = choose_victims(index, frees(3000), {})
    assert chosen is not None and [r.model for r in chosen] == ["qwen3:8b"]


def test_victims_fewest_first() -> None:
    index, _ = _index("qwen3:8b", "phi3:mini", "llama3.2:3b")
    chosen = choose_victims(index, frees(5000), {})  # the 8b alone beats phi3 + llama together
    assert chosen is not None and [r.model for r in chosen] == ["qwen3:8b"]


@pytest.mark.parametrize(
    ("demand", "victim"),
    [
        ({"phi3:mini": ModelDemand(intents=1)}, "llama3.2:3b"),
        ({"llama3.2:3b": ModelDemand(recent_use=2)}, "phi3:mini"),
        ({"phi3:mini": ModelDemand(last_used_at=NOW)}, "llama3.2:3b"),
        ({}, "llama3.2:3b"),  # all equal: by name
    ],
)
def test_victims_least_needed_first(demand: dict[str, ModelDemand], victim: str) -> None:
    index, _ = _index("phi3:mini", "llama3.2:3b")
    chosen = choose_victims(index, frees(3000), demand)
    assert chosen is not None and [r.model for r in chosen] == [victim]


def test_models_with_waiters_only_as_a_last_resort() -> None:
    index, _ = _index("qwen3:8b", "phi3:mini", "llama3.2:3b")
    demand = {"qwen3:8b": ModelDemand(waiters=1)}
    chosen = choose_victims(index, frees(5000), demand)
    assert chosen is not None and {r.model for r in chosen} == {"phi3:mini", "llama3.2:3b"}
    chosen = choose_victims(index, frees(9000), demand)
    assert chosen is not None and "qwen3:8b" in {r.model for r in chosen}


@pytest.mark.parametrize(
    ("victim_mib", "use", "expected"),
    [(27000, 1.0, 1 + 27000 / 1024 * 0.5), (6000, 0.0, 1.0)],
)
def test_victim_cost_reference(victim_mib: int, use: float, expected: float) -> None:
    snap = snapshot(gpu("a"), demand={"v": ModelDemand(recent_use=use)})
    assert victims_cost_s(snap.providers[0], [Resident("v", victim_mib)], snap,
                          DEFAULT_POLICY) == pytest.approx(
        expected)


# --- the ticket budget ---------------------------------------------------------------------

def _t(tid: str, model: str, mib: int, *, cold: bool = True,
       evicts: dict[str, int] | None = None) -> Ticket:
    return Ticket(tid, "a", model, mib, NOW, NOW + 60, cold=cold, evicts=evicts or {})


def test_budget_counts_tickets_against_usable_minus_residents() -> None:
    view = gpu("a", 20000, ("qwen3:8b",))  # usable 17600 (2400 reserved): 11600 beside the 8b
    assert ticket_budget_ok([_t("1", "qwen3:14b", 10000)], _t("2", "x", 1600), view,
                            DEFAULT_POLICY)[0]
    assert not ticket_budget_ok([_t("1", "qwen3:14b", 10000)], _t("2", "x", 1601), view,
                                DEFAULT_POLICY)[0]
    # A call sharing a loaded copy loads nothing: only a card full to its total refuses it.
    full = [_t("1", "qwen3:14b", 13500)]
    assert ticket_budget_ok(full, _t("2", "qwen3:8b", 500, cold=False), view, DEFAULT_POLICY)[0]


def test_two_planners_cannot_both_spend_one_victims_memory() -> None:
    view = gpu("a", 20000, ("qwen3:8b",))
    first = _t("1", "qwen3:14b", 11600 + 6000, evicts={"qwen3:8b": 6000})
    assert ticket_budget_ok([], first, view, DEFAULT_POLICY)[0]
    second = _t("2", "other", 6000, evicts={"qwen3:8b": 6000})
    ok, why = ticket_budget_ok([first], second, view, DEFAULT_POLICY)
    assert not ok and "exceed" in why  # the credit counts the 8b once


def test_credit_only_while_the_victim_is_still_resident() -> None:
    gone = gpu("a", 20000)  # the victim was unloaded: residents no longer hold it
    plan = _t("1", "qwen3:14b", 17600, evicts={"qwen3:8b": 6000})
    assert ticket_budget_ok([], plan, gone, DEFAULT_POLICY)[0]
    late = _t("2", "y", 1, evicts={"qwen3:8b": 6000})
    assert not ticket_budget_ok([plan], late, gone, DEFAULT_POLICY)[0]


def test_claim_refused_when_its_victim_picked_up_work() -> None:
    view = gpu("a", 20000, ("qwen3:8b",))
    busy = _t("1", "qwen3:8b", 512, cold=False)
    ok, why = ticket_budget_ok([busy], _t("2", "q", 20000, evicts={"qwen3:8b": 6000}), view,
                               DEFAULT_POLICY)
    assert not ok and "in-flight" in why


def test_claim_refused_when_the_copy_it_would_join_is_not_there() -> None:
    view = gpu("a", 20000, ("qwen3:8b",))
    joiner = _t("2", "qwen3:14b", 512, cold=False)  # decided "loading" behind a cold claim
    ok, why = ticket_budget_ok([], joiner, view, DEFAULT_POLICY)
    assert not ok and "neither loaded nor being loaded" in why  # that claim was refused
    assert ticket_budget_ok([_t("1", "qwen3:14b", 12224)], joiner, view, DEFAULT_POLICY)[0]


def test_nobody_joins_a_load_before_its_victims_are_gone() -> None:
    view = gpu("a", 20000, ("phi3:mini",))
    evicting = _t("1", "qwen3:14b", 12224, evicts={"phi3:mini": 3600})
    joiner = _t("2", "qwen3:14b", 512, cold=False)
    ok, why = ticket_budget_ok([evicting], joiner, view, DEFAULT_POLICY)
    assert not ok and "room" in why  # sent now, it would load the 14b beside the phi3
    index = index_providers(snapshot(view, tickets=(evicting,)), DEFAULT_POLICY)["a"]
    assert not index.is_loading("qwen3:14b") and "qwen3:14b" in index.making_room
    gone = gpu("a", 20000)  # the phi3 was unloaded
    assert ticket_budget_ok([evicting], joiner, gone, DEFAULT_POLICY)[0]
    assert index_providers(snapshot(gone, tickets=(evicting,)), DEFAULT_POLICY)["a"].is_loading(
        "qwen3:14b")


def test_no_new_work_for_a_planned_victim() -> None:
    view = gpu("a", 20000, ("phi3:mini",))
    evicting = _t("1", "qwen3:14b", 12224, evicts={"phi3:mini": 3600})
    ok, why = ticket_budget_ok([evicting], _t("2", "phi3:mini", 512, cold=False), view,
                               DEFAULT_POLICY)
    assert not ok and "planned for eviction" in why
    ok, why = ticket_budget_ok([evicting], _t("3", "phi3:mini", 3600), view, DEFAULT_POLICY)
    assert not ok and "planned for eviction" in why  # nor a load of it beside its evictor


def test_an_idle_copy_past_its_keep_alive_is_not_warm() -> None:
    expiring = Resident("qwen3:8b", 6000, 8192, expires_at=NOW + 0.5)  # within the margin
    view = replace(gpu("a", 20000), residents=(expiring, Resident("phi3:mini", 3600)))
    index = index_providers(snapshot(view), DEFAULT_POLICY)["a"]
    assert not index.is_warm("qwen3:8b") and index.is_warm("phi3:mini")
    assert index.resident_mib == 9600  # its memory counts until a probe shows it freed
    busy = index_providers(snapshot(view, tickets=(ticket("a", "qwen3:8b"),)), DEFAULT_POLICY)
    assert busy["a"].is_warm("qwen3:8b")  # in use: Ollama keeps it
    ok, why = ticket_budget_ok([], _t("2", "qwen3:8b", 512, cold=False), view, DEFAULT_POLICY)
    assert not ok and "neither loaded" in why
    lasting = replace(expiring, expires_at=NOW + 60)
    view = replace(view, residents=(lasting,))
    assert index_providers(snapshot(view), DEFAULT_POLICY)["a"].is_warm("qwen3:8b")


def test_warm_tickets_claim_scratch_and_resident_loads_stop_counting_in_full() -> None:
    view = gpu("a", 20000, ("qwen3:14b",))  # 7776 MiB beside it
    loaded = _t("1", "qwen3:14b", 12224)  # its model is resident now: counts as scratch
    warm = [_t(str(i), "qwen3:14b", 512, cold=False) for i in range(2, 15)]
    assert ticket_budget_ok([loaded, *warm], _t("x", "qwen3:14b", 512, cold=False), view,
                            DEFAULT_POLICY)[0]


# --- health --------------------------------------------------------------------------------

def test_breaker_opens_after_three_failures_in_120s_then_half_opens() -> None:
    b = Breaker()
    for t in (0.0, 50.0):
        b = b.record(False, t)
        assert b.state(t) is Circuit.CLOSED
    b = b.record(False, 100.0)
    assert b.state(100.0) is Circuit.OPEN and not b.allows(159.9)
    assert b.state(160.0) is Circuit.HALF_OPEN and b.allows(160.0)
    trial = b.start_trial(160.0)
    assert not trial.allows(160.5)  # one trial at a time
    assert trial.record(True, 161.0).state(161.0) is Circuit.CLOSED
    assert trial.record(False, 161.0).state(161.0) is Circuit.OPEN


def test_a_call_its_client_left_is_neither_success_nor_failure() -> None:
    stats = ProviderStats().record(True, 2.0, 0.0)
    left = stats.abandoned()
    assert (left.latency, left.success, left.breaker) == (stats.latency, stats.success,
                                                          stats.breaker)
    opened = Breaker().record(False, 0).record(False, 1).record(False, 2)
    trial = ProviderStats(opened.start_trial(62.0))
    assert not trial.breaker.allows(62.5)
    after = trial.abandoned().breaker
    assert after.state(63.0) is Circuit.HALF_OPEN and after.allows(63.0)  # another trial


def test_breaker_forgets_failures_older_than_the_window() -> None:
    b = Breaker().record(False, 0).record(False, 10).record(False, 130.1)
    assert b.state(130.1) is Circuit.CLOSED


def test_latency_ema_and_success_rate_after_five_samples() -> None:
    assert Ema().add(10, 0.4).add(20, 0.4).value == pytest.approx(14.0)
    stats = ProviderStats()
    for i in range(4):
        stats = stats.record(i != 0, 1.0, float(i))
    assert stats.success_rate is None
    stats = stats.record(True, 1.0, 5.0)
    assert stats.success_rate is not None and 0 < stats.success_rate < 1


# --- prompt sizing -------------------------------------------------------------------------

def test_prompt_chars_counts_messages_tool_calls_results_and_schemas() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "abcd"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"function": {"name": "ls", "arguments": {"p": "/"}}}]},
            {"role": "tool", "content": "12345"},
        ],
        "tools": [{"type": "function", "function": {
            "name": "ls", "description": "list", "parameters": {"type": "object"}}}],
    }
    # 4 + (2 + len('{"p":"/"}')=9) + 5 + (2 + 4 + len('{"type":"object"}')=17)
    assert prompt_size(body).chars == 4 + 11 + 5 + 23
    assert prompt_size({"prompt": "hello", "system": "sys"}).chars == 8
    fill_in_the_middle = {"prompt": "def f(", "suffix": "return x"}
    assert prompt_size(fill_in_the_middle).chars == 14
    assert prompt_size({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "abc"}]}]}).chars == 3


def test_prompt_chars_reads_anthropic_blocks_and_responses_items() -> None:
    image = {"type": "image", "source": {"type": "base64", "data": "A" * 5000}}
    anthropic = {
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "tool_use", "id": "t1", "name": "ls", "input": {"p": "/"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": "a b"}]}]},
        ],
        "tools": [{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
    }
    # sys + look (not the image) + hmm + ls + {"p":"/"} + a b + (ls + list + schema)
    assert prompt_size(anthropic).chars == 3 + 4 + 3 + 2 + 9 + 3 + (2 + 4 + 17)
    responses = {
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                         {"type": "input_image", "image_url": "data:x" * 99}]},
            {"type": "reasoning", "id": "rs_1", "encrypted_content": "think"},
            {"type": "function_call", "call_id": "c1", "name": "run", "arguments": '{"a":1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
        ],
        "tools": [{"type": "function", "name": "run", "description": "go",
                   "parameters": {"type": "object"}}],
    }
    assert prompt_size(responses).chars == 8 + 2 + 5 + (3 + 7) + 4 + (3 + 2 + 17)
    assert prompt_size({"input": "plain text"}).chars == 10


def test_a_replayed_reasoning_item_counts_its_thinking_once() -> None:
    """Ollama's answer has its thinking in a reasoning item's summary and encrypted_content
    both; sent back, it reads encrypted_content alone (openai/responses.go)."""
    thinking = "because " * 100
    item = {"type": "reasoning", "id": "rs_1", "encrypted_content": thinking,
            "summary": [{"type": "summary_text", "text": thinking}]}
    assert prompt_size({"input": [item]}).chars == len(thinking)
    summary_only = {**item, "encrypted_content": None}
    assert prompt_size({"input": [summary_only]}).chars == 0
    # an OpenAI chat message's thinking, as Ollama's answer gave it
    chat = {"messages": [{"role": "assistant", "content": "ok", "reasoning": thinking}]}
    assert prompt_size(chat).chars == 2 + len(thinking)


def test_a_responses_image_by_file_id_alone_is_not_counted() -> None:
    """Ollama skips it (convertResponsesContent: no image_url)."""
    by_id = {"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}
    assert prompt_size({"input": [by_id]}).images == 0
    by_url = {"role": "user", "content": [{"type": "input_image", "image_url": "data:;base64,"}]}
    assert prompt_size({"input": [by_url]}).images == 1


def test_a_responses_namespace_tool_is_sized_by_its_member_functions() -> None:
    """Ollama offers the model each member of a `namespace` tool, named `ns.member`, with
    its schema (openai/responses.go convertTools): a namespace of MCP tools is most of such
    a prompt."""
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    body = {"input": "hi", "tools": [{"type": "namespace", "name": "fs", "tools": [
        {"type": "function", "name": "read", "description": "read a file",
         "parameters": schema},
        {"type": "function", "name": "list", "description": "list files",
         "parameters": schema}]}]}
    member = len(orjson.dumps(schema))
    assert prompt_size(body).chars == 2 + (3 + 4 + 11 + member) + (3 + 4 + 10 + member)


def test_an_embedding_request_is_sized_by_its_longest_input() -> None:
    assert longest_input_size({"input": ["ab", "abcd", ""]}).chars == 4
    assert longest_input_size({"input": "abc"}).chars == 3
    assert longest_input_size({"prompt": "legacy"}).chars == 6  # /api/embeddings


def test_token_ratio_learns_from_the_engine() -> None:
    ratio = TokenRatio()
    assert ratio.tokens(35) == 10 and ratio.prompt_tokens(35) == 10  # ceil(35 / 3.5)
    # prose of many sizes at 4 characters a token and 20 tokens of template each
    for chars in (400, 4000, 1200, 20000, 800, 9000, 2400, 16000) * 3:
        ratio = ratio.observe(chars, chars // 4 + 20)
    assert ratio.chars_per_token == pytest.approx(4.0, rel=0.02)
    assert 10 < ratio.fixed_tokens < 35  # the starting line (no fixed part) still weighs a little
    assert ratio.prompt_tokens(100_000) == pytest.approx(25_020, rel=0.02)
    assert ratio.observe(1000, 100) == ratio  # 10 chars/token: cut or cached, ignored
    assert ratio.observe(100, 0) == ratio
    assert ratio.observe(200, 63) == ratio  # too short to tell anything
    assert ratio.tokens(0) == 0 and ratio.tokens(1) == math.ceil(1 / ratio.chars_per_token)


def test_a_template_heavy_prompt_teaches_a_fixed_part_not_a_low_ratio() -> None:
    """A tool loop's prompts are a short question, a tool schema and the template's tools
    block (~150 tokens in Qwen's and Llama's): 250 characters counted 220 tokens, over and
    over. Taken as a ratio (1.1 characters a token) a 100,000-character document after them
    would be sized at 90,000 tokens and refused; as a line it is sized as prose."""
    ratio = TokenRatio()
    for _ in range(30):
        ratio = ratio.observe(250, 220)
    assert ratio.prompt_tokens(250) == pytest.approx(220, abs=12)
    assert ratio.fixed_tokens > 100
    assert 3.0 < ratio.chars_per_token <= 4.5
    assert ratio.prompt_tokens(100_000) < 100_000 / 3.0
    # prose that follows corrects the slope
    for chars in (20000, 60000, 8000, 40000):
        ratio = ratio.observe(chars, chars // 4 + 20)
    assert ratio.prompt_tokens(100_000) == pytest.approx(25_000, rel=0.08)


def test_claim_rechecks_the_slot_a_warm_decision_assumed() -> None:
    view = gpu("a", 20000, ("qwen3:8b",), parallel=1)
    running = _t("1", "qwen3:8b", 512, cold=False)
    late = _t("2", "qwen3:8b", 512, cold=False)
    ok, why = ticket_budget_ok([running], late, view, DEFAULT_POLICY, needs_free_slot=True)
    assert not ok and "slot" in why
    assert ticket_budget_ok([running], late, view, DEFAULT_POLICY)[0]  # queueing is allowed


def test_claim_refuses_a_second_load_of_a_model_already_loading() -> None:
    view = gpu("a", 40000)
    first = _t("1", "qwen3:14b", 12224)
    second = _t("2", "qwen3:14b", 12224)
    ok, why = ticket_budget_ok([first], second, view, DEFAULT_POLICY)
    assert not ok and "already being loaded" in why


def test_claim_refuses_a_load_beside_one_of_the_same_weights_file_in_flight() -> None:
    """qwen3-16k is made FROM qwen3:8b: Ollama runs one copy of the file, so two sidecars'
    loads of the two at once would have it reload one for the other."""
    file = ModelInfo(weights="sha256-" + "ab" * 32)
    view = replace(gpu("a", 40000), models={"qwen3:8b": file, "qwen3-16k": file,
                                            "qwen3:14b": ModelInfo(weights="sha256-" + "cd" * 32)})
    loading = _t("1", "qwen3:8b", 7000)
    ok, why = ticket_budget_ok([loading], _t("2", "qwen3-16k", 9000), view, DEFAULT_POLICY)
    assert not ok and why == "qwen3:8b is being loaded here from the same weights file"
    assert ticket_budget_ok([loading], _t("2", "qwen3:14b", 12224), view, DEFAULT_POLICY)[0]
    listed = replace(view, residents=(Resident("qwen3:8b", 7000, 4096),))
    assert ticket_budget_ok([loading], _t("2", "qwen3-16k", 9000), listed, DEFAULT_POLICY)[0]


def test_claim_refuses_a_load_beside_a_reload_of_the_same_weights_file_in_flight() -> None:
    """A reload of llama3.2:3b at 32768 while its copy at 8192 is still listed (its unload
    not seen yet): a load of llama-8k (FROM it, num_ctx 8192) claimed then reached Ollama
    beside the reload, and Ollama reloaded the copy for it (NATS sweep seed 187, 0.13.4)."""
    file = ModelInfo(weights="sha256-" + "ab" * 32, trained_context=131072)
    view = replace(gpu("a", 40000), models={"llama3.2:3b": file, "llama-8k": file},
                   residents=(Resident("llama3.2:3b", 3246, 8192),))
    reload = replace(_t("1", "llama3.2:3b", 5767), evicts={"llama3.2:3b": 3246},
                     context=32768)
    ok, why = ticket_budget_ok([reload], _t("2", "llama-8k", 3079), view, DEFAULT_POLICY)
    assert not ok and why == "llama3.2:3b is being loaded here from the same weights file"
    # listed at its new context, the copy is no load in flight (a load of llama-8k is then
    # planned as its eviction, Fitting.sibling)
    reloaded = replace(view, residents=(Resident("llama3.2:3b", 5767, 32768),))
    assert ticket_budget_ok([reload], _t("2", "llama-8k", 3079), reloaded, DEFAULT_POLICY)[0]


def test_claim_refuses_a_load_that_would_reload_another_models_copy_of_its_file() -> None:
    """llama-8k's copy at 32768 was loaded (by the other sidecar) after this sidecar decided
    a load of llama3.2:3b at 4096 on a view without it: claimed, Ollama reloaded the copy
    once its call ended (rough-agents sweep seed 177, 0.12.11, two sidecars)."""
    file = ModelInfo(weights="sha256-" + "ab" * 32, trained_context=131072)
    view = replace(gpu("a", 40000), version="0.12.11",
                   models={"llama3.2:3b": file, "llama-8k": file},
                   residents=(Resident("llama-8k", 4087, 32768),))
    load = replace(_t("1", "llama3.2:3b", 2421), context=4096)
    ok, why = ticket_budget_ok([], load, view, DEFAULT_POLICY)
    assert not ok and why == ("llama-8k is loaded here from the same weights file at other "
                              "options: Ollama would reload it")
    assert ticket_budget_ok([], replace(load, context=32768), view, DEFAULT_POLICY)[0]  # joins
    assert ticket_budget_ok([], replace(load, evicts={"llama-8k": 4087}), view,
                            DEFAULT_POLICY)[0]  # planned as its eviction


def test_a_copy_a_call_runs_on_under_another_name_of_its_file_is_no_victim() -> None:
    """A call joined the 8b's load; that load was abandoned and Ollama loaded the copy for
    the call under the call's own name, qwen3-16k (FROM qwen3:8b), which a probe listed. The
    call's ticket names qwen3:8b: a reload of qwen3-16k planned it as an idle victim, its
    unload came while the copy was still loading and was lost, and the reload went out
    beside it (rough-agents sweep seed 3667, 0.12.11)."""
    file = ModelInfo(weights="sha256-" + "cd" * 32, trained_context=40960)
    view = replace(gpu("a", 28800), models={"qwen3:8b": file, "qwen3-16k": file},
                   residents=(Resident("qwen3-16k", 8260, 4096),))
    joined = _t("1", "qwen3:8b", 512, cold=False)
    reload = replace(_t("2", "qwen3-16k", 18340), evicts={"qwen3-16k": 8260}, context=16384)
    ok, why = ticket_budget_ok([joined], reload, view, DEFAULT_POLICY)
    assert not ok and why == "planned victim qwen3-16k has in-flight work"
    index = index_providers(snapshot(view, tickets=(replace(joined, provider="a"),)),
                            DEFAULT_POLICY)["a"]
    assert idle_residents(index) == []
    assert ticket_budget_ok([], reload, view, DEFAULT_POLICY)[0]  # once the call is done


def test_tokens_sent_as_tokens_are_added_to_the_estimate_and_left_out_of_the_ratio() -> None:
    learning = Learning()
    call = CallRequest("/api/generate", "m", prompt=PromptSize(700), context_tokens=1000)
    assert learning.prompt_tokens(call) == 200 + 1000  # 700 chars at 3.5 per token
    learning.observe_prompt(call, 1000 + 175)  # the engine counted the context too
    assert learning.ratio == TokenRatio().observe(700, 175)


def _chat(*contents: str, tools: list[object] | None = None) -> dict[str, object]:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": c}
                for i, c in enumerate(contents)]
    return {"model": "m", "messages": messages, "tools": tools or []}


def test_a_conversation_has_one_digest_per_prefix_shared_by_its_continuation() -> None:
    first = conversation_digests(_chat("hello", "hi"))
    later = conversation_digests(_chat("hello", "hi", "and then?"))
    assert len(first) == 2 and later[:2] == first and later[2] not in first
    assert conversation_digests(_chat("hello", "hi", tools=[{"name": "t"}]))[:2] != first
    assert conversation_digests({"model": "m", "prompt": "not a conversation"}) == ()
    responses = conversation_digests({"model": "m", "input": [{"role": "user", "content": "x"}]})
    assert len(responses) == 1


def test_a_conversation_is_sized_from_the_engines_count_of_what_it_already_sent() -> None:
    """docs/rules.md: the prompt size the engine reported for the previous call, plus what was
    appended since. Images, a heavy chat template or text a tokenizer splits finely count
    for more than their characters say, and only the engine's count shows it."""
    learning = Learning(ratio=TokenRatio.taught(4.0))
    first_body = _chat("x" * 2000)  # the engine counts 2000 tokens, the ratio 500
    first = CallRequest("/api/chat", "m", prompt=PromptSize(prompt_size(first_body).chars),
                        conversation=conversation_digests(first_body))
    assert learning.prompt_tokens(first) == 500
    learning.observe_prompt(first, 2004)
    later_body = _chat("x" * 2000, "ok", "x" * 800)
    later = CallRequest("/api/chat", "m", prompt=PromptSize(prompt_size(later_body).chars),
                        conversation=conversation_digests(later_body))
    appended = learning.ratio.tokens(2 + 800)
    assert learning.prompt_tokens(later) == 2004 + appended
    assert learning.prompt_tokens(later) > learning.ratio.tokens(later.prompt.chars) * 2
    # Another conversation (other tools) is not sized from this one's count.
    other = _chat("x" * 2000, "ok", "x" * 800, tools=[{"name": "t"}])
    assert learning.prompt_tokens(replace(later, conversation=conversation_digests(other))) \
        == learning.ratio.tokens(later.prompt.chars)


def test_an_engine_count_below_the_ratios_never_lowers_the_estimate() -> None:
    """Some Ollama versions count only the tokens not found in the prompt cache."""
    learning = Learning(ratio=TokenRatio.taught(4.0))
    body = _chat("x" * 4000, "ok", "y" * 400)
    call = CallRequest("/api/chat", "m", prompt=PromptSize(prompt_size(body).chars),
                       conversation=conversation_digests(body))
    learning.observe_prompt(replace(call, conversation=call.conversation[:1],
                                    prompt=PromptSize(4000)), 30)
    assert learning.prompt_tokens(call) == learning.ratio.tokens(call.prompt.chars)


def test_the_conversation_memory_forgets_the_least_recently_used() -> None:
    memory = ConversationMemory(size=2)
    memory.record((1,), Anchor(PromptSize(10), 5))
    memory.record((2,), Anchor(PromptSize(20), 9))
    assert memory.longest_known((1,)) == Anchor(PromptSize(10), 5)  # now the most recent
    memory.record((3,), Anchor(PromptSize(30), 12))
    assert memory.longest_known((2,)) is None
    assert memory.longest_known((1, 3)) == Anchor(PromptSize(30), 12)  # the longest known
    assert memory.longest_known((1, 4)) == Anchor(PromptSize(10), 5)
    memory.record((), Anchor(PromptSize(5), 5))
    memory.record((5,), Anchor(PromptSize(5), 0))
    assert memory.longest_known((5,)) is None


def test_digits_and_characters_outside_ascii_are_counted_apart() -> None:
    body = {"messages": [{"role": "user", "content": "héllo 世界 42"}], "system": "ok"}
    assert prompt_size(body) == PromptSize(13, 5, pieces=2)  # the message and the system
    assert longest_input_size({"input": ["abc", "Привет!"]}) == PromptSize(7, 6)
    ratio = TokenRatio.taught(4.0)
    assert ratio.tokens(8 + 1000, 1000) == 2 + 1000  # one token per such character until taught


def test_the_rate_for_other_scripts_is_learned_from_prompts_mostly_in_them() -> None:
    ratio = TokenRatio.taught(4.0)
    russian = ratio.observe(1000, 400 + 25, dense=900)  # 100 ASCII at 4/token + 0.44 each
    assert russian.chars_per_token == 4.0
    assert russian.tokens_per_dense == pytest.approx(0.4444, 1e-3)
    again = russian.observe(1000, 25 + 300, dense=900)  # then EMA 0.3 of the samples
    assert again.tokens_per_dense == pytest.approx(0.3 * 300 / 900 + 0.7 * 400 / 900)
    # A prompt mostly of ASCII teaches the ASCII ratio, its few others taken at their rate.
    prose = russian.observe(4100, 1000 + 44, dense=100)
    assert prose.tokens_per_dense == russian.tokens_per_dense
    assert prose.chars_per_token == pytest.approx(0.3 * 4000 / (1044 - 44.44) + 0.7 * 4.0, 1e-3)
    assert ratio.observe(1000, 5000, dense=900) == ratio  # 5.5 tokens each: not a rate to learn


def test_an_embedding_input_is_sized_without_a_chat_templates_fixed_part() -> None:
    """Chat traffic taught 60 fixed tokens a prompt; an 1800-character chunk for a
    512-token embedding model has no template: 450 tokens, not 510, and it fits."""
    learning = Learning(ratio=replace(TokenRatio.taught(4.0), fixed_tokens=60.0))
    chunk = PromptSize(1800)
    assert learning.prompt_tokens(CallRequest("/api/chat", "m", prompt=chunk)) == 510
    assert learning.prompt_tokens(CallRequest("/api/embed", "m", prompt=chunk)) == 450
    assert learning.prompt_tokens(CallRequest("/v1/embeddings", "m", prompt=chunk)) == 450


def test_images_count_as_ollama_counts_them_in_every_dialect() -> None:
    ollama_chat = {"messages": [{"role": "user", "content": "what?", "images": ["a", "b"]}]}
    generate = {"prompt": "what?", "images": ["a"]}
    openai_chat = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}
    responses = {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}
    anthropic = {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
        {"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "base64", "data": "AAAA"}}]}]}]}
    sizes = [prompt_size(b) for b in (ollama_chat, generate, openai_chat, responses, anthropic)]
    assert [s.images for s in sizes] == [2, 1, 1, 1, 2]
    assert sizes[0] == PromptSize(5, 0, 2, 1) and sizes[0].image_tokens == 2 * 768
    odd = {"messages": [{"role": "user", "content": [{"type": ["image"], "text": "x"}]}]}
    assert prompt_size(odd) == PromptSize(1, pieces=1)  # a malformed part: text, no crash


def test_what_a_conversation_appends_carries_the_chat_templates_tokens() -> None:
    """Role markers and separators around each appended message: without them a tool loop's
    next call, sized to the last token, would be cut at a card's boundary. (The ratio, learned from
    whole prompts, carries the template on average.)"""
    learning = Learning(ratio=TokenRatio.taught(4.0))
    body = _chat("x" * 400, "y" * 400, "z" * 400)
    size = prompt_size(body)
    assert size.pieces == 3
    call = CallRequest("/api/chat", "m", prompt=size, conversation=conversation_digests(body))
    assert learning.prompt_tokens(call) == 300
    learning.observe_prompt(call, 315)
    longer = _chat("x" * 400, "y" * 400, "z" * 400, "w" * 40, "v" * 40)
    grown = prompt_size(longer)
    later = CallRequest("/api/chat", "m", prompt=grown, conversation=conversation_digests(longer))
    appended = math.ceil(80 / learning.ratio.chars_per_token) + 2 * PIECE_TOKENS
    assert learning.prompt_tokens(later) == 315 + appended


TOOLS = [{"type": "function", "function": {"name": "ls"}}]
ASKED = {"role": "user", "content": "list the files"}


@pytest.mark.parametrize(("body", "loop"), [
    ({"tools": TOOLS, "messages": [ASKED, {"role": "assistant", "tool_calls": []},
                                   {"role": "tool", "content": "a.py"}]}, True),  # Ollama
    ({"tools": TOOLS, "messages": [ASKED, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]}]}, True),  # Anthropic
    ({"tools": TOOLS, "input": [ASKED, {"type": "function_call_output", "call_id": "c1",
                                        "output": "a.py"}]}, True),  # the Responses API
    ({"tools": TOOLS, "messages": [ASKED]}, False),  # a chat turn: the user may go on
    ({"messages": [ASKED, {"role": "tool", "content": "a.py"}]}, False),  # no tools offered
    ({"tools": TOOLS, "input": "list the files"}, False),
])
def test_a_call_answering_a_tools_result_is_an_agents_loop(body: dict[str, object],
                                                             loop: bool) -> None:
    assert answers_tool_result(body) is loop


def test_several_thinking_blocks_in_a_message_count_as_ollama_keeps_them() -> None:
    """anthropic.go convertMessage keeps one thinking text a message, its last thinking
    block's (one with no text leaves it as it was)."""
    message = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "first " * 50, "signature": "a"},
        {"type": "text", "text": "ok"},
        {"type": "thinking", "thinking": "last", "signature": "b"},
        {"type": "thinking", "thinking": None}]}
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}, message]}
    assert prompt_size(body).chars == 2 + 2 + 4


@pytest.mark.parametrize(("version", "chars"), [
    # 0.13.3: each function call its own message, which takes the pending reasoning
    ((0, 13, 3), 2 + (3 + 2) + 3 + 4 + 6),
    # 0.13.4 on: a call joins the assistant message before it, whose thinking it replaces
    ((0, 13, 4), 2 + 2 + 3 + 4 + 6)])
def test_reasoning_items_count_as_ollama_gives_them_to_messages(
        version: tuple[int, int, int], chars: int) -> None:
    """FromResponsesRequest: a reasoning item's text goes to the next assistant message or
    function call; one followed by another reasoning item first is dropped."""
    reasoning = [{"type": "reasoning", "encrypted_content": text}
                 for text in ("dropped " * 40, "one", "two", "three")]
    items = [{"role": "user", "content": "hi"}, reasoning[0], reasoning[1],
             {"role": "assistant", "content": "ok"}, reasoning[2],
             {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": ""},
             {"type": "function_call_output", "call_id": "c1", "output": "done"},
             {"type": "reasoning", "encrypted_content": "trails"}]
    sized = prompt_size({"input": items}, version)
    assert sized.chars == chars + len("ls")
    # with one reasoning item nothing is dropped
    assert prompt_size({"input": items[:1] + items[2:]}, version).chars > 0


@pytest.mark.parametrize(("version", "chars"), [((0, 32, 9), 2 + 5 + 3 + 4 + 4),
                                                ((0, 32, 10), 2 + 3 + 4 + 4)])
def test_an_assistant_reply_joined_to_its_call_keeps_its_own_thinking(
        version: tuple[int, int, int], chars: int) -> None:
    """From 0.32.10 an assistant message between a function call and its output joins the
    call's message, its thinking replacing the call's."""
    items = [{"type": "reasoning", "encrypted_content": "first"},
             {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": ""},
             {"type": "reasoning", "encrypted_content": "two"},
             {"role": "assistant", "content": "note"},
             {"type": "function_call_output", "call_id": "c1", "output": "done"}]
    assert prompt_size({"input": items}, version).chars == chars


def test_a_responses_web_search_tool_counts_as_the_function_ollama_offers() -> None:
    """From 0.32.10 Ollama offers the model its own web_search function for the tool (and
    drops a declared function of that name); before, a function with no name."""
    declared = {"type": "function", "name": "web_search", "description": "mine " * 20,
                "parameters": {}}
    body = {"input": "hi", "tools": [{"type": "web_search"}, declared]}
    before = prompt_size(body, (0, 32, 9)).chars
    assert before == 2 + len("web_search") + 100 + 2
    function: Any = WEB_SEARCH_FUNCTION["function"]
    spec = len(orjson.dumps(function["parameters"]))
    assert prompt_size(body, (0, 32, 10)).chars == 2 + len(
        "web_searchSearch the web for current information.") + spec


@pytest.mark.parametrize(("version", "chars"), [
    # from 0.16.2: the search's call and a line `- title: url` per result, no page content
    ((0, 16, 2), 2 + len("web_search") + len('{"query":"news"}') + len("- A: u1\n- B: u2\n")),
    # before, Ollama reads neither block
    ((0, 16, 1), 2)])
def test_a_web_search_result_counts_as_ollama_reads_it(version: tuple[int, int, int],
                                                        chars: int) -> None:
    """anthropic.go convertMessage, formatWebSearchToolResultContent."""
    page = "encrypted page content " * 200
    message = {"role": "assistant", "content": [
        {"type": "text", "text": "ok"},
        {"type": "server_tool_use", "id": "s1", "name": "web_search",
         "input": {"query": "news"}},
        {"type": "web_search_tool_result", "tool_use_id": "s1", "content": [
            {"type": "web_search_result", "title": "A", "url": "u1", "encrypted_content": page},
            {"type": "web_search_result", "title": "B", "url": "u2", "page_age": "1d"}]}]}
    assert prompt_size({"messages": [message]}, version).chars == chars
