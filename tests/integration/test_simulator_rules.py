"""The simulator is the Ollama the sidecar is tested against: these pin it to what Ollama's
source does (not to what the sidecar expects), over real HTTP, one rule each."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest

from loadtest.ollama_sim import SimServer
from loadtest.sim_engine import (
    INPUT_TOO_LONG,
    PARSE_ERROR,
    PROMPT_TOO_LONG,
    commits_before_read,
)
from loadtest.sim_model import CATALOG, WINDOWED_MODELS
from proxy.adapters.ollama import OllamaClient
from proxy.core.sizing import weights_floor_mib
from proxy.ports import UpstreamError
from proxy.service.prober import model_info
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
    # 5200 less its Q4_K token table (151936 x 4096 x 4.5 bits, kept on the CPU) on the GPU
    # + 144 KiB x 65536 + compute: a batch of 512's logits and hidden states, 4 x 512 x
    # (4096 + 151936) B = 304.75 MiB, and 2048 (a 2048 batch above 32768 tokens)
    weights = 5200 - 151936 * 4096 * 144 / 256 / 2**20
    compute = math.ceil(4 * 512 * (4096 + 151936) / 2**20) + 2048
    assert copy["size_vram"] == copy["size"] == math.ceil(weights + 9216 + compute) * 2**20
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


@pytest.mark.parametrize(("version", "listed"), [
    ("0.15.4", 8192), ("0.15.5", 4096), ("0.24.0", 4096), ("0.30.0", 4096)])
def test_ollama_lists_the_context_a_copy_runs_at_from_0_15_5(
        sim_factory: Sims, version: str, listed: int) -> None:
    """Every version runs a copy at most at the trained context (llm/server.go NewLlamaServer,
    v0.12.6 :172-176, v0.15.5 :166-170, either engine); /api/ps says so from 0.15.5
    (llmServer.ContextLength, v0.15.5 server/routes.go:1914), before that it lists the
    num_ctx asked for (v0.15.4 server/routes.go:1901)."""
    sim = sim_factory("gpu", total_vram_mib=24564, version=version, time_scale=SCALE)
    load(sim, "phi3:mini", num_ctx=8192)  # trained for 4096
    assert sim.sim.runners["phi3:mini"].ctx == 4096
    assert ps(sim)["phi3:mini"]["context_length"] == listed


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
    """pendingReqCh holds OLLAMA_MAX_QUEUE calls beside the one processPending is loading
    for (server/sched.go:91-95, 205-207): with 1, a third call is refused."""
    sim = sim_factory("gpu", total_vram_mib=24564, max_queue=1, time_scale=0.05)
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(load, sim, "qwen3:8b")  # loading for ~0.8 s
        assert eventually(lambda: sim.sim._pending == 1)
        second = pool.submit(load, sim, "qwen3:8b")  # waits in the queue
        assert eventually(lambda: sim.sim._pending == 2)
        third = load(sim, "qwen3:8b")
        assert first.result().status_code == second.result().status_code == 200
    assert third.status_code == 503 and "server busy" in third.json()["error"]


@pytest.mark.parametrize(("version", "new_engine", "own_engine"), [
    # v0.12.6: qwen3 and gemma3 require Ollama's own engine (fs/ggml/ggml.go:241-253); llama
    # takes it with OLLAMA_NEW_ENGINE; phi3 and nomic-bert ("nomic-bert_embed") have no model
    # there
    ("0.12.6", False, {"qwen3:32b", "qwen3:14b", "qwen3:8b", "gemma3:27b"}),
    ("0.12.6", True, {"qwen3:32b", "qwen3:14b", "qwen3:8b", "llama3.2:3b", "gemma3:27b"}),
    ("0.11.4", True, set()),  # no commit before 0.11.5 (not modelled)
    ("0.30.0", True, set()),  # llama-server for every GGUF model
])
def test_which_of_the_catalog_commits_its_memory_before_reading_its_weights(
        version: str, new_engine: bool, own_engine: set[str]) -> None:
    assert {m.name for m in CATALOG
            if commits_before_read(m.arch, m.embedding, version, new_engine)} == own_engine


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


@pytest.mark.parametrize(("version", "body", "reason", "shifted", "reloads"), [
    # 0.12: each call's own shift (runner/ollamarunner/runner.go:526-537), no reload
    ("0.12.6", {}, "stop", True, 0),
    ("0.12.6", {"shift": False}, "length", False, 0),
    # 0.30+: the copy's (--context-shift); another value reloads it (server/sched.go:1413-1419)
    ("0.33.0", {}, "stop", True, 0),
    ("0.33.0", {"shift": False}, "length", False, 1),
])
def test_an_answer_that_reaches_the_end_of_the_context_shifts_or_stops(
        sim_factory: Sims, version: str, body: dict[str, Any], reason: str, shifted: bool,
        reloads: int) -> None:
    sim = sim_factory("gpu", total_vram_mib=16376, context_length=2048, version=version,
                      time_scale=SCALE)
    assert load(sim, "qwen3:8b").status_code == 200
    r = chat(sim, "qwen3:8b", "w " * 200, options={"sim_answer_tokens": 3000}, **body)
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["done_reason"] == reason
    assert (sim.sim.stats.truncations == 1) is shifted
    assert sim.sim.stats.reloads == reloads
    if not shifted:  # it filled the context, no further
        assert done["prompt_eval_count"] + done["eval_count"] == 2048


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


def test_show_gives_the_files_key_values_arrays_only_when_verbose(sim_factory: Sims) -> None:
    """/api/show's model_info is the GGUF's key-values (server/routes.go GetModelInfo), read
    with maxArraySize 0 unless verbose (getModelData): the token lists are null, and
    `tensors` is there either way."""
    sim = sim_factory("gpu", time_scale=SCALE)

    def show(**body: Any) -> dict[str, Any]:
        shown: dict[str, Any] = httpx.post(f"{sim.url}/api/show",
                                           json={"model": "phi3:mini", **body}).json()
        return shown

    info, verbose = show()["model_info"], show(verbose=True)
    assert info["general.file_type"] == 15 and info["phi3.feed_forward_length"] == 8192
    assert info["phi3.rope.dimension_count"] == 96
    assert info["phi3.attention.layer_norm_rms_epsilon"] == 1e-5
    assert info["tokenizer.ggml.model"] == "llama" and info["tokenizer.ggml.eos_token_id"] == 32000
    assert info["tokenizer.ggml.tokens"] is None and info["tokenizer.ggml.scores"] is None
    tokens = verbose["model_info"]["tokenizer.ggml.tokens"]
    assert len(tokens) == len(verbose["model_info"]["tokenizer.ggml.token_type"]) == 32064
    names = {t["name"] for t in verbose["tensors"]}
    assert names >= {"token_embd.weight", "blk.31.ffn_down.weight"}
    assert show()["tensors"] == verbose["tensors"]


def test_show_gives_each_familys_vocabulary_and_the_sidecars_floor_stays_under_it(
        sim_factory: Sims) -> None:
    """<arch>.vocab_size is the family's (Qwen3 151936, Llama 3 128256, Phi-3 32064, Gemma 3
    262144); the sidecar's weights floor (the file less an f16 table of that vocabulary) is
    never above what the simulator's copy puts on the GPU (the file less its quantised table,
    or all of it when the output is tied)."""
    sim = sim_factory("gpu", models=(*CATALOG, *WINDOWED_MODELS), time_scale=SCALE)
    vocab = {"qwen3:8b": 151936, "llama3.2:3b": 128256, "phi3:mini": 32064,
             "gemma3:27b": 262144}
    for model in (*CATALOG, *WINDOWED_MODELS):
        shown = httpx.post(f"{sim.url}/api/show", json={"model": model.name}).json()
        if model.name in vocab:
            assert shown["model_info"][f"{model.arch}.vocab_size"] == vocab[model.name]
        floor = weights_floor_mib(model_info(shown), model.disk_mib)
        assert 0 < floor <= model.gpu_weights_mib < model.disk_mib + 1, model.name


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


# -- keep_alive ------------------------------------------------------------------------------
def test_a_call_without_keep_alive_leaves_the_copys_own(sim_factory: Sims) -> None:
    """Only a call that sets keep_alive changes a loaded copy's (server/sched.go:483-485); the
    default is for a load (:512-515)."""
    sim = sim_factory("gpu", time_scale=SCALE)
    r = httpx.post(f"{sim.url}/api/generate", json={"model": "llama3.2:3b", "keep_alive": -1})
    assert r.status_code == 200
    assert chat(sim, "llama3.2:3b", "hi").status_code == 200
    assert sim.sim.runners["llama3.2:3b"].keep_alive_s == math.inf
    expires = ps(sim)["llama3.2:3b"]["expires_at"]
    assert int(expires[:4]) > time.gmtime().tm_year + 100  # forever, not 5 minutes


def test_a_copy_kept_forever_expires_when_go_says(sim_factory: Sims) -> None:
    """A negative keep_alive is math.MaxInt64 ns (api/types.go:1227, 1237); /api/ps shows
    time.Now().Add of it (server/sched.go:320-324, routes.go:2155): 292 years, 3 months and
    a bit (2026-12-03 + it is 2319-03-15, as a real v0.12.6 and v0.24.0 say)."""
    sim = sim_factory("gpu", time_scale=SCALE)
    r = httpx.post(f"{sim.url}/api/generate", json={"model": "llama3.2:3b", "keep_alive": "-5m"})
    assert r.status_code == 200
    stamp = ps(sim)["llama3.2:3b"]["expires_at"].replace("Z", "+00:00")
    ahead = datetime.fromisoformat(stamp) - datetime.now(UTC)
    assert abs(ahead.total_seconds() - (2**63 - 1) / 1e9) < 60


@pytest.mark.parametrize(("keep_alive", "status", "message"), [
    ("300", 400, 'time: missing unit in duration "300"'),
    ("-1", 400, 'time: missing unit in duration "-1"'),
    ("5 m", 400, 'time: unknown unit " m" in duration "5 m"'),
    ("", 400, 'time: invalid duration ""'),
    (True, 400, "Unsupported type: 'bool'"),
    ([300], 400, "Unsupported type: '[]interface {}'"),
    ({"s": 1}, 400, "Unsupported type: 'map[string]interface {}'"),
    (None, 200, None),
    ("0", 200, None),
    ("1h30m", 200, None),
    ("-1s", 200, None),
    (300, 200, None),
])
def test_keep_alive_strings_are_read_as_gos_time_parse_duration(
        sim_factory: Sims, keep_alive: Any, status: int, message: str | None) -> None:
    sim = sim_factory("gpu", time_scale=SCALE)
    r = httpx.post(f"{sim.url}/api/generate", timeout=30,
                   json={"model": "llama3.2:3b", "keep_alive": keep_alive})
    assert r.status_code == status, r.text
    if message is not None:
        assert r.json() == {"error": message}


def test_embed_honours_keep_alive(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", time_scale=SCALE)
    r = httpx.post(f"{sim.url}/api/embed", timeout=30,
                   json={"model": "nomic-embed-text", "input": "x", "keep_alive": 0})
    assert r.status_code == 200
    assert sim.sim.stats.loads == 1 and ps(sim) == {}


def test_an_unload_of_a_copy_still_loading_is_ignored(sim_factory: Sims) -> None:
    """expireRunner looks only at s.loaded (server/sched.go:1713-1731), which a copy joins
    once loaded (:627, 727): it finishes loading and stays."""
    sim = sim_factory("gpu", total_vram_mib=24564, time_scale=0.05)
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(load, sim, "qwen3:8b")
        assert eventually(lambda: "qwen3:8b" in sim.sim.runners)
        r = httpx.post(f"{sim.url}/api/generate", json={"model": "qwen3:8b", "keep_alive": 0})
        assert r.json()["done_reason"] == "unload"
        assert loading.result().status_code == 200
    assert "qwen3:8b" in ps(sim) and sim.sim.used_vram_mib() > 0


def test_an_unload_of_a_copy_0_12_lists_while_loading_waits_for_it_then_unloads_it(
        sim_factory: Sims) -> None:
    """0.12's own engine puts the copy in s.loaded while it reads its weights, its refMu
    held until it runs (v0.12.6 server/sched.go:470-487): expireRunner waits for that lock,
    then the copy goes once the call that loaded it ends (:809-825)."""
    sim = sim_factory("gpu", total_vram_mib=24564, version="0.12.11", time_scale=0.05)
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(load, sim, "qwen3:8b")
        assert eventually(lambda: "qwen3:8b" in ps(sim))
        assert not sim.sim.runners["qwen3:8b"].loaded.is_set()
        r = httpx.post(f"{sim.url}/api/generate", json={"model": "qwen3:8b", "keep_alive": 0})
        assert r.json()["done_reason"] == "unload"
        assert sim.sim.runners.get("qwen3:8b") is None or \
            sim.sim.runners["qwen3:8b"].loaded.is_set()  # answered once it ran
        assert loading.result().status_code == 200
    assert eventually(lambda: ps(sim) == {} and sim.sim.used_vram_mib() == 0)


# -- answers ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("model", "options", "eval_count", "reason"), [
    ("llama3.2:3b", {}, 16, "stop"),  # the simulator's own length
    ("llama3.2:3b", {"num_predict": 400}, 16, "stop"),  # a cap, not a request
    ("llama3.2:3b", {"num_predict": 5}, 5, "length"),
    ("llama3.2:3b", {"sim_answer_tokens": 40, "num_predict": 100}, 40, "stop"),
    ("llama3.2:3b", {"sim_answer_tokens": 40, "num_predict": 30}, 30, "length"),
    ("qwen3:8b", {"num_predict": 5}, 5, "length"),  # the thought counts within the cap
])
def test_num_predict_caps_an_answer_of_its_own_length(
        sim_factory: Sims, model: str, options: dict[str, Any], eval_count: int,
        reason: str) -> None:
    sim = sim_factory("gpu", time_scale=SCALE)
    answer = chat(sim, model, "hi", options=options).json()
    assert (answer["eval_count"], answer["done_reason"]) == (eval_count, reason)


def test_a_capped_answer_is_length_on_openai_and_max_tokens_on_anthropic(
        sim_factory: Sims) -> None:
    sim = sim_factory("gpu", time_scale=SCALE)
    hi = [{"role": "user", "content": "hi"}]
    openai = httpx.post(f"{sim.url}/v1/chat/completions", timeout=30,
                        json={"model": "llama3.2:3b", "messages": hi, "max_tokens": 5}).json()
    assert openai["choices"][0]["finish_reason"] == "length"
    assert openai["usage"]["completion_tokens"] == 5
    anthropic = httpx.post(f"{sim.url}/v1/messages", timeout=30,
                           json={"model": "llama3.2:3b", "messages": hi, "max_tokens": 200,
                                 "sim_answer_tokens": 300}).json()
    assert anthropic["stop_reason"] == "max_tokens"
    assert anthropic["usage"]["output_tokens"] == 200


@pytest.mark.parametrize(("body", "thinks"), [({}, True), ({"think": False}, False),
                                              ({"think": "low"}, True)])
def test_a_thinking_model_thinks_unless_told_not_to(
        sim_factory: Sims, body: dict[str, Any], thinks: bool) -> None:
    """req.Think defaults to true on a model with the "thinking" capability
    (server/routes.go:457 generate, 2619 chat)."""
    sim = sim_factory("gpu", time_scale=SCALE)
    message = chat(sim, "qwen3:8b", "hi", **body).json()["message"]
    assert bool(message.get("thinking")) is thinks
    openai = httpx.post(f"{sim.url}/v1/chat/completions", timeout=30, json={
        "model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}]}).json()
    assert openai["choices"][0]["message"]["reasoning"]


# -- OLLAMA_MAX_LOADED_MODELS ---------------------------------------------------------------
def test_max_loaded_models_0_is_three_per_gpu(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", total_vram_mib=81920, max_loaded_models=0, context_length=4096,
                      time_scale=SCALE)
    for model in ("llama3.2:3b", "phi3:mini", "qwen3:8b", "qwen3:14b"):
        assert load(sim, model).status_code == 200
    assert len(ps(sim)) == 3 and sim.sim.stats.self_evictions == 1


# -- refusals before any load ---------------------------------------------------------------
@pytest.mark.parametrize(("path", "body", "message"), [
    ("/api/chat", {"model": "nomic-embed-text", "messages": [{"role": "user", "content": "x"}]},
     '"nomic-embed-text" does not support chat'),
    ("/api/generate", {"model": "nomic-embed-text", "prompt": "x"},
     '"nomic-embed-text" does not support generate'),
    ("/api/generate", {"model": "nomic-embed-text"},  # a load too
     '"nomic-embed-text" does not support generate'),
    ("/api/chat", {"model": "llama3.2:3b", "think": True,
                   "messages": [{"role": "user", "content": "x"}]},
     '"llama3.2:3b" does not support thinking'),
    ("/api/chat", {"model": "phi3:mini", "messages": [{"role": "user", "content": "x"}],
                   "tools": [{"type": "function", "function": {"name": "f"}}]},
     "registry.ollama.ai/library/phi3:mini does not support tools"),
    # no model of the catalog inserts: their templates have no .Suffix
    ("/api/generate", {"model": "qwen3:8b", "prompt": "def f(", "suffix": "return x"},
     "registry.ollama.ai/library/qwen3:8b does not support insert"),
    ("/api/generate", {"model": "llama3.2:3b", "suffix": "return x"},  # a load too
     "registry.ollama.ai/library/llama3.2:3b does not support insert"),
])
def test_a_capability_the_model_lacks_is_refused_before_any_load(
        sim_factory: Sims, path: str, body: dict[str, Any], message: str) -> None:
    sim = sim_factory("gpu", time_scale=SCALE)
    r = httpx.post(f"{sim.url}{path}", json={**body, "stream": False}, timeout=30)
    assert (r.status_code, r.json()) == (400, {"error": message})
    assert sim.sim.stats.loads == 0


def test_a_suffix_is_taken_by_a_model_whose_template_has_one(sim_factory: Sims) -> None:
    """The "insert" capability: listed by /api/show, and a suffix served; an empty suffix
    asks for nothing (server/routes.go:448-451)."""
    coder = replace(CATALOG[3], name="qwen2.5-coder:1.5b", insert=True)
    sim = sim_factory("gpu", models=(coder, CATALOG[2]), time_scale=SCALE)
    show = httpx.post(f"{sim.url}/api/show", json={"model": "qwen2.5-coder:1.5b"}).json()
    assert show["capabilities"] == ["completion", "tools", "insert"]
    assert "insert" not in httpx.post(f"{sim.url}/api/show",
                                      json={"model": "qwen3:8b"}).json()["capabilities"]
    for model, suffix in (("qwen2.5-coder:1.5b", "return x"), ("qwen3:8b", "")):
        r = httpx.post(f"{sim.url}/api/generate", json={
            "model": model, "prompt": "def f(", "suffix": suffix, "stream": False}, timeout=30)
        assert r.status_code == 200, r.text


def assert_answered_or_refused(r: httpx.Response, message: str | None) -> None:
    """200 when no refusal is expected, else Ollama's 400 with `message` (its own API's
    error text, or the OpenAI layer's error object's)."""
    if message is None:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["message"] if isinstance(error, dict) else error) == message


LEVEL_REFUSED = 'think value "high" is not supported for this model'


@pytest.mark.parametrize(("version", "path", "model", "think", "message"), [
    ("0.12.6", "/api/generate", "qwen3:8b", "high", LEVEL_REFUSED),
    ("0.12.6", "/api/generate", "llama3.2:3b", "high", LEVEL_REFUSED),
    ("0.12.6", "/api/chat", "qwen3:8b", "high", LEVEL_REFUSED),
    ("0.12.6", "/v1/chat/completions", "qwen3:8b", "high", LEVEL_REFUSED),
    ("0.12.6", "/api/generate", "qwen3:8b", True, None),
    ("0.17.6", "/api/generate", "qwen3:8b", "low",
     'think value "low" is not supported for this model'),
    ("0.17.7", "/api/generate", "qwen3:8b", "high", None),
    ("0.24.0", "/api/generate", "qwen3:8b", "high", None),
    ("0.24.0", "/api/generate", "llama3.2:3b", "high", '"llama3.2:3b" does not support thinking'),
])
def test_a_think_level_is_refused_in_the_versions_words(
        sim_factory: Sims, version: str, path: str, model: str, think: Any,
        message: str | None) -> None:
    """Before 0.17.7 a string `think` is refused on any model without harmony (gpt-oss),
    before the capabilities (v0.12.6 server/routes.go:323-327); from 0.17.7 only a model
    without "thinking" refuses it (v0.24.0 :411-413)."""
    sim = sim_factory("gpu", version=version, models=CATALOG[2:4], time_scale=SCALE)
    ask: dict[str, Any] = {"prompt": "x", "think": think} if path == "/api/generate" else \
        {"messages": [{"role": "user", "content": "x"}], "think": think}
    if path.startswith("/v1"):
        ask = {"messages": ask["messages"], "reasoning_effort": think}
    r = httpx.post(f"{sim.url}{path}", json={"model": model, **ask, "stream": False},
                   timeout=30)
    assert_answered_or_refused(r, message)


THINK_FORMS = '"high", "medium", "low", "max", true, or false'


@pytest.mark.parametrize(("version", "path", "body", "message"), [
    ("0.33.0", "/api/chat", {"think": "bogus"},
     f'invalid think value: "bogus" (must be {THINK_FORMS})'),
    ("0.33.0", "/api/generate", {"think": 1}, f"think must be a boolean or string ({THINK_FORMS})"),
    ("0.12.6", "/api/chat", {"think": "max"},  # "max" from 0.22.0
     'invalid think value: "max" (must be "high", "medium", "low", true, or false)'),
    ("0.33.0", "/api/chat", {"top_logprobs": 21}, "top_logprobs must be between 0 and 20"),
    ("0.33.0", "/api/generate", {"top_logprobs": -1}, "top_logprobs must be between 0 and 20"),
    ("0.12.6", "/api/chat", {"top_logprobs": 21}, None),  # no such field before 0.12.11
    ("0.33.0", "/v1/chat/completions", {"top_logprobs": 21},
     "top_logprobs must be between 0 and 20"),
    ("0.33.0", "/v1/completions", {"logprobs": 25}, "top_logprobs must be between 0 and 20"),
    ("0.33.0", "/v1/completions", {"logprobs": -3}, None),  # not positive: none asked
    # keep_alive and think are decoded in the body's order: the first to fail is answered
    ("0.33.0", "/api/chat", {"keep_alive": "300", "think": "x"},
     'time: missing unit in duration "300"'),
])
def test_ollamas_first_checks_refuse_before_the_model_is_looked_up(
        sim_factory: Sims, version: str, path: str, body: dict[str, Any],
        message: str | None) -> None:
    """api.ThinkValue's decoder (api/types.go:1202-1222; v0.12.6 :936-956) and the handlers'
    top_logprobs check (server/routes.go:256-258, 2452-2454, from 0.12.11)."""
    sim = sim_factory("gpu", version=version, time_scale=SCALE)
    ask = {"messages": [{"role": "user", "content": "x"}]} if "chat" in path else \
        {"prompt": "x"}
    r = httpx.post(f"{sim.url}{path}", json={"model": "qwen3:8b", **ask, **body,
                                             "stream": False}, timeout=30)
    assert_answered_or_refused(r, message)
    assert message is None or sim.sim.stats.loads == 0


def test_answers_keep_the_field_order_of_ollamas_structs(sim_factory: Sims) -> None:
    """Go writes a struct's fields in their order (api/types.go:520-540 ChatResponse,
    891-930 GenerateResponse): `done` before `done_reason`, and /api/generate's metrics
    after its `context`, whose length is the whole prompt's and answer's tokens."""
    sim = sim_factory("gpu", time_scale=SCALE)
    r = httpx.post(f"{sim.url}/api/generate", timeout=30, json={
        "model": "llama3.2:3b", "prompt": "hi", "options": {"num_predict": 3}})
    final = orjson.loads(r.content.splitlines()[-1])
    assert list(final) == ["model", "created_at", "response", "done", "done_reason", "context",
                           "total_duration", "load_duration", "prompt_eval_count",
                           "prompt_eval_duration", "eval_count", "eval_duration"]
    assert len(final["context"]) == final["prompt_eval_count"] + final["eval_count"]
    whole = httpx.post(f"{sim.url}/api/generate", timeout=30, json={
        "model": "llama3.2:3b", "prompt": "hi", "stream": False}).json()
    assert list(whole)[:6] == list(final)[:6]
    r = chat(sim, "llama3.2:3b", "hi")
    assert list(r.json())[2:5] == ["message", "done", "done_reason"]
    loaded = httpx.post(f"{sim.url}/api/chat", json={"model": "llama3.2:3b"}, timeout=30).json()
    assert list(loaded)[2:] == ["message", "done", "done_reason"]


def go_misfit(value: str, struct: str, field: str, kind: str) -> str:
    return f"json: cannot unmarshal {value} into Go struct field {struct}.{field} of type {kind}"


@pytest.mark.parametrize(("version", "path", "body", "message"), [
    ("0.33.0", "/api/chat", {"model": 5}, go_misfit("number", "ChatRequest", "model", "string")),
    ("0.33.0", "/api/chat", {"stream": "yes"},
     go_misfit("string", "ChatRequest", "stream", "bool")),
    ("0.33.0", "/api/chat", {"messages": "hi"},
     go_misfit("string", "ChatRequest", "messages", "[]api.Message")),
    ("0.33.0", "/api/chat", {"options": []},
     go_misfit("array", "ChatRequest", "options", "map[string]interface {}")),
    ("0.33.0", "/api/generate", {"raw": 1}, go_misfit("number", "GenerateRequest", "raw", "bool")),
    ("0.33.0", "/api/generate", {"prompt": ["x"], "system": 2},  # the first in the body
     go_misfit("array", "GenerateRequest", "prompt", "string")),
    ("0.33.0", "/api/generate", {"logprobs": "yes"},
     go_misfit("string", "GenerateRequest", "logprobs", "bool")),
    ("0.12.6", "/api/generate", {"logprobs": "yes"}, None),  # no such field before 0.12.11
    ("0.12.3", "/api/chat", {"truncate": "no", "shift": 1}, None),  # nor these before 0.12.4
    ("0.11.10", "/api/embed", {"dimensions": "8"}, None),  # nor this before 0.11.11
    ("0.11.10", "/api/embed", {"truncate": "no"},
     go_misfit("string", "EmbedRequest", "truncate", "bool")),
    ("0.33.0", "/api/generate", {"stream": None, "raw": None}, None),  # null leaves a field be
    ("0.33.0", "/api/embed", {"model": 5},
     go_misfit("number", "EmbedRequest", "model", "string")),
    ("0.33.0", "/api/embed", {"dimensions": "8"},
     go_misfit("string", "EmbedRequest", "dimensions", "int")),
    ("0.33.0", "/api/embeddings", {"prompt": 3},
     go_misfit("number", "EmbeddingRequest", "prompt", "string")),
])
def test_a_wrongly_typed_field_is_the_bindings_400(
        sim_factory: Sims, version: str, path: str, body: dict[str, Any],
        message: str | None) -> None:
    """Each native handler's ShouldBindJSON (server/routes.go:248-254, 798-806, 1044-1050,
    2444-2450) refuses a field its struct types otherwise (api/types.go:62-180, 599-640) with
    encoding/json's first UnmarshalTypeError, before the model is looked up."""
    sim = sim_factory("gpu", version=version, time_scale=SCALE)
    model = "nomic-embed-text" if "embed" in path else "llama3.2:3b"
    ask = {"messages": [{"role": "user", "content": "x"}]} if "chat" in path else \
        {"input": "x"} if path == "/api/embed" else {"prompt": "x"}
    r = httpx.post(f"{sim.url}{path}", json={"model": model, **ask, "stream": False, **body},
                   timeout=30)
    if message is None:
        assert r.status_code == 200, r.text
        return
    assert (r.status_code, r.json()) == (400, {"error": message})
    assert sim.sim.stats.loads == 0


@pytest.mark.parametrize(("options", "message"), [
    ({"stop": "\n"}, 'option "stop" must be of type array'),
    ({"stop": [1]}, 'option "stop" must be of an array of strings'),
    ({"temperature": "0.2"}, 'option "temperature" must be of type float32'),
    ({"num_predict": "100"}, 'option "num_predict" must be of type integer'),
    ({"num_ctx": True}, 'option "num_ctx" must be of type integer'),
    ({"use_mmap": 1}, 'option "use_mmap" must be of type boolean'),
    ({"num_predict": 5.0, "temperature": 1, "stop": None, "made_up": "x"}, None),
])
def test_a_wrongly_typed_option_is_ollamas_500(
        sim_factory: Sims, options: dict[str, Any], message: str | None) -> None:
    """Options.FromMap (api/types.go:991-1090) through handleScheduleError's default
    (server/routes.go:3107-3119)."""
    sim = sim_factory("gpu", time_scale=SCALE)
    r = chat(sim, "llama3.2:3b", "hi", options=options)
    if message is None:
        assert r.status_code == 200, r.text
        return
    assert (r.status_code, r.json()) == (500, {"error": message})
    assert sim.sim.stats.loads == 0


# -- /api/embed ------------------------------------------------------------------------------
def test_embed_inputs_take_the_runners_one_slot(sim_factory: Sims) -> None:
    """Each input takes the runner's semaphore (llm/llama_server.go:2339), one slot for an
    embedding model (server/sched.go:497-501): of two calls at once, one waits for the
    other's whole evaluation."""
    sim = sim_factory("gpu", time_scale=1.0)
    body = {"model": "nomic-embed-text", "input": "w " * 3000}  # 1500 tokens
    evaluation_s = 1500 / sim.config.prompt_tokens_per_s  # 0.375 s
    httpx.post(f"{sim.url}/api/embed", json=body, timeout=30)  # loaded

    def timed() -> float:
        start = time.perf_counter()
        httpx.post(f"{sim.url}/api/embed", json=body, timeout=30)
        return time.perf_counter() - start

    with ThreadPoolExecutor(2) as pool:
        start = time.perf_counter()
        list(pool.map(lambda _: timed(), range(2)))
        both = time.perf_counter() - start
    # one after the other: two evaluations at least (with a slot each, about one); a lower
    # bound, which a loaded machine only makes longer
    assert both > 1.8 * evaluation_s, both


@pytest.mark.parametrize(("value", "status", "answer"), [
    ("", 200, {"model": "nomic-embed-text", "embeddings": []}),
    ([1], 400, {"error": "invalid input type"}),
    ({"text": "x"}, 400, {"error": "invalid input type"}),
])
def test_embed_input_is_a_text_or_texts(sim_factory: Sims, value: Any, status: int,
                                        answer: dict[str, Any]) -> None:
    sim = sim_factory("gpu", time_scale=SCALE)
    r = httpx.post(f"{sim.url}/api/embed", timeout=30,
                   json={"model": "nomic-embed-text", "input": value})
    assert (r.status_code, r.json()) == (status, answer)


def test_ollama_echoes_the_model_as_the_call_names_it(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", time_scale=SCALE)
    r = httpx.post(f"{sim.url}/api/embed", json={"model": "nomic-embed-text", "input": "x"})
    assert r.json()["model"] == "nomic-embed-text"
    assert chat(sim, "llama3.2:3b", "hi").json()["model"] == "llama3.2:3b"


# -- a runner that dies ----------------------------------------------------------------------
def crash_next(sim: SimServer, after_chunks: int = 2) -> None:
    httpx.post(f"{sim.url}/_sim/fault",
               json={"mode": "midstream", "count": 1, "after_chunks": after_chunks})


def test_a_runner_that_dies_mid_stream_ends_it_with_ollamas_error_line(
        sim_factory: Sims) -> None:
    """routes.go:2116-2124: an error after the first chunk is an {"error"} line under 200;
    llama-server is gone (llm/llama_server.go:1759-1766) but listed until a call reloads
    it (server/sched.go:1426)."""
    sim = sim_factory("gpu", time_scale=SCALE)
    load(sim, "llama3.2:3b")
    crash_next(sim)
    with httpx.stream("POST", f"{sim.url}/api/chat", timeout=30, json={
            "model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}]}) as r:
        lines = [orjson.loads(line) for line in r.iter_lines() if line]
    assert r.status_code == 200 and len(lines) == 3
    assert lines[-1] == {"error": "an error was encountered while running the model: "
                                  "unexpected EOF"}
    assert "llama3.2:3b" in ps(sim)
    assert chat(sim, "llama3.2:3b", "hi").status_code == 200
    assert sim.sim.stats.loads == 2 and sim.sim.stats.reloads == 0


@pytest.mark.parametrize(("version", "wedged"), [("0.32.14", True), ("0.32.15", False)])
def test_a_parser_error_mid_stream_holds_its_slot_before_0_32_15(
        sim_factory: Sims, version: str, wedged: bool) -> None:
    """Commit e0c95a5ff (0.32.15): before it the callback blocked on the next chunk and
    Completion kept llama-server's semaphore (llm/llama_server.go:1536-1542), while the
    scheduler's ref went with the request (server/sched.go:747-749): the copy's one slot
    stays taken and the next call waits for good."""
    sim = sim_factory("gpu", num_parallel=1, version=version, time_scale=SCALE)
    load(sim, "llama3.2:3b")
    httpx.post(f"{sim.url}/_sim/fault", json={"mode": "parser", "count": 1, "after_chunks": 1})
    r = chat(sim, "llama3.2:3b", "hi")
    assert (r.status_code, r.json()) == (500, {"error": PARSE_ERROR})
    runner = sim.sim.runners["llama3.2:3b"]
    assert eventually(lambda: runner.refcount == 0)
    assert runner.slots.locked() is wedged and sim.sim.stats.wedged_slots == int(wedged)
    if not wedged:
        assert chat(sim, "llama3.2:3b", "again").status_code == 200


def test_a_non_streamed_call_whose_runner_dies_is_a_json_500(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", time_scale=SCALE)
    crash_next(sim)
    r = chat(sim, "llama3.2:3b", "hi")
    assert r.status_code == 500 and r.json()["error"].startswith("an error was encountered")


def test_an_openai_stream_whose_runner_dies_ends_without_its_close(sim_factory: Sims) -> None:
    """middleware/openai.go:80-170: the error line is read as an empty chunk; no finish
    chunk, no [DONE]."""
    sim = sim_factory("gpu", time_scale=SCALE)
    crash_next(sim)
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", timeout=30, json={
            "model": "llama3.2:3b", "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and len(events) == 3 and "data: [DONE]" not in events
    assert all(orjson.loads(e[6:])["choices"][0]["finish_reason"] is None for e in events)


def test_a_call_waiting_on_a_runner_that_died_gets_500(sim_factory: Sims) -> None:
    """Completion checks llama-server's status once it has a slot (llm/llama_server.go:
    1546-1551, 1192-1199)."""
    sim = sim_factory("gpu", tokens_per_s=2, time_scale=0.2)
    load(sim, "llama3.2:3b")
    # ~0.8 s in: the second call must reach the slot's queue before the crash, even on a
    # loaded machine (after it, the call finds the copy dead and reloads it)
    crash_next(sim, after_chunks=8)
    results: dict[str, httpx.Response] = {}
    first = threading.Thread(target=lambda: results.update(first=chat(sim, "llama3.2:3b", "a")))
    first.start()
    assert eventually(lambda: sim.sim.runners["llama3.2:3b"].refcount == 1)
    second = chat(sim, "llama3.2:3b", "b")
    first.join()
    assert results["first"].status_code == 500
    assert (second.status_code, second.json()) == (
        500, {"error": "llama-server process no longer running: unknown "})


async def test_the_adapter_loads_an_embedding_model_through_an_embed(sim_factory: Sims) -> None:
    """Ollama's generate refuses a model without "completion" before loading it; its embed
    loads any model and answers no vectors for no input (server/routes.go:466-469, 843-865)."""
    sim = sim_factory("gpu", total_vram_mib=16376)
    client = OllamaClient(sim.url)
    try:
        with pytest.raises(UpstreamError, match="does not support generate"):
            await client.load("nomic-embed-text")
        await client.load("nomic-embed-text", num_ctx=2048, embedding=True)
        await client.load("qwen3:8b", num_ctx=4096)
        loaded = await client.ps()
    finally:
        await client.close()
    assert sorted((m["name"], m["context_length"]) for m in loaded) == [
        ("nomic-embed-text:latest", 2048), ("qwen3:8b", 4096)]


# -- what Ollama refuses that a lax simulator would answer ----------------------------------
def openai_chat(sim: SimServer, **body: Any) -> httpx.Response:
    payload = {"model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(f"{sim.url}/v1/chat/completions", json=payload, timeout=30)


def openai_error(r: httpx.Response) -> str:
    error = r.json()["error"]
    assert r.status_code == 400 and error["type"] == "invalid_request_error", r.text
    return str(error["message"])


def test_openai_refuses_a_field_of_the_wrong_json_type_at_binding(sim_factory: Sims) -> None:
    """ChatMiddleware's ShouldBindJSON (middleware/openai.go:449-452): encoding/json's words,
    a 400 before any model is looked up or loaded."""
    sim = sim_factory("gpu", time_scale=SCALE)
    assert openai_error(openai_chat(sim, temperature="hot")) == (
        "json: cannot unmarshal string into Go struct field ChatCompletionRequest.temperature"
        " of type float64")
    assert openai_error(openai_chat(sim, max_tokens=1.5)) == (
        "json: cannot unmarshal number 1.5 into Go struct field ChatCompletionRequest."
        "max_tokens of type int")
    completion = httpx.post(f"{sim.url}/v1/completions", timeout=30, json={
        "model": "llama3.2:3b", "prompt": "hi", "temperature": [1]})
    assert openai_error(completion) == ("json: cannot unmarshal array into Go struct field "
                                        "CompletionRequest.temperature of type float32")
    assert ps(sim) == {} and openai_chat(sim, temperature=0.2).status_code == 200


def test_openai_refuses_a_reasoning_effort_it_does_not_know(sim_factory: Sims) -> None:
    """thinkFromReasoningEffort (openai/openai.go:531-546; responses.go:575): a 400."""
    sim = sim_factory("gpu", time_scale=SCALE)
    words = ('invalid reasoning value: "bogus" (must be "minimal", "low", "medium", "high", '
             '"xhigh", "ultra", "max", or "none")')
    assert openai_error(openai_chat(sim, reasoning_effort="bogus")) == words
    assert openai_error(openai_chat(sim, reasoning={"effort": "bogus"})) == words
    responses = httpx.post(f"{sim.url}/v1/responses", timeout=30, json={
        "model": "llama3.2:3b", "input": "hi", "reasoning": {"effort": "bogus"}})
    assert openai_error(responses) == words
    assert openai_chat(sim, model="qwen3:8b", reasoning_effort="xhigh").status_code == 200


def test_a_format_neither_json_nor_a_schema_is_refused_by_the_runner_after_the_load(
        sim_factory: Sims) -> None:
    """llm/llama_server.go:1584-1595 (2308-2326 on the chat path): a 500, streamed or not
    (streamResponse answers an error before any content as JSON, server/routes.go:2097-2122),
    once the model is loaded."""
    sim = sim_factory("gpu", time_scale=SCALE)
    for stream in (False, True):
        r = httpx.post(f"{sim.url}/api/generate", timeout=30, json={
            "model": "llama3.2:3b", "prompt": "hi", "format": "yaml", "stream": stream})
        assert r.status_code == 500 and r.json() == {"error": (
            'invalid format: "\\"yaml\\""; expected "json" or a valid JSON Schema object')}
    assert "llama3.2:3b" in ps(sim)
    assert chat(sim, "llama3.2:3b", "hi", format=["a"]).status_code == 500
    for fine in ("json", {"type": "object"}, "", None):
        assert chat(sim, "llama3.2:3b", "hi", format=fine).status_code == 200


@pytest.mark.parametrize(("image", "byte"), [("not base64!", 3), ("aW1", 0), ("aW1nZ", 4),
                                             ("a===", 1), ("aW1n=", 4), ("aQ==x", 4)])
def test_an_image_that_is_not_base64_is_refused_at_binding(
        sim_factory: Sims, image: str, byte: int) -> None:
    """api.ImageData is a []byte: encoding/json decodes it with base64.StdEncoding and the
    binding fails with its CorruptInputError (server/routes.go:248-254, a 400)."""
    sim = sim_factory("gpu", time_scale=SCALE)
    wrong = {"error": f"illegal base64 data at input byte {byte}"}
    r = httpx.post(f"{sim.url}/api/generate", timeout=30, json={
        "model": "llama3.2:3b", "prompt": "look", "images": [image], "stream": False})
    assert (r.status_code, r.json()) == (400, wrong)
    r = httpx.post(f"{sim.url}/api/chat", timeout=30, json={"model": "llama3.2:3b", "messages": [
        {"role": "user", "content": "look", "images": ["aW1n", image]}]})
    assert (r.status_code, r.json()) == (400, wrong)
    r = openai_chat(sim, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}]}])
    assert openai_error(r) == "invalid image input"  # openai/openai.go:738-768
    assert ps(sim) == {}


def test_raw_mode_refuses_a_system_template_or_context(sim_factory: Sims) -> None:
    """server/routes.go:422-424: a 400 after the model is found, before any load."""
    sim = sim_factory("gpu", time_scale=SCALE)
    for extra in ({"system": "be brief"}, {"template": "{{ .Prompt }}"}, {"context": [1, 2]}):
        r = httpx.post(f"{sim.url}/api/generate", timeout=30, json={
            "model": "llama3.2:3b", "prompt": "hi", "raw": True, "stream": False, **extra})
        assert (r.status_code, r.json()) == (
            400, {"error": "raw mode does not support template, system, or context"})
    assert ps(sim) == {}
    r = httpx.post(f"{sim.url}/api/generate", timeout=30, json={
        "model": "llama3.2:3b", "prompt": "hi", "raw": True, "stream": False})
    assert r.status_code == 200


def test_openai_embeddings_in_base64_are_little_endian_float32s(sim_factory: Sims) -> None:
    """ToEmbeddingList (openai/openai.go:472-511); any other encoding_format is a 400
    (middleware/openai.go:405-410)."""
    import base64
    import struct

    sim = sim_factory("gpu", time_scale=SCALE)

    def embed(**body: Any) -> httpx.Response:
        return httpx.post(f"{sim.url}/v1/embeddings", timeout=30,
                          json={"model": "nomic-embed-text", "input": ["a", "b"], **body})

    floats = [d["embedding"] for d in embed().json()["data"]]
    packed = [d["embedding"] for d in embed(encoding_format="BASE64").json()["data"]]
    assert all(isinstance(p, str) for p in packed)
    unpacked = [list(struct.unpack(f"<{len(f)}f", base64.b64decode(p)))
                for f, p in zip(floats, packed, strict=True)]
    assert all(math.isclose(u, f, rel_tol=1e-6) for us, fs in zip(unpacked, floats, strict=True)
               for u, f in zip(us, fs, strict=True))
    assert openai_error(embed(encoding_format="int8")) == (
        "Invalid value for 'encoding_format' = int8. Supported values: ['float', 'base64'].")


def test_openai_embeddings_fields_are_bound_as_the_versions_layer_binds_them(
        sim_factory: Sims) -> None:
    """openai.EmbedRequest: `dimensions` an int (from 0.11.11), `encoding_format` a string
    checked from 0.12.7 (commit e0ead1ade); before, Ollama has no such field and ignores it."""
    new, old = sim_factory("new", time_scale=SCALE), sim_factory("old", version="0.12.6",
                                                                  time_scale=SCALE)

    def embed(sim: Any, **body: Any) -> httpx.Response:
        return httpx.post(f"{sim.url}/v1/embeddings", timeout=30,
                          json={"model": "nomic-embed-text", "input": "a", **body})

    assert openai_error(embed(new, dimensions="8")) == (
        "json: cannot unmarshal string into Go struct field EmbedRequest.dimensions of type int")
    assert openai_error(embed(new, encoding_format=1)) == (
        "json: cannot unmarshal number into Go struct field EmbedRequest.encoding_format of "
        "type string")
    plain = embed(old, encoding_format="int8")
    assert plain.status_code == 200 and isinstance(plain.json()["data"][0]["embedding"], list)
    assert isinstance(embed(old, encoding_format="base64").json()["data"][0]["embedding"],
                      list)


@pytest.mark.parametrize(("version", "roles"), [("0.32.6", 1), ("0.30.0", None)])
def test_a_streamed_openai_chat_names_the_role_as_the_version_does(
        sim_factory: Sims, version: str, roles: int | None) -> None:
    """From 0.32.6 only the first chunk says `role` (middleware/openai.go ChatWriter,
    commit 8edecb5c6); before, every content chunk did."""
    sim = sim_factory("gpu", version=version, time_scale=SCALE)
    answer = httpx.post(f"{sim.url}/v1/chat/completions", timeout=30, json={
        "model": "llama3.2:3b", "stream": True, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}]})
    chunks = [orjson.loads(line[6:]) for line in answer.text.splitlines()
              if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    content = [d for d in deltas if d]
    named = sum("role" in d for d in content)
    assert named == (roles if roles is not None else len(content)) and len(content) > 1


def test_a_responses_function_call_whose_arguments_are_no_json_is_a_400(
        sim_factory: Sims) -> None:
    """FromResponsesRequest refuses it before any model (openai/responses.go: `failed to
    parse function call arguments`): a 400, not the simulator's own fault."""
    sim = sim_factory("gpu", time_scale=SCALE)
    answer = httpx.post(f"{sim.url}/v1/responses", timeout=30, json={
        "model": "llama3.2:3b", "input": [
            {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{bad"}]})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        "failed to parse function call arguments: invalid character 'b' looking for "
        "beginning of object key string")


# -- what Ollama answers a body it cannot use --------------------------------------------------
@pytest.mark.parametrize("version", ["0.12.6", "0.24.0", "0.33.0"])
def test_generate_without_a_model_finds_none_while_chat_requires_one(sim_factory: Sims,
                                                                     version: str) -> None:
    """GenerateHandler refuses an empty name as one it cannot find (v0.12.6
    server/routes.go:178-183; HEAD :261-264, routes_generate_test.go:1545-1560, a `null`
    body too), ChatHandler as required (HEAD :2459). Seen on real 0.12.6 and 0.24.0."""
    sim = sim_factory("gpu", version=version)
    for body in (b"{}", b"null", b'{"model": "", "prompt": "hi"}'):
        r = httpx.post(f"{sim.url}/api/generate", content=body)
        assert (r.status_code, r.json()) == (404, {"error": "model '' not found"}), body
    r = httpx.post(f"{sim.url}/api/chat", content=b"{}")
    assert (r.status_code, r.json()) == (400, {"error": "model is required"})


@pytest.mark.parametrize(("path", "raw", "said"), [
    ("/api/generate", b'{nope}', "invalid character 'n' looking for beginning of object key "
                                 "string"),
    ("/api/chat", b'{"model": "llama3.2:3b", "messages": [', "unexpected EOF"),
    ("/api/generate", b'[{"model": "llama3.2:3b"}]',
     "json: cannot unmarshal array into Go value of type api.GenerateRequest"),
    ("/api/show", b'"llama3.2:3b"',
     "json: cannot unmarshal string into Go value of type api.ShowRequest"),
    ("/api/embed", b" \n", "missing request body"),
    ("/v1/chat/completions", b"{nope}", "invalid character 'n' looking for beginning of "
                                        "object key string"),
    ("/v1/completions", b"12", "json: cannot unmarshal number into Go value of type "
                               "openai.CompletionRequest"),
    ("/v1/embeddings", b"", "EOF"),  # the layers answer err.Error() (middleware/openai.go)
])
def test_a_body_ollama_cannot_decode_is_refused_in_gos_words(sim_factory: Sims, path: str,
                                                             raw: bytes, said: str) -> None:
    """gin's ShouldBindJSON: json.Decoder's words, the struct's type named (seen on real
    0.12.6 and 0.24.0); Ollama's own handlers answer io.EOF "missing request body"."""
    sim = sim_factory("gpu", version="0.24.0")
    r = httpx.post(f"{sim.url}{path}", content=raw)
    error = r.json()["error"]
    assert (r.status_code, error if path.startswith("/api/") else error["message"]) == (
        400, said)


def test_what_follows_a_bodys_first_value_is_never_read(sim_factory: Sims) -> None:
    """json.Decoder.Decode reads one value (stream.go readValue); the rest is left unread."""
    sim = sim_factory("gpu")
    r = httpx.post(f"{sim.url}/api/show", content=b'{"model": "llama3.2:3b"} trailing {')
    assert r.status_code == 200 and r.json()["details"]["family"] == "llama"


@pytest.mark.parametrize(("version", "last"), [
    ("0.12.6", {"role": "assistant", "content": ""}), ("0.32.5", {"role": "assistant",
                                                                   "content": ""}),
    ("0.32.6", {})])
def test_an_openai_stream_ends_with_the_delta_of_its_version(sim_factory: Sims, version: str,
                                                             last: dict[str, str]) -> None:
    """Before 0.32.6 the done answer is a chunk like any (v0.12.6 openai/openai.go:295,
    v0.24.0 :310: Message, role and content never omitted; seen on real 0.12.6 and 0.24.0);
    from commit 8edecb5c6 (0.32.6) a finish chunk of its own, `Delta{}` (FinishChunk)."""
    sim = sim_factory("gpu", version=version)
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", timeout=30, json={
            "model": "llama3.2:3b", "stream": True, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]}) as r:
        chunks = [orjson.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    choice = chunks[-1]["choices"][0]
    assert choice["finish_reason"] == "length" and choice["delta"] == last


@pytest.mark.parametrize("version", ["0.12.6", "0.33.0"])
def test_openai_retrieves_a_local_model_through_show(sim_factory: Sims, version: str) -> None:
    """RetrieveMiddleware over ShowHandler (v0.12.6 server/routes.go:1492, openai.go:406-413
    ToModel; seen on real 0.12.6): the name as asked, show's modified_at, its namespace;
    show's refusal in OpenAI's shape."""
    sim = sim_factory("gpu", version=version)
    r = httpx.get(f"{sim.url}/v1/models/LLAMA3.2:3b")
    assert (r.status_code, r.json()) == (200, {
        "id": "LLAMA3.2:3b", "object": "model", "created": 1767225600, "owned_by": "library"})
    r = httpx.get(f"{sim.url}/v1/models/nope:1b")
    assert (r.status_code, r.json()["error"]["message"]) == (404, "model 'nope:1b' not found")


@pytest.mark.parametrize(("version", "tokens", "left_out"), [
    ("0.12.6", 1, {"eval_duration"}), ("0.24.0", 1, {"eval_duration"}), ("0.12.6", 2, set()),
    ("0.30.0", 1, set())])
def test_one_token_from_the_llama_engine_leaves_its_zero_eval_duration_out(
        sim_factory: Sims, version: str, tokens: int, left_out: set[str]) -> None:
    """The llama engine counts the first token's decode as the prompt's (v0.12.6
    runner/llamarunner/runner.go:483-488), and a zero duration is omitempty (api/types.go:385):
    seen on real 0.12.6 and 0.24.0; llama-server (0.30+) times its own."""
    sim = sim_factory("gpu", version=version, time_scale=SCALE)
    final = httpx.post(f"{sim.url}/api/generate", timeout=30, json={
        "model": "llama3.2:3b", "prompt": "hi", "stream": False,
        "options": {"num_predict": tokens}}).json()
    assert final["eval_count"] == tokens
    assert {"prompt_eval_duration", "eval_duration"} - set(final) == left_out


# Every field of OpenAI's Response from 0.14.2, the request's echoed (commit 38eac40d5; v0.24.0
# openai/responses.go:666-698, ToResponse :753-876, buildResponseObject :978-1080)
RESPONSE_KEYS = {
    "id", "object", "created_at", "completed_at", "status", "incomplete_details", "model",
    "previous_response_id", "instructions", "output", "error", "tools", "tool_choice",
    "truncation", "parallel_tool_calls", "text", "top_p", "presence_penalty",
    "frequency_penalty", "top_logprobs", "temperature", "reasoning", "usage",
    "max_output_tokens", "max_tool_calls", "store", "background", "service_tier", "metadata",
    "safety_identifier", "prompt_cache_key"}


def responses_events(sim: SimServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    answer = httpx.post(f"{sim.url}/v1/responses", timeout=30, json={**body, "stream": True})
    return [orjson.loads(line[6:]) for line in answer.text.splitlines()
            if line.startswith("data: ")]


@pytest.mark.parametrize("version", ["0.24.0", "0.14.1"])
def test_a_responses_answer_has_the_fields_of_its_version(sim_factory: Sims,
                                                          version: str) -> None:
    sim = sim_factory(version=version)
    body = {"model": "qwen3:8b", "input": "hi", "max_output_tokens": 3, "temperature": 0.5,
            "think": False}
    whole = httpx.post(f"{sim.url}/v1/responses", timeout=30, json=body).json()
    events = responses_events(sim, body)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    first, last = events[0]["response"], events[-1]["response"]
    if version == "0.14.1":  # v0.14.1 openai/responses.go:519-527, :721-737, :1000-1011
        assert set(whole) == {"id", "object", "created_at", "status", "model", "output",
                              "usage"}
        assert (set(first), set(last)) == ({"id", "object", "status", "output"},
                                           {"id", "object", "status", "output", "usage"})
        assert set(whole["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}
        return
    assert set(whole) == set(first) == set(last) == RESPONSE_KEYS
    assert (whole["service_tier"], whole["store"], whole["background"]) == ("default", False,
                                                                             False)
    assert (whole["max_output_tokens"], whole["temperature"], whole["top_p"]) == (3, 0.5, 1)
    assert isinstance(whole["completed_at"], int) and first["completed_at"] is None
    assert isinstance(last["completed_at"], int)


def test_a_deleted_model_keeps_its_loaded_copy_and_its_calls_get_404(sim_factory: Sims) -> None:
    """DeleteHandler removes the manifest and unloads nothing (v0.24.0 server/routes.go
    :1066-1115; the CLI's `ollama rm` unloads first, cmd/cmd.go:1108-1117): the copy stays
    in /api/ps, and GetModel finds no manifest for a call (:235-240), as a real 0.24.0 does."""
    sim = sim_factory()
    assert load(sim, "qwen3:8b").status_code == 200
    gone = httpx.request("DELETE", f"{sim.url}/api/delete", json={"model": "qwen3:8b"})
    assert (gone.status_code, gone.content) == (200, b"")
    assert "qwen3:8b" in ps(sim)
    assert "qwen3:8b" not in [m["name"] for m in httpx.get(f"{sim.url}/api/tags").json()["models"]]
    answer = chat(sim, "qwen3:8b", "hi")
    assert (answer.status_code, answer.json()["error"]) == (404, "model 'qwen3:8b' not found")
    again = httpx.request("DELETE", f"{sim.url}/api/delete", json={"model": "qwen3:8b"})
    assert (again.status_code, again.json()["error"]) == (404, "model 'qwen3:8b' not found")
    empty = httpx.request("DELETE", f"{sim.url}/api/delete")
    assert (empty.status_code, empty.json()["error"]) == (400, "missing request body")


@pytest.mark.parametrize(("version", "name", "error"), [
    ("0.24.0", "", "model is required"),
    ("0.24.0", "  ", "model is required"),
    ("0.24.0", "a:b:cloud:local", 'use either :local or :cloud, not both: "a:b:cloud:local"'),
    ("0.24.0", "bad name!", 'name "bad name!" is invalid'),
    ("0.12.6", "", 'name "" is invalid'),
    ("0.12.6", "bad name!", 'name "bad name!" is invalid'),
])
def test_a_delete_of_a_name_ollama_cannot_read_is_a_400(sim_factory, version, name, error):
    """DeleteHandler parses the name before it looks: from 0.18 parseNormalizePullModelRef
    (v0.24.0 server/routes.go:1076-1087, internal/modelref ParseRef), before ParseName
    (v0.12.6); only a name it can read and does not hold is a 404."""
    sim = sim_factory(version=version)
    refused = httpx.request("DELETE", f"{sim.url}/api/delete", json={"model": name})
    assert (refused.status_code, refused.json()["error"]) == (400, error)
    missing = httpx.request("DELETE", f"{sim.url}/api/delete", json={"model": "nosuch:1b"})
    assert (missing.status_code, missing.json()["error"]) == (404, "model 'nosuch:1b' not found")


@pytest.mark.parametrize(("host", "allowed"), [
    ("localhost:11434", True), ("127.0.0.1", True), ("[::1]:11434", True), ("10.0.0.8", True),
    ("gpu.local", True), ("ollama.internal:11434", True), ("", True),
    ("rebind.example", False), ("8.8.8.8:11434", False), ("[::1]", False)])
def test_a_loopback_simulator_refuses_a_host_that_is_not_local(
        sim_factory: Sims, host: str, allowed: bool) -> None:
    """Ollama's allowedHostsMiddleware on a loopback listener: 403 with no body, on every
    path, before the route is looked up (server/routes.go, 0.12.6 and 0.24.0 alike)."""
    sim = sim_factory("gpu", time_scale=SCALE)
    for path in ("/api/version", "/no/such/path"):
        r = httpx.get(f"{sim.url}{path}", headers={"Host": host})
        if allowed:
            assert r.status_code != 403
        else:
            assert (r.status_code, r.content) == (403, b"")


def test_a_loopback_simulator_answers_options_from_a_local_name_204(sim_factory: Sims) -> None:
    """allowedHostsMiddleware aborts an OPTIONS that passes as a local name (allowedHost)
    with 204 and no body, on any path; one naming a local IP goes on to the routes; a Host
    not local is its 403 (server/routes.go, 0.12.6 and 0.24.0 alike)."""
    sim = sim_factory("gpu", time_scale=SCALE)
    for path in ("/api/tags", "/api/chat", "/no/such/path"):
        r = httpx.options(f"{sim.url}{path}", headers={"Host": "localhost:11434"})
        assert (r.status_code, r.content) == (204, b"")
        assert httpx.options(f"{sim.url}{path}").status_code in (404, 405)  # 127.0.0.1:port
    r = httpx.options(f"{sim.url}/api/tags", headers={"Host": "rebind.example"})
    assert (r.status_code, r.content) == (403, b"")
