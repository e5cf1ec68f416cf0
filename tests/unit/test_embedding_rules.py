"""An embedding as the card's Ollama runs it: from 0.30 only a model with a pooling type
embeds (llama-server gets `--embedding` for no other), 0.12's own engine refuses a model it
does not pool while its llama engine embeds with any, and at 0.30+ an input to a model that
pools every token must fit llama-server's batch. The sidecar refuses what Ollama would, in
its words and status, before anything is loaded, and sizes an input against that batch."""

from __future__ import annotations

import pytest

from proxy.api.capabilities import embeds
from proxy.core.engine_errors import callers_error
from proxy.core.engines import (
    NO_EMBEDDING_MODEL,
    NO_EMBEDDING_SERVER,
    embedding_refusal,
    embedding_window,
)
from proxy.core.models import not_found
from proxy.core.placement import place
from proxy.core.types import Lack, ModelInfo
from proxy.service.codec import decode_model_info, encode_model_info
from tests.unit.builders import call, gpu, snapshot

QWEN = ModelInfo(capabilities=("completion", "tools", "thinking"), architecture="qwen3",
                 family="qwen3", trained_context=40960)
LLAMA = ModelInfo(capabilities=("completion", "tools"), architecture="llama", family="llama",
                  trained_context=131072)
NOMIC = ModelInfo(capabilities=("embedding",), architecture="nomic-bert", family="nomic-bert",
                  embedding=True, pooling_type=1, trained_context=2048)
# A mean-pooled model trained for 8192 tokens (bge-m3's shape), and one that pools the last
# token (qwen3-embedding's): llama-server splits only the latter's input over batches
LONG_MEAN = ModelInfo(capabilities=("embedding",), architecture="bert", family="bert",
                      embedding=True, pooling_type=2, trained_context=8192)
LONG_LAST = ModelInfo(capabilities=("embedding",), architecture="qwen3", family="qwen3",
                      embedding=True, pooling_type=3, trained_context=32768)
SIZED = {"nomic-embed-text:latest": {0: 300}, "bge-m3:latest": {0: 1300},
         "qwen3-embedding:latest": {0: 800}}
API, LEGACY, OPENAI = "/api/embed", "/api/embeddings", "/v1/embeddings"


@pytest.mark.parametrize(("info", "version", "path", "refused"), [
    (QWEN, "0.33.0", API, Lack(NO_EMBEDDING_SERVER, 501)),
    (QWEN, "0.33.0", OPENAI, Lack(NO_EMBEDDING_SERVER, 501)),
    (QWEN, "0.33.0", LEGACY, Lack(NO_EMBEDDING_SERVER, 500)),
    (LLAMA, "", API, Lack(NO_EMBEDDING_SERVER, 501)),  # unknown: the newest rules
    (NOMIC, "0.33.0", API, None),
    (QWEN, "0.12.6", API, Lack(NO_EMBEDDING_MODEL, 500)),  # Ollama's own engine
    (QWEN, "0.12.6", LEGACY, Lack(NO_EMBEDDING_MODEL, 500)),
    (QWEN, "0.20.0", API, Lack(NO_EMBEDDING_MODEL, 501)),  # the runner's status from 0.13.3
    (QWEN, "0.20.0", LEGACY, Lack(NO_EMBEDDING_MODEL, 500)),
    (LLAMA, "0.12.6", API, None),  # the llama engine embeds with any model
    (QWEN, "0.12.5", API, None),  # qwen3 on the llama engine in 0.12.5 only
    (LONG_LAST, "0.12.6", API, None),  # qwen3_embed: pooled on Ollama's own engine
    (ModelInfo(), "0.33.0", API, None),  # nothing known of it: the engine decides
    (None, "0.33.0", API, None),
])
def test_which_card_embeds_with_which_model_and_ollamas_answer_when_not(
        info: ModelInfo | None, version: str, path: str, refused: Lack | None) -> None:
    assert embedding_refusal(info, version, path) == refused


@pytest.mark.parametrize(("path", "body", "embedded"), [
    (API, {"input": "hi"}, API),
    (API, {"input": ["a", ""]}, API),
    (API, {"input": ""}, ""),  # a load, answered 200 with no embedding
    (API, {"input": []}, ""),
    (API, {}, ""),
    (API, {"input": ["a", 1]}, ""),  # Ollama's own 400 "invalid input type" first
    (LEGACY, {"prompt": "hi"}, LEGACY),
    (LEGACY, {"prompt": ""}, ""),
    (OPENAI, {"input": ""}, OPENAI),  # the OpenAI layer makes "" one input
    (OPENAI, {"input": []}, ""),  # its own 400 "invalid input"
    (OPENAI, {}, ""),
    ("/api/chat", {"input": "hi"}, ""),
])
def test_which_calls_embed(path: str, body: dict[str, object], embedded: str) -> None:
    assert embeds(path, body) == embedded


def test_an_embedding_with_a_chat_model_is_refused_as_ollama_answers_it_unloaded() -> None:
    card = gpu("a", residents=("qwen3:8b",), models={"qwen3:8b": QWEN}, version="0.33.0")
    for path, status in ((API, 501), (OPENAI, 501), (LEGACY, 500)):
        decision = place(call("qwen3:8b", embeds=path, generates=False), snapshot(card))
        assert (decision.outcome, decision.placement, decision.reason, decision.status) == (
            "unsupported", None, NO_EMBEDDING_SERVER, status)
    old = gpu("a", models={"qwen3:8b": QWEN}, version="0.12.6")
    decision = place(call("qwen3:8b", embeds=API, generates=False), snapshot(old))
    assert (decision.outcome, decision.reason, decision.status) == (
        "unsupported", NO_EMBEDDING_MODEL, 500)


def test_a_mixed_fleet_embeds_with_a_chat_model_only_where_its_engine_can() -> None:
    new = gpu("new", residents=("llama3.2:3b",), models={"llama3.2:3b": LLAMA},
              version="0.33.0")
    old = gpu("old", models={"llama3.2:3b": LLAMA}, version="0.12.6")
    decision = place(call("llama3.2:3b", embeds=API, generates=False), snapshot(new, old))
    assert decision.placement is not None and (
        decision.placement.provider, decision.placement.kind) == ("old", "cold")
    chat = place(call("llama3.2:3b"), snapshot(new, old))  # a chat joins the warm copy
    assert chat.placement is not None and chat.placement.provider == "new"


def test_an_in_tolerance_candidate_that_embeds_takes_the_call() -> None:
    card = gpu("a", residents=("qwen3:8b",), models={
        "qwen3:8b": QWEN, "nomic-embed-text:latest": NOMIC}, version="0.33.0",
        observed={"qwen3:8b": {0: 6000}, **SIZED})
    spec = call(("qwen3:8b", 70), ("nomic-embed-text:latest", 65), embeds=API,
                generates=False)
    decision = place(spec, snapshot(card))
    assert decision.placement is not None and \
        decision.placement.model == "nomic-embed-text:latest"


@pytest.mark.parametrize(("info", "version", "context", "window"), [
    (LONG_MEAN, "0.33.0", 8192, 2048),  # llama-server's batch, min(2048, num_ctx)
    (LONG_MEAN, "0.33.0", 1024, 1024),
    (LONG_LAST, "0.33.0", 8192, 8192),  # split over batches: the context
    (LONG_MEAN, "0.12.6", 8192, 8192),  # 0.12's runners take any input within the context
    (QWEN, "0.12.6", 8192, 8192),
])
def test_an_embedding_input_fits_the_batch_llama_server_takes_it_in(
        info: ModelInfo, version: str, context: int, window: int) -> None:
    assert embedding_window(info, version, context) == window


def test_an_input_over_the_batch_is_refused_with_its_own_figure_not_placed() -> None:
    card = gpu("a", ctx=8192, models={"bge-m3:latest": LONG_MEAN}, version="0.33.0",
               observed=SIZED)
    over = place(call("bge-m3:latest", tokens=3000, embeds=API, generates=False),
                 snapshot(card))
    assert over.outcome == "prompt-too-large"
    assert "about 3000 tokens" in over.reason and "is 2048 tokens" in over.reason
    assert "one batch" in over.reason and "truncate: true" in over.reason
    under = place(call("bge-m3:latest", tokens=2000, embeds=API, generates=False),
                  snapshot(card))
    assert under.placement is not None and under.placement.context_length == 2048
    old = gpu("a", ctx=8192, models={"bge-m3:latest": LONG_MEAN}, version="0.12.6",
              observed=SIZED)
    placed = place(call("bge-m3:latest", tokens=3000, embeds=API, generates=False),
                   snapshot(old))
    assert placed.placement is not None and placed.placement.context_length == 8192


def test_an_unknown_model_in_the_words_of_the_path() -> None:
    card = gpu("a", models={"qwen3:8b": QWEN}, disk_mib={"qwen3:8b": 5200})
    for generates, words in ((True, "model 'nope:latest' not found"),
                             (False, 'model "nope:latest" not found, try pulling it first')):
        decision = place(call("nope:latest", generates=generates), snapshot(card))
        assert (decision.outcome, decision.reason) == ("model-not-found", words)
    assert not_found("nope", embedding=True) == 'model "nope" not found, try pulling it first'


@pytest.mark.parametrize("message", [NO_EMBEDDING_SERVER, NO_EMBEDDING_MODEL])
def test_an_engines_refusal_to_embed_is_the_callers_error(message: str) -> None:
    assert callers_error(message)
    assert not callers_error("llama-server process no longer running: unknown ")


def test_the_pooling_type_is_shared_with_the_provider_state() -> None:
    assert decode_model_info(encode_model_info(LONG_LAST)) == LONG_LAST
    assert decode_model_info({"embedding": True}).pooling_type == -1  # older writer
