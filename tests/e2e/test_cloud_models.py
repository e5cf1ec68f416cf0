"""Models Ollama's cloud runs, and names that say their source (`:local`, `:cloud`, a tag
ending in `-cloud`; Ollama 0.18+): the official clients through the sidecar to simulated
GPUs. A cloud call takes no GPU, so it is sent on through a provider's Ollama as it came,
neither placed nor held; a `:local` call is placed as the model it names."""

from __future__ import annotations

import asyncio

import httpx
import nats
import ollama
import openai
import orjson
import pytest

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import with_derived
from loadtest.sim_cloud import CloudStub
from loadtest.sim_model import CATALOG
from proxy.ports import BINDINGS
from proxy.service.codec import escape_key
from proxy.service.routing import CallRequest, Granted
from tests.conftest import empty_buckets, eventually
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
    # (chat's words for a name it cannot parse, then)
    for name in ("gpt-oss:120b:cloud", "qwen3:8b:local"):
        for target in (url, old.url):
            refused = _chat(target, name)
            assert (refused.status_code, refused.json()["error"]) == (400, "model is required")


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


def test_the_account_and_web_search_are_those_of_the_provider_cloud_calls_go_through(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """`ollama run x:cloud` asks POST /api/me before it runs (cmd/cmd.go:566): the account is
    that of the Ollama the sidecar sends cloud calls through, the first up with the cloud
    on; so are a web search, a web fetch and /api/status."""
    off = sim_factory("off", total_vram_mib=24564, models=CATALOG, no_cloud=True)
    on = sim_factory("on", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([off, on]).url
    assert eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200)
    assert eventually(lambda: httpx.post(f"{url}/api/me").json().get("name") == "on")
    me = httpx.post(f"{url}/api/me")
    assert me.json() == httpx.post(f"{on.url}/api/me").json()
    assert httpx.get(f"{url}/api/status").json() == {
        "cloud": {"disabled": False, "source": "none"}}
    found = httpx.post(f"{url}/api/experimental/web_search", json={"query": "ollama"})
    assert found.json() == httpx.post(f"{on.url}/api/experimental/web_search",
                                      json={"query": "ollama"}).json()
    fetched = httpx.post(f"{url}/api/experimental/web_fetch", json={"url": "https://a.b/"})
    assert fetched.status_code == 200 and fetched.json()["title"] == "https://a.b/"
    empty = httpx.post(f"{url}/api/experimental/web_search")
    assert (empty.status_code, empty.json()) == (400, {"error": "missing request body"})
    recommended = httpx.get(f"{url}/api/experimental/model-recommendations")
    assert recommended.json()["recommendations"]
    signout = httpx.post(f"{url}/api/signout")
    assert (signout.status_code, signout.json()["reason"]) == (501, "not-supported")
    assert httpx.delete(f"{url}/api/user/keys/abc").status_code == 501
    # an Ollama that has no such path says so, as it does to a client of its own
    old = sidecar_factory([sim_factory("old", models=CATALOG, version="0.17.7")]).url
    assert eventually(lambda: httpx.get(f"{old}/readyz").status_code == 200)
    missing = httpx.post(f"{old}/api/experimental/web_search", json={"query": "x"})
    assert (missing.status_code, missing.text) == (404, "404 page not found")
    assert httpx.post(f"{old}/api/me").json()["name"] == "old"


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
    assert eventually(lambda: gpu.sim.stats.loads == 1)  # the plan's load runs after its answer


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


def test_a_bound_cloud_model_is_sent_on(sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu], model_model="gpt-oss:20b-cloud").url
    named = _chat(url, "gpt-oss:20b-cloud")
    assert named.headers["x-kubemoot-placement"] == "cloud"  # holds: named, it is sent on
    bound = httpx.post(f"{url}/api/chat", timeout=30,
                       json={"messages": HI, "stream": False})
    assert bound.status_code == 200, bound.text
    assert bound.headers["x-kubemoot-placement"] == "cloud"
    explained = httpx.get(f"{url}/kubemoot/v1/explain").json()
    assert explained["decision"]["outcome"] == "cloud"
    plan = httpx.post(f"{url}/kubemoot/v1/plans", json={"thread": "t1"}).json()
    assert plan.get("outcome") != "model-not-found", plan
    assert gpu.sim.stats.loads == 0


def test_a_stub_s_call_is_not_refused_for_what_only_a_local_model_checks(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    stub = CloudStub("mycloud:latest", "gpt-oss:120b")
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG, cloud_stubs=(stub,))
    url = sidecar_factory([gpu]).url
    body = {"model": "mycloud", "prompt": "hi", "raw": True, "template": "{{ .Prompt }}",
            "stream": False}
    assert httpx.post(f"{gpu.url}/api/generate", json=body, timeout=30).status_code == 200
    answered = httpx.post(f"{url}/api/generate", json=body, timeout=30)
    assert answered.status_code == 200, answered.text
    assert answered.headers["x-kubemoot-placement"] == "cloud"


def test_a_stub_s_generate_with_keep_alive_0_is_sent_on(sim_factory: Sims,
                                                        sidecar_factory: Sidecars) -> None:
    stub = CloudStub("mycloud:latest", "gpt-oss:120b")
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG, cloud_stubs=(stub,))
    url = sidecar_factory([gpu]).url
    body = {"model": "mycloud", "prompt": "", "keep_alive": 0, "stream": False}
    direct = httpx.post(f"{gpu.url}/api/generate", json=body, timeout=30).json()
    answered = httpx.post(f"{url}/api/generate", json=body, timeout=30)
    assert answered.json().get("done_reason") == direct["done_reason"] == "stop"
    assert answered.headers.get("x-kubemoot-placement") == "cloud"


def test_a_pull_of_a_cloud_name_is_not_refused(sim_factory: Sims,
                                               sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu]).url
    for name in ("gpt-oss:20b-cloud", "gpt-oss:20b:cloud"):
        pulled = httpx.post(f"{url}/api/pull", json={"model": name, "stream": False})
        assert (pulled.status_code, pulled.json()) == (200, {"status": "success"})


def test_an_unload_named_local_echoes_the_name(sim_factory: Sims,
                                               sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu]).url
    body = {"model": "qwen3:8b:local", "messages": [], "keep_alive": 0, "stream": False}
    direct = httpx.post(f"{gpu.url}/api/chat", json=body, timeout=30).json()
    assert direct["model"] == "qwen3:8b:local"
    assert httpx.post(f"{url}/api/chat", json=body, timeout=30).json()["model"] == \
        "qwen3:8b:local"


def test_a_provider_with_the_cloud_off_does_not_take_the_cloud_calls(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    off = sim_factory("off", total_vram_mib=24564, models=CATALOG, no_cloud=True)
    on = sim_factory("on", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([off, on]).url
    answered = _chat(url, "gpt-oss:20b-cloud")
    assert answered.status_code == 200, answered.text
    assert answered.headers["x-kubemoot-provider"] == "on"


def test_before_0_18_a_suffixed_name_is_refused_as_that_ollama_does(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    old = sim_factory("old", total_vram_mib=24564, models=CATALOG, version="0.12.6")
    url = sidecar_factory([old]).url
    for target in (old.url, url):
        chat = _chat(target, "gpt-oss:120b:cloud")
        assert (chat.status_code, chat.json()["error"]) == (400, "model is required")
        generate = httpx.post(f"{target}/api/generate", timeout=30, json={
            "model": "gpt-oss:120b:cloud", "prompt": "hi", "stream": False})
        assert (generate.status_code, generate.json()["error"]) == (
            404, "model 'gpt-oss:120b:cloud' not found")
        embed = httpx.post(f"{target}/api/embed", timeout=30, json={
            "model": "qwen3:", "input": "hi"})
        assert (embed.status_code, embed.json()["error"]) == (404, "model 'qwen3:' not found")
        legacy = httpx.post(f"{target}/api/embeddings", timeout=30, json={
            "model": "qwen3:", "prompt": "hi"})
        assert (legacy.status_code, legacy.json()["error"]) == (400, "model is required")


def test_a_cloud_embed_is_sent_on_before_its_input_is_read(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu]).url
    body = {"model": "embeddinggemma:cloud", "input": [[1, 2, 3]]}
    assert httpx.post(f"{gpu.url}/api/embed", json=body, timeout=30).status_code == 200
    embedded = httpx.post(f"{url}/api/embed", json=body, timeout=30)
    assert embedded.status_code == 200, embedded.text
    assert embedded.headers["x-kubemoot-placement"] == "cloud"


def _deployed_cloud_bound_to_gpu(sim_factory: Sims, sidecar_factory: Sidecars,
                                 nats_server: NatsServer) -> str:
    """A sidecar deployed with `gpt-oss:20b-cloud` whose binding moved it to qwen3:8b."""
    asyncio.run(empty_buckets(nats_server.url))
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu], nats_url=nats_server.url, namespace="crew",
                          agent_name="tooler", model_model="gpt-oss:20b-cloud").url
    asyncio.run(_bind(nats_server.url, "crew/tooler", {
        "namespace": "crew", "agent": "tooler", "generation": 1,
        "phases": {"mulling": {"model": "qwen3:8b", "provider": "gpu"}},
        "candidates": {"mulling": [{"model": "qwen3:8b", "score": 100}]},
        "tolerance": None, "unschedulable": []}))
    assert eventually(lambda: httpx.get(f"{url}/kubemoot/v1/explain").json()[
        "candidates"][0]["model"] == "qwen3:8b")  # the binding is read
    return url


def test_a_binding_to_a_gpu_model_is_not_sent_to_the_cloud(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    url = _deployed_cloud_bound_to_gpu(sim_factory, sidecar_factory, nats_server)
    answered = _chat(url, "gpt-oss:20b-cloud")  # the deployed name: the binding's model
    assert answered.status_code == 200, answered.text
    assert answered.headers["x-kubemoot-placement"] != "cloud"
    assert answered.headers["x-kubemoot-model"] == "qwen3:8b"


async def _bind(url: str, agent: str, binding: dict[str, object]) -> None:
    nc = await nats.connect(url)
    kv = await nc.jetstream().key_value(BINDINGS)
    await kv.put(escape_key(agent), orjson.dumps(binding))
    await nc.close()


def test_a_bound_local_name_is_its_model(sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu], model_model="qwen3:8b:local").url
    answered = httpx.post(f"{url}/api/chat", timeout=30, json={"messages": HI, "stream": False})
    assert answered.status_code == 200, answered.text
    assert answered.headers["x-kubemoot-model"] == "qwen3:8b"
    assert gpu.sim.stats.loads == 1


def test_a_stubs_details_name_the_model_it_runs(sim_factory: Sims,
                                                sidecar_factory: Sidecars) -> None:
    stub = CloudStub("mycloud:latest", "gpt-oss:120b")
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG, cloud_stubs=(stub,))
    shown = ollama.Client(host=sidecar_factory([gpu]).url).show("mycloud")
    assert shown.model_dump().get("remote_model", "gpt-oss:120b") == "gpt-oss:120b"
    assert httpx.post(f"{gpu.url}/api/show", json={"model": "mycloud"}).json()[
        "remote_model"] == "gpt-oss:120b"



def test_a_call_bound_to_a_local_name_is_not_sent_to_the_cloud(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Card a lists `mycloud` as a cloud stub, card b has a model of its own named
    `mycloud`; the role is bound to `mycloud:local`, the local one. A call naming no model
    runs on b, as Ollama runs `mycloud:local` (on a it is Ollama's 404)."""
    a = sim_factory("a", total_vram_mib=24564, models=CATALOG,
                    cloud_stubs=(CloudStub("mycloud:latest", "gpt-oss:120b"),))
    b = sim_factory("b", total_vram_mib=24564,
                    models=with_derived(CATALOG, ["mycloud=qwen3:8b:0"]))
    url = sidecar_factory([a, b], model_model="mycloud:local").url
    answered = httpx.post(f"{url}/api/chat", timeout=30,
                          json={"messages": HI, "stream": False})
    assert answered.headers.get("x-kubemoot-placement") != "cloud", answered.headers
    assert (answered.status_code, answered.headers.get("x-kubemoot-provider")) == (200, "b")


def test_an_agent_pulls_its_deployed_cloud_name_that_a_binding_moved_to_a_gpu(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    """Deployed with `gpt-oss:20b-cloud`, bound to qwen3:8b: the sidecar's pull of a cloud
    name succeeds (tests/e2e/test_cloud_models.py), and so should this one, whose calls
    run qwen3:8b, which a provider has."""
    url = _deployed_cloud_bound_to_gpu(sim_factory, sidecar_factory, nats_server)
    pulled = httpx.post(f"{url}/api/pull", timeout=30,
                        json={"model": "gpt-oss:20b-cloud", "stream": False})
    assert (pulled.status_code, pulled.json()) == (200, {"status": "success"})


def test_a_call_asks_once_whether_it_is_a_cloud_call(sim_factory: Sims,
                                                     sidecar_factory: Sidecars,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The API's checks and the call's first attempt read one answer (what it costs: the
    candidates resolved and every card's view read)."""
    from proxy.service.scheduler import Scheduler

    asked: list[str | None] = []
    ask = Scheduler.cloud_attempt

    def counted(self: Scheduler, call: CallRequest) -> Granted | None:
        asked.append(call.model)
        return ask(self, call)

    monkeypatch.setattr(Scheduler, "cloud_attempt", counted)
    url = sidecar_factory([sim_factory("gpu", total_vram_mib=24564, models=CATALOG)]).url
    for model, placement in (("qwen3:8b", "cold"), ("gpt-oss:120b-cloud", "cloud")):
        asked.clear()
        answered = _chat(url, model)
        assert answered.headers["x-kubemoot-placement"] == placement
        assert len(asked) == 1, asked
