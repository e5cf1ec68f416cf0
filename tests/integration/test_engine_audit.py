"""Where the simulator departs from Ollama's source (an audit of server/sched.go,
server/routes.go, server/prompt.go, llm/llama_server.go and the 0.12 runners at HEAD fb30760
and v0.12.6). Each test states Ollama's rule and is expected to fail until the simulator
follows it (strict xfail: a fix turns it into a plain pass)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from loadtest.ollama_sim import SimServer

Sims = Callable[..., SimServer]
SCALE = 0.002


def chat(sim: SimServer, model: str, messages: list[dict[str, str]], **body: Any
         ) -> httpx.Response:
    payload = {"model": model, "messages": messages, "stream": False, **body}
    return httpx.post(f"{sim.url}/api/chat", json=payload, timeout=30)


@pytest.mark.xfail(strict=True, reason=(
    "the simulator drops old messages against the copy's capped context on every version; "
    "0.12 drops them against the call's own num_ctx (uncapped) and its runner then cuts "
    "the middle, keeping num_keep tokens"))
def test_0_12_drops_messages_against_the_calls_num_ctx_not_the_trained_one(
        sim_factory: Sims) -> None:
    """v0.12.6: chatPrompt gets the options scheduleRunner resolved (server/routes.go:1997)
    and keeps messages while they fit opts.NumCtx (server/prompt.go:62); the trained cap is
    applied to NewLlamaServer's own copy of the options (llm/server.go:172-176), so a call
    asking phi3:mini (trained 4096) for 8192 keeps all its messages. The runner then cuts
    the prompt to fill its 4096 exactly, num_keep (+ BOS) kept, and counts what it kept
    (runner/llamarunner/runner.go:116-137, 155, 677). HEAD caps first (optionsForPrompt,
    server/routes.go:2336-2347, 2699), as the simulator does for both."""
    sim = sim_factory("gpu", total_vram_mib=24564, version="0.12.6", time_scale=SCALE)
    messages = [{"role": "system", "content": "rule " * 400},  # ~500 tokens
                {"role": "user", "content": "word " * 2400},  # ~3000
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "more " * 1200}]  # ~1500: ~5000 in all
    r = chat(sim, "phi3:mini", messages, options={"num_ctx": 8192})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] == 4096


@pytest.mark.xfail(strict=True, reason=(
    "the simulator halves an over-long prompt keeping Ollama's default num_keep (4) + BOS "
    "whatever the call sets; HEAD keeps the call's num_keep (-1: the whole prompt)"))
def test_the_context_shift_of_an_over_long_prompt_keeps_the_calls_num_keep(
        sim_factory: Sims) -> None:
    """HEAD llm/llama_server.go:279-331 completionPromptForRequest: nKeep is the call's
    num_keep (all the prompt when negative), + 1 where the tokenizer adds BOS, at most
    num_ctx - 1; the prompt keeps contextShiftPromptLimit(num_ctx, nKeep) = num_ctx -
    max((num_ctx - nKeep) / 2, 1) tokens. num_keep -1 on a 4096 context: 4095 kept (the
    head), not 2051. prompt_eval_count is cache_n + prompt_n (:1503-1513)."""
    sim = sim_factory("gpu", total_vram_mib=24564, version="0.33.0", time_scale=SCALE)
    r = chat(sim, "qwen3:8b", [{"role": "user", "content": "word " * 6000}],  # ~7500 tokens
             options={"num_ctx": 4096, "num_keep": -1})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] == 4095
