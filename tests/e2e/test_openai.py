"""OpenAI's API through the sidecar: the `openai` client -> sidecar -> simulated GPUs.

Ollama serves OpenAI's chat, completions, embeddings and models endpoints over the same
scheduler; the sidecar places the first three like native calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]
SCALE = 0.02
HI: Any = [{"role": "user", "content": "hello there"}]


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_chat_completions_streaming_or_not(sim_factory: Sims, sidecar_factory: Sidecars
                                           ) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    client = client_for(sidecar_factory([gpu]).url)
    reply = client.chat.completions.create(model="qwen3:8b", messages=HI)
    assert reply.choices[0].message.content and reply.model == "qwen3:8b"
    parts = list(client.chat.completions.create(model="qwen3:8b", messages=HI, stream=True))
    assert "".join(p.choices[0].delta.content or "" for p in parts).startswith("the answer")
    assert "qwen3:8b" in [m.id for m in client.models.list()]
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="qwen3:32b", messages=HI)
    assert info.value.status_code == 507


def test_completions_and_embeddings_are_placed(sim_factory: Sims, sidecar_factory: Sidecars,
                                               mode: dict[str, Any]) -> None:
    big = sim_factory("big", total_vram_mib=32768, time_scale=SCALE)
    small = sim_factory("small", total_vram_mib=16376, time_scale=SCALE)
    httpx.post(f"{big.url}/api/generate", json={"model": "qwen3:8b"})  # warm on the big card
    client = client_for(sidecar_factory([big, small], **mode).url)

    raw = client.completions.with_raw_response.create(model="qwen3:8b", prompt="say hi",
                                                      max_tokens=5)
    assert (raw.headers["x-kubemoot-provider"], raw.headers["x-kubemoot-placement"]) == (
        "big", "warm")
    done = raw.parse()
    assert done.choices[0].text == "the answer is forty two"
    assert done.usage is not None and done.usage.completion_tokens == 5

    parts = list(client.completions.create(model="qwen3:8b", prompt="say hi", max_tokens=5,
                                           stream=True, stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == "the answer is forty two"
    assert parts[-1].usage is not None and parts[-1].usage.prompt_tokens > 0

    vectors = client.embeddings.create(model="qwen3:8b", input=["first text", "second"])
    assert [d.index for d in vectors.data] == [0, 1] and vectors.model == "qwen3:8b"
    assert small.sim.stats.inference_requests == 0  # every call went to the warm copy
    assert big.sim.stats.inference_requests == 3


def test_one_model_is_looked_up_by_name(sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    client = client_for(sidecar_factory([gpu]).url)
    found = client.models.retrieve("qwen3:8b")
    assert (found.id, found.object, found.owned_by) == ("qwen3:8b", "model", "library")
    assert found.created > 0  # the model's modification time, as Ollama gives it
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("nothing:1b")
    assert "nothing:1b" in info.value.message


def test_a_completion_prompt_no_context_holds_is_refused_unseen(sim_factory: Sims,
                                                                sidecar_factory: Sidecars
                                                                ) -> None:
    gpu = sim_factory("gpu", context_length=4096, time_scale=SCALE)
    client = client_for(sidecar_factory([gpu]).url)
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(model="qwen3:8b", prompt="word " * 20000)
    assert info.value.status_code == 413
    body: Any = info.value.body
    assert body["code"] == "prompt-too-large" and "OLLAMA_CONTEXT_LENGTH" in body["message"]
    assert gpu.sim.stats.inference_requests == 0 and gpu.sim.stats.truncations == 0


def test_the_token_ratio_is_learned_from_openai_usage(sim_factory: Sims,
                                                      sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)  # counts 4 characters per token
    url = sidecar_factory([gpu]).url

    def estimate() -> int:
        explain = httpx.get(f"{url}/kubemoot/v1/explain",
                            params={"model": "qwen3:8b", "promptChars": 8000})
        return int(explain.json()["promptTokens"])

    assert estimate() == 2286  # 3.5 characters per token before any answer
    message = [{"role": "user", "content": "abcd" * 2000}]
    client_for(url).chat.completions.create(model="qwen3:8b", messages=message)  # type: ignore[arg-type]
    assert 1990 < estimate() < 2010  # the engine counted 2004 tokens for 8000 characters


def test_an_unknown_path_is_named_in_the_error(sim_factory: Sims, sidecar_factory: Sidecars
                                               ) -> None:
    url = sidecar_factory([sim_factory("gpu", time_scale=SCALE)]).url
    answer = httpx.post(f"{url}/v1/responses", json={"model": "qwen3:8b", "input": "hi"})
    assert answer.status_code == 404
    assert "/v1/responses" in answer.json()["error"]["message"]
    native = httpx.get(f"{url}/api/nothing")
    assert native.status_code == 404 and native.json()["reason"] == "not-found"
