"""Models made from one weights file (`ollama create NAME` with `FROM qwen3:8b`): Ollama runs
one copy of the file, under the name of the call that loaded it, and reloads it when a call's
runner options differ (server/sched.go schedulerModelKey, needsReload). The sidecar reads the
file from /api/show's FROM line and plans such a reload as the copy's eviction."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

import httpx
import pytest

from loadtest.ollama_sim import SimServer
from loadtest.sim_model import CATALOG
from tests.conftest import eventually
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims, chat, stream_in_background
from tests.integration.test_engine_audit import (
    QWEN3_8B,
    QWEN3_16K,
    QWEN3_BATCH,
    QWEN3_GPU,
    QWEN3_LORA,
)

# the same file and runner options; only its template differs (no tools)
QWEN3_PLAIN = replace(QWEN3_8B, name="qwen3-plain:latest", tools=False)
MODELS = (*CATALOG, QWEN3_16K, QWEN3_PLAIN)


def listed(url: str) -> set[str]:
    return {m["name"] for m in httpx.get(f"{url}/api/ps").json()["models"]}


def openai_chat(url: str, model: str, timeout: float = 30) -> httpx.Response:
    """A chat over the OpenAI API: it cannot carry num_ctx, so Ollama gives the model its own
    (its Modelfile's), not the copy's."""
    return httpx.post(f"{url}/v1/chat/completions", timeout=timeout,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def behind_a_long_8b_call(sim_factory: Sims, sidecar_factory: Sidecars, total_mib: int,
                          model: str, send: Callable[..., httpx.Response] = chat
                          ) -> tuple[SimServer, httpx.Response]:
    """A call for `model` sent (by `send`) while a long call runs on qwen3:8b's one slot,
    which it waits for: the card, and its answer."""
    gpu = sim_factory("gpu", total_vram_mib=total_mib, context_length=4096, models=MODELS,
                      time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    started = threading.Event()
    long_call = stream_in_background(url, "qwen3:8b", 400, started)
    assert started.wait(30)
    r = send(url, model, timeout=60)
    assert r.status_code == 200, r.text
    assert not long_call.is_alive()  # it ran to its end first
    return gpu, r


def test_calls_alternating_between_two_models_of_one_file_keep_each_on_its_own_card(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """qwen3-16k's calls come over the OpenAI API: at its own 16384, which the 8b's copy at
    4096 is not."""
    gpus = [sim_factory(name, total_vram_mib=16376, context_length=4096, models=MODELS,
                        time_scale=SCALE) for name in ("a", "b")]
    url = sidecar_factory(gpus).url
    placed = []
    for model in ("qwen3:8b", "qwen3-16k", "qwen3:8b", "qwen3-16k", "qwen3:8b", "qwen3-16k"):
        r = chat(url, model) if model == "qwen3:8b" else openai_chat(url, model)
        assert r.status_code == 200, r.text
        placed.append((model, r.headers["x-kubemoot-provider"],
                       r.headers["x-kubemoot-placement"]))
    homes = {model: provider for model, provider, _ in placed}
    assert homes["qwen3:8b"] != homes["qwen3-16k"], placed
    assert [kind for _, _, kind in placed[2:]] == ["warm"] * 4, placed
    for gpu in gpus:
        stats = gpu.sim.stats
        assert (stats.reloads, stats.self_evictions) == (0, 0)


def test_a_model_of_a_busy_copys_file_waits_for_its_call_then_reloads_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu, r = behind_a_long_8b_call(sim_factory, sidecar_factory, 16376, "qwen3-16k",
                                   openai_chat)
    assert (r.headers["x-kubemoot-placement"], r.headers["x-kubemoot-evicted"]) == (
        "evict", "qwen3:8b")
    assert int(r.headers["x-kubemoot-waited-ms"]) > 0
    assert listed(gpu.url) == {"qwen3-16k:latest"}
    assert (gpu.sim.stats.reloads, gpu.sim.stats.self_evictions) == (0, 0)


def test_a_model_of_a_loaded_copys_file_with_its_runner_options_is_no_eviction(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama has the call join the copy: nothing is unloaded or loaded for it, and the
    sidecar places it there warm, as that copy's call."""
    gpu = sim_factory("gpu", total_vram_mib=24564, context_length=4096, models=MODELS,
                      time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    assert chat(url, "qwen3:8b").status_code == 200
    r = chat(url, "qwen3-plain")
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-placement"] == "warm"
    assert r.headers["x-kubemoot-model"] == "qwen3-plain"
    assert gpu.sim.stats.reloads == 0
    assert eventually(lambda: listed(gpu.url) == {"qwen3:8b"}, timeout_s=5)
    again = chat(url, "qwen3:8b")
    assert again.headers["x-kubemoot-placement"] == "warm"
    assert gpu.sim.stats.loads == 1


def test_a_model_of_a_loaded_copys_file_joins_it_on_a_full_card_and_unloads_nothing(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """No room is left for a second copy of the file: planned as a load beside the copy,
    the call unloaded an idle model that Ollama never needed gone."""
    gpu = sim_factory("gpu", total_vram_mib=16376, context_length=4096, models=MODELS,
                      time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    for model in ("qwen3:8b", "llama3.2:3b", "phi3:mini"):
        assert chat(url, model).status_code == 200
    r = chat(url, "qwen3-plain")
    assert r.status_code == 200, r.text
    assert (r.headers["x-kubemoot-placement"], r.headers.get("x-kubemoot-evicted", "")) == (
        "warm", ""), dict(r.headers)
    assert listed(gpu.url) == {"qwen3:8b", "llama3.2:3b", "phi3:mini"}
    assert (gpu.sim.stats.loads, gpu.sim.stats.reloads) == (3, 0)


def test_a_model_of_a_busy_copys_file_with_its_options_waits_for_a_slot_of_that_copy(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama never loads a second copy of one file: a load planned beside the busy copy
    would queue inside Ollama instead. The call waits in the sidecar for the copy's slot."""
    gpu, r = behind_a_long_8b_call(sim_factory, sidecar_factory, 24564, "qwen3-plain")
    assert r.headers["x-kubemoot-placement"] == "warm"
    assert int(r.headers["x-kubemoot-waited-ms"]) > 0
    assert (gpu.sim.stats.loads, gpu.sim.stats.reloads) == (1, 0)


def test_keep_alive_0_on_a_call_that_joined_another_models_copy_unloads_that_copy(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, context_length=4096, models=MODELS,
                      time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    assert chat(url, "qwen3:8b").status_code == 200
    r = chat(url, "qwen3-plain", keep_alive=0)
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-placement"] == "warm"
    assert eventually(lambda: listed(gpu.url) == set(), timeout_s=5)
    again = chat(url, "qwen3:8b")
    assert again.headers["x-kubemoot-placement"] == "cold"


@pytest.mark.parametrize(("loaded", "asked", "placement"), [
    ("qwen3-gpu", "qwen3:8b", "warm"),  # a call without num_gpu takes the copy's
    ("qwen3:8b", "qwen3-gpu", "evict"),
    ("qwen3:8b", "qwen3-batch", "evict"),  # a Modelfile's num_batch is compared
    ("qwen3-lora", "qwen3:8b", "evict"),  # and its adapter
])
def test_runner_parameters_and_adapters_of_models_of_one_file_are_planned_as_ollama_runs_them(
        sim_factory: Sims, sidecar_factory: Sidecars, loaded: str, asked: str,
        placement: str) -> None:
    """The prober reads them from /api/show's Modelfile; Ollama never reloads or evicts a
    copy on its own for these calls."""
    gpu = sim_factory("gpu", total_vram_mib=24564, context_length=4096, time_scale=SCALE,
                      models=(*MODELS, QWEN3_BATCH, QWEN3_GPU, QWEN3_LORA))
    url = sidecar_factory([gpu]).url
    assert chat(url, loaded).status_code == 200
    r = chat(url, asked)
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-placement"] == placement
    assert (gpu.sim.stats.reloads, gpu.sim.stats.self_evictions) == (0, 0)
    assert gpu.sim.stats.loads == (1 if placement == "warm" else 2)


def test_a_model_with_a_context_of_its_own_joins_the_copy_when_its_call_can_carry_the_copys(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Over Ollama's API the call is sent with the num_ctx of the copy it joins, as any call
    is: qwen3-16k's short prompt runs on the 8b's copy at 4096, with no reload."""
    gpu = sim_factory("gpu", total_vram_mib=16376, context_length=4096, models=MODELS,
                      time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    assert chat(url, "qwen3:8b").status_code == 200
    r = chat(url, "qwen3-16k")
    assert (r.status_code, r.headers["x-kubemoot-placement"]) == (200, "warm"), r.text
    assert (gpu.sim.stats.loads, gpu.sim.stats.reloads) == (1, 0)


@pytest.mark.parametrize("version", ["0.12.6", "0.15.5", "0.24.0", "0.33.0"])
def test_a_model_with_a_context_of_its_own_joins_a_copy_at_the_trained_cap_as_it_was_loaded(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str) -> None:
    """OLLAMA_CONTEXT_LENGTH 65536 loads qwen3:8b (trained 40960) asked for 65536; from 0.15.5
    /api/ps lists 40960, while up to 0.29 needsReload compares the 65536. qwen3-16k, whose
    own call would ask 16384 (its Modelfile), joins that copy only if sent the 65536 its
    loader asked, not the cap its own ask would give."""
    gpu = sim_factory("gpu", total_vram_mib=24576, context_length=65536, version=version,
                      models=MODELS, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    assert chat(url, "qwen3:8b").status_code == 200
    r = chat(url, "qwen3-16k")
    assert (r.status_code, r.headers["x-kubemoot-placement"]) == (200, "warm"), r.text
    assert (gpu.sim.stats.loads, gpu.sim.stats.reloads) == (1, 0)


def test_ollama_stop_of_a_model_made_from_a_loaded_one_unloads_that_copy(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama's expireRunner finds the copy by the weights file (sched.go
    schedulerModelKey): `ollama stop qwen3-plain` unloads the copy listed as qwen3:8b."""
    gpu = sim_factory("gpu", total_vram_mib=24564, context_length=4096, models=MODELS,
                      time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    assert chat(url, "qwen3:8b").status_code == 200
    stop = httpx.post(f"{url}/api/generate", json={"model": "qwen3-plain", "keep_alive": 0})
    assert stop.status_code == 200, stop.text
    assert eventually(lambda: listed(gpu.url) == set(), timeout_s=5)


CANDIDATES = [{"model": "qwen3-plain", "score": 100}, {"model": "qwen3:8b", "score": 95}]


def test_a_candidates_busy_copy_of_the_file_unloads_nothing_for_a_model_made_from_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, context_length=4096, models=MODELS,
                      time_scale=SCALE, version="0.12.6")  # (no 80 % rule to refuse the load)
    for model in ("qwen3:8b", "llama3.2:3b", "phi3:mini"):  # (no call length learned)
        assert httpx.post(f"{gpu.url}/api/generate", json={"model": model}).status_code == 200
    url = sidecar_factory([gpu], model_candidates_mulling=CANDIDATES).url
    started = threading.Event()
    long_call = stream_in_background(url, "qwen3:8b", 400, started)
    assert started.wait(30)
    r = chat(url, "qwen3-plain", timeout=60)
    assert r.status_code == 200, r.text
    long_call.join(60)
    assert r.headers.get("x-kubemoot-evicted", "") == "", dict(r.headers)
    assert listed(gpu.url) == {"qwen3:8b", "llama3.2:3b", "phi3:mini"}
    assert (gpu.sim.stats.loads, gpu.sim.stats.reloads) == (3, 0)
