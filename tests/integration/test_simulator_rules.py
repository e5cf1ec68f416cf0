"""The simulator is the Ollama the sidecar is tested against: these pin it to what Ollama's
source does (not to what the sidecar expects), over real HTTP, one rule each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from loadtest.ollama_sim import SimServer
from loadtest.sim_engine import INPUT_TOO_LONG, PROMPT_TOO_LONG
from loadtest.sim_model import CATALOG
from tests.conftest import eventually

Sims = Callable[..., SimServer]
SCALE = 0.002


def load(sim: SimServer, model: str, **options: Any) -> httpx.Response:
    body: dict[str, Any] = {"model": model}
    if options:
        body["options"] = options
    return httpx.post(f"{sim.url}/api/generate", json=body, timeout=30)


def ps(sim: SimServer) -> dict[str, dict[str, Any]]:
    return {m["model"]: m for m in httpx.get(f"{sim.url}/api/ps").json()["models"]}


def chat(sim: SimServer, model: str, text: str, **body: Any) -> httpx.Response:
    payload = {"model": model, "messages": [{"role": "user", "content": text}],
               "stream": False, **body}
    return httpx.post(f"{sim.url}/api/chat", json=payload, timeout=30)


def test_a_copy_takes_weights_kv_and_compute_by_its_architecture(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", total_vram_mib=24564, num_parallel=2, time_scale=SCALE)
    load(sim, "qwen3:8b")  # default on 24 GiB: 32768 per slot, 2 slots
    copy = ps(sim)["qwen3:8b"]
    # 5200 x 0.97 on the GPU + 144 KiB x 65536 + 256 + 2048 (a 2048 batch above 32768 tokens)
    assert copy["size_vram"] == copy["size"] == (5044 + 9216 + 256 + 2048) * 2**20
    assert copy["context_length"] == 32768


def test_ollama_reloads_a_copy_for_other_load_options_but_not_for_equal_ones(
        sim_factory: Sims) -> None:
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=8192, time_scale=SCALE)
    load(sim, "qwen3:8b")
    load(sim, "qwen3:8b", num_ctx=8192)  # equal, if explicit
    load(sim, "qwen3:8b", num_ctx=65536)  # capped at the trained 40960: differs
    assert sim.sim.stats.reloads == 1 and ps(sim)["qwen3:8b"]["context_length"] == 40960
    load(sim, "qwen3:8b", num_ctx=40960)
    load(sim, "qwen3:8b", num_ctx=40960, num_batch=1024)  # not the batch it was loaded with
    assert sim.sim.stats.reloads == 2
    load(sim, "qwen3:8b", num_ctx=40960, num_batch=1024, num_gpu=-1)  # num_gpu < 0: ignored
    assert sim.sim.stats.reloads == 2


def test_ollama_0_12_compares_num_ctx_as_requested(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", total_vram_mib=24564, version="0.12.6", time_scale=SCALE)
    load(sim, "phi3:mini", num_ctx=8192)  # trained for 4096; recorded as asked
    assert ps(sim)["phi3:mini"]["context_length"] == 8192
    load(sim, "phi3:mini")  # the default 4096 differs from the recorded 8192
    assert sim.sim.stats.reloads == 1


def test_beside_other_models_ollama_admits_a_load_within_80_percent_of_free_memory(
        sim_factory: Sims) -> None:
    new = sim_factory("new", total_vram_mib=16000, context_length=4096, time_scale=SCALE)
    old = sim_factory("old", total_vram_mib=16000, context_length=4096, version="0.12.6",
                      time_scale=SCALE)
    for sim in (new, old):
        load(sim, "phi3:mini")
        load(sim, "qwen3:14b")  # estimate 9940 MiB, 12097 free: 80 % is 9677
    assert new.sim.stats.self_evictions == 1 and sorted(ps(new)) == ["qwen3:14b"]
    assert old.sim.stats.self_evictions == 0 and sorted(ps(old)) == ["phi3:mini", "qwen3:14b"]


def test_a_model_that_does_not_fit_alone_is_loaded_partly_into_cpu_memory(
        sim_factory: Sims) -> None:
    sim = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE)
    load(sim, "qwen3:14b", num_ctx=40960)
    copy = ps(sim)["qwen3:14b"]
    assert copy["size_vram"] < copy["size"] and sim.sim.stats.spills == 1


def test_one_load_at_a_time_and_a_full_queue_is_server_busy(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", total_vram_mib=24564, max_queue=0, time_scale=SCALE)
    r = load(sim, "qwen3:8b")
    assert r.status_code == 503 and "server busy" in r.json()["error"]


def test_an_embedding_model_gets_one_slot(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", total_vram_mib=24564, num_parallel=4, context_length=2048,
                      time_scale=SCALE)
    r = httpx.post(f"{sim.url}/api/embed", json={"model": "nomic-embed-text", "input": "x"})
    assert r.status_code == 200
    runner = sim.sim.runners["nomic-embed-text:latest"]
    assert runner.slot_count == 1
    show = httpx.post(f"{sim.url}/api/show", json={"model": "nomic-embed-text"}).json()
    assert show["capabilities"] == ["embedding"]
    assert "nomic-bert.pooling_type" in show["model_info"]


@pytest.mark.parametrize(("version", "body", "status", "message", "cut"), [
    # 0.30+: a prompt of num_ctx tokens or more is halved (context shift), or refused
    ("0.33.0", {}, 200, None, True),
    ("0.33.0", {"truncate": False}, 400, "exceeds the available context size", False),
    ("0.33.0", {"shift": False}, 400, PROMPT_TOO_LONG, False),
    # 0.12: keep num_keep tokens and fill the context; refused with truncate false
    ("0.12.6", {}, 200, None, True),
    ("0.12.6", {"truncate": False}, 400, INPUT_TOO_LONG, False),
])
def test_an_over_long_prompt_is_cut_or_refused_as_the_version_does(
        sim_factory: Sims, version: str, body: dict[str, Any], status: int,
        message: str | None, cut: bool) -> None:
    sim = sim_factory("gpu", total_vram_mib=16376, context_length=2048, version=version,
                      time_scale=SCALE)
    r = chat(sim, "qwen3:8b", "w " * 6000, **body)  # ~3000 tokens
    assert r.status_code == status, r.text
    if message is not None:
        assert message in r.json()["error"]
    assert (sim.sim.stats.truncations == 1) is cut
    if cut:
        kept = r.json()["prompt_eval_count"]
        assert kept == (2048 if version == "0.12.6" else 2048 - (2048 - 5) // 2)


@pytest.mark.parametrize(("version", "path", "body", "status", "message"), [
    ("0.33.0", "/api/embed", {}, 200, None),
    ("0.33.0", "/api/embed", {"truncate": False}, 400, INPUT_TOO_LONG),
    ("0.33.0", "/api/embeddings", {}, 500, INPUT_TOO_LONG),
    ("0.12.6", "/api/embed", {}, 200, None),
    ("0.12.6", "/api/embed", {"truncate": False}, 400, "input exceeds maximum context length"),
    ("0.12.6", "/api/embeddings", {}, 500, f"failed to create new sequence: {INPUT_TOO_LONG}"),
])
def test_an_over_long_embedding_input_is_cut_only_where_ollama_cuts_it(
        sim_factory: Sims, version: str, path: str, body: dict[str, Any], status: int,
        message: str | None) -> None:
    sim = sim_factory("gpu", version=version, time_scale=SCALE)
    text = "w " * 6000  # 3000 tokens at 4 characters each; nomic-embed-text holds 2048
    field = "input" if path == "/api/embed" else "prompt"
    r = httpx.post(f"{sim.url}{path}", timeout=30,
                   json={"model": "nomic-embed-text", field: text, **body})
    assert r.status_code == status, r.text
    assert message is None or r.json()["error"] == message
    assert sim.sim.stats.truncations == (1 if message is None else 0)


def test_images_skip_ollamas_own_cut_and_llama_server_refuses(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", total_vram_mib=16376, context_length=2048, time_scale=SCALE)
    r = httpx.post(f"{sim.url}/api/chat", timeout=30, json={
        "model": "qwen3:8b", "stream": False,
        "messages": [{"role": "user", "content": "look", "images": ["aW1n"] * 3}]})
    assert r.status_code == 400 and "n_prompt_tokens" in r.json()["error"]


def test_load_duration_covers_the_load_not_the_wait_for_a_slot(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, tokens_per_s=20,
                      time_scale=0.05)
    load(sim, "llama3.2:3b")
    slow = {"model": "llama3.2:3b", "prompt": "hi", "stream": False,
            "options": {"num_predict": 40}}
    with httpx.Client(timeout=30) as client:
        import threading

        first = threading.Thread(target=client.post, args=(f"{sim.url}/api/generate",),
                                 kwargs={"json": slow})
        first.start()
        second = client.post(f"{sim.url}/api/generate", json=slow).json()
        first.join()
    # the second waited ~0.1 s for the one slot; its load_duration says nothing of it
    assert second["load_duration"] < 0.02 * 1e9


def test_a_client_that_leaves_during_its_load_aborts_it(sim_factory: Sims) -> None:
    """Ollama loads for the request that asked and aborts when its connection closes
    (llm/llama_server.go:1299-1301, server/sched.go:733-739): no copy is left behind."""
    sim = sim_factory("gpu", total_vram_mib=24564, time_scale=0.5)  # qwen3:14b: ~5 s
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sim.url}/api/generate", timeout=0.5,
                   json={"model": "qwen3:14b", "prompt": "hi", "stream": False})
    assert eventually(lambda: sim.sim.stats.aborted_loads == 1)
    assert "qwen3:14b:latest" not in sim.sim.runners and "qwen3:14b" not in sim.sim.runners
    assert sim.sim.used_vram_mib() == 0


def test_the_catalog_is_what_ollamas_converters_write(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", time_scale=SCALE)
    info = httpx.post(f"{sim.url}/api/show", json={"model": "phi3:mini"}).json()["model_info"]
    assert "phi3.attention.key_length" not in info  # phi3's converter writes none
    assert info["phi3.attention.head_count_kv"] == 32
    assert {m.name for m in CATALOG} >= {"qwen3:32b", "qwen3:14b", "qwen3:8b", "phi3:mini"}


SYSTEM = {"role": "system", "content": "You are a careful agent. " * 200}  # ~1250 tokens


def turn(sim: SimServer, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{sim.url}/api/chat", timeout=30, json={
        "model": "qwen3:8b", "messages": messages, "stream": False,
        "options": {"num_predict": 4}, **body})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def conversation(topic: str, turns: int, system: bool = True) -> list[dict[str, Any]]:
    """A tool loop's history: the agent's system prompt, the task, then calls and results."""
    messages = [SYSTEM] if system else []
    messages.append({"role": "user", "content": f"{topic}: " + "go on " * 400})
    for i in range(turns):
        messages += [{"role": "assistant", "content": f"calling tool {i}"},
                     {"role": "tool", "content": f"{topic} result {i} " + "data " * 300}]
    return messages


def evaluated(sim: SimServer, messages: list[dict[str, Any]], **body: Any) -> int:
    """The prompt tokens the copy evaluated for one call (the simulator's own count)."""
    before = sim.sim.stats.evaluated_tokens
    turn(sim, messages, **body)
    return sim.sim.stats.evaluated_tokens - before


def test_a_conversations_next_call_on_the_same_copy_evaluates_only_the_tail(
        sim_factory: Sims) -> None:
    sim = sim_factory("gpu", context_length=32768, time_scale=SCALE)
    first = evaluated(sim, conversation("a", 1))
    tail = evaluated(sim, conversation("a", 2))
    # the whole first prompt was cached; what the second added is one call and its result
    assert first > 2000 and 0 < tail < 500
    assert sim.sim.stats.cache_hits == 1
    assert sim.sim.stats.cached_tokens == first


def test_another_conversation_taking_the_only_slot_wipes_it(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", context_length=32768, time_scale=SCALE)
    evaluated(sim, conversation("a", 1))
    evaluated(sim, [{"role": "user", "content": "b " * 3000}])  # shares only the first token
    again = conversation("a", 2)
    assert evaluated(sim, again) == sim.sim.chat_prompt({"messages": again}).total


@pytest.mark.parametrize(("version", "both_kept"), [
    ("0.33.0", True),  # llama-server: an empty slot before one that holds only the BOS
    # Ollama 0.12's runner: the slot with the longest common prefix, and a used slot shares
    # the first token: b takes a's slot and the second stays empty
    ("0.12.6", False),
])
def test_two_slots_keep_two_interleaved_conversations_as_the_version_does(
        sim_factory: Sims, version: str, both_kept: bool) -> None:
    sim = sim_factory("gpu", context_length=32768, num_parallel=2, version=version,
                      time_scale=SCALE)
    evaluated(sim, conversation("a", 1, system=False))
    evaluated(sim, conversation("b", 1, system=False))
    assert (evaluated(sim, conversation("a", 2, system=False)) < 500) is both_kept
    assert (evaluated(sim, conversation("b", 2, system=False)) < 500) is both_kept


@pytest.mark.parametrize("version", ["0.33.0", "0.12.6"])
def test_a_conversation_sharing_the_system_prompt_takes_the_slot_that_holds_it(
        sim_factory: Sims, version: str) -> None:
    """0.12's longest common prefix and llama-server's similarity both pick the slot that
    holds the shared system prompt over an empty one: the first conversation's history
    goes."""
    sim = sim_factory("gpu", context_length=32768, num_parallel=2, version=version,
                      time_scale=SCALE)
    evaluated(sim, conversation("a", 1))
    system = sim.sim.chat_prompt({"messages": [SYSTEM]}).total + 1
    b = conversation("b", 1)
    assert evaluated(sim, b) == sim.sim.chat_prompt({"messages": b}).total + 1 - system
    a = conversation("a", 2)
    assert evaluated(sim, a) == sim.sim.chat_prompt({"messages": a}).total + 1 - system


def test_llama_server_gives_an_unrelated_conversation_the_least_recently_used_slot(
        sim_factory: Sims) -> None:
    sim = sim_factory("gpu", context_length=32768, num_parallel=2, time_scale=SCALE)
    evaluated(sim, conversation("a", 1, system=False))  # slot 0
    evaluated(sim, conversation("b", 1, system=False))  # slot 1
    evaluated(sim, conversation("a", 2, system=False))  # slot 0 again, now the newest
    evaluated(sim, [{"role": "user", "content": "c " * 3000}])
    # nothing shares enough of c: it took b's slot, the least recently used
    assert evaluated(sim, conversation("a", 3, system=False)) < 500
    b = conversation("b", 2, system=False)
    assert evaluated(sim, b) == sim.sim.chat_prompt({"messages": b}).total


def test_a_reload_wipes_every_slot(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", context_length=32768, num_parallel=2, time_scale=SCALE)
    evaluated(sim, conversation("a", 1))
    load(sim, "qwen3:8b", num_ctx=16384)  # other load options: a new runner
    assert sim.sim.stats.reloads == 1
    again = conversation("a", 2)
    assert evaluated(sim, again, options={"num_ctx": 16384, "num_predict": 4}) == \
        sim.sim.chat_prompt({"messages": again}).total + 1


@pytest.mark.parametrize(("version", "counts_cached"), [
    ("0.12.6", True),  # numPromptInputs: the whole prompt
    ("0.30.0", False),  # llama-server's prompt_n: the tokens evaluated
    ("0.33.0", True),  # cache_n + prompt_n
])
def test_prompt_eval_count_counts_cached_tokens_as_the_version_does(
        sim_factory: Sims, version: str, counts_cached: bool) -> None:
    sim = sim_factory("gpu", context_length=32768, version=version, time_scale=SCALE)
    turn(sim, conversation("a", 1))
    messages = conversation("a", 2)
    whole = sim.sim.chat_prompt({"messages": messages}).total + 1  # and the BOS
    count = turn(sim, messages)["prompt_eval_count"]
    assert (count == whole) is counts_cached
    assert count == whole or count < 500
