"""HEAD's fit check before a load beside loaded runners reads one runner's own accounting
(docs/engine.md, "The simulator's loads and unloads"): the first runner on the GPU in the
loaded map's order answers with free = what the card had free at its own load - its VRAM
(discover/runner.go:285-331, llm/llama_server.go:2600-2636), lowered to the total less the
loaded runners' VRAM (server/sched.go:1295-1335); the load needs its estimate within 80 % of
that (:544-551). A copy unloaded since that runner loaded is still counted as taken."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from loadtest.ollama_sim import SimServer
from tests.conftest import eventually

Sims = Callable[..., SimServer]

# A 16 GiB card at 4096 tokens x 1 slot, CUDA context 457 MiB a runner: qwen3:8b holds
# 5876 MiB, llama3.2:3b 2573 MiB; qwen3:14b's estimate is 9940 MiB. Beside llama3.2:3b alone
# the card has 16376 - 2573 - 457 = 13346 MiB free (80 %: 10676, qwen3:14b fits); with
# qwen3:8b also counted, 7013 (80 %: 5610, it does not).
CARD_MIB = 16376
COPY, SURVIVOR, NEWCOMER = "qwen3:8b", "llama3.2:3b", "qwen3:14b"


def call(sim: SimServer, model: str) -> None:
    r = httpx.post(f"{sim.url}/api/generate", json={
        "model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 1}},
        timeout=30)
    assert r.status_code == 200, r.text


def unload(sim: SimServer, model: str) -> None:
    r = httpx.post(f"{sim.url}/api/generate", json={"model": model, "keep_alive": 0})
    assert r.json()["done_reason"] == "unload"


def ps(sim: SimServer) -> set[str]:
    return {m["model"] for m in httpx.get(f"{sim.url}/api/ps").json()["models"]}


def self_evictions(sim: SimServer) -> int:
    evictions: int = httpx.get(f"{sim.url}/_sim/stats").json()["self_evictions"]
    return evictions


def test_a_survivor_loaded_after_an_unloaded_copy_still_counts_its_memory(
        sim_factory: Sims) -> None:
    """qwen3:8b is unloaded with keep_alive 0; llama3.2:3b, the one runner left to answer,
    then reads 7013 MiB free if it loaded beside qwen3:8b (it logged 9586 MiB free at its
    load) and Ollama evicts it for qwen3:14b, which fits in the memory qwen3:8b gave back;
    loaded first (15919 MiB free at its load) it reads 13346 MiB, and both stay."""
    def run(order: tuple[str, str]) -> tuple[int, set[str]]:
        # a keep-alive of a day: the default's 300 s is 0.6 s here, which a busy machine outlasts
        sim = sim_factory(f"gpu-{order[0]}", total_vram_mib=CARD_MIB, context_length=4096,
                          keep_alive_s=86400.0)
        for model in order:
            call(sim, model)
        unload(sim, COPY)
        assert eventually(lambda: ps(sim) == {SURVIVOR})
        assert self_evictions(sim) == 0
        call(sim, NEWCOMER)
        return self_evictions(sim), ps(sim)

    assert run((COPY, SURVIVOR)) == (1, {NEWCOMER})
    assert run((SURVIVOR, COPY)) == (0, {SURVIVOR, NEWCOMER})

