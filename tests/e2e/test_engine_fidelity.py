"""Ollama's engine rules, end to end: the official `ollama` client (and OpenAI's) through the
sidecar to simulated GPUs that behave as Ollama's source says (memory per architecture x
context x slots, context resolution by version, the reload rule, admission, truncation).

Each test names the rule; each fails on a sidecar that does not plan for it (the simulator
then reloads, evicts on its own, spills to the CPU or cuts the prompt, and counts it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import ollama
import openai
import pytest

from loadtest.ollama_sim import with_derived
from loadtest.sim_model import CATALOG
from loadtest.sim_output import answer_options
from tests.conftest import eventually
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims, chat

MIB = 1 << 20
WORDS = [{"role": "user", "content": "word " * 4500}]  # ~6400 tokens at 3.5 characters each


def quiet(gpu: Any) -> dict[str, int]:
    """What Ollama did on its own: each must stay 0 with the sidecar in front."""
    s = gpu.sim.stats
    return {"reloads": s.reloads, "self_evictions": s.self_evictions, "spills": s.spills,
            "truncations": s.truncations, "too_long_refusals": s.too_long_refusals}


NOTHING = {"reloads": 0, "self_evictions": 0, "spills": 0, "truncations": 0,
           "too_long_refusals": 0}


def test_a_copy_seen_on_one_card_is_sized_again_for_anothers_context(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """qwen3:8b takes ~5.6 GiB at 2048 tokens but ~10.4 GiB at 32768 (its KV cache is
    144 KiB a token). Sized as seen on the small-context card, it would go beside the idle
    14b on the 24 GiB card, where Ollama would unload the 14b itself to make room."""
    small = sim_factory("small", total_vram_mib=16376, context_length=2048, time_scale=SCALE)
    big = sim_factory("big", total_vram_mib=24564, time_scale=SCALE)  # default: 32768
    httpx.post(f"{small.url}/api/generate", json={"model": "qwen3:8b"}, timeout=30)
    httpx.post(f"{big.url}/api/generate", json={"model": "qwen3:14b"}, timeout=30)
    url = sidecar_factory([small, big], **mode).url
    # ~3400 tokens: more than the small card's 2048
    r = chat(url, "qwen3:8b", messages=[{"role": "user", "content": "word " * 2400}])
    assert r.status_code == 200, r.text
    assert (r.headers["x-kubemoot-provider"], r.headers["x-kubemoot-placement"]) == (
        "big", "evict")
    assert r.headers["x-kubemoot-evicted"] == "qwen3:14b"
    assert quiet(big) == quiet(small) == NOTHING


@pytest.mark.parametrize("listed_at", ["0.24.0", "0.12.6"])
def test_a_copy_listed_at_ollamas_estimate_sizes_no_other_card(
        sim_factory: Sims, sidecar_factory: Sidecars, listed_at: str) -> None:
    """Before 0.30 /api/ps lists a llama-engine copy at Ollama's estimate: llama3.2:3b at
    32768 tokens on 0.24.0 is listed with a graph of no flash attention (7134 MiB where it
    holds 5767), on 0.12.6 with the minimum and a layer besides (7780 where it holds 7135).
    Weights worked out from such a listing counted the 3b 0.6-1.4 GiB large on every other
    card; its own first figure is the copy's."""
    old = sim_factory("old", total_vram_mib=16376, context_length=32768, version=listed_at,
                      time_scale=SCALE)
    new = sim_factory("new", total_vram_mib=16376, context_length=4096, time_scale=SCALE)
    _load(old, "llama3.2:3b")
    listed = httpx.get(f"{old.url}/api/ps", timeout=10).json()["models"][0]["size_vram"]
    assert listed // MIB - old.sim.runners["llama3.2:3b"].footprint_mib >= 600
    url = sidecar_factory([old, new]).url

    def sized_on_new() -> dict[str, Any]:
        verdicts = httpx.get(f"{url}/kubemoot/v1/explain", timeout=10, params={
            "model": "llama3.2:3b", "numCtx": 4096}).json()["verdicts"]
        return next(v for v in verdicts if v["provider"] == "new")

    assert eventually(lambda: next(v for v in httpx.get(  # a probe listed the copy
        f"{url}/kubemoot/v1/explain", timeout=10, params={"model": "llama3.2:3b"}).json()[
        "verdicts"] if v["provider"] == "old")["reason"] == "warm")
    verdict = sized_on_new()
    _load(new, "llama3.2:3b")
    held = new.sim.runners["llama3.2:3b"].footprint_mib
    assert held <= verdict["footprintTotalMiB"] <= held + 64, (verdict, held)
    assert "calibrated" not in verdict["footprintSource"], verdict


@pytest.mark.parametrize(("version", "total", "placement"),
                         [("0.33.0", 16000, "evict"), ("0.12.6", 16600, "cold")])
def test_ollamas_admission_rule_is_planned_for(sim_factory: Sims, sidecar_factory: Sidecars,
                                               mode: dict[str, Any], version: str, total: int,
                                               placement: str) -> None:
    """From 0.30 Ollama loads beside other models only when its estimate is within 80 % of
    the free memory. Here the 14b fits the memory left beside phi3, but not that rule: the
    sidecar unloads phi3 itself rather than let Ollama choose. Before 0.30 it loads beside
    (0.12.6 lists phi3 at its own estimate, 4484 MiB where it holds 3949: a card 600 MiB
    larger leaves the same room)."""
    gpu = sim_factory("gpu", total_vram_mib=total, context_length=4096, version=version,
                      time_scale=SCALE)
    httpx.post(f"{gpu.url}/api/generate", json={"model": "phi3:mini"}, timeout=30)
    url = sidecar_factory([gpu], **mode).url
    r = chat(url, "qwen3:14b")
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-placement"] == placement
    assert quiet(gpu) == NOTHING
    assert ("phi3:mini" in gpu.sim.runners) is (placement == "cold")


def _load(gpu: Any, model: str) -> None:
    r = httpx.post(f"{gpu.url}/api/generate", json={"model": model}, timeout=30)
    assert r.status_code == 200, r.text


def test_a_copy_that_loaded_beside_a_victim_goes_with_it(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """From 0.30 Ollama reads free memory from a runner's own accounting, fixed at its load:
    llama3.2:3b, loaded beside qwen3:8b, goes on counting the 8b after it leaves, and Ollama
    would unload the 3b itself to load the 14b in the 8b's place (docs/rules.md, "Ollama's
    own admission is planned for"). The sidecar unloads both."""
    gpu = sim_factory("gpu", total_vram_mib=16376, context_length=4096, time_scale=SCALE)
    _load(gpu, "qwen3:8b")
    _load(gpu, "llama3.2:3b")
    url = sidecar_factory([gpu], **mode).url
    r = chat(url, "qwen3:14b")
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-placement"] == "evict"
    assert set(r.headers["x-kubemoot-evicted"].split(",")) == {"qwen3:8b", "llama3.2:3b"}
    assert quiet(gpu) == NOTHING


def _residents(sidecar_url: str, card: str | None = None) -> list[str]:
    """The models the sidecar's own view holds on a card, its first by default (not what
    the GPU lists)."""
    state = httpx.get(f"{sidecar_url}/kubemoot/v1/state", timeout=5).json()
    provider = next(p for p in state["providers"] if card in (None, p["name"]))
    return sorted(r["model"] for r in provider["residents"])


def test_a_copy_loaded_before_the_victim_stays(sim_factory: Sims, sidecar_factory: Sidecars
                                               ) -> None:
    """The same card with llama3.2:3b loaded first, and qwen3:8b seen to arrive beside it:
    the 3b's runner never counted the 8b, so only the 8b goes."""
    gpu = sim_factory("gpu", total_vram_mib=16376, context_length=4096, time_scale=SCALE)
    _load(gpu, "llama3.2:3b")
    sidecar = sidecar_factory([gpu], probe_interval_seconds=0.1)
    assert eventually(lambda: _residents(sidecar.url) == ["llama3.2:3b"])
    _load(gpu, "qwen3:8b")  # by another client, after the sidecar saw the 3b alone
    assert eventually(lambda: _residents(sidecar.url) == ["llama3.2:3b", "qwen3:8b"])
    r = chat(sidecar.url, "qwen3:14b")
    assert r.status_code == 200, r.text
    assert (r.headers["x-kubemoot-placement"], r.headers["x-kubemoot-evicted"]) == (
        "evict", "qwen3:8b")
    assert quiet(gpu) == NOTHING
    assert sorted(gpu.sim.runners) == ["llama3.2:3b", "qwen3:14b"]


def test_a_copy_listed_while_it_reads_its_weights_is_costed_with_the_read(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """0.12's own engine (qwen3) lists a copy once its memory is committed, ~9 s before its
    runner has read the weights (docs/engine.md, "Loads, one at a time on every version"). A
    call joining it then waits for the read, and so does a load of another model: explain
    counts the rest of the read in both while the simulator still reads."""
    gpu = sim_factory("gpu", total_vram_mib=32768, context_length=4096, num_parallel=2,
                      version="0.12.6", time_scale=0.3)  # the read: ~2.8 s here
    sidecar = sidecar_factory([gpu], probe_interval_seconds=0.05)  # (embedded: probes all)
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(chat, sidecar.url, "qwen3:14b")
        assert eventually(lambda: _residents(sidecar.url) == ["qwen3:14b"])
        runner = gpu.sim.runners["qwen3:14b"]
        join = httpx.get(f"{sidecar.url}/kubemoot/v1/explain",
                         params={"model": "qwen3:14b"}, timeout=5).json()
        load = httpx.get(f"{sidecar.url}/kubemoot/v1/explain",
                         params={"model": "llama3.2:3b"}, timeout=5).json()
        assert runner.listed and not runner.loaded.is_set()  # explained during the read
        first = loading.result()
    assert first.status_code == 200 and first.headers["x-kubemoot-placement"] == "cold"
    assert join["decision"]["placement"]["kind"] == "warm"
    # the sidecar's expected read: 1 s + 9300 MiB at 1 GiB/s from the claim, less the time
    # gone (its own clock)
    assert 5.0 < join["verdicts"][0]["terms"]["load"] < 10.1
    assert 5.0 < load["verdicts"][0]["terms"]["loads_ahead"] < 10.1
    assert quiet(gpu) == NOTHING


def test_a_copy_loaded_with_its_own_num_ctx_is_joined_as_it_is(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """Another client loaded the 8b with num_ctx 16384 on a card configured for 8192. A call
    sent without num_ctx (or with options that change how a copy loads) would make Ollama
    reload it at 8192, and the long prompt after it would be cut."""
    gpu = sim_factory("gpu", total_vram_mib=24564, context_length=8192, time_scale=SCALE)
    httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b",
                                                "options": {"num_ctx": 16384}}, timeout=30)
    url = sidecar_factory([gpu], **mode).url
    client = ollama.Client(host=url)
    for options in ({}, {"num_batch": 1024, "num_thread": 4}, {"num_ctx": 2048}):
        answer = client.chat(model="qwen3:8b", messages=[{"role": "user", "content": "hi"}],
                             options=options)
        assert answer.done
    assert client.chat(model="qwen3:8b", messages=[*WORDS, *WORDS]).done  # ~12.8k tokens
    assert quiet(gpu) == NOTHING and gpu.sim.stats.loads == 1
    assert gpu.sim.runners["qwen3:8b"].ctx == 16384


def test_a_call_that_needs_a_larger_context_reloads_the_copy_as_planned(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE)  # default: 4096
    httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"}, timeout=30)
    url = sidecar_factory([gpu], **mode).url
    r = chat(url, "qwen3:8b", options={"num_ctx": 16384}, messages=WORDS)
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-placement"] == "evict"  # its own copy, unloaded first
    assert r.headers["x-kubemoot-evicted"] == "qwen3:8b"
    assert quiet(gpu) == NOTHING and gpu.sim.runners["qwen3:8b"].ctx == 16384


def test_an_openai_call_never_makes_ollama_reload_a_copy(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """OpenAI's API carries no num_ctx: Ollama gives such a call its default context, and
    reloads a copy loaded with another. The sidecar plans that reload (or goes elsewhere)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, context_length=8192, time_scale=SCALE)
    httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b",
                                                "options": {"num_ctx": 16384}}, timeout=30)
    url = sidecar_factory([gpu], **mode).url
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0)
    answer = client.chat.completions.with_raw_response.create(
        model="qwen3:8b", messages=[{"role": "user", "content": "hi"}])
    assert answer.headers["x-kubemoot-placement"] == "evict"
    assert answer.parse().choices[0].message.content
    again = client.chat.completions.with_raw_response.create(
        model="qwen3:8b", messages=[{"role": "user", "content": "hi"}])
    # (The first answer reaches the client before its release is written: with NATS the
    # second may still see the load, not the copy it left.)
    assert again.headers["x-kubemoot-placement"] in ("warm", "cold")
    assert quiet(gpu) == NOTHING and gpu.sim.stats.loads == 2  # the other client's, and one
    assert gpu.sim.runners["qwen3:8b"].ctx == 8192


@pytest.mark.parametrize(("version", "status", "context"), [("0.12.6", 413, 4096),
                                                            ("0.33.0", 200, 32768)])
def test_an_unset_context_is_ollamas_default_for_its_version(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str, status: int,
        context: int) -> None:
    """No OLLAMA_CONTEXT_LENGTH: 0.12 gives 4096, from 0.15.5 a 24 GiB card gives 32768."""
    gpu = sim_factory("gpu", total_vram_mib=24564, version=version, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    explained = httpx.get(f"{url}/kubemoot/v1/explain",
                          params={"model": "qwen3:8b", "promptChars": 100}).json()
    verdict = explained["verdicts"][0]
    assert (verdict["contextLength"], verdict["contextSource"]) == (context, f"default {version}")
    r = chat(url, "qwen3:8b", messages=WORDS)
    assert r.status_code == status, r.text
    assert quiet(gpu) == NOTHING


def test_a_model_that_fits_only_below_the_automatic_context_loads_at_ollamas_lower_step(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """qwen3:32b at 0.33's automatic 32768 on a 24 GiB card takes ~28.5 GiB; Ollama would
    spill it or, out of memory, lower the context to 4096. A call on Ollama's API that sets
    no num_ctx is loaded at 4096 (sent as num_ctx: nothing spills); an OpenAI call, which
    cannot name a context, is still 507 (Ollama would reload that copy at 32768)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    verdict = httpx.get(f"{url}/kubemoot/v1/explain", params={
        "model": "qwen3:32b", "promptChars": 100}).json()["verdicts"][0]
    assert (verdict["contextLength"], verdict["contextSource"]) == (
        4096, "default 0.33.0, lowered to fit")
    r = chat(url, "qwen3:32b")
    assert (r.status_code, r.headers["x-kubemoot-placement"]) == (200, "cold"), r.text
    assert gpu.sim.runners["qwen3:32b"].ctx == 4096 and quiet(gpu) == NOTHING
    assert chat(url, "qwen3:32b").headers["x-kubemoot-placement"] == "warm"
    too_long = chat(url, "qwen3:32b", messages=WORDS)  # ~6400 tokens: 4096 cannot hold it
    assert too_long.status_code == 413, too_long.text
    assert "Ollama's default context, 32768, does not fit" in too_long.json()["error"]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="qwen3:32b",
                                       messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 507
    assert quiet(gpu) == NOTHING


def test_a_modelfiles_num_ctx_is_the_context_a_copy_gets(sim_factory: Sims,
                                                         sidecar_factory: Sidecars) -> None:
    models = tuple(replace(m, modelfile_num_ctx=16384) if m.name == "qwen3:8b" else m
                   for m in CATALOG)
    gpu = sim_factory("gpu", total_vram_mib=16376, models=models, time_scale=SCALE)
    url = sidecar_factory([gpu]).url  # the card's own default would be 4096
    r = chat(url, "qwen3:8b", messages=WORDS)
    assert r.status_code == 200, r.text
    assert quiet(gpu) == NOTHING and gpu.sim.runners["qwen3:8b"].ctx == 16384


def test_a_copy_partly_in_cpu_memory_is_neither_a_footprint_nor_a_free_reuse(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """Loaded by another client at its trained 40960 tokens, the 14b does not fit the 16 GiB
    card: Ollama puts part of it in CPU memory (size_vram < size), where it runs slowly."""
    small = sim_factory("small", total_vram_mib=16376, time_scale=SCALE)
    big = sim_factory("big", total_vram_mib=32768, context_length=8192, time_scale=SCALE)
    httpx.post(f"{small.url}/api/generate", json={"model": "qwen3:14b",
                                                  "options": {"num_ctx": 40960}}, timeout=30)
    assert small.sim.runners["qwen3:14b"].spilled
    url = sidecar_factory([small, big], **mode).url
    explained = httpx.get(f"{url}/kubemoot/v1/explain", params={"model": "qwen3:14b"}).json()
    on_big = next(v for v in explained["verdicts"] if v["provider"] == "big")
    # What a copy on big takes is not learned from the spilled one.
    assert on_big["footprintSource"] == "architecture, file size and compute"
    # the file less its token table on the CPU with its logits, 160 KiB x 8192, batch 1024
    assert on_big["footprintTotalMiB"] == 9300 - 417 + 307 + 1280 + 768
    r = chat(url, "qwen3:14b")
    assert (r.headers["x-kubemoot-provider"], r.headers["x-kubemoot-placement"]) == (
        "big", "cold")
    assert quiet(big) == NOTHING


def test_a_prompt_the_engine_refuses_as_too_long_is_placed_again(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """A vision model that spends 2500 tokens on an image where the sidecar assumes 768:
    with images Ollama does not cut the prompt but refuses it (llama-server's 400, with its
    count). The sidecar sizes it at that count and places it where it fits."""
    small = sim_factory("small", context_length=4096, image_tokens=2500, time_scale=SCALE)
    big = sim_factory("big", context_length=16384, image_tokens=2500, time_scale=SCALE)
    httpx.post(f"{small.url}/api/generate", json={"model": "qwen3:8b"}, timeout=30)
    url = sidecar_factory([small, big], **mode).url
    look = [{"role": "user", "content": "which differ?", "images": ["aW1n"] * 2}]
    r = chat(url, "qwen3:8b", messages=look)
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-provider"] == "big"
    assert small.sim.stats.too_long_refusals == 1 and small.sim.stats.truncations == 0
    assert big.sim.stats.truncations == 0
    alone = sidecar_factory([small], **mode).url
    refused = chat(alone, "qwen3:8b", messages=look)
    assert refused.status_code == 413 and refused.json()["reason"] == "prompt-too-large"


@pytest.mark.parametrize(("path", "version"), [
    ("/api/embed", "0.33.0"), ("/api/embed", "0.12.6"),
    ("/api/embeddings", "0.33.0"), ("/api/embeddings", "0.12.6")])
def test_an_embedding_input_the_sidecar_undersized_is_refused_not_cut(
        sim_factory: Sims, sidecar_factory: Sidecars, path: str, version: str) -> None:
    """Text the sidecar reads at 3.5 characters a token where the tokenizer makes 2: it takes
    ~1700 tokens to fit nomic-embed-text's 2048, the engine counts 3000. /api/embed cuts such
    an input unless told `truncate: false` (the sidecar tells it); the legacy path never
    cuts and fails it with 500, which is the input's fault, not the card's."""
    gpu = sim_factory("gpu", chars_per_token=2.0, version=version, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    field = "input" if path == "/api/embed" else "prompt"

    def embed(text: str) -> httpx.Response:
        return httpx.post(f"{url}{path}", json={"model": "nomic-embed-text", field: text},
                          timeout=30)

    r = embed("w " * 3000)
    assert r.status_code == 413 and r.json()["reason"] == "prompt-too-large", r.text
    assert gpu.sim.stats.truncations == 0 and gpu.sim.stats.too_long_refusals == 1
    assert 'kubemoot_circuit_open{provider="gpu"} 0.0' in httpx.get(f"{url}/metrics").text
    assert embed("w " * 900).status_code == 200 and gpu.sim.stats.truncations == 0


def test_an_agent_that_asks_for_the_cut_gets_it_where_nothing_holds_its_prompt_whole(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """`truncate: true` sent by the agent: a prompt no card holds whole is placed anyway and
    Ollama cuts it, as the agent asked; without it the same prompt is 413."""
    gpu = sim_factory("gpu", context_length=2048, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    embed = {"model": "nomic-embed-text", "input": "w " * 6000}  # ~3400 tokens
    assert httpx.post(f"{url}/api/embed", json=embed, timeout=30).status_code == 413
    r = httpx.post(f"{url}/api/embed", json={**embed, "truncate": True}, timeout=30)
    assert r.status_code == 200 and gpu.sim.stats.truncations == 1, r.text
    long_chat = {"model": "qwen3:8b", "messages": WORDS, "stream": False}
    assert httpx.post(f"{url}/api/chat", json=long_chat, timeout=30).status_code == 413
    r = httpx.post(f"{url}/api/chat", json={**long_chat, "truncate": True}, timeout=30)
    assert r.status_code == 200 and gpu.sim.stats.truncations == 2, r.text
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert not state["tickets"]


def test_an_engine_out_of_memory_leaves_no_copy_counted_on_its_card(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """Ollama unloads every model of a card whose engine ran out of memory. The sidecar marks
    them leaving at once: no call is sent to a copy that is gone (Ollama would load it again
    on memory no ticket holds)."""
    a = sim_factory("a", total_vram_mib=24564, context_length=4096, time_scale=SCALE)
    b = sim_factory("b", total_vram_mib=24564, context_length=4096, time_scale=SCALE)
    for model in ("qwen3:8b", "llama3.2:3b"):
        httpx.post(f"{a.url}/api/generate", json={"model": model}, timeout=30)
    url = sidecar_factory([a, b], **mode).url
    httpx.post(f"{a.url}/_sim/fault", json={"mode": "oom", "count": 1})
    r = chat(url, "qwen3:8b")
    assert r.status_code == 200 and r.headers["x-kubemoot-provider"] == "b"
    assert eventually(lambda: not a.sim.runners)
    after = chat(url, "llama3.2:3b")
    assert after.status_code == 200 and after.headers["x-kubemoot-placement"] == "cold"


def test_a_full_load_queue_is_no_failure_of_the_provider(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """OLLAMA_MAX_QUEUE reached: 503 "server busy". Another GPU takes the call, and the busy
    one's circuit does not open."""
    busy = sim_factory("busy", total_vram_mib=16376, context_length=4096, max_queue=0,
                       load_mib_per_s=10, time_scale=SCALE)
    other = sim_factory("other", total_vram_mib=24564, context_length=4096, time_scale=SCALE)
    url = sidecar_factory([busy, other]).url
    # A load of its own keeps busy's loader for ~5 s; with OLLAMA_MAX_QUEUE 0 no other load
    # may wait beside it (server/sched.go:91-95, 205-207).
    holder = threading.Thread(daemon=True, target=lambda: httpx.post(
        f"{busy.url}/api/generate", json={"model": "llama3.2:3b"}, timeout=30))
    holder.start()
    assert eventually(lambda: busy.sim.loads_pending > 0)
    for model in ("qwen3:8b", "llama3.2:3b", "phi3:mini", "qwen3:14b"):
        r = chat(url, model)
        assert r.status_code == 200 and r.headers["x-kubemoot-provider"] == "other", model
    assert busy.sim.stats.busy_refusals >= 3
    assert 'kubemoot_circuit_open{provider="busy"} 1.0' not in httpx.get(f"{url}/metrics").text


def _hold(url: str, model: str, tokens: int) -> Callable[[], None]:
    """A long streaming call by a client outside the sidecars, straight to a GPU; the
    function returned leaves it (no cut stream left to raise in its thread)."""
    started, stop = threading.Event(), threading.Event()

    def hold() -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                "options": answer_options(tokens)}
        with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=60) as r:
            for _ in r.iter_lines():
                started.set()
                if stop.is_set():
                    break

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert started.wait(10)

    def leave() -> None:
        stop.set()
        holder.join(10)
    return leave


@pytest.mark.parametrize("mode", ["nats"], indirect=True)  # (its prober publishes)
def test_a_copy_busy_past_its_keep_alive_is_joined_not_loaded_again(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """Ollama sets a copy's `/api/ps` expiry when it goes idle and stops its timer while a
    call holds it: a call from a client outside the sidecars that outlasts the keep-alive
    leaves the copy listed with an expiry in the past, and still loaded. A sidecar's call
    joins its free slot rather than load a second copy on the idle card, and the sidecar
    goes on probing and publishing (an unknown expiry is written as none)."""
    a = sim_factory("a", total_vram_mib=32768, context_length=32768, num_parallel=2,
                    keep_alive_s=20.0, tokens_per_s=25.0, time_scale=SCALE)
    b = sim_factory("b", total_vram_mib=32768, context_length=32768, time_scale=SCALE)
    _load(a, "qwen3:8b")
    leave = _hold(a.url, "qwen3:8b", 20000)  # 800 s at 25 tokens/s
    # shared: a state older than half of 2 s is probed again (the publisher's job in a pod)
    sidecar = sidecar_factory([a, b], probe_interval_seconds=0.1, state_stale_seconds=2.0,
                              **mode)
    # the copy's expiry (20 s of keep-alive, 0.4 s here) passed more than 6 s (the prober's
    # margin) before the last probe, and it is listed
    time.sleep(0.4 + 6.0 + 1.6)
    assert _residents(sidecar.url, "a") == ["qwen3:8b"]
    r = chat(sidecar.url, "qwen3:8b")
    assert r.status_code == 200, r.text
    assert (r.headers["x-kubemoot-provider"], r.headers["x-kubemoot-placement"]) == (
        "a", "warm")
    assert b.sim.stats.loads == 0
    _load(b, "llama3.2:3b")  # by another client: the sidecar still probes
    assert eventually(lambda: _residents(sidecar.url, "b") == ["llama3.2:3b"])
    assert quiet(a) == NOTHING
    leave()



@pytest.mark.parametrize("keep_alive", [1e10, 2**63])
def test_a_keep_alive_past_gos_duration_keeps_the_copy_as_the_agent_meant(
        sim_factory: Sims, sidecar_factory: Sidecars, keep_alive: float) -> None:
    """Ollama on amd64 reads such a number as the most negative duration and unloads the copy
    as its call ends, while every sidecar counts it loaded (tests/integration/
    test_engine_audit.py); the sidecar sends -1, forever, as arm64 reads it."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    assert chat(url, "qwen3:8b", keep_alive=keep_alive).status_code == 200
    time.sleep(0.5)
    listed = httpx.get(f"{gpu.url}/api/ps").json()["models"]
    assert [m["name"] for m in listed] == ["qwen3:8b"]
    forever = datetime.now(UTC) + timedelta(seconds=(2**63 - 1) / 1e9)  # Go's largest Duration
    assert listed[0]["expires_at"].startswith(f"{forever:%Y-%m-%d}"), listed


def test_an_uncapped_call_with_a_small_num_ctx_is_served(sim_factory: Sims,
                                                         sidecar_factory: Sidecars) -> None:
    """num_ctx 256 without num_predict: half the context is kept for the answer, not 256
    tokens, which would leave none for the prompt (docs/rules.md)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[1:4])
    url = sidecar_factory([gpu]).url
    r = httpx.post(f"{url}/api/generate", timeout=30, json={
        "model": "llama3.2:3b", "prompt": "Why is the sky blue?", "stream": False,
        "options": {"num_ctx": 256}})
    assert r.status_code == 200, r.text


PHI3 = next(m for m in CATALOG if m.name == "phi3:mini")
# created FROM phi3:mini with a system prompt of its own (a manifest of its own)
PHI3_HELPER = with_derived((PHI3,), ["phi3-helper=phi3:mini:0"])[1]


def test_a_model_created_from_a_file_seen_loaded_is_sized_as_its_copy(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """phi3's file (2176 MiB) undercounts its copy (3916 MiB at 4096 x 1) by the compute
    buffers its small token embeddings do not make up for. A model created FROM it is sized
    from the copy seen under phi3's name, as it will hold, not from the file (3712 MiB):
    counted short as a load in flight, it let the fleet soak's 32b claim pass the 80 % rule
    beside it, and Ollama unloaded it on its own."""
    gpu = sim_factory("gpu", total_vram_mib=16376, context_length=4096,
                      models=(*CATALOG, PHI3_HELPER), time_scale=SCALE)
    httpx.post(f"{gpu.url}/api/generate", json={"model": "phi3:mini"}, timeout=30)
    real = gpu.sim.runners["phi3:mini"].footprint_mib
    url = sidecar_factory([gpu]).url

    def verdict(model: str) -> dict[str, Any]:
        verdicts = httpx.get(f"{url}/kubemoot/v1/explain", timeout=10,
                             params={"model": model, "numCtx": 4096}).json()["verdicts"]
        return dict(verdicts[0])

    assert eventually(lambda: verdict("phi3:mini")["reason"] == "warm")  # a probe listed it
    # unloaded: a call for the helper loads it (with phi3's copy listed it would join it)
    httpx.post(f"{gpu.url}/api/generate", json={"model": "phi3:mini", "keep_alive": 0},
               timeout=30)
    assert eventually(lambda: "footprintTotalMiB" in verdict("phi3-helper"))  # sized to load
    helper = verdict("phi3-helper")
    assert helper["footprintTotalMiB"] == real == 3916, helper
    assert "a copy of phi3:mini" in helper["footprintSource"]


# Small llama-engine models, each a file of its own, 150 MiB apart: ~2.6-3.2 GiB a copy
SMALL_LLAMAS = tuple(replace(next(m for m in CATALOG if m.name == "llama3.2:3b"),
                             name=f"llama-{i}", weights="", disk_mib=1926 + 150 * i)
                     for i in range(5))


@pytest.mark.parametrize(("version", "total", "slots", "context", "kept"), [
    ("0.24.0", 13650, 1, 4096, 3), ("0.12.11", 13650, 2, 4096, 3),
    # 7.1-7.9 GiB by Ollama's estimate (no flash attention in its sums), 5.6-6.2 held: one
    ("0.24.0", 14000, 2, 16384, 1),
    ("0.12.6", 13650, 1, 4096, 3), ("0.33.0", 13650, 1, 4096, 4)])
def test_a_card_of_many_small_copies_never_makes_ollama_unload_one_itself(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str, total: int, slots: int,
        context: int, kept: int) -> None:
    """OLLAMA_MAX_LOADED_MODELS raised, five ~3 GiB models loaded one by one on one card.
    Before 0.30 Ollama loads beside others only when the free memory it reads (the
    driver's: every runner's CUDA context gone; or the total less the runners' reported
    estimates) holds the new copy, the minimum again, a layer and its larger graph: the
    sidecar's reserve alone held that for three runners, not four (docs/engine.md, "Ollama's
    fit check before 0.30")."""
    gpu = sim_factory("gpu", total_vram_mib=total, context_length=context, version=version,
                      time_scale=SCALE, models=(*CATALOG, *SMALL_LLAMAS), max_loaded_models=12,
                      num_parallel=slots)
    client = ollama.Client(host=sidecar_factory([gpu]).url)
    for model in SMALL_LLAMAS:
        client.chat(model=model.name, messages=[{"role": "user", "content": "hi"}],
                    keep_alive="1h")
        assert quiet(gpu) == NOTHING, (model.name, sorted(gpu.sim.runners))
    assert len(gpu.sim.runners) == kept
