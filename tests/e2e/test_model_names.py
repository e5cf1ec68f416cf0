"""Model names as Ollama reads them (types/model/name.go ParseName, each part matched
case-insensitively): the official `ollama` client through the sidecar to simulated GPUs,
every spelling of a model served by the one copy."""

from __future__ import annotations

import httpx
import ollama
import pytest

from loadtest.sim_model import CATALOG
from tests.e2e.test_scheduling import Sidecars, Sims

HI = [{"role": "user", "content": "hello there"}]
SPELLINGS = ("qwen3:8b", "Qwen3:8B", "registry.ollama.ai/library/qwen3:8b", "library/QWEN3:8b")


def _ps(url: str) -> list[str]:
    return [m["model"] for m in httpx.get(f"{url}/api/ps").json()["models"]]


@pytest.mark.parametrize("configured", ["qwen3:8b", "Qwen3:8B"])
def test_every_spelling_of_a_model_runs_on_its_one_copy(
        sim_factory: Sims, sidecar_factory: Sidecars, configured: str) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu], model_model=configured).url
    client = ollama.Client(host=url)
    for name in SPELLINGS:  # each answered under its own spelling, as Ollama echoes it
        assert client.chat(model=name, messages=HI).model == name
        assert client.generate(model=name, prompt="hi").model == name
        named = httpx.post(f"{url}/api/chat", timeout=30, json={
            "model": name, "messages": HI, "stream": False})
        assert named.headers["x-kubemoot-model"] == named.json()["model"] == name
    assert client.embed(model="NOMIC-EMBED-TEXT", input="hi").embeddings
    assert (gpu.sim.stats.inference_requests, gpu.sim.stats.loads) == (13, 2)
    assert sorted(_ps(gpu.url)) == ["nomic-embed-text:latest", "qwen3:8b"]
    assert client.show("Qwen3:8B").capabilities


def test_before_0_15_5_chat_gets_the_spelling_the_store_has(sim_factory: Sims,
                                                             sidecar_factory: Sidecars) -> None:
    """0.12.6's chat reads the manifest under the name as spelled: `Qwen3:8B` is its 404.
    The sidecar sends such a provider the spelling it lists."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG, version="0.12.6")
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=gpu.url).chat(model="Qwen3:8B", messages=HI)
    assert caught.value.status_code == 404
    assert ollama.Client(host=gpu.url).generate(model="Qwen3:8B", prompt="hi").done
    url = sidecar_factory([gpu]).url
    assert ollama.Client(host=url).chat(model="Qwen3:8B", messages=HI).model == "qwen3:8b"
    named = httpx.post(f"{url}/api/chat", timeout=30, json={
        "model": "Qwen3:8B", "messages": HI, "stream": False})
    assert named.headers["x-kubemoot-model"] == named.json()["model"] == "qwen3:8b"
    # A spelling of the same path (Ollama fills in the host, namespace and tag) is sent, and
    # echoed, as asked, as that Ollama answers it
    for client in (ollama.Client(host=gpu.url), ollama.Client(host=url)):
        assert client.chat(model="library/qwen3:8b", messages=HI).model == "library/qwen3:8b"
        assert client.embed(model="nomic-embed-text", input="hi").model == "nomic-embed-text"


@pytest.mark.parametrize("name", ["qwen3:", "qwen3:8b!", "/qwen3", "my.team/qwen3", "q" * 81])
def test_a_name_ollama_cannot_parse_is_its_400(sim_factory: Sims, sidecar_factory: Sidecars,
                                               name: str) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    for url in (sidecar_factory([gpu]).url, gpu.url):  # the simulator answers as Ollama
        with pytest.raises(ollama.ResponseError) as caught:
            ollama.Client(host=url).chat(model=name, messages=HI)
        assert (caught.value.status_code, caught.value.error) == (400, "invalid model name")
    assert (gpu.sim.stats.inference_requests, gpu.sim.stats.loads) == (0, 0)


@pytest.mark.parametrize("name", ["qwen3:", "/qwen3"])
def test_explain_refuses_a_name_ollama_cannot_parse(sim_factory: Sims, sidecar_factory: Sidecars,
                                                   name: str) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = f"{sidecar_factory([gpu]).url}/kubemoot/v1/explain"
    for r in (httpx.get(url, params={"model": name}),
              httpx.post(url, json={"model": name, "messages": HI})):
        assert r.status_code == 400
        assert (r.json()["error"], r.json()["model"]) == ("invalid model name", name)


@pytest.mark.parametrize(("path", "body", "reason"), [
    ("/api/chat", {"model": "nosuch", "messages": HI}, "model-not-found"),
    ("/v1/chat/completions", {"model": "NoSuch", "messages": HI}, "model-not-found"),
    ("/api/embed", {"model": "Nomic-Embed-Text", "input": "word " * 20000}, "prompt-too-large"),
    ("/api/chat", {"model": "library/qwen3:8b", "messages": [
        {"role": "user", "content": "word " * 40000}]}, "prompt-too-large"),
])
def test_a_refusal_names_the_model_as_the_call_did(
        sim_factory: Sims, sidecar_factory: Sidecars, path: str, body: dict[str, object],
        reason: str) -> None:
    """As `/api/show` and every 400 do, and as Ollama's own answers echo the name: not the
    sidecar's normalised spelling (`nosuch:latest`)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu]).url
    refused = httpx.post(f"{url}{path}", json={**body, "stream": False}, timeout=30).json()
    assert (refused["reason"], refused["model"]) == (reason, body["model"])


# CONTRACT.md: KUBEMOOT_MODEL_MODEL is the preferred (bound) mulling model, a request without
# a model uses the phase's preferred model, and the triage model defaults to the mulling one.
CANDIDATES = [{"model": "qwen3:8b", "score": 60}, {"model": "llama3.2:3b", "score": 55}]


def _unnamed(url: str, phase: str = "mulling") -> httpx.Response:
    return httpx.post(f"{url}/api/chat", json={"messages": HI, "stream": False},
                      headers={"X-Kubemoot-Phase": phase}, timeout=30)


def test_a_call_naming_no_model_runs_the_bound_model_not_the_lists_first(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu], model_model="llama3.2:3b",
                          model_candidates_mulling=CANDIDATES).url
    for phase in ("mulling", "triage"):
        r = _unnamed(url, phase)
        assert r.status_code == 200, r.text
        assert r.headers["x-kubemoot-model"] == r.json()["model"] == "llama3.2:3b"
    assert _ps(gpu.url) == ["llama3.2:3b"]


def test_a_triage_call_naming_no_model_runs_the_mulling_model_when_no_model_is_bound(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu], model_candidates_mulling=CANDIDATES).url
    mulling, triage = _unnamed(url), _unnamed(url, "triage")
    assert mulling.status_code == triage.status_code == 200, triage.text
    assert mulling.headers["x-kubemoot-model"] == triage.headers["x-kubemoot-model"] == "qwen3:8b"


def _send(url: str, path: str, fields: str) -> httpx.Response:
    rest = {"/api/chat": '"messages": [{"role": "user", "content": "hi"}], "stream": false',
            "/api/generate": '"prompt": "hi", "stream": false',
            "/v1/chat/completions": '"messages": [{"role": "user", "content": "hi"}]',
            "/v1/messages": '"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]',
            "/api/embed": '"input": "hi"'}[path]
    return httpx.post(f"{url}{path}", content=f"{{{fields}, {rest}}}".encode(), timeout=30,
                      headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/v1/chat/completions",
                                  "/v1/messages", "/api/embed"])
def test_of_keys_naming_the_model_the_last_is_placed_and_run_as_go_binds_them(
        sim_factory: Sims, sidecar_factory: Sidecars, path: str) -> None:
    """encoding/json binds a key to its field case-insensitively (`Model`, `MODEL`, U+017F as
    `s`) and the last of a field's keys wins: the model placed is the one Ollama runs, and
    the card runs no other (the simulator binds keys as Go does)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu]).url
    embed = path == "/api/embed"
    first, last = ("qwen3:8b", "nomic-embed-text:latest") if embed else \
        ("llama3.2:3b", "qwen3:8b")
    for fields in (f'"model": "{first}", "model": "{last}"',
                   f'"model": "{first}", "Model": "{last}"',
                   f'"MODEL": "{first}", "model": "x", "MODEL": "{last}"'):
        answered = _send(url, path, fields)
        assert answered.status_code == 200, (fields, answered.text)
        assert answered.headers["x-kubemoot-model"] == last, fields
        if not embed:
            assert answered.json()["model"] == last, fields
    assert _ps(gpu.url) == [last]
    if path == "/api/chat":  # `\u017ftream` is Go's `stream` too: the last says not to stream
        whole = httpx.post(f"{url}{path}", timeout=30, content=(
            '{"model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}], '
            '"stream": true, "\u017ftream": false}').encode())
        assert whole.json()["done"] is True
