"""Embeddings through the sidecar, with the official client, against the simulator as each
version of Ollama serves them: a model that cannot embed is refused in Ollama's words and
status without loading it (and the card stays healthy), a chat model embeds only on the
cards whose engine can, an input is sized against the batch llama-server takes it whole
in, and an unknown model is named in the embedding handlers' words."""

from __future__ import annotations

import time

import httpx
import ollama
import pytest

from loadtest.sim_engine import NO_EMBEDDING_MODEL, NO_EMBEDDING_SERVER
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims, chat
from tests.integration.test_sim_embeddings import BGE, MODELS

NEW, OLD = "0.33.0", "0.12.6"


def circuit(url: str, provider: str) -> str:
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    return next(p["circuit"] for p in state["providers"] if p["name"] == provider)


@pytest.mark.parametrize(("version", "status", "message"), [
    (NEW, 501, NO_EMBEDDING_SERVER), (OLD, 500, NO_EMBEDDING_MODEL)])
def test_an_embedding_with_a_chat_model_is_ollamas_refusal_without_a_load(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str, status: int,
        message: str) -> None:
    """qwen3 cannot embed on 0.30+ (no `--embedding` for a model without pooling) nor on
    0.12's own engine: refused as Ollama refuses it, before anything is loaded, three times
    over, and the card's next chat is served at once (its circuit stayed closed)."""
    gpu = sim_factory("gpu", version=version, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    client = ollama.Client(host=url)
    for _ in range(3):  # as many as open a failing card's circuit
        with pytest.raises(ollama.ResponseError) as caught:
            client.embed(model="qwen3:8b", input="hello")
        assert (caught.value.status_code, caught.value.error) == (status, message)
    with pytest.raises(ollama.ResponseError) as caught:
        client.embeddings(model="qwen3:8b", prompt="hello")
    assert (caught.value.status_code, caught.value.error) == (500, message)
    r = httpx.post(f"{url}/v1/embeddings", json={"model": "qwen3:8b", "input": "hello"})
    assert (r.status_code, r.json()["error"]["message"]) == (status, message)
    assert gpu.sim.stats.loads == 0 and gpu.sim.stats.inference_requests == 0
    assert circuit(url, "gpu") == "closed"
    started = time.monotonic()
    assert chat(url, "qwen3:8b", timeout=20).status_code == 200
    assert time.monotonic() - started < 15  # an open circuit holds it 60 s
    # an empty input only loads the model: Ollama answers that, as ever
    assert client.embed(model="qwen3:8b", input="").embeddings == []


@pytest.mark.parametrize(("version", "status"), [("0.20.0", 501), (OLD, 500)])
def test_the_engines_refusal_to_embed_is_the_callers_error_not_the_cards(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str, status: int) -> None:
    """With OLLAMA_NEW_ENGINE (which no API shows) llama3.2 runs on Ollama's own engine, which
    refuses to embed with it after its load: the sidecar did not see that coming, and relays
    the refusal as it came, neither retried on the other card nor counted against either."""
    gpus = [sim_factory(name, version=version, new_engine=True, time_scale=SCALE)
            for name in ("a", "b")]
    url = sidecar_factory(gpus).url
    model = "llama3.2:3b"
    client = ollama.Client(host=url)
    for _ in range(3):
        with pytest.raises(ollama.ResponseError) as caught:
            client.embed(model=model, input="hello")
        assert caught.value.status_code == status
        assert "does not support embeddings" in caught.value.error
    assert sum(g.sim.stats.inference_requests for g in gpus) == 3  # none retried elsewhere
    assert [circuit(url, g.config.name) for g in gpus] == ["closed", "closed"]
    assert 'kubemoot_upstream_errors_total{provider=' not in httpx.get(f"{url}/metrics").text
    started = time.monotonic()
    assert chat(url, model, timeout=20).status_code == 200
    assert time.monotonic() - started < 15


def test_a_mixed_fleet_embeds_with_a_chat_model_on_the_cards_that_can(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """llama3.2 embeds on 0.12's llama engine, not on 0.30+; qwen3 on neither."""
    new = sim_factory("new", version=NEW, time_scale=SCALE)
    old = sim_factory("old", version=OLD, time_scale=SCALE)
    url = sidecar_factory([new, old]).url
    r = httpx.post(f"{url}/api/embed", json={"model": "llama3.2:3b", "input": "hi"})
    assert r.status_code == 200 and r.headers["x-kubemoot-provider"] == "old", r.text
    r = httpx.post(f"{url}/api/embed", json={"model": "qwen3:8b", "input": "hi"})
    assert r.status_code in (500, 501) and "does not support embeddings" in r.json()["error"]
    assert new.sim.stats.loads == 0 and old.sim.stats.loads == 1


@pytest.mark.parametrize("version", [NEW, OLD])
def test_an_unknown_model_in_the_embedding_handlers_words(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str) -> None:
    url = sidecar_factory([sim_factory("gpu", version=version, time_scale=SCALE)]).url
    client = ollama.Client(host=url)
    words = 'model "nope" not found, try pulling it first'
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model="nope", input="hi")
    assert (caught.value.status_code, caught.value.error) == (404, words)
    with pytest.raises(ollama.ResponseError) as caught:
        client.embeddings(model="nope", prompt="hi")
    assert (caught.value.status_code, caught.value.error) == (404, words)


@pytest.mark.parametrize("version", [NEW, OLD])
def test_an_input_is_sized_against_the_batch_that_takes_it_whole(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str) -> None:
    """bge-m3's shape (CLS pooling, trained for 8192) on a card at 8192: at 0.30+ llama-
    server takes an input whole in a batch of min(2048, num_ctx), so a ~3400-token input is
    refused up front with its own figure, nothing loaded; 0.12 embeds it within the context.
    With `truncate: true` Ollama cuts it to the batch, as asked."""
    gpu = sim_factory("gpu", models=MODELS, context_length=8192, version=version,
                      time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    client = ollama.Client(host=url)
    text = "w " * 6000  # the sidecar reads ~3400 tokens, the engine 3000
    if version == OLD:
        assert len(client.embed(model=BGE.name, input=text).embeddings) == 1
        return
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model=BGE.name, input=text)
    assert caught.value.status_code == 413
    said = caught.value.error
    assert "about 34" in said and "is 2048 tokens" in said and "one batch" in said, said
    assert "answer" not in said and "2 for the input's start and end tokens" in said, said
    assert gpu.sim.stats.loads == 0
    assert len(client.embed(model=BGE.name, input=text, truncate=True).embeddings) == 1
    assert gpu.sim.stats.truncations == 1


def test_an_input_the_sidecar_undersized_is_placed_again_at_the_batch_not_the_context(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Text the engine reads at 2 characters a token: the sidecar takes ~1260 tokens to fit
    the 2048-token batch, llama-server counts 2200 and refuses (Ollama gives no count). The
    call is placed again at the batch it was refused at, not the context: 413, naming the
    batch, with no other load."""
    gpu = sim_factory("gpu", models=MODELS, context_length=8192, chars_per_token=2.0,
                      time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    r = httpx.post(f"{url}/api/embed", timeout=30,
                   json={"model": BGE.name, "input": "w " * 2200})
    assert r.status_code == 413 and r.json()["reason"] == "prompt-too-large", r.text
    assert "is 2048 tokens" in r.json()["error"] and "one batch" in r.json()["error"]
    assert (gpu.sim.stats.loads, gpu.sim.stats.reloads) == (1, 0)
    assert circuit(url, "gpu") == "closed"
