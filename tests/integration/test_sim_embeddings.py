"""The simulator's embeddings pinned to Ollama's source (docs/engine.md, "Embeddings"): which
model embeds on which version, with Ollama's words and status for one that cannot (after the
load, which stays), the batch llama-server takes an input whole in at 0.30+, the OpenAI
layer's inputs and `dimensions`, and an unknown model's words on each path."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from loadtest.sim_engine import INPUT_TOO_LONG, NO_EMBEDDING_MODEL, NO_EMBEDDING_SERVER
from loadtest.sim_model import CATALOG, SimModel
from tests.integration.test_simulator_rules import SCALE, Sims, ps

# Embedding models trained for longer than 2048 tokens: one that pools every token (bge-m3's
# shape, CLS) and one that pools the last (qwen3-embedding's), which llama-server may split
BGE = SimModel("bge-m3:latest", disk_mib=1100, arch="bert", block_count=24,
               embedding_length=1024, head_count=16, head_count_kv=16, trained_ctx=8192,
               parameter_size="567M", quantization="F16", embedding=True, pooling=2)
QWEN_EMBED = SimModel("qwen3-embedding:0.6b", disk_mib=610, block_count=28,
                      embedding_length=1024, head_count=16, head_count_kv=8, key_length=128,
                      value_length=128, trained_ctx=32768, parameter_size="0.6B",
                      quantization="Q8_0", embedding=True, pooling=3)
MODELS = (*CATALOG, BGE, QWEN_EMBED)
TEXT = "w " * 6000  # 3000 tokens at 4 characters each


def post(sim: Any, path: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{sim.url}{path}", json=body, timeout=30)


@pytest.mark.parametrize(("version", "model", "status", "legacy", "message"), [
    ("0.33.0", "llama3.2:3b", 501, 500, NO_EMBEDDING_SERVER),  # no --embedding
    ("0.33.0", "qwen3:8b", 501, 500, NO_EMBEDDING_SERVER),
    ("0.12.6", "qwen3:8b", 500, 500, NO_EMBEDDING_MODEL),  # Ollama's own engine
    ("0.20.0", "qwen3:8b", 501, 500, NO_EMBEDDING_MODEL),  # the runner's status from 0.13.3
])
def test_a_model_that_cannot_embed_is_loaded_then_refused(
        sim_factory: Sims, version: str, model: str, status: int, legacy: int,
        message: str) -> None:
    sim = sim_factory("gpu", version=version, keep_alive_s=1e6, time_scale=SCALE)
    r = post(sim, "/api/embed", model=model, input=["hi", "there"])
    assert (r.status_code, r.json()) == (status, {"error": message})
    assert model in ps(sim)  # loaded first, and kept
    r = post(sim, "/api/embeddings", model=model, prompt="hi")
    assert (r.status_code, r.json()) == (legacy, {"error": message})
    r = post(sim, "/v1/embeddings", model=model, input="hi")
    assert r.status_code == status
    assert r.json()["error"] == {"message": message, "type": "api_error", "param": None,
                                 "code": None}
    # no input: the load alone, answered as ever
    assert post(sim, "/api/embed", model=model, input="").json()["embeddings"] == []
    assert post(sim, "/api/embeddings", model=model, prompt="").json() == {"embedding": []}
    assert sim.sim.stats.loads == 1


@pytest.mark.parametrize(("new_engine", "status"), [(False, 200), (True, 500)])
def test_on_0_12_the_llama_engine_embeds_with_any_model(sim_factory: Sims, new_engine: bool,
                                                        status: int) -> None:
    """llama3.2 runs on the llama engine unless OLLAMA_NEW_ENGINE moves it to Ollama's own,
    which has it in its registry and refuses to embed with it."""
    sim = sim_factory("gpu", version="0.12.6", new_engine=new_engine, time_scale=SCALE)
    r = post(sim, "/api/embed", model="llama3.2:3b", input="hi")
    assert r.status_code == status, r.text


def test_an_over_long_input_on_a_chat_model_is_refused_as_over_long_first(
        sim_factory: Sims) -> None:
    """/api/embed checks the context before the runner embeds (routes.go:928-939): with
    `truncate: false` that 400 comes first; the legacy path's runner refuses first."""
    sim = sim_factory("gpu", total_vram_mib=16376, context_length=2048, time_scale=SCALE)
    r = post(sim, "/api/embed", model="qwen3:8b", input=TEXT, truncate=False)
    assert (r.status_code, r.json()["error"]) == (400, INPUT_TOO_LONG)
    r = post(sim, "/api/embeddings", model="qwen3:8b", prompt=TEXT)
    assert (r.status_code, r.json()["error"]) == (500, NO_EMBEDDING_SERVER)


@pytest.mark.parametrize(("model", "version", "body", "status", "count"), [
    # 0.30+, a model that pools every token: the batch, min(2048, num_ctx), takes the input
    (BGE, "0.33.0", {"truncate": False}, 400, None),
    (BGE, "0.33.0", {}, 200, 2046),  # cut to the batch and retried (routes.go:956-973)
    (BGE, "0.33.0", {"options": {"num_batch": 4096}}, 200, 3000),  # the call's own batch
    (BGE, "0.12.6", {"truncate": False}, 200, 3000),  # 0.12: the context alone
    (QWEN_EMBED, "0.33.0", {"truncate": False}, 200, 3000),  # split over batches
])
def test_an_input_must_fit_the_batch_llama_server_takes_it_whole_in(
        sim_factory: Sims, model: SimModel, version: str, body: dict[str, Any], status: int,
        count: int | None) -> None:
    sim = sim_factory("gpu", version=version, models=MODELS, context_length=8192,
                      time_scale=SCALE)
    r = post(sim, "/api/embed", model=model.name, input=TEXT, **body)
    assert r.status_code == status, r.text
    if count is None:
        assert r.json()["error"] == INPUT_TOO_LONG
    else:
        assert r.json()["prompt_eval_count"] == count
    assert sim.sim.stats.truncations == (1 if count == 2046 else 0)


def test_the_legacy_path_never_cuts_an_input_over_the_batch(sim_factory: Sims) -> None:
    sim = sim_factory("gpu", models=MODELS, context_length=8192, time_scale=SCALE)
    r = post(sim, "/api/embeddings", model=BGE.name, prompt=TEXT)
    assert (r.status_code, r.json()["error"]) == (500, INPUT_TOO_LONG)
    assert post(sim, "/api/embeddings", model=BGE.name, prompt="w " * 4000).status_code == 200


def test_an_embedding_models_batch_is_a_load_option(sim_factory: Sims) -> None:
    """HEAD sets min(2048, num_ctx) as an embedding model's num_batch (not automatic), so a
    call that sets another reloads the copy (server/routes.go:150-152, 216-218,
    sched.go:1402-1404)."""
    sim = sim_factory("gpu", models=MODELS, context_length=8192, time_scale=SCALE)
    assert post(sim, "/api/embed", model=BGE.name, input="x").status_code == 200
    assert post(sim, "/api/embed", model=BGE.name, input="x",
                options={"num_batch": 2048}).status_code == 200
    assert sim.sim.stats.reloads == 0
    assert post(sim, "/api/embed", model=BGE.name, input="x",
                options={"num_batch": 4096}).status_code == 200
    assert sim.sim.stats.reloads == 1


@pytest.mark.parametrize(("body", "message"), [({}, "invalid input"),
                                               ({"input": []}, "invalid input")])
def test_the_openai_layer_refuses_no_input(sim_factory: Sims, body: dict[str, Any],
                                           message: str) -> None:
    sim = sim_factory("gpu", time_scale=SCALE)
    r = post(sim, "/v1/embeddings", model="nomic-embed-text", **body)
    assert r.status_code == 400 and r.json()["error"]["message"] == message
    assert sim.sim.stats.loads == 0


def test_the_openai_layer_embeds_an_empty_text_and_dimensions_cut_the_vector(
        sim_factory: Sims) -> None:
    sim = sim_factory("gpu", time_scale=SCALE)
    r = post(sim, "/v1/embeddings", model="nomic-embed-text", input="")
    assert r.status_code == 200 and len(r.json()["data"]) == 1
    full = post(sim, "/v1/embeddings", model="nomic-embed-text", input="hi").json()
    cut = post(sim, "/v1/embeddings", model="nomic-embed-text", input="hi",
               dimensions=4).json()
    vector = full["data"][0]["embedding"]
    short = cut["data"][0]["embedding"]
    assert len(short) == 4 and len(vector) > 4
    assert math.isclose(math.hypot(*short), 1.0, abs_tol=1e-5)  # normalized again
    assert math.isclose(math.hypot(*vector), 1.0, abs_tol=1e-5)
    norm = math.hypot(*vector[:4])
    assert all(math.isclose(a, b / norm, abs_tol=1e-5) for a, b in zip(short, vector[:4],
                                                                        strict=True))
    native = post(sim, "/api/embed", model="nomic-embed-text", input="hi", dimensions=4)
    assert native.json()["embeddings"] == [short]


@pytest.mark.parametrize("version", ["0.33.0", "0.12.6"])
def test_an_unknown_model_on_the_embedding_paths(sim_factory: Sims, version: str) -> None:
    """handleScheduleError's words (server/routes.go:3116), not the chat handler's."""
    sim = sim_factory("gpu", version=version, time_scale=SCALE)
    words = 'model "nope" not found, try pulling it first'
    for path, field in (("/api/embed", "input"), ("/api/embeddings", "prompt")):
        r = post(sim, path, model="nope", **{field: "hi"})
        assert (r.status_code, r.json()) == (404, {"error": words})
    r = post(sim, "/v1/embeddings", model="nope", input="hi")
    assert r.status_code == 404
    assert r.json()["error"]["message"] == words
    assert r.json()["error"]["type"] == "not_found_error"
