"""Request fields the sidecar treats as Ollama does, end to end with the official `ollama` and
`openai` clients through the sidecar to simulated GPUs: `keep_alive` only where Ollama reads
it, `suffix` only on a model that can insert, `shift: false` never shifted, Ollama's own
first checks in its words, and what an unload of an unknown model and `/v1/models` say."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import ollama
import openai
import pytest

from loadtest.sim_model import CATALOG
from tests.conftest import eventually
from tests.e2e.test_dialects import anthropic_for, client_for
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims

HI: Any = [{"role": "user", "content": "hello there"}]
LLAMA = CATALOG[3]  # llama3.2:3b


def _loaded(gpu: Any) -> list[str]:
    return [m["model"] for m in httpx.get(f"{gpu.url}/api/ps").json()["models"]]


def test_keep_alive_on_the_openai_and_anthropic_apis_is_ignored_as_ollama_ignores_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama's OpenAI and Anthropic request structs have no keep_alive: a call there that
    sends `keep_alive: 0` leaves its model loaded."""
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    reply = client_for(url).chat.completions.create(model="qwen3:8b", messages=HI,
                                                    extra_body={"keep_alive": 0})
    assert reply.choices[0].message.content
    anthropic_for(url).messages.create(model="qwen3:8b", max_tokens=16, messages=HI,
                                       extra_body={"keep_alive": "0s"})
    assert not eventually(lambda: not _loaded(gpu), timeout_s=1.0)
    assert _loaded(gpu) == ["qwen3:8b"] and gpu.sim.stats.unloads == 0
    # on Ollama's own API it is read: the call's model goes once it ends
    ollama.Client(host=url).chat(model="qwen3:8b", messages=HI, keep_alive=0)
    assert eventually(lambda: not _loaded(gpu))


def test_the_simulator_ignores_keep_alive_on_openais_embeddings(sim_factory: Sims) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    r = httpx.post(f"{gpu.url}/v1/embeddings", json={"model": "nomic-embed-text", "input": "x",
                                                     "keep_alive": 0}, timeout=30)
    assert r.status_code == 200, r.text
    assert not eventually(lambda: not _loaded(gpu), timeout_s=0.5)


def test_an_unload_of_a_model_no_provider_has_is_ollamas_404(sim_factory: Sims,
                                                             sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    client = ollama.Client(host=url)
    for unload in (lambda: client.generate(model="nothing:1b", keep_alive=0),
                   lambda: client.chat(model="nothing:1b", messages=[], keep_alive="0s")):
        with pytest.raises(ollama.ResponseError) as caught:
            unload()
        assert (caught.value.status_code, caught.value.error) == (
            404, "model 'nothing:1b' not found")
    assert client.generate(model="qwen3:8b", keep_alive=0).done_reason == "unload"
    direct = httpx.post(f"{gpu.url}/api/generate", json={"model": "nothing:1b", "keep_alive": 0})
    assert (direct.status_code, direct.json()) == (404, {"error": "model 'nothing:1b' not found"})


def test_openai_models_are_owned_by_their_namespace(sim_factory: Sims,
                                                    sidecar_factory: Sidecars) -> None:
    mine = replace(LLAMA, name="someone/llama3.2:3b")
    gpu = sim_factory("gpu", models=(CATALOG[2], mine), time_scale=SCALE)
    client = client_for(sidecar_factory([gpu]).url)
    owners = {m.id: m.owned_by for m in client.models.list()}
    assert owners == {"qwen3:8b": "library", "someone/llama3.2:3b": "someone"}


@pytest.mark.parametrize("name", ["someone/llama3.2:3b", "library/qwen3:8b", "hf.co/x/y:q4"])
def test_a_namespaced_model_is_not_retrieved_as_ollamas_router_has_no_such_path(
        sim_factory: Sims, sidecar_factory: Sidecars, name: str) -> None:
    """gin's `/v1/models/:model` takes one path segment, from the decoded path: a name with
    a slash (`%2F`, as the openai client sends it, or not) is its router's 404 for every
    method (server/routes.go:1920), though the list names the model."""
    mine = replace(LLAMA, name="someone/llama3.2:3b")
    gpu = sim_factory("gpu", models=(CATALOG[2], mine), time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    for base in (url, gpu.url):
        with pytest.raises(openai.NotFoundError):
            client_for(base).models.retrieve(name)
        for method in ("GET", "HEAD"):
            assert httpx.request(method, f"{base}/v1/models/{name}").status_code == 404
    refused = httpx.get(f"{url}/v1/models/{name}").json()
    assert refused["reason"] == "not-found" and "GET /v1/models" in refused["error"]["message"]
    assert client_for(url).models.retrieve("qwen3:8b").owned_by == "library"


@pytest.mark.parametrize("version", ["0.30.6", "0.30.7"])
def test_openai_models_are_listed_and_retrieved_as_the_versions_ollama_names_them(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str) -> None:
    """The list's ids are the tags entries' (`name` before 0.30.7, `model` from it, as
    ToListCompletion reads them), the simulator's list alike; one model's id is the name as
    asked (ToModel is given the path's name, not the one found)."""
    gpu = sim_factory("gpu", version=version, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    assert eventually(lambda: httpx.get(f"{url}/api/version").json().get("version") == version)
    listed = httpx.get(f"{url}/v1/models").json()["data"]
    assert sorted(listed, key=str) == sorted(httpx.get(f"{gpu.url}/v1/models").json()["data"],
                                             key=str)
    found = client_for(url).models.retrieve("Qwen3:8B")
    assert (found.id, found.owned_by) == ("Qwen3:8B", "library")


def test_an_openai_refusal_is_in_ollamas_shape_with_the_reason_beside_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    client = client_for(sidecar_factory([gpu]).url)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="qwen3:32b", messages=HI)  # no card holds it
    assert info.value.status_code == 507
    body: Any = info.value.body
    assert {k: v for k, v in body.items() if k != "message"} == {
        "type": "api_error", "param": None, "code": None}
    assert "qwen3:32b" in body["message"] and info.value.code is None
    assert info.value.response.json()["reason"] == "model-too-large"


def _ready(url: str) -> None:
    assert eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200)


def test_a_suffix_goes_only_to_a_model_that_can_insert(sim_factory: Sims,
                                                       sidecar_factory: Sidecars) -> None:
    """Ollama refuses a suffix, before any load, on a model whose template has no `.Suffix`
    (server/routes.go:448-451): the sidecar places it on an in-tolerance candidate that can
    insert, or answers Ollama's 400 in its words with nothing loaded."""
    coder = replace(LLAMA, name="qwen2.5-coder:1.5b", insert=True)
    gpu = sim_factory("gpu", total_vram_mib=24564, models=(CATALOG[2], coder),
                      time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _ready(url)
    client = ollama.Client(host=url)
    with pytest.raises(ollama.ResponseError) as caught:
        client.generate(model="qwen3:8b", prompt="def add(a, b):", suffix="    return c")
    assert (caught.value.status_code, caught.value.error) == (
        400, "registry.ollama.ai/library/qwen3:8b does not support insert")
    with pytest.raises(openai.BadRequestError) as info:
        client_for(url).completions.create(model="qwen3:8b", prompt="def add(a, b):",
                                           suffix="    return c")
    assert info.value.message.endswith("qwen3:8b does not support insert")
    assert (gpu.sim.stats.loads, gpu.sim.stats.inference_requests) == (0, 0)
    assert client.generate(model="qwen3:8b", prompt="hi", suffix="").done  # empty: no insert

    either = sidecar_factory([gpu], model_candidates_mulling=(
        '[{"model": "qwen3:8b", "score": 70}, {"model": "qwen2.5-coder:1.5b", "score": 65}]')
                             ).url
    _ready(either)
    r = httpx.post(f"{either}/api/generate", json={
        "model": "qwen3:8b", "prompt": "def add(a, b):", "suffix": "    return c",
        "stream": False}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-model"] == "qwen2.5-coder:1.5b"


THINK_FORMS = '"high", "medium", "low", "max", true, or false'


def test_ollamas_first_checks_are_answered_in_its_words_before_any_placement(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """A `think` value Ollama's decoder refuses and top_logprobs outside 0-20 (from 0.12.11)
    are its 400s, in its words, before the sidecar places the call."""
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _ready(url)
    client = ollama.Client(host=url)
    for ask, message in (
            (dict(think="bogus"), f'invalid think value: "bogus" (must be {THINK_FORMS})'),
            (dict(top_logprobs=21), "top_logprobs must be between 0 and 20")):
        with pytest.raises(ollama.ResponseError) as caught:
            client.chat(model="qwen3:8b", messages=HI, **ask)  # type: ignore[arg-type]
        assert (caught.value.status_code, caught.value.error) == (400, message)
    with pytest.raises(openai.BadRequestError) as info:
        client_for(url).chat.completions.create(model="qwen3:8b", messages=HI, logprobs=True,
                                                top_logprobs=25)
    assert info.value.message.endswith("top_logprobs must be between 0 and 20")
    assert info.value.response.json()["reason"] == "bad-request"
    with pytest.raises(openai.BadRequestError):
        client_for(url).completions.create(model="qwen3:8b", prompt="hi", logprobs=21)
    assert (gpu.sim.stats.loads, gpu.sim.stats.inference_requests) == (0, 0)
    assert not httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"]
    assert client.chat(model="qwen3:8b", messages=HI, think="max", top_logprobs=20).done


def test_an_older_ollamas_checks_are_its_own(sim_factory: Sims,
                                             sidecar_factory: Sidecars) -> None:
    """0.12.6 has no top_logprobs (ignored) and no "max" level: its words, without it."""
    gpu = sim_factory("gpu", version="0.12.6", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _ready(url)
    client = ollama.Client(host=url)
    assert client.chat(model="qwen3:8b", messages=HI, top_logprobs=21).done
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="qwen3:8b", messages=HI, think="max")
    assert (caught.value.status_code, caught.value.error) == (
        400, 'invalid think value: "max" (must be "high", "medium", "low", true, or false)')


@pytest.mark.parametrize("version", ["0.12.6", "0.33.0"])
def test_an_answer_told_not_to_shift_stops_at_the_context_and_reloads_nothing(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str) -> None:
    """`shift: false`: an answer that would run past the context stops there with
    done_reason "length" instead of shifting it silently. 0.12 takes it per call; from 0.30
    it is a load option that would reload the copy, so the sidecar caps the answer instead.
    (The official client has no `shift`: the body is posted as it would send it.)"""
    gpu = sim_factory("gpu", total_vram_mib=16376, context_length=2048, version=version,
                      time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _ready(url)
    assert ollama.Client(host=url).chat(model="qwen3:8b", messages=HI).done  # loads it
    r = httpx.post(f"{url}/api/chat", json={
        "model": "qwen3:8b", "messages": HI, "stream": False, "shift": False,
        "options": {"sim_answer_tokens": 3000}}, timeout=30)
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["done_reason"] == "length"
    assert done["prompt_eval_count"] + done["eval_count"] <= 2048
    assert (gpu.sim.stats.truncations, gpu.sim.stats.reloads, gpu.sim.stats.loads) == (0, 0, 1)
