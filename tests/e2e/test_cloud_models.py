"""Models Ollama's cloud runs, and names that say their source (`:local`, `:cloud`, a tag
ending in `-cloud`; Ollama 0.18+): the official clients through the sidecar to simulated
GPUs. A cloud call takes no GPU, so it is sent on through a provider's Ollama as it came,
neither placed nor held; a `:local` call is placed as the model it names."""

from __future__ import annotations

import httpx
import ollama
import openai
import pytest

from loadtest.sim_cloud import CloudStub
from loadtest.sim_model import CATALOG
from tests.e2e.test_scheduling import Sidecars, Sims

HI = [{"role": "user", "content": "hello there"}]


def _chat(url: str, model: str, **extra: object) -> httpx.Response:
    return httpx.post(f"{url}/api/chat", timeout=30,
                      json={"model": model, "messages": HI, "stream": False, **extra})


@pytest.mark.parametrize(("name", "echo"), [("gpt-oss:120b-cloud", "gpt-oss:120b"),
                                            ("gpt-oss:120b:cloud", "gpt-oss:120b")])
def test_a_cloud_model_is_sent_on_without_a_gpu(sim_factory: Sims, sidecar_factory: Sidecars,
                                                name: str, echo: str) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu]).url
    client = ollama.Client(host=url)
    streamed = list(client.chat(model=name, messages=HI, stream=True))
    assert streamed[-1].done and streamed[-1].model == echo
    assert client.generate(model=name, prompt="hi").response
    answered = _chat(url, name)
    assert answered.status_code == 200
    assert answered.headers["x-kubemoot-placement"] == "cloud"
    assert answered.headers["x-kubemoot-provider"] == "gpu"
    assert answered.headers["x-kubemoot-model"] == answered.json()["model"] == echo
    assert answered.headers["x-kubemoot-waited-ms"] == "0"
    completion = openai.OpenAI(base_url=f"{url}/v1", api_key="-").chat.completions.create(
        model=name, messages=HI)  # type: ignore[arg-type]
    assert completion.choices[0].message.content
    # keep_alive 0 is the cloud's to read: not an unload of a model no GPU has
    assert _chat(url, name, keep_alive=0).status_code == 200
    embedded = httpx.post(f"{url}/api/embed", json={"model": name, "input": ["a", "b"]})
    assert embedded.headers["x-kubemoot-placement"] == "cloud"
    assert len(embedded.json()["embeddings"]) == 2
    assert (gpu.sim.stats.cloud_requests, gpu.sim.stats.loads) == (6, 0)
    assert httpx.get(f"{url}/api/ps").json()["models"] == []
    assert 'placement="cloud"' in httpx.get(f"{url}/metrics").text
    retrieved = openai.OpenAI(base_url=f"{url}/v1", api_key="-").models.retrieve(name)
    assert (retrieved.id, retrieved.owned_by) == (echo, "library")


def test_a_cloud_call_does_not_wait_for_a_busy_gpu(sim_factory: Sims,
                                                   sidecar_factory: Sidecars) -> None:
    """The one slot is taken and calls for the GPU's model would wait; a cloud call is not
    one of them."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG, time_scale=0.02)
    url = sidecar_factory([gpu], discuss_gpu_wait_limit_seconds=1).url
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{url}/api/chat", json={
            "model": "qwen3:8b", "messages": HI,
            "options": {"sim_answer_tokens": 4000}}) as busy:
        lines = busy.iter_lines()
        next(lines)  # answering: its slot is held
        waiting = _chat(url, "qwen3:8b", options={"num_predict": 5})
        assert (waiting.status_code, waiting.json()["reason"]) == (503, "gpu-busy")
        cloud = _chat(url, "gpt-oss:20b-cloud")
        assert cloud.status_code == 200 and cloud.headers["x-kubemoot-waited-ms"] == "0"


def test_a_stub_is_the_cloud_s_and_never_a_gpu_load(sim_factory: Sims,
                                                    sidecar_factory: Sidecars) -> None:
    """Before 0.18 `gpt-oss:120b-cloud` is a stub's name, listed with a `remote_host`:
    its calls go to the cloud through the Ollama that has it, which answers under that
    name; nothing of it is sized or loaded."""
    stub = CloudStub("gpt-oss:120b-cloud", "gpt-oss:120b")
    old = sim_factory("old", total_vram_mib=24564, models=CATALOG, version="0.12.6",
                      cloud_stubs=(stub,))
    url = sidecar_factory([old]).url
    answered = _chat(url, "gpt-oss:120b-cloud")
    assert answered.headers["x-kubemoot-placement"] == "cloud"
    assert answered.headers["x-kubemoot-model"] == answered.json()["model"] == \
        "gpt-oss:120b-cloud"
    assert "gpt-oss:120b-cloud" in [m.model for m in ollama.Client(host=url).list().models]
    assert (old.sim.stats.cloud_requests, old.sim.stats.loads) == (1, 0)
    # an Ollama before 0.18 has no such suffixes: `:cloud` and `:local` are names it refuses
    for name in ("gpt-oss:120b:cloud", "qwen3:8b:local"):
        for target in (url, old.url):
            refused = _chat(target, name)
            assert (refused.status_code, refused.json()["error"]) == (400, "invalid model name")


def test_a_local_name_is_placed_as_its_model(sim_factory: Sims,
                                             sidecar_factory: Sidecars) -> None:
    stub = CloudStub("mycloud:latest", "gpt-oss:120b")
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG, cloud_stubs=(stub,))
    url = sidecar_factory([gpu]).url
    client = ollama.Client(host=url)
    assert client.chat(model="qwen3:8b:local", messages=HI).model == "qwen3:8b:local"
    answered = _chat(url, "qwen3:8b:local")
    assert answered.headers["x-kubemoot-model"] == answered.json()["model"] == "qwen3:8b:local"
    assert [m["model"] for m in httpx.get(f"{url}/api/ps").json()["models"]] == ["qwen3:8b"]
    assert gpu.sim.stats.loads == 1
    # the stub's own name goes to the cloud; asked for as local it is Ollama's 404
    assert _chat(url, "mycloud").headers["x-kubemoot-placement"] == "cloud"
    for target in (url, gpu.url):
        missing = _chat(target, "mycloud:local")
        assert (missing.status_code, missing.json()["error"]) == (
            404, "model 'mycloud:local' not found")
        both = _chat(target, "qwen3:8b:local:cloud")
        assert (both.status_code, both.json()["error"]) == (
            400, 'use either :local or :cloud, not both: "qwen3:8b:local:cloud"')


def test_with_the_cloud_off_ollama_s_refusal_is_the_answer(sim_factory: Sims,
                                                           sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG, no_cloud=True)
    url = sidecar_factory([gpu]).url
    client = ollama.Client(host=url)
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="gpt-oss:20b-cloud", messages=HI)
    assert (refused.value.status_code, refused.value.error) == (
        403, "ollama cloud is disabled: remote inference is unavailable")
    with pytest.raises(ollama.ResponseError) as details:
        client.show("gpt-oss:20b-cloud")
    assert details.value.status_code == 403
    assert httpx.get(f"{url}/v1/models/gpt-oss:20b-cloud").status_code == 403
    assert httpx.get(f"{url}/api/status").json() == {
        "cloud": {"disabled": True, "source": "env"}}


def test_api_status_is_the_providers(sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama's /api/status (0.17+) says whether cloud models run; a sidecar in front of an
    older Ollama answers as it would, 404."""
    old = sim_factory("old", total_vram_mib=24564, models=CATALOG, version="0.12.6")
    new = sim_factory("new", total_vram_mib=24564, models=CATALOG)
    assert httpx.get(f"{sidecar_factory([old, new]).url}/api/status").json() == {
        "cloud": {"disabled": False, "source": "none"}}
    alone = httpx.get(f"{sidecar_factory([old]).url}/api/status")
    assert (alone.status_code, alone.json()["reason"]) == (404, "not-found")
    assert httpx.head(f"{sidecar_factory([new]).url}/api/status").status_code == 405


def test_explain_and_plans_know_a_cloud_model(sim_factory: Sims,
                                              sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu]).url
    explained = httpx.get(f"{url}/kubemoot/v1/explain", params={"model": "gpt-oss:20b-cloud"})
    assert explained.json()["decision"]["outcome"] == "cloud"
    assert explained.json()["decision"]["provider"] == "gpu"
    posted = httpx.post(f"{url}/kubemoot/v1/explain", json={"model": "x:cloud", "messages": HI})
    assert posted.json()["decision"]["outcome"] == "cloud"
    local = httpx.get(f"{url}/kubemoot/v1/explain", params={"model": "qwen3:8b:local"}).json()
    assert [v["model"] for v in local["verdicts"]] == ["qwen3:8b"]
    plan = httpx.post(f"{url}/kubemoot/v1/plans", json={"thread": "t1",
                                                        "model": "gpt-oss:20b:cloud"})
    assert (plan.status_code, plan.json()["planned"]) == (200, False)
    planned = httpx.post(f"{url}/kubemoot/v1/plans", json={"thread": "t2",
                                                          "model": "qwen3:8b:local"})
    assert (planned.status_code, planned.json()["planned"]) == (201, True)
    assert gpu.sim.stats.loads == 1


def test_a_bound_cloud_model_serves_calls_that_name_none(sim_factory: Sims,
                                                         sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu], model_model="gpt-oss:20b-cloud").url
    answered = httpx.post(f"{url}/api/chat", timeout=30, json={"messages": HI, "stream": False})
    assert answered.status_code == 200, answered.text
    assert answered.headers["x-kubemoot-placement"] == "cloud"
    assert (gpu.sim.stats.cloud_requests, gpu.sim.stats.loads) == (1, 0)


def test_a_threads_plan_is_released_when_its_call_goes_to_the_cloud(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """The plan held a GPU for the thread; its call runs on no GPU of the fleet, so nothing
    else would take the plan before it expires."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu], model_model="qwen3:8b").url
    planned = httpx.post(f"{url}/kubemoot/v1/plans", json={"thread": "t1"})
    assert planned.json()["planned"] is True
    answered = httpx.post(f"{url}/api/chat", timeout=30, headers={"X-Kubemoot-Thread": "t1"},
                          json={"model": "gpt-oss:20b-cloud", "messages": HI, "stream": False})
    assert answered.headers["x-kubemoot-placement"] == "cloud"
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert (state["tickets"], state["plans"]) == ([], [])
