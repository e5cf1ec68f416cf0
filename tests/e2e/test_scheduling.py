"""The scheduled call end to end: the official clients -> sidecar -> simulated GPUs.

Every test that matters runs in both modes: embedded state and shared state in a real NATS.
The simulators run at 1/50 of real time, so a 6000 MiB load takes ~0.12 s and a 16-token
answer ~6 ms; the ratios the scheduler reasons about are those of a real fleet.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
import ollama
import pytest

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from loadtest.sim_output import answer_options
from proxy.adapters.memory_kv import MemoryStore
from proxy.app import build_app
from proxy.settings import load_settings
from tests.conftest import eventually, provider_entry

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]
SCALE = 0.02
HI = [{"role": "user", "content": "hello there"}]


def chat(url: str, model: str, headers: dict[str, str] | None = None, timeout: float = 30,
         **body: Any) -> httpx.Response:
    payload = {"model": model, "messages": HI, "stream": False, **body}
    return httpx.post(f"{url}/api/chat", json=payload, headers=headers, timeout=timeout)


def stream_in_background(url: str, model: str, tokens: int, started: threading.Event,
                         leave: threading.Event | None = None) -> threading.Thread:
    """A long streaming call holding a slot until it finishes, or its agent leaves it once
    `leave` is set."""

    def run() -> None:
        body = {"model": model, "messages": HI, "options": answer_options(tokens)}
        with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=60) as r:
            for _ in r.iter_lines():
                started.set()
                if leave is not None and leave.is_set():
                    break

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    return thread


def test_warm_reuse(sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]
                    ) -> None:
    a = sim_factory("a", total_vram_mib=32768, time_scale=SCALE)
    b = sim_factory("b", total_vram_mib=16376, time_scale=SCALE)
    httpx.post(f"{a.url}/api/generate", json={"model": "qwen3:8b"})  # warm on the big card
    url = sidecar_factory([a, b], **mode).url
    r = chat(url, "qwen3:8b")
    assert r.status_code == 200
    assert (r.headers["x-kubemoot-provider"], r.headers["x-kubemoot-placement"]) == (
        "a", "warm")
    assert b.sim.stats.loads == 0


def test_a_call_takes_the_idle_copy_not_a_free_slot_beside_a_running_call(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """Two cards with a warm two-slot copy each; one call streams on "a" (first by name).
    The next call decodes faster on "b" than in "a"'s batch (the simulator shares a runner's
    decode between its busy slots, as Ollama's runners do): it goes to "b"."""
    a = sim_factory("a", num_parallel=2, time_scale=SCALE)
    b = sim_factory("b", num_parallel=2, time_scale=SCALE)
    for gpu in (a, b):
        httpx.post(f"{gpu.url}/api/generate", json={"model": "llama3.2:3b"})
    url = sidecar_factory([a, b], **mode).url
    started = threading.Event()
    leave = threading.Event()  # the busy call's agent leaves once the answer is checked
    running = stream_in_background(url, "llama3.2:3b", 2000, started, leave)
    assert a.sim.stats.peak_decoding == 1 and b.sim.stats.peak_decoding == 0
    r = chat(url, "llama3.2:3b")
    assert (r.headers["x-kubemoot-provider"], r.headers["x-kubemoot-placement"]) == (
        "b", "warm")
    assert a.sim.stats.peak_decoding == 1  # never two in a's batch
    leave.set()
    running.join(30)


def test_a_conversation_with_capitalised_keys_is_sized_as_ollama_binds_it(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """Go binds a message's `Content` to its content, as the simulator does: the sidecar
    sizes it so too, and refuses or places it as it does the lower-case conversation."""
    gpus = [sim_factory("a", context_length=4096), sim_factory("b", context_length=8192)]
    url = sidecar_factory(gpus, **mode).url

    def ask(words: int) -> httpx.Response:
        body = {"model": "qwen3:8b", "stream": False,
                "messages": [{"Role": "user", "CONTENT": "word " * words}]}
        return httpx.post(f"{url}/api/chat", json=body, timeout=30)

    too_long = ask(8000)  # ~11k tokens
    assert too_long.status_code == 413 and too_long.json()["reason"] == "prompt-too-large"
    assert all(gpu.sim.stats.inference_requests == 0 for gpu in gpus)
    ok = ask(5000)  # ~7.1k tokens: only the 8192 card holds it
    assert ok.status_code == 200 and ok.headers["x-kubemoot-provider"] == "b", ok.text
    assert ok.json()["prompt_eval_count"] > 4096
    assert gpus[1].sim.stats.truncations == 0


def test_cold_load_onto_free_room_on_the_smallest_card(sim_factory: Sims,
                                                       sidecar_factory: Sidecars,
                                                       mode: dict[str, Any]) -> None:
    big = sim_factory("big", total_vram_mib=32768, time_scale=SCALE)
    small = sim_factory("small", total_vram_mib=16376, time_scale=SCALE)
    url = sidecar_factory([big, small], **mode).url
    r = chat(url, "qwen3:8b")
    assert (r.headers["x-kubemoot-provider"], r.headers["x-kubemoot-placement"]) == (
        "small", "cold")
    assert r.json()["model"] == "qwen3:8b"
    again = chat(url, "qwen3:8b")
    assert (again.headers["x-kubemoot-provider"], again.headers["x-kubemoot-placement"]) == (
        "small", "warm")


def test_queues_at_a_busy_warm_copy_then_makes_a_second_copy_once_the_queue_is_long(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    a = sim_factory("a", total_vram_mib=24564, time_scale=SCALE)
    b = sim_factory("b", total_vram_mib=24564, time_scale=SCALE)
    url = sidecar_factory([a, b], **mode).url
    for _ in range(3):  # a warm copy on one card, and an observed call latency
        assert chat(url, "qwen3:8b", options=answer_options(200)).status_code == 200
    home = "a" if a.sim.stats.loads else "b"
    results: list[httpx.Response] = []
    lock = threading.Lock()

    def call() -> None:
        r = chat(url, "qwen3:8b", options=answer_options(200))
        with lock:
            results.append(r)

    threads = [threading.Thread(target=call) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    placements = [(r.headers["x-kubemoot-provider"], r.headers["x-kubemoot-placement"])
                  for r in results]
    assert all(r.status_code == 200 for r in results)
    # a short wait for a slot does not duplicate the model
    assert any(r.headers["x-kubemoot-provider"] == home and
               int(r.headers["x-kubemoot-waited-ms"]) > 0 for r in results), placements
    second = [p for p in placements if p[0] != home]
    assert second and ("cold" in {k for _, k in second}), placements  # a long one does
    assert a.sim.stats.loads == 1 and b.sim.stats.loads == 1


def test_unloads_idle_unwanted_models_to_make_room(sim_factory: Sims,
                                                   sidecar_factory: Sidecars,
                                                   mode: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE)
    for model in ("qwen3:8b", "phi3:mini"):
        httpx.post(f"{gpu.url}/api/generate", json={"model": model})
    url = sidecar_factory([gpu], **mode).url
    r = chat(url, "qwen3:14b")
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-placement"] == "evict"
    # The 8b alone would leave the memory, but not Ollama's own 80 % rule with phi3 beside
    # the 14b (its estimate, 9940 MiB, against 80 % of 16376 - 3903 - phi3's CUDA context).
    # (listed in the order they were ranked: the 8b, loaded first, expires first)
    assert r.headers["x-kubemoot-evicted"] == "qwen3:8b,phi3:mini"
    assert sorted(gpu.sim.runners) == ["qwen3:14b"]
    stats = gpu.sim.stats
    assert stats.oom_events == 0 and stats.self_evictions == 0  # room was made first
    assert stats.peak_vram_mib <= 16376


def test_at_ollamas_model_count_limit_the_sidecar_picks_the_victim_itself(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """Memory would hold a fourth model, but Ollama keeps at most OLLAMA_MAX_LOADED_MODELS (3
    per GPU by default) and would unload one of its own choosing, mid-work if need be."""
    gpu = sim_factory("gpu", total_vram_mib=32605, context_length=4096, time_scale=SCALE)
    three = ("qwen3:8b", "phi3:mini", "llama3.2:3b")
    for model in three:
        httpx.post(f"{gpu.url}/api/generate", json={"model": model})
    url = sidecar_factory([gpu], **mode).url
    response = chat(url, "qwen3:14b")
    assert response.status_code == 200, response.text
    assert response.headers["x-kubemoot-placement"] == "evict"
    assert response.headers["x-kubemoot-evicted"] in three
    assert gpu.sim.stats.self_evictions == 0 and len(gpu.sim.runners) == 3
    assert gpu.sim.used_vram_mib() <= 32605


def test_never_unloads_a_model_with_work_in_flight(sim_factory: Sims,
                                                   sidecar_factory: Sidecars,
                                                   mode: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE)
    httpx.post(f"{gpu.url}/api/generate", json={"model": "phi3:mini"})
    url = sidecar_factory([gpu], discuss_gpu_wait_limit_seconds=0.5, **mode).url
    busy = threading.Event()
    # ~2 s of tokens: well past the 0.5 s wait even when the test's thread runs late
    leave = threading.Event()
    worker = stream_in_background(url, "qwen3:8b", 5000, busy, leave)
    r = chat(url, "qwen3:14b")
    assert r.status_code == 503 and r.json()["reason"] == "gpu-busy"
    assert r.headers["retry-after"]
    assert "qwen3:8b" in gpu.sim.runners  # still there, still working
    assert gpu.sim.stats.oom_events == 0
    leave.set()
    worker.join(30)


def test_a_busy_wait_ends_when_capacity_frees(sim_factory: Sims, sidecar_factory: Sidecars,
                                              mode: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE)
    url = sidecar_factory([gpu], discuss_gpu_wait_limit_seconds=20, **mode).url
    leave = threading.Event()
    worker = stream_in_background(url, "qwen3:8b", 20000, threading.Event(), leave)
    started = time.monotonic()
    replies: list[httpx.Response] = []
    caller = threading.Thread(target=lambda: replies.append(chat(url, "qwen3:14b")))
    caller.start()
    assert eventually(lambda: waiting_calls(url, "qwen3:14b"))
    leave.set()  # the 8b's agent leaves: its slot and memory free
    caller.join(30)
    r = replies[0]
    assert r.status_code == 200
    assert int(r.headers["x-kubemoot-waited-ms"]) > 0
    assert r.headers["x-kubemoot-placement"] == "evict"
    assert time.monotonic() - started < 10  # woken by the release, not by the limit
    worker.join(30)


def waiting_calls(url: str, model: str) -> int:
    demand = httpx.get(f"{url}/kubemoot/v1/state").json()["demand"]
    return int(demand.get(model, {}).get("waiters") or 0)


def test_model_too_large_is_507(sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    # OLLAMA_CONTEXT_LENGTH set on b: 32768 is no automatic context to lower
    gpus = [sim_factory("a", total_vram_mib=16376),
            sim_factory("b", total_vram_mib=24564, context_length=32768)]
    url = sidecar_factory(gpus).url
    r = chat(url, "qwen3:32b")
    assert r.status_code == 507
    body = r.json()
    assert body["reason"] == "model-too-large" and body["model"] == "qwen3:32b"
    assert "larger GPU" in body["error"]
    metrics = httpx.get(f"{url}/metrics").text
    assert 'kubemoot_refusals_total{reason="model-too-large"} 1.0' in metrics


def test_prompt_too_large_is_413_and_never_reaches_a_gpu(sim_factory: Sims,
                                                         sidecar_factory: Sidecars,
                                                         mode: dict[str, Any]) -> None:
    gpus = [sim_factory("a", context_length=4096), sim_factory("b", context_length=8192)]
    url = sidecar_factory(gpus, **mode).url
    long_prompt = [{"role": "user", "content": "word " * 8000}]  # ~11k tokens at 3.5 c/t
    client = ollama.Client(host=url)
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="qwen3:8b", messages=long_prompt)
    assert info.value.status_code == 413
    assert "OLLAMA_CONTEXT_LENGTH" in info.value.error
    for gpu in gpus:  # never sent, so never silently truncated
        assert gpu.sim.stats.inference_requests == 0 and gpu.sim.stats.truncations == 0
    ok = client.chat(model="qwen3:8b", messages=[{"role": "user", "content": "word " * 5000}])
    assert ok.done  # ~7.1k tokens: only the 8192 card can hold it, and it does
    assert gpus[1].sim.stats.truncations == 0


def test_a_generate_context_counts_toward_the_prompt(sim_factory: Sims,
                                                      sidecar_factory: Sidecars) -> None:
    # /api/generate's `context` (an earlier answer's tokens) goes before the prompt.
    small = sim_factory("small", context_length=4096, time_scale=SCALE)
    big = sim_factory("big", context_length=8192, time_scale=SCALE)
    client = ollama.Client(host=sidecar_factory([small, big]).url)
    answer = client.generate(model="qwen3:8b", prompt="and then?", context=[7] * 6000)
    assert answer.done and big.sim.stats.inference_requests == 1
    assert small.sim.stats.inference_requests == 0 and big.sim.stats.truncations == 0
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model="qwen3:8b", prompt="and then?", context=[7] * 9000)
    assert info.value.status_code == 413
    assert big.sim.stats.inference_requests == 1 and big.sim.stats.truncations == 0


def test_a_conversation_is_sized_from_the_engines_own_count(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """The tool-loop rule (docs/rules.md): the engine's count for the previous call plus what
    was appended since. This vision model spends 1500 tokens on an image where the sidecar
    assumes Ollama's 768: sized without the engine's count, the loop's next call (~4160
    tokens by the engine's count, ~2700 estimated) would go to the warm copy on the
    4096-token card and be cut there."""
    small = sim_factory("small", context_length=4096, time_scale=SCALE, image_tokens=1500)
    big = sim_factory("big", context_length=16384, time_scale=SCALE, image_tokens=1500)
    httpx.post(f"{small.url}/api/generate", json={"model": "qwen3:8b"})  # warm, small context
    url = sidecar_factory([small, big], **mode).url
    client = ollama.Client(host=url)
    prose = client.chat(model="qwen3:8b", messages=[{"role": "user", "content": "word " * 800}])
    assert prose.done  # the ratio has learned ~4 characters per token
    history: list[Any] = [{"role": "user", "content": "what differs?", "images": [b"i"] * 2}]
    first = client.chat(model="qwen3:8b", messages=history)  # ~3010 tokens: fits either card
    history += [first.message, {"role": "tool", "content": "x" * 4500}]
    second = client.chat(model="qwen3:8b", messages=history)
    assert second.done and big.sim.stats.inference_requests == 1
    assert small.sim.stats.truncations == 0 and big.sim.stats.truncations == 0
    # The call with images was estimated at half the engine's count: operators see it.
    name = "kubemoot_prompt_tokens_reported_to_estimated"
    assert eventually(lambda: f"{name}_count 3.0" in httpx.get(f"{url}/metrics").text)
    metrics = httpx.get(f"{url}/metrics").text
    assert f'{name}_bucket{{le="1.1"}} 2.0' in metrics  # prose (0.88) and the second call
    assert f'{name}_bucket{{le="2.0"}} 3.0' in metrics  # the first: ~3010 of ~1540 estimated


def test_cjk_text_and_images_are_sized_as_the_engine_counts_them(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """After prose has taught ~4 characters per token, one ratio for every script sized 5000
    CJK characters (~5000 tokens) at ~1250 and sent them to the warm 4096-token card."""
    small = sim_factory("small", context_length=4096, time_scale=SCALE)
    big = sim_factory("big", context_length=16384, time_scale=SCALE)
    httpx.post(f"{small.url}/api/generate", json={"model": "qwen3:8b"})  # warm, small context
    client = ollama.Client(host=sidecar_factory([small, big]).url)
    assert client.chat(model="qwen3:8b", messages=[{"role": "user", "content": "word " * 800}])
    answer = client.chat(model="qwen3:8b", messages=[{"role": "user", "content": "字" * 5000}])
    assert answer.done and big.sim.stats.inference_requests == 1
    # Six images are 4608 tokens to Ollama, a few characters to a character count.
    look = client.chat(model="qwen3:8b", messages=[
        {"role": "user", "content": "which differ?", "images": [b"i"] * 6}])
    assert look.done and big.sim.stats.inference_requests == 2
    assert small.sim.stats.truncations == 0 and big.sim.stats.truncations == 0


def test_a_models_trained_context_is_respected(sim_factory: Sims,
                                               sidecar_factory: Sidecars) -> None:
    # phi3:mini was trained for 4096 tokens: Ollama caps its context there on any card.
    gpu = sim_factory("gpu", context_length=8192, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    prompt = [{"role": "user", "content": "word " * 4000}]  # ~5.7k tokens
    r = chat(url, "phi3:mini", messages=prompt)
    assert r.status_code == 413 and "trained" in r.json()["error"]
    assert gpu.sim.stats.inference_requests == 0  # never sent, so never cut
    candidates = [{"model": "phi3:mini", "score": 40}, {"model": "llama3.2:3b", "score": 35}]
    url = sidecar_factory([gpu], model_candidates_mulling=candidates).url
    r = chat(url, "phi3:mini", messages=prompt)
    assert r.status_code == 200 and r.headers["x-kubemoot-model"] == "llama3.2:3b"
    assert gpu.sim.stats.truncations == 0


@pytest.mark.parametrize("version", ["0.12.6", "0.15.4", "0.15.5", "0.24.0"])
def test_a_prompt_over_the_trained_context_is_refused_on_every_version(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str) -> None:
    """Every version's runner runs phi3:mini at its trained 4096 tokens whatever num_ctx asks
    (NewLlamaServer, v0.12.6 llm/server.go:172-176, v0.15.5 :166-170) and cuts a longer
    prompt; /api/ps lists the 8192 asked for up to 0.15.4, 4096 from 0.15.5 (v0.15.5
    server/routes.go:1914). A prompt between the two is refused, never sent, on a warm copy
    as on a cold card, whichever figure the copy is listed at."""
    warm = sim_factory("warm", version=version, time_scale=SCALE)
    cold = sim_factory("cold", version=version, context_length=8192, time_scale=SCALE)
    httpx.post(f"{warm.url}/api/generate", json={"model": "phi3:mini",
                                                  "options": {"num_ctx": 8192}})
    listed = httpx.get(f"{warm.url}/api/ps").json()["models"][0]["context_length"]
    assert listed == (8192 if version < "0.15.5" else 4096)
    prompt = [{"role": "user", "content": "word " * 4000}]  # ~5.7k tokens
    for gpus, options in (([warm], {"num_ctx": 8192}), ([cold], {})):
        r = chat(sidecar_factory(gpus).url, "phi3:mini", messages=prompt, options=options)
        assert r.status_code == 413 and "trained" in r.json()["error"], r.text
    assert warm.sim.stats.inference_requests == cold.sim.stats.inference_requests == 0
    assert warm.sim.stats.truncations == cold.sim.stats.truncations == 0


@pytest.mark.parametrize("version", ["0.12.6", "0.15.5", "0.24.0", "0.30.0"])
def test_a_copy_listed_at_its_trained_context_is_joined_without_a_reload(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str) -> None:
    """OLLAMA_CONTEXT_LENGTH 8192 loads phi3:mini (trained 4096) asked for 8192; from 0.15.5
    /api/ps lists 4096 (server/routes.go:1914), but up to 0.24 needsReload compares the 8192
    (v0.24.0 server/sched.go:692-705): a call asking 4096 joins only if sent with 8192."""
    gpu = sim_factory("gpu", version=version, context_length=8192, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    assert chat(url, "phi3:mini").status_code == 200
    assert chat(url, "phi3:mini", options={"num_ctx": 4096}).status_code == 200
    assert gpu.sim.stats.reloads == 0 and gpu.sim.stats.loads == 1


def _openai_chat(url: str, model: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


@pytest.mark.parametrize("version", ["0.12.6", "0.15.5", "0.24.0", "0.33.0"])
@pytest.mark.parametrize(("first", "then", "restarted"), [
    (16384, "openai", False), (4096, "openai", False), ("openai", 4096, True),
    (16384, "openai", True), (16384, 2048, True)])
def test_a_copy_at_its_trained_context_is_loaded_with_one_num_ctx_every_call_agrees_on(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str, first: int | str,
        then: int | str, restarted: bool) -> None:
    """phi3:mini (trained 4096) on a card whose calls without num_ctx get 8192: from 0.15.5
    to 0.29 /api/ps lists any copy of it at 4096 while needsReload compares the num_ctx it
    was asked with (v0.24.0 server/sched.go:691-705). The sidecar loads every copy at that
    cap with the 8192 an OpenAI call brings (context.as_loaded), and reads a listing at the
    cap so, whatever sidecar loaded it: no call makes Ollama reload it, and from 0.15.5 it
    is not reloaded at all. (0.12.6 lists the ask, and the sidecar plans the reload.)"""
    gpu = sim_factory("gpu", version=version, context_length=8192, time_scale=SCALE)
    url = sidecar_factory([gpu]).url

    def call(how: int | str) -> None:
        r = _openai_chat(url, "phi3:mini") if how == "openai" else \
            chat(url, "phi3:mini", options={"num_ctx": how})
        assert r.status_code == 200, r.text

    call(first)
    if restarted:  # another sidecar, which knows the copy only from /api/ps
        url = sidecar_factory([gpu]).url
    call(then)
    assert gpu.sim.stats.reloads == 0
    assert gpu.sim.stats.loads == (2 if version == "0.12.6" and then == "openai" else 1)


@pytest.mark.parametrize("version", ["0.12.6", "0.13.4"])
def test_before_0_15_5_the_listing_is_the_ask_whatever_an_earlier_copy_was_asked(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str) -> None:
    """phi3:mini loaded through the sidecar asking 32768, then reloaded at the default 4096
    by a call that went around it (or one whose record is not written yet): the listing
    says 4096, and before 0.15.5 that is the ask, so a call asking 32768 (4096 for phi3)
    joins it sent with 4096, not with the record's 32768 of the copy before."""
    gpu = sim_factory("gpu", version=version, time_scale=SCALE)
    url = sidecar_factory([gpu], probe_interval_seconds=0.2).url
    assert chat(url, "phi3:mini", options={"num_ctx": 32768}).status_code == 200
    httpx.post(f"{gpu.url}/api/generate", json={"model": "phi3:mini"}, timeout=30)
    assert gpu.sim.stats.reloads == 1  # Ollama's own, for the direct call
    time.sleep(0.5)  # probes list the copy at 4096
    assert chat(url, "phi3:mini", options={"num_ctx": 32768}).status_code == 200
    assert gpu.sim.stats.reloads == 1 and gpu.sim.stats.loads == 2


def test_num_ctx_is_a_requirement_not_a_reload(sim_factory: Sims,
                                               sidecar_factory: Sidecars) -> None:
    small = sim_factory("small", context_length=4096, time_scale=SCALE)
    large = sim_factory("large", context_length=16384, time_scale=SCALE)
    url = sidecar_factory([small, large]).url
    for _ in range(3):
        r = chat(url, "qwen3:8b", options={"num_ctx": 8192})
        assert r.headers["x-kubemoot-provider"] == "large"
    assert large.sim.stats.reloads == 0 and large.sim.stats.loads == 1


def test_an_unload_request_unloads_and_places_nothing(sim_factory: Sims,
                                                       sidecar_factory: Sidecars) -> None:
    gpus = [sim_factory("a", time_scale=SCALE), sim_factory("b", time_scale=SCALE)]
    url = sidecar_factory(gpus).url
    assert chat(url, "qwen3:8b").status_code == 200
    holder = next(g for g in gpus if g.sim.stats.loads)
    client = ollama.Client(host=url)
    stopped = client.generate(model="qwen3:8b", keep_alive=0)  # what `ollama stop` sends
    assert stopped.done_reason == "unload"
    assert eventually(lambda: not holder.sim.runners)
    assert eventually(lambda: not any(  # seen gone by the sidecar, before any probe says so
        p["residents"] for p in httpx.get(f"{url}/kubemoot/v1/state").json()["providers"]),
        timeout_s=1.0)
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    # Not loaded anywhere: nothing is loaded, evicted or claimed just to unload it.
    assert client.chat(model="qwen3:14b", messages=[], keep_alive="0s").done_reason == "unload"
    assert sum(g.sim.stats.loads for g in gpus) == 1 and not state["tickets"]


def test_a_call_with_keep_alive_zero_leaves_no_phantom_copy(sim_factory: Sims,
                                                            sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("a", time_scale=SCALE)
    url = sidecar_factory([gpu], probe_interval_seconds=60).url  # no probe will tell it

    def residents() -> list[object]:
        state = httpx.get(f"{url}/kubemoot/v1/state").json()
        return [r for p in state["providers"] for r in p["residents"]]

    assert chat(url, "qwen3:8b").status_code == 200
    assert eventually(lambda: bool(residents()))
    r = chat(url, "qwen3:8b", keep_alive=0)  # a warm call asking Ollama to unload after it
    assert r.status_code == 200 and r.headers["x-kubemoot-placement"] == "warm"
    assert eventually(lambda: not gpu.sim.runners)
    assert eventually(lambda: not residents(), timeout_s=1.0)  # the call's release said so


def test_keep_alive_zero_leaves_a_model_another_call_holds_a_ticket_for(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", num_parallel=2, time_scale=SCALE)  # a slot for each call
    url = sidecar_factory([gpu], **mode).url

    def tickets() -> int:
        return len(httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"])

    assert chat(url, "qwen3:8b").status_code == 200
    plan = httpx.post(f"{url}/kubemoot/v1/plans", json={"thread": "t-1", "model": "qwen3:8b"})
    assert plan.status_code == 201 and plan.json()["placement"] == "warm"
    # This call asks for the model to go as it ends, but the plan's call, not yet sent,
    # holds a ticket for it: Ollama would unload it, then reload it for that call on
    # memory nobody claimed. So it stays.
    assert chat(url, "qwen3:8b", keep_alive=0).status_code == 200
    assert eventually(lambda: tickets() == 1)  # released: only the plan's ticket is left
    assert "qwen3:8b" in gpu.sim.runners
    held = chat(url, "qwen3:8b", headers={"X-Kubemoot-Thread": "t-1"})
    assert held.headers["x-kubemoot-placement"] == "held"
    assert gpu.sim.stats.loads == 1 and gpu.sim.stats.reloads == 0
    assert chat(url, "qwen3:8b", keep_alive=0).status_code == 200  # the last one out
    assert eventually(lambda: not gpu.sim.runners)


def test_a_call_that_cannot_wait_goes_to_the_static_endpoint(sim_factory: Sims,
                                                             sidecar_factory: Sidecars
                                                             ) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE)
    static = sim_factory("static", total_vram_mib=49152, time_scale=SCALE)
    url = sidecar_factory([gpu], model_endpoint=static.url).url
    busy = threading.Event()
    leave = threading.Event()
    worker = stream_in_background(url, "qwen3:8b", 1000, busy, leave)
    r = chat(url, "qwen3:14b", headers={"X-Kubemoot-Wait": "false"})
    assert r.status_code == 200
    assert (r.headers["x-kubemoot-provider"], r.headers["x-kubemoot-placement"]) == (
        "static", "static")
    assert static.sim.stats.inference_requests == 1
    leave.set()
    worker.join(30)


def test_a_prompt_longer_than_the_static_endpoints_context_is_refused_not_cut(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """The sidecar does not size calls for the static endpoint: it tells Ollama not to cut
    (`truncate: false`), and Ollama's refusal becomes the call's 413."""
    # the GPU's one slot stays busy for 2 s (1000 tokens at 10/s, time x 0.02)
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE, tokens_per_s=10)
    static = sim_factory("static", total_vram_mib=49152, context_length=2048,
                         time_scale=SCALE)
    url = sidecar_factory([gpu], model_endpoint=static.url).url
    busy = threading.Event()
    leave = threading.Event()
    worker = stream_in_background(url, "qwen3:8b", 1000, busy, leave)
    long = [{"role": "user", "content": "read this file " * 800}]  # ~3k tokens
    r = chat(url, "qwen3:14b", headers={"X-Kubemoot-Wait": "false"}, messages=long)
    assert r.status_code == 413 and r.json()["reason"] == "prompt-too-large", r.text
    assert static.sim.stats.truncations == 0 and static.sim.stats.too_long_refusals == 1
    # an agent that asks for Ollama's cut gets it
    r = chat(url, "qwen3:14b", headers={"X-Kubemoot-Wait": "false"}, messages=long,
             truncate=True)
    assert r.status_code == 200 and r.headers["x-kubemoot-provider"] == "static"
    assert static.sim.stats.truncations == 1
    leave.set()
    worker.join(30)


def test_many_short_calls_do_not_teach_a_ratio_that_refuses_long_prompts(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """A short prompt's count is mostly its chat template: 21 characters counted 11 tokens
    would teach 1.9 characters a token, and a 16,000-character prompt (4k tokens, half the
    context) would be refused as too long for 8192."""
    gpu = sim_factory("gpu", total_vram_mib=24564, context_length=8192, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    for _ in range(15):
        r = httpx.post(f"{url}/api/generate", timeout=30, json={
            "model": "qwen3:8b", "prompt": "tell me a joke please", "stream": False})
        assert r.status_code == 200 and r.json()["prompt_eval_count"] < 64
    r = chat(url, "qwen3:8b", messages=[{"role": "user", "content": "word " * 3200}])
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] < 8192 / 2 + 100


def test_coordinator_role_never_waits(sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376)
    url = sidecar_factory([gpu], role="coordinator").url
    r = chat(url, "qwen3:32b")
    assert r.status_code == 507  # no static endpoint: too large is still said plainly


def test_a_held_plan_is_taken_by_the_first_call_of_its_thread(sim_factory: Sims,
                                                              sidecar_factory: Sidecars,
                                                              mode: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, time_scale=SCALE)
    url = sidecar_factory([gpu], **mode).url
    plan = httpx.post(f"{url}/kubemoot/v1/plans", json={"thread": "t-1", "model": "qwen3:14b"})
    assert plan.status_code == 201 and plan.json()["placement"] == "cold"
    assert eventually(lambda: "qwen3:14b" in gpu.sim.runners)  # the load started at once
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert state["plans"] == ["t-1"] and len(state["tickets"]) == 1
    r = chat(url, "qwen3:14b", headers={"X-Kubemoot-Thread": "t-1"})
    assert r.status_code == 200 and r.headers["x-kubemoot-placement"] == "held"
    assert eventually(lambda: not httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"])
    again = httpx.post(f"{url}/kubemoot/v1/plans", json={"thread": "t-2", "model": "qwen3:14b"})
    assert again.json()["placement"] == "warm"
    gone = httpx.delete(f"{url}/kubemoot/v1/plans/t-2").json()
    assert gone["released"] is True


def test_a_held_plan_on_a_copy_that_went_away_is_not_taken(sim_factory: Sims,
                                                           sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", num_parallel=2, time_scale=SCALE)
    url = sidecar_factory([gpu], probe_interval_seconds=0.1).url
    assert chat(url, "qwen3:8b").status_code == 200
    plan = httpx.post(f"{url}/kubemoot/v1/plans", json={"thread": "t-1", "model": "qwen3:8b"})
    assert plan.json()["placement"] == "warm"  # its ticket holds a call's share, not a load
    # Someone unloads the model on the GPU itself; the next probe sees it gone.
    httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b", "keep_alive": 0})
    assert eventually(lambda: not any(
        p["residents"] for p in httpx.get(f"{url}/kubemoot/v1/state").json()["providers"]))
    r = chat(url, "qwen3:8b", headers={"X-Kubemoot-Thread": "t-1"})
    assert r.headers["x-kubemoot-placement"] == "cold"  # placed afresh: the load is claimed
    assert gpu.sim.stats.loads == 2


def test_client_disconnect_mid_stream_releases_the_ticket(sim_factory: Sims,
                                                          sidecar_factory: Sidecars,
                                                          mode: dict[str, Any]) -> None:
    """...and is no failure of the provider: three agents leaving (Ctrl-C) within the
    breaker's window must not shut a healthy GPU out for a minute."""
    gpu = sim_factory("gpu", tokens_per_s=5, time_scale=0.2)
    url = sidecar_factory([gpu], **mode).url
    for _ in range(3):
        with httpx.stream("POST", f"{url}/api/chat",
                          json={"model": "llama3.2:3b", "messages": HI}, timeout=30) as r:
            lines = r.iter_lines()  # kept alive: a dropped iterator closes the response
            assert "the" in next(lines)
            assert httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"]
        assert eventually(lambda: not httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"])
        assert eventually(lambda: gpu.sim.runners["llama3.2:3b"].refcount == 0)
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert [p["circuit"] for p in state["providers"]] == ["closed"]
    assert 'kubemoot_upstream_errors_total{provider="gpu"}' not in httpx.get(
        f"{url}/metrics").text


def test_an_agent_that_gives_up_before_its_answer_begins_stops_the_generation(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """A client timeout on a long complete answer: the GPU must not go on generating it for
    nobody (and the retry queue behind it) while the ticket stays claimed."""
    gpu = sim_factory("gpu", tokens_per_s=2, time_scale=1.0, context_length=4096)  # 8 s
    url = sidecar_factory([gpu], **mode).url
    httpx.post(f"{gpu.url}/api/generate", json={"model": "llama3.2:3b"}, timeout=10)
    with pytest.raises(httpx.ReadTimeout):
        chat(url, "llama3.2:3b", timeout=0.5)
    assert eventually(lambda: gpu.sim.stats.abandoned == 1, timeout_s=3)
    assert gpu.sim.runners["llama3.2:3b"].refcount == 0
    assert eventually(lambda: not httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"],
                      timeout_s=3)
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert [p["circuit"] for p in state["providers"]] == ["closed"]


def test_failing_provider_opens_its_circuit_and_calls_go_elsewhere(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    a = sim_factory("a", total_vram_mib=16376, time_scale=SCALE)
    b = sim_factory("b", total_vram_mib=24564, time_scale=SCALE)
    httpx.post(f"{a.url}/api/generate", json={"model": "qwen3:8b"})
    url = sidecar_factory([a, b]).url
    # (a failure that leaves the copy usable: one whose runner Ollama closed is unloaded,
    # and the next call loads the model where it fits best)
    a.sim.fault.mode, a.sim.fault.count = "parser", 3
    client = ollama.Client(host=url)
    for _ in range(3):
        with pytest.raises(ollama.ResponseError) as info:
            for _chunk in client.chat(model="qwen3:8b", messages=HI, stream=True):
                pass
        assert "XML syntax error" in info.value.error
    r = chat(url, "qwen3:8b")
    assert r.status_code == 200 and r.headers["x-kubemoot-provider"] == "b"
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    circuits = {p["name"]: p["circuit"] for p in state["providers"]}
    assert circuits == {"a": "open", "b": "closed"}
    assert 'kubemoot_circuit_open{provider="a"} 1.0' in httpx.get(f"{url}/metrics").text


def test_connection_refused_before_any_byte_is_retried_on_another_provider(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    a = sim_factory("a", total_vram_mib=16376, time_scale=SCALE)
    b = sim_factory("b", total_vram_mib=24564, time_scale=SCALE)
    url = sidecar_factory([a, b], probe_interval_seconds=60).url
    a.stop()  # the sidecar's last probe still says it is ready
    r = chat(url, "qwen3:8b")
    assert r.status_code == 200 and r.headers["x-kubemoot-provider"] == "b"


def test_a_provider_that_no_longer_has_the_model_hands_the_call_to_one_that_does(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """The model was removed from the smallest card (`ollama rm`) after its last probe."""
    a = sim_factory("a", total_vram_mib=16376, time_scale=SCALE)
    b = sim_factory("b", total_vram_mib=24564, time_scale=SCALE)
    url = sidecar_factory([a, b], probe_interval_seconds=60).url
    a.sim.config = replace(a.sim.config, models=tuple(
        m for m in a.sim.config.models if m.name != "qwen3:8b"))
    r = chat(url, "qwen3:8b")
    assert r.status_code == 200 and r.headers["x-kubemoot-provider"] == "b"
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert {p["name"]: p["circuit"] for p in state["providers"]}["a"] == "closed"
    assert not state["tickets"]


def test_an_engine_error_before_any_byte_is_retried_once_then_named(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """A 5xx answer (a load that ran out of memory, a full queue) is a provider failing
    before the agent saw a byte: another provider takes the call. With none left, the agent
    gets 502 upstream-failed carrying the engine's own words, not a bare 500."""
    a = sim_factory("a", total_vram_mib=16376, time_scale=SCALE)
    b = sim_factory("b", total_vram_mib=24564, time_scale=SCALE)
    httpx.post(f"{a.url}/api/generate", json={"model": "qwen3:8b"})  # warm on a: a is picked
    url = sidecar_factory([a, b]).url
    a.sim.fault.mode, a.sim.fault.count, a.sim.fault.status = "error", 1, 500
    client = ollama.Client(host=url)
    streamed = list(client.chat(model="qwen3:8b", messages=HI, stream=True))
    assert streamed[-1].done and b.sim.stats.inference_requests == 1
    assert a.sim.stats.inference_requests == 0  # the failure came before any work

    a.sim.fault.mode, a.sim.fault.count, a.sim.fault.status = "error", 2, 503
    b.sim.fault.mode, b.sim.fault.count, b.sim.fault.status = "error", 2, 503
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="qwen3:8b", messages=HI)
    assert info.value.status_code == 502
    assert "failed before answering: HTTP 503: simulated upstream failure" in info.value.error
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert not state["tickets"]


def test_two_sidecars_sharing_nats_converge_on_one_loading_copy(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    import asyncio

    from tests.conftest import empty_buckets

    asyncio.run(empty_buckets(nats_server.url))
    # Two slots: the loading copy has one no call is bound to yet
    gpus = [sim_factory(n, total_vram_mib=24564, time_scale=0.1, num_parallel=2)
            for n in ("a", "b")]
    one = sidecar_factory(gpus, nats_url=nats_server.url, agent_name="one").url
    two = sidecar_factory(gpus, nats_url=nats_server.url, agent_name="two").url
    results: dict[str, httpx.Response] = {}

    def call(name: str, url: str) -> None:
        results[name] = chat(url, "qwen3:14b")  # a ~1.2 s load

    first = threading.Thread(target=call, args=("one", one))
    first.start()
    assert eventually(lambda: any("qwen3:14b" in g.sim.runners for g in gpus))
    call("two", two)
    first.join(30)
    assert results["one"].status_code == results["two"].status_code == 200
    assert results["one"].headers["x-kubemoot-placement"] == "cold"
    assert results["two"].headers["x-kubemoot-placement"] == "loading"
    assert results["two"].headers["x-kubemoot-provider"] == results["one"].headers[
        "x-kubemoot-provider"]
    assert sum(g.sim.stats.loads for g in gpus) == 1


def test_a_sidecar_joining_shared_state_asks_no_card_to_describe_its_models_again(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    """One sidecar per agent pod: a pod that starts beside others probes what each card has
    loaded (/api/ps, /api/tags, /api/version: a published state may be seconds old) but
    takes what /api/show says of each model from the published state, not from the card."""
    import asyncio

    from tests.conftest import empty_buckets

    asyncio.run(empty_buckets(nats_server.url))
    gpu = sim_factory("gpu", time_scale=SCALE)
    sidecar_factory([gpu], nats_url=nats_server.url, agent_name="first", probe_interval_seconds=60)
    probes = dict(gpu.sim.stats.probes_by_path)
    assert probes.get("/api/show", 0) >= len(gpu.sim.config.models)  # the first one probed
    url = sidecar_factory([gpu], nats_url=nats_server.url, agent_name="second",
                          probe_interval_seconds=60).url
    after = gpu.sim.stats.probes_by_path
    assert after["/api/show"] == probes["/api/show"]
    # (its own probe; a sidecar whose shared state is not in its view yet may probe again)
    assert all(after[p] > probes[p] for p in ("/api/ps", "/api/tags", "/api/version"))
    assert chat(url, "qwen3:8b").status_code == 200


def test_models_an_older_sidecar_described_are_described_again(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    """A description published by a sidecar that did not read the weights file (an older
    version, in a rolling upgrade) is not taken: the sidecar asks the card itself, and
    publishes what it learned, so models made from one file are told apart from then on."""
    import asyncio
    from dataclasses import replace

    import nats

    from proxy.ports import PROVIDER_STATE
    from proxy.service.codec import ProviderState
    from tests.conftest import empty_buckets

    asyncio.run(empty_buckets(nats_server.url))
    gpu = sim_factory("gpu", time_scale=SCALE)
    sidecar_factory([gpu], nats_url=nats_server.url, agent_name="old", probe_interval_seconds=60)

    async def as_an_older_sidecar_wrote_it() -> None:
        nc = await nats.connect(nats_server.url)
        kv = await nc.jetstream().key_value(PROVIDER_STATE)
        state = ProviderState.decode((await kv.get("gpu")).value)
        assert all(info.weights for info in state.models.values())
        older = {m: replace(info, weights="") for m, info in state.models.items()}
        await kv.put("gpu", replace(state, models=older).encode())
        await nc.close()

    asyncio.run(as_an_older_sidecar_wrote_it())
    shows = gpu.sim.stats.probes_by_path["/api/show"]
    url = sidecar_factory([gpu], nats_url=nats_server.url, agent_name="new",
                          probe_interval_seconds=60).url
    assert gpu.sim.stats.probes_by_path["/api/show"] == shows + len(gpu.sim.config.models)
    assert chat(url, "qwen3:8b").status_code == 200


def _nats_returns(server: NatsServer, url: str) -> None:
    """Start NATS again; the sidecar reconnects and keeps placing."""
    server.start()
    assert eventually(lambda: "kubemoot_nats_connected 1.0" in
                      httpx.get(f"{url}/metrics").text, timeout_s=15)
    assert chat(url, "qwen3:8b").status_code == 200


def test_sidecar_keeps_placing_while_nats_is_down(sim_factory: Sims,
                                                  sidecar_factory: Sidecars) -> None:
    server = NatsServer().start()
    try:
        gpu = sim_factory("gpu", time_scale=SCALE)
        url = sidecar_factory([gpu], nats_url=server.url, probe_interval_seconds=0.2).url
        assert chat(url, "qwen3:8b").status_code == 200
        server.stop()
        assert eventually(lambda: "kubemoot_nats_connected 0.0" in
                          httpx.get(f"{url}/metrics").text)
        r = chat(url, "qwen3:8b")
        assert r.status_code == 200 and r.headers["x-kubemoot-provider"] == "gpu"
        assert httpx.get(f"{url}/readyz").status_code == 200
        _nats_returns(server, url)
    finally:
        server.cleanup()


def test_while_nats_is_down_no_load_is_started_and_one_waits_for_nats(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Other sidecars' loads reach a sidecar only by probe while NATS is down, and a load
    shows in /api/ps only once loaded: a load it planned alone could take room another is
    loading into (Ollama then evicts on its own). It waits for NATS (tests/e2e/
    test_nats_outages.py), here past its 1 s limit; the loaded copy still serves."""
    server = NatsServer().start()
    try:
        gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE)
        url = sidecar_factory([gpu], nats_url=server.url, probe_interval_seconds=60,
                              discuss_gpu_wait_limit_seconds=1).url
        assert chat(url, "llama3.2:3b").status_code == 200
        server.stop()
        assert eventually(lambda: "kubemoot_nats_connected 0.0" in
                          httpx.get(f"{url}/metrics").text)
        r = chat(url, "qwen3:14b")
        assert (r.status_code, r.json()["reason"]) == (503, "gpu-busy"), r.text
        assert "NATS" in r.json()["error"]
        assert chat(url, "llama3.2:3b").headers["x-kubemoot-placement"] == "warm"
        assert gpu.sim.stats.requests_by_model.get("qwen3:14b", 0) == 0
        assert gpu.sim.stats.oom_events == 0 and gpu.sim.stats.self_evictions == 0
    finally:
        server.cleanup()


def test_a_call_in_flight_when_nats_goes_down_leaves_no_phantom_ticket(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    server = NatsServer().start()
    try:
        gpu = sim_factory("gpu", time_scale=SCALE)  # one slot
        url = sidecar_factory([gpu], nats_url=server.url, probe_interval_seconds=0.2).url
        assert chat(url, "qwen3:8b").status_code == 200
        started = threading.Event()
        streaming = stream_in_background(url, "qwen3:8b", 2000, started)
        server.stop()
        streaming.join(30)
        # Its release could not be written; the slot is free here anyway, not for the
        # ticket's 60 s TTL.
        began = time.monotonic()
        r = chat(url, "qwen3:8b", timeout=20)
        assert r.status_code == 200 and time.monotonic() - began < 5
        _nats_returns(server, url)
        tickets = httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"]
        assert eventually(lambda: not httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"]
                          ), tickets
    finally:
        server.cleanup()


def test_a_call_longer_than_the_ticket_ttl_keeps_its_ticket(sim_factory: Sims,
                                                            sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", time_scale=0.1)  # 2 ms per token
    url = sidecar_factory([gpu], ticket_ttl_seconds=5).url
    started = threading.Event()
    streaming = stream_in_background(url, "qwen3:8b", 3200, started)  # ~6.4 s
    time.sleep(5.6)  # past the TTL: only the renewal sweep keeps it counted
    assert len(httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"]) == 1
    streaming.join(20)
    assert eventually(lambda: not httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"])


def test_a_ticket_names_its_holders_crew_in_every_sidecars_book(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_url: str) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    crewed = sidecar_factory([gpu], nats_url=nats_url, agent_name="one", crew="pilot").url
    other = sidecar_factory([gpu], nats_url=nats_url, agent_name="two").url
    leave = threading.Event()
    streaming = stream_in_background(crewed, "qwen3:8b", 2000, threading.Event(), leave)
    seen = lambda: httpx.get(f"{other}/kubemoot/v1/state").json()["tickets"]  # noqa: E731
    assert eventually(lambda: [(t["holder"], t.get("crew")) for t in seen()] == [
        ("default/one", "pilot")]), seen()
    leave.set()
    streaming.join(20)


class SlowWrites(MemoryStore):
    """The embedded store with a round trip on every write, as NATS has."""

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        await asyncio.sleep(0.02)
        return await super().cas(bucket, key, value, last_revision)


def test_calls_decide_knowing_the_claims_still_on_their_way(sim_factory: Sims) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)  # one slot
    httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"})
    settings = load_settings(providers=[provider_entry(gpu)])
    server = ThreadedServer(build_app(settings, SlowWrites()), name="sidecar").start()
    try:
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda _: chat(server.url, "qwen3:8b"), range(4)))
        assert [r.status_code for r in replies] == [200] * 4
        # Each decision counted the others' claims while their writes were in flight, so no
        # claim was refused for a slot another call had just taken.
        metrics = httpx.get(f"{server.url}/metrics").text
        assert 'kubemoot_ticket_claims_total{result="won"} 4.0' in metrics
        assert 'result="refused"' not in metrics
        assert gpu.sim.stats.loads == 1  # the warm-up; nobody loaded a second copy
    finally:
        server.stop()


class NextTurnWrites(MemoryStore):
    """A store whose writes leave on the loop's next turn, as nats-py's flusher sends them;
    it notes when each one goes."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        await asyncio.sleep(0)
        self.events.append("sent")
        return await super().cas(bucket, key, value, last_revision)


async def test_a_burst_of_calls_does_not_hold_back_the_first_claim(
        sim_factory: Sims, monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.service import scheduler as scheduler_module
    from proxy.service.routing import CallOutcome, CallRequest, Granted

    gpu = sim_factory("gpu", time_scale=SCALE, num_parallel=8, context_length=2048)
    async with httpx.AsyncClient() as client:  # loaded: every call can join it
        await client.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"})
    events: list[str] = []
    place = scheduler_module.place

    def noted_place(*args: Any) -> Any:
        events.append("decided")
        return place(*args)

    monkeypatch.setattr(scheduler_module, "place", noted_place)
    app = build_app(load_settings(providers=[provider_entry(gpu)]), NextTurnWrites(events))
    async with app.router.lifespan_context(app):
        events.clear()
        routes = await asyncio.gather(*(app.state.scheduler.place_call(
            CallRequest("/api/chat", "qwen3:8b")) for _ in range(8)))
        calls = app.state.api.calls
        for granted in routes:
            assert isinstance(granted, Granted) and granted.attempt.placement == "warm"
            assert granted.claimed is not None
            await calls.settle(granted.claimed, CallRequest("/api/chat", "qwen3:8b"), 0,
                               CallOutcome(True, 0.01))
    # Eight calls arrived in one loop turn; the first claim left before the second decision
    # (decided all at once, every call would wait for all eight decisions).
    assert events[:3] == ["decided", "sent", "decided"], events
    assert events.count("decided") == 8


def test_explain_is_a_dry_run(sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564)
    url = sidecar_factory([gpu]).url
    r = httpx.get(f"{url}/kubemoot/v1/explain", params={"model": "qwen3:14b",
                                                        "promptChars": 7000})
    data = r.json()
    assert data["decision"]["outcome"] == "placed"
    assert data["decision"]["placement"]["kind"] == "cold"
    assert data["promptTokens"] == 2000
    assert data["verdicts"][0]["feasible"] and "load" in data["verdicts"][0]["terms"]
    assert not httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"]  # nothing claimed
    assert httpx.get(f"{url}/kubemoot/v1/explain",
                     params={"promptChars": "x"}).status_code == 400


def test_a_client_that_gives_up_while_waiting_is_never_placed(sim_factory: Sims,
                                                              sidecar_factory: Sidecars
                                                              ) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE)
    url = sidecar_factory([gpu], discuss_gpu_wait_limit_seconds=30).url
    leave = threading.Event()
    worker = stream_in_background(url, "qwen3:8b", 20000, threading.Event(), leave)
    with pytest.raises(httpx.ReadTimeout):
        chat(url, "qwen3:14b", timeout=0.2)  # waits for memory, then the client leaves
    assert eventually(lambda: not waiting_calls(url, "qwen3:14b"))
    leave.set()
    worker.join(30)
    time.sleep(0.3)  # the release has happened; an abandoned waiter would be placed now
    assert "qwen3:14b" not in gpu.sim.stats.requests_by_model
    assert not httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"]


def test_sidecar_starts_without_nats_and_joins_it_later(sim_factory: Sims,
                                                        sidecar_factory: Sidecars) -> None:
    server = NatsServer().start()
    server.stop()  # the port is known; nothing listens yet
    try:
        gpu = sim_factory("gpu", time_scale=SCALE)
        httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"}, timeout=30)
        url = sidecar_factory([gpu], nats_url=server.url, probe_interval_seconds=0.2).url
        r = chat(url, "qwen3:8b")  # direct probes, a local ticket (no load: none alone)
        assert (r.status_code, r.headers["x-kubemoot-placement"]) == (200, "warm")
        assert httpx.get(f"{url}/readyz").status_code == 200
        _nats_returns(server, url)
    finally:
        server.cleanup()


def test_embeddings_are_placed_too(sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """An embedding model that pools the last token (qwen3-embedding's shape): llama-server
    splits its input over batches, so the context alone bounds it."""
    from tests.integration.test_sim_embeddings import MODELS, QWEN_EMBED

    gpus = [sim_factory("a", total_vram_mib=16376, context_length=2048, models=MODELS,
                        time_scale=SCALE),
            sim_factory("b", total_vram_mib=24564, context_length=8192, models=MODELS,
                        time_scale=SCALE)]
    url = sidecar_factory(gpus).url
    client = ollama.Client(host=url)
    model = QWEN_EMBED.name
    out = client.embed(model=model, input=["first text", "second text"])
    assert len(out.embeddings) == 2 and out.model == model
    assert client.embeddings(model=model, prompt="legacy").embedding
    for path, body in (("/api/embed", {"input": "hi"}), ("/api/embeddings", {"prompt": "hi"}),
                       ("/v1/embeddings", {"input": "hi"})):  # `stream` ignored, as Ollama does
        said = httpx.post(f"{url}{path}", json={"model": model, "stream": False, **body})
        assert said.status_code == 200, (path, said.text)
    long_text = "word " * 4000  # ~5.7k tokens: only the 8k card holds it whole
    r = httpx.post(f"{url}/api/embed", json={"model": model, "input": [long_text, "x"]})
    assert r.status_code == 200 and r.headers["x-kubemoot-provider"] == "b"
    too_long = httpx.post(f"{url}/api/embed", json={"model": model, "input": "word " * 8000})
    assert too_long.status_code == 413 and too_long.json()["reason"] == "prompt-too-large"
    assert all(g.sim.stats.truncations == 0 for g in gpus)


def test_a_pull_of_a_present_model_succeeds_and_the_rest_is_refused(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    url = sidecar_factory([sim_factory("a")]).url
    client = ollama.Client(host=url)
    assert client.pull("qwen3:8b").status == "success"  # on a provider already: nothing to do
    assert [p.status for p in client.pull("qwen3:8b", stream=True)][-1] == "success"
    with pytest.raises(ollama.ResponseError) as info:
        client.pull("mistral:7b")
    assert info.value.status_code == 501 and "each provider" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.delete("qwen3:8b")
    assert info.value.status_code == 501 and "each provider" in info.value.error
