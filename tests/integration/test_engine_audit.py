"""Rules of Ollama's found by reading its source against the simulator (an audit of
server/sched.go, server/routes.go, server/prompt.go, llm/llama_server.go, api/types.go and
the 0.12 runners at HEAD fb30760 and v0.12.6). Each test states one rule, with its source
lines. A departure found so goes in as a strict xfail until the simulator follows it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
import pytest

from loadtest.ollama_sim import SimServer
from loadtest.sim_model import CATALOG, Fitted, PromptTokens, SimModel, fit_prompt
from proxy.service.prober import runner_files, weights_file
from tests.conftest import eventually

Sims = Callable[..., SimServer]
SCALE = 0.002


def chat(sim: SimServer, model: str, messages: list[dict[str, str]], **body: Any
         ) -> httpx.Response:
    payload = {"model": model, "messages": messages, "stream": False, **body}
    return httpx.post(f"{sim.url}/api/chat", json=payload, timeout=30)


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
    head = sim_factory("head", total_vram_mib=24564, version="0.33.0", time_scale=SCALE)
    r = chat(head, "phi3:mini", messages, options={"num_ctx": 8192})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] < 2500  # the ~3000-token message dropped


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


@pytest.mark.parametrize(("version", "num_keep", "kept"), [
    ("0.33.0", 4, 4096 - (4096 - 5) // 2),  # Ollama's default, + BOS: 2051
    ("0.33.0", 1000, 4096 - (4096 - 1001) // 2),  # 2549
    ("0.33.0", 0, 4096 - (4096 - 1) // 2),  # BOS alone: 2049
    ("0.33.0", 5000, 4095),  # at most num_ctx - 1
    ("0.33.0", -1, 4095),  # the whole prompt: as much of its head as leaves one to discard
    ("0.12.6", -1, 4096),  # 0.12's runners fill the context whatever they keep
])
def test_a_shifted_prompt_keeps_the_calls_num_keep_and_bos(
        version: str, num_keep: int, kept: int) -> None:
    """HEAD completionPromptForRequest and contextShiftPromptLimit (llm/llama_server.go:
    301-318, 321-331); v0.12.6 runner/llamarunner/runner.go:116-137."""
    prompt = PromptTokens(messages=[7500], system_flags=[False])
    fitted = fit_prompt(prompt, 4096, version, chat=False, num_keep=num_keep)
    assert fitted == Fitted(kept, True)


def load(sim: SimServer, model: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{sim.url}/api/generate", json={"model": model, **body}, timeout=30)


def listed(sim: SimServer) -> set[str]:
    return {m["model"] for m in httpx.get(f"{sim.url}/api/ps").json()["models"]}


def test_ollamas_own_victim_among_equal_keep_alives_is_the_first_blob_path(
        sim_factory: Sims) -> None:
    """findRunnerToUnload sorts s.loaded with ByDurationAndName (HEAD server/sched.go:
    1557-1578, 1664-1693; v0.12.6 :738-751, 760-789): by sessionDuration, then by
    runnerRef.modelPath (HEAD falls back to the model key only for a model without one),
    the blob's path, .../blobs/sha256-<hex>, which /api/show's modelfile names in its FROM
    line (server/routes.go:1520-1533, server/images.go:586-592). The name plays no part."""
    sim = sim_factory("gpu", total_vram_mib=24564, max_loaded_models=2, time_scale=SCALE)
    for model in ("llama3.2:3b", "phi3:mini"):
        assert load(sim, model).status_code == 200
    blobs = {}
    for model in ("llama3.2:3b", "phi3:mini"):
        modelfile = httpx.post(f"{sim.url}/api/show", json={"model": model}).json()["modelfile"]
        blobs[model] = next(line.split(" ", 1)[1] for line in modelfile.splitlines()
                            if line.startswith("FROM "))
    assert all("/blobs/sha256-" in path for path in blobs.values()), blobs
    assert load(sim, "qwen3:8b").status_code == 200  # a third model: one must go
    victim = min(blobs, key=lambda m: blobs[m])
    assert victim not in listed(sim)


def test_a_keep_alive_number_past_gos_duration_unloads_the_copy_after_its_call(
        sim_factory: Sims) -> None:
    """api.Duration.UnmarshalJSON (HEAD api/types.go:1252-1257; v0.12.6 :986-991) turns a
    non-negative number into time.Duration(t * float64(time.Second)): over 9.22e18 ns the
    float-to-int64 conversion is implementation-defined in Go, and amd64's CVTTSD2SQ gives
    math.MinInt64. A copy with a sessionDuration <= 0 is expired as soon as its last call
    ends (processCompleted, HEAD server/sched.go:383-392; v0.12.6 :283-292). (arm64
    saturates instead: forever.)"""
    sim = sim_factory("gpu", total_vram_mib=24564, time_scale=SCALE)
    r = load(sim, "qwen3:8b", prompt="hello", stream=False, keep_alive=1e10)
    assert r.status_code == 200, r.text
    deadline = 50
    while "qwen3:8b" in listed(sim) and deadline:
        deadline -= 1
        time.sleep(0.05)
    assert "qwen3:8b" not in listed(sim)


def test_a_busy_copy_whose_keep_alive_overflowed_is_the_last_victim(sim_factory: Sims) -> None:
    """ByDurationAndName compares sessionDurations as uint64 (HEAD server/sched.go:1561-1567;
    v0.12.6 :742-747): the negative one an overflowed keep_alive gives sorts after every
    other, forever included. With both copies busy findRunnerToUnload takes the first in that
    order, so a load expires the copy with 5 s, not the one with the overflowed keep_alive."""
    sim = sim_factory("gpu", total_vram_mib=49152, context_length=4096, max_loaded_models=2,
                      tokens_per_s=20, time_scale=0.1, startup_s=0.0, load_mib_per_s=1e6)
    for model in ("llama3.2:3b", "phi3:mini"):
        assert load(sim, model).status_code == 200

    def busy_chat(model: str, keep_alive: Any) -> httpx.Response:
        return chat(sim, model, [{"role": "user", "content": "hi"}], keep_alive=keep_alive,
                    options={"sim_answer_tokens": 300})  # 15 s: 1.5 s real

    with ThreadPoolExecutor(3) as pool:
        overflowed = pool.submit(busy_chat, "llama3.2:3b", 1e10)
        other = pool.submit(busy_chat, "phi3:mini", "5s")
        runners = sim.sim.runners
        assert eventually(lambda: all(runners[m].refcount == 1
                                      for m in ("llama3.2:3b", "phi3:mini")))
        evicting = pool.submit(load, sim, "qwen3:8b")  # two loaded: one must go
        assert eventually(lambda: runners["phi3:mini"].keep_alive_s == 0)
        assert runners["llama3.2:3b"].keep_alive_s < 0
        assert overflowed.result().status_code == other.result().status_code == 200
        assert evicting.result().status_code == 200
    assert sim.sim.stats.self_evictions == 1


def test_a_call_without_use_mmap_reloads_a_copy_loaded_with_one(sim_factory: Sims) -> None:
    """HEAD needsReload (server/sched.go:1405-1407): `if runner.useMMapAuto && optsNew.UseMMap
    == nil` takes the copy's value; useMMapAuto is set only where the scheduler derived
    UseMMap itself (:1143-1146, 1213-1214). A copy loaded with `use_mmap: false` keeps
    UseMMap &false and useMMapAuto false, so a later call without the option compares nil
    with &false in reflect.DeepEqual (:1425) and reloads it. v0.12.6 compares the struct as
    it is (:600-612): a reload too, which the simulator does get right there."""
    sim = sim_factory("gpu", total_vram_mib=24564, version="0.33.0", time_scale=SCALE)
    assert load(sim, "qwen3:8b", options={"use_mmap": False}).status_code == 200
    assert load(sim, "qwen3:8b").status_code == 200
    assert sim.sim.stats.reloads == 1


@pytest.mark.parametrize(("version", "reloads"), [("0.33.0", 0), ("0.12.6", 1)])
def test_a_copy_ollama_chose_use_mmap_for_is_joined_by_a_call_without_one(
        sim_factory: Sims, version: str, reloads: int) -> None:
    """HEAD: a load with num_gpu 0 and no use_mmap gets use_mmap false from the scheduler
    (disableMmapDefaultReason "cpu", server/sched.go:1143-1146, 1162-1163), marked
    useMMapAuto: a later call with num_gpu 0 and no use_mmap joins the copy, and so does one
    that sends the value Ollama chose. v0.12.6 derives nothing and compares the options as
    they are (:600-612): the call with use_mmap false reloads."""
    sim = sim_factory("gpu", total_vram_mib=24564, version=version, time_scale=SCALE)
    assert load(sim, "qwen3:8b", options={"num_gpu": 0}).status_code == 200
    assert load(sim, "qwen3:8b", options={"num_gpu": 0}).status_code == 200
    assert load(sim, "qwen3:8b", options={"num_gpu": 0, "use_mmap": False}).status_code == 200
    assert sim.sim.stats.reloads == reloads


QWEN3_8B = next(m for m in CATALOG if m.name == "qwen3:8b")
# `ollama create qwen3-16k -f Modelfile` with `FROM qwen3:8b` and `PARAMETER num_ctx 16384`:
# a new manifest whose model layer is qwen3:8b's own blob (only the params layer is new)
QWEN3_16K = replace(QWEN3_8B, name="qwen3-16k:latest", modelfile_num_ctx=16384)


def test_two_names_on_one_weights_file_share_one_runner(sim_factory: Sims) -> None:
    """HEAD getRunner and processPending look the runner up by schedulerModelKey (server/
    sched.go:111-128: ModelPath, the model blob, whenever there is one; :198-200, 246-248),
    v0.12.6 by req.model.ModelPath itself (:107, 151). A model created FROM another keeps
    the other's model layer, so a call for it finds the other's runner and needsReload
    compares its own options (its Modelfile's num_ctx) with the runner's: here a reload of
    the one copy at 16384, never a second copy beside it. /api/ps then lists that one runner
    under the name of the call that loaded it (server/routes.go:2276)."""
    sim = sim_factory("gpu", total_vram_mib=24564, models=(*CATALOG, QWEN3_16K),
                      context_length=4096, time_scale=SCALE)
    assert load(sim, "qwen3:8b").status_code == 200
    r = chat(sim, "qwen3-16k", [{"role": "user", "content": "hello"}])
    assert r.status_code == 200, r.text
    assert sim.sim.stats.reloads == 1
    assert listed(sim) == {"qwen3-16k:latest"}


def test_a_queued_call_whose_client_left_keeps_its_place_in_the_load_queue(
        sim_factory: Sims) -> None:
    """GetRunner puts a call that needs a load into pendingReqCh, a channel of
    OLLAMA_MAX_QUEUE places, without blocking, else ErrMaxQueue (503; HEAD server/sched.go:
    88-95, 203-208, routes.go:3113-3114; v0.12.6 :111-117). Nothing takes a call out of it
    when its client leaves: processPending drops it only when it reaches it (HEAD :237-240;
    v0.12.6 :143-146), after the load it is busy with. So with one place, a call whose
    client left holds it, and the next call is refused."""
    sim = sim_factory("gpu", total_vram_mib=49152, context_length=4096, max_queue=1,
                      time_scale=0.3)  # qwen3:14b loads in about 3 s
    first = threading.Thread(target=load, args=(sim, "qwen3:14b"), daemon=True)
    first.start()
    time.sleep(0.2)  # loading
    with pytest.raises(httpx.ReadTimeout):  # queued, then its client leaves
        httpx.post(f"{sim.url}/api/generate", json={"model": "phi3:mini"}, timeout=0.3)
    time.sleep(0.3)  # (the simulator has seen it leave)
    third = load(sim, "llama3.2:3b")
    first.join(10)
    assert third.status_code == 503, third.text
    assert eventually(lambda: sim.sim.loads_pending == 0)  # dropped once the loader came
    assert load(sim, "llama3.2:3b").status_code == 200
    assert listed(sim) == {"qwen3:14b", "llama3.2:3b"}  # phi3:mini was never loaded


# Models created FROM qwen3:8b with runner options of their own in their Modelfiles
QWEN3_BATCH = replace(QWEN3_8B, name="qwen3-batch:latest", parameters=(("num_batch", 1024),))
QWEN3_GPU = replace(QWEN3_8B, name="qwen3-gpu:latest", parameters=(("num_gpu", 99),))
QWEN3_LORA = replace(QWEN3_8B, name="qwen3-lora:latest", adapter="ab" * 32)
QWEN3_PLAIN = replace(QWEN3_8B, name="qwen3-plain:latest", system="You are plain.")


@pytest.mark.parametrize(("first", "then", "reloads"), [
    # a Modelfile's num_batch is no automatic one (routes.go usesAutomaticNumBatch)
    ("qwen3:8b", "qwen3-batch", 1), ("qwen3-batch", "qwen3:8b", 1),
    # AdapterPaths are compared, the model's that loaded the copy with the call's (:1423)
    ("qwen3:8b", "qwen3-lora", 1), ("qwen3-lora", "qwen3:8b", 1),
    # a call whose num_gpu is -1 takes the copy's, whatever it is (:1390-1395); one that sets
    # it compares it
    ("qwen3-gpu", "qwen3:8b", 0), ("qwen3:8b", "qwen3-gpu", 1),
    ("qwen3:8b", "qwen3-plain", 0), ("qwen3-plain", "qwen3:8b", 0),
])
@pytest.mark.parametrize("version", ["0.33.0", "0.12.6"])
def test_models_of_one_file_share_its_copy_unless_their_runner_options_differ(
        sim_factory: Sims, first: str, then: str, reloads: int, version: str) -> None:
    """needsReload (HEAD server/sched.go:1381-1431; v0.12.6 :586-618) on a call for one
    model created FROM another: the options are the Modelfile's PARAMETERs under the call's
    (routes.go modelOptions)."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, time_scale=SCALE,
                      version=version,
                      models=(*CATALOG, QWEN3_BATCH, QWEN3_GPU, QWEN3_LORA, QWEN3_PLAIN))
    # kept for good: at the simulator's time scale a default keep-alive can end before /api/ps
    assert load(sim, first, keep_alive=-1).status_code == 200
    r = chat(sim, then, [{"role": "user", "content": "hello"}], keep_alive=-1)
    assert r.status_code == 200, r.text
    assert sim.sim.stats.reloads == reloads
    assert len(listed(sim)) == 1


def test_the_simulators_show_lists_a_models_runner_parameters_and_adapter(
        sim_factory: Sims) -> None:
    """As Ollama's Modelfile String() writes them (server/images.go:586-640), and as the
    sidecar's prober reads them."""
    sim = sim_factory("gpu", total_vram_mib=24564, models=(*CATALOG, QWEN3_BATCH, QWEN3_LORA))
    shown = {m: httpx.post(f"{sim.url}/api/show", json={"model": m}).json()
             for m in ("qwen3-batch", "qwen3-lora")}
    assert runner_files(shown["qwen3-batch"]) == "num_batch=1024"
    assert runner_files(shown["qwen3-lora"]) == "adapter=sha256-" + "ab" * 32
    assert weights_file(shown["qwen3-batch"]) == weights_file(shown["qwen3-lora"])


# Models created FROM qwen3:8b with a DRAFT model (0.30+, manifest.MediaTypeImageDraft)
DRAFT = SimModel("qwen3-draft:0.6b", disk_mib=500, block_count=28, embedding_length=1024,
                 head_count=16, head_count_kv=8, key_length=128, value_length=128,
                 parameter_size="0.6B")
QWEN3_SPEC = replace(QWEN3_8B, name="qwen3-spec:latest", draft=DRAFT)
QWEN3_SPEC_OTHER = replace(QWEN3_8B, name="qwen3-spec-other:latest",
                           draft=replace(DRAFT, name="other-draft:0.6b", weights=""))


@pytest.mark.parametrize(("version", "size_mib", "reloads"),
                         # 0.12's batch is 512 at any context: no 768 MiB batch tier
                         [("0.33.0", 8244 + 3276, (1, 0, 1)), ("0.12.6", 8244 - 768, (0, 0, 0))])
def test_a_draft_model_runs_beside_its_model_from_0_30(
        sim_factory: Sims, version: str, size_mib: int, reloads: tuple[int, ...]) -> None:
    """HEAD runs a model's DRAFT in its llama-server (--spec-draft-model, llm/
    llama_server.go:807-823) when draft_num_predict is above 0: 4 by default for a model
    with a DRAFT, 0 for one without unless set (server/routes.go:136-156). The draft holds
    its weights (417), a KV cache of its own at f16 (28 layers x 8 heads x 256 B x 16384 =
    1792) and compute (299 + 768: its logits over qwen3's 151936 tokens, and the batch's).
    needsReload compares draft_num_predict (api.Runner) but not the DRAFT file (:1422-1424):
    the same file without a draft reloads, another draft joins, a call's own
    draft_num_predict reloads. /api/tags counts the draft's file
    (manifest.Size). 0.12 has no DRAFT layer and no draft_num_predict."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=16384, time_scale=SCALE,
                      version=version, models=(*CATALOG, QWEN3_SPEC, QWEN3_SPEC_OTHER))
    shown = httpx.post(f"{sim.url}/api/show", json={"model": "qwen3-spec"}).json()
    drafted = f"DRAFT /root/.ollama/models/blobs/sha256-{DRAFT.weights}"
    assert (drafted in shown["modelfile"]) == (version == "0.33.0")
    tags = {m["name"]: m["size"] >> 20 for m in httpx.get(f"{sim.url}/api/tags").json()[
        "models"]}
    assert (tags["qwen3:8b"], tags["qwen3-spec:latest"]) == (5200, 5700)
    assert load(sim, "qwen3-spec").status_code == 200
    assert [m["size"] >> 20 for m in httpx.get(f"{sim.url}/api/ps").json()["models"]] == [
        size_mib]
    seen = []
    for model, options in (("qwen3:8b", {}), ("qwen3-spec-other", {}),
                           ("qwen3-spec", {"draft_num_predict": 2})):
        assert load(sim, "qwen3-spec").status_code == 200  # (the copy with the draft)
        before = sim.sim.stats.reloads
        assert load(sim, model, options=options).status_code == 200
        seen.append(sim.sim.stats.reloads - before)
    assert tuple(seen) == reloads


# qwen3.5's MTP head: one layer in the model's own file (its weights in disk_mib)
MTP_HEAD = SimModel("mtp-head", disk_mib=0, block_count=1, embedding_length=4096,
                    head_count=32, head_count_kv=8, key_length=128, value_length=128,
                    parameter_size="0.1B")
QWEN3_MTP = replace(QWEN3_8B, name="qwen3-mtp:latest", weights="", mtp=MTP_HEAD)
QWEN3_MTP_ON = replace(QWEN3_MTP, name="qwen3-mtp-on:latest",
                       parameters=(("draft_num_predict", 3),))


@pytest.mark.parametrize(("version", "copy_mib", "drafted_mib"),
                         [("0.33.0", 8244, 8244 + 1137), ("0.12.6", 8244 - 768, 8244 - 768)])
def test_an_mtp_head_runs_as_the_draft_when_draft_num_predict_is_set(
        sim_factory: Sims, version: str, copy_mib: int, drafted_mib: int) -> None:
    """A file with an MTP head (<arch>.nextn_predict_layers) is run with it as the draft
    (llm/llama_server.go:837-842, 901-907) when draft_num_predict is above 0, which Ollama
    leaves 0 for a model without a DRAFT unless set (server/routes.go:153-155): its own KV
    cache (1 layer x 8 heads x 256 values x 2 B x 16384 = 64) and compute (305 + 768); its
    weights are in the file. 0.12 runs none, nor the 768 MiB of a larger batch."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=16384, time_scale=SCALE,
                      version=version, models=(*CATALOG, QWEN3_MTP, QWEN3_MTP_ON))
    shown = httpx.post(f"{sim.url}/api/show", json={"model": "qwen3-mtp"}).json()
    assert shown["model_info"]["qwen3.nextn_predict_layers"] == 1
    sizes = []
    for model in ("qwen3-mtp", "qwen3-mtp-on"):  # one file: the second reloads the copy
        assert load(sim, model).status_code == 200
        sizes.append([m["size"] >> 20 for m in httpx.get(f"{sim.url}/api/ps").json()[
            "models"]])
    assert sizes == [[copy_mib], [drafted_mib]]


@pytest.mark.parametrize("version", ["0.33.0", "0.12.6"])
def test_an_automatic_call_on_a_copy_with_a_modelfile_num_batch_compares_ollamas_default(
        sim_factory: Sims, version: str) -> None:
    """qwen3-batch (PARAMETER num_batch 1024) loaded; a call for qwen3:8b (no num_batch):
    HEAD's needsReload keeps the request's 512 (only both automatic take the copy's,
    :1402-1404) against 1024, and reloads; v0.12.6 compares its 512 too (:595-610)."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, num_parallel=2,
                      time_scale=SCALE, version=version, models=(*CATALOG, QWEN3_BATCH))
    assert load(sim, "qwen3-batch").status_code == 200
    r = chat(sim, "qwen3:8b", [{"role": "user", "content": "hello"}])
    assert r.status_code == 200, r.text
    assert sim.sim.stats.reloads == 1
    assert len(listed(sim)) == 1
