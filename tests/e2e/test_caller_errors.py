"""The caller's own mistakes, refused as Ollama refuses them and before any placement: the
official `ollama` client through the sidecar to simulated GPUs, which must see no call (no
ticket, no load, no eviction, nothing against their health)."""

from __future__ import annotations

from typing import Any

import httpx
import ollama
import pytest

from loadtest.sim_model import CATALOG
from tests.conftest import eventually
from tests.e2e.test_scheduling import Sidecars, Sims

HI = [{"role": "user", "content": "hello there"}]


@pytest.mark.parametrize(("options", "message"), [
    ({"temperature": "0.2"}, 'option "temperature" must be of type float32'),
    ({"num_predict": "100"}, 'option "num_predict" must be of type integer'),
    ({"stop": "\n"}, 'option "stop" must be of type array'),
    ({"stop": ["a", 1]}, 'option "stop" must be of an array of strings'),
    ({"use_mmap": 1}, 'option "use_mmap" must be of type boolean'),
    ({"num_ctx": True}, 'option "num_ctx" must be of type integer'),
])
def test_a_mistyped_option_is_ollamas_400_before_any_placement(
        sim_factory: Sims, sidecar_factory: Sidecars, options: dict[str, Any],
        message: str) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[1:3])
    url = sidecar_factory([gpu]).url
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=url).chat(model="qwen3:8b", messages=HI, options=options)
    assert (caught.value.status_code, caught.value.error) == (400, message)
    assert (gpu.sim.stats.inference_requests, gpu.sim.stats.loads) == (0, 0)
    refused = httpx.post(f"{url}/api/generate", json={
        "model": "qwen3:8b", "prompt": "hi", "options": options})
    assert refused.json() == {"error": message, "reason": "bad-request", "model": "qwen3:8b"}


def test_well_typed_options_pass_as_ollama_reads_them(sim_factory: Sims,
                                                      sidecar_factory: Sidecars) -> None:
    """A whole number for a float option, a fraction for an int one (Go truncates it), null,
    and an option Ollama does not know (it ignores it) all pass."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[1:3])
    client = ollama.Client(host=sidecar_factory([gpu]).url)
    reply = client.chat(model="qwen3:8b", messages=HI, options={
        "temperature": 1, "seed": 4.0, "top_k": None, "mirostat": "whatever"})
    assert reply.done


def _ready(url: str) -> None:
    assert eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200)


@pytest.mark.parametrize(("model", "extra", "message"), [
    ("nomic-embed-text", {}, '"nomic-embed-text" does not support chat'),
    ("phi3:mini", {"think": True}, '"phi3:mini" does not support thinking'),
])
def test_a_call_the_model_cannot_take_is_ollamas_400_before_any_load(
        sim_factory: Sims, sidecar_factory: Sidecars, model: str, extra: dict[str, Any],
        message: str) -> None:
    """Ollama refuses these before loading (server/routes.go:2613-2637); the sidecar knows
    the model's capabilities from /api/show and refuses them as Ollama does, with nothing
    loaded or evicted (the 8b stays)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"}, timeout=30)
    url = sidecar_factory([gpu]).url
    _ready(url)
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=url).chat(model=model, messages=HI, **extra)
    assert (caught.value.status_code, caught.value.error) == (400, message)
    assert (gpu.sim.stats.inference_requests, gpu.sim.stats.loads) == (0, 1)
    assert [m["model"] for m in httpx.get(f"{gpu.url}/api/ps").json()["models"]] == [
        "qwen3:8b"]


def test_a_candidate_that_can_think_serves_a_thinking_call(sim_factory: Sims,
                                                           sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu], model_candidates_mulling=(
        '[{"model": "phi3:mini", "score": 70}, {"model": "qwen3:8b", "score": 65}]')).url
    _ready(url)
    r = httpx.post(f"{url}/api/chat", json={"model": "phi3:mini", "messages": HI,
                                            "think": True, "stream": False}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-model"] == "qwen3:8b"


def test_a_call_that_names_no_model_is_refused_in_its_bound_models_name(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu], model_model="phi3:mini").url
    _ready(url)
    r = httpx.post(f"{url}/api/chat", json={"messages": HI, "think": True, "stream": False},
                   timeout=30)
    assert (r.status_code, r.json()["error"]) == (400, '"phi3:mini" does not support thinking')
    assert gpu.sim.stats.loads == 0
