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
    # kept for good: at the simulator's time scale a default keep-alive could end mid-test
    httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b", "keep_alive": -1},
               timeout=30)
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


# What Ollama's OpenAI and Anthropic layers refuse from the body alone, before any model
# (middleware/openai.go:395-465, middleware/anthropic.go:731-761): the caller's dialect,
# Ollama's words.
LAYER_REFUSALS = [
    ("/v1/chat/completions", {"model": "qwen3:8b", "messages": []},
     "[] is too short - 'messages'"),
    ("/v1/chat/completions", {"model": "qwen3:8b", "messages": HI, "max_tokens": "5"},
     "json: cannot unmarshal string into Go struct field ChatCompletionRequest.max_tokens "
     "of type int"),
    ("/v1/completions", {"model": "qwen3:8b", "prompt": "hi", "temperature": "hot"},
     "json: cannot unmarshal string into Go struct field CompletionRequest.temperature "
     "of type float32"),
    # a list of prompts (or of tokens): Ollama's completions take one string
    ("/v1/completions", {"model": "qwen3:8b", "prompt": ["hi", "there"]},
     "json: cannot unmarshal array into Go struct field CompletionRequest.prompt of type "
     "string"),
    ("/v1/completions", {"model": "qwen3:8b", "prompt": "hi", "stream": True,
                         "stream_options": {"include_usage": "yes"}},
     "json: cannot unmarshal string into Go struct field StreamOptions.stream_options."
     "include_usage of type bool"),
    ("/v1/chat/completions", {"model": "qwen3:8b", "messages": HI, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "json: cannot unmarshal string into Go struct field ToolFunction.tools.function.parameters"
     " of type api.ToolFunctionParameters"),
    ("/v1/chat/completions", {"model": "qwen3:8b", "messages": HI,
                              "response_format": "json_object"},
     "json: cannot unmarshal string into Go struct field ChatCompletionRequest.response_format"
     " of type openai.ResponseFormat"),
    ("/v1/chat/completions", {"model": "qwen3:8b", "messages": HI, "response_format": {
        "type": "json_schema", "json_schema": "object"}},
     "json: cannot unmarshal string into Go struct field "
     "ResponseFormat.response_format.json_schema of type openai.JsonSchema"),
    ("/v1/chat/completions", {"model": "qwen3:8b", "messages": HI, "logprobs": "true"},
     "json: cannot unmarshal string into Go struct field ChatCompletionRequest.logprobs of "
     "type bool"),
    ("/v1/chat/completions", {"model": "qwen3:8b", "messages": HI, "reasoning": "high"},
     "json: cannot unmarshal string into Go struct field ChatCompletionRequest.reasoning of "
     "type openai.Reasoning"),
    # an assistant's tool call with its arguments as an object: a string on this API
    ("/v1/chat/completions", {"model": "qwen3:8b", "messages": [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "f",
                                                                          "arguments": {}}}]},
        *HI]},
     "json: cannot unmarshal object into Go struct field .messages.tool_calls.function."
     "arguments of type string"),
    ("/v1/embeddings", {"model": "nomic-embed-text", "input": []}, "invalid input"),
    # token arrays: Ollama's embed handler takes texts only
    ("/v1/embeddings", {"model": "nomic-embed-text", "input": [[1, 2, 3]]}, "invalid input type"),
    ("/v1/embeddings", {"model": "nomic-embed-text", "input": [1, 2, 3]}, "invalid input type"),
    ("/v1/embeddings", {"model": "nomic-embed-text", "input": "hi", "encoding_format": "hex"},
     "Invalid value for 'encoding_format' = hex. Supported values: ['float', 'base64']."),
    # openai.EmbedRequest's typed fields, bound before anything is checked
    ("/v1/embeddings", {"model": "nomic-embed-text", "input": "hi", "dimensions": "256"},
     "json: cannot unmarshal string into Go struct field EmbedRequest.dimensions of type int"),
    ("/v1/embeddings", {"model": "nomic-embed-text", "input": [], "encoding_format": 1},
     "json: cannot unmarshal number into Go struct field EmbedRequest.encoding_format of type "
     "string"),
    ("/v1/messages", {"model": "qwen3:8b", "messages": HI}, "max_tokens is required and "
     "must be positive"),
    ("/v1/messages", {"model": "qwen3:8b", "max_tokens": 0, "messages": HI},
     "max_tokens is required and must be positive"),
    ("/v1/messages", {"model": "qwen3:8b", "max_tokens": 5, "messages": []},
     "messages is required"),
    ("/v1/messages", {"model": "qwen3:8b", "max_tokens": 5, "messages": HI,
                      "stop_sequences": "\n\n"},
     "json: cannot unmarshal string into Go struct field MessagesRequest.stop_sequences of "
     "type []string"),
    ("/v1/messages", {"model": "qwen3:8b", "max_tokens": 5, "messages": HI,
                      "thinking": {"type": "enabled", "budget_tokens": "1024"}},
     "json: cannot unmarshal string into Go struct field ThinkingConfig.thinking.budget_tokens"
     " of type int"),
    ("/v1/messages", {"model": "qwen3:8b", "max_tokens": 5, "messages": HI,
                      "tool_choice": "auto"},
     "json: cannot unmarshal string into Go struct field MessagesRequest.tool_choice of type "
     "anthropic.ToolChoice"),
]


@pytest.mark.parametrize(("path", "body", "message"), LAYER_REFUSALS)
def test_a_call_ollamas_dialect_layer_refuses_is_its_400_before_any_placement(
        sim_factory: Sims, sidecar_factory: Sidecars, path: str, body: dict[str, Any],
        message: str) -> None:
    """Refused at once, even when no GPU has room and the call cannot wait (placed, it was a
    503 `gpu-busy` then, or a wait for a slot only to be refused after it), and never sent."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[1:3] + CATALOG[5:6])
    url = sidecar_factory([gpu]).url
    _ready(url)
    refused = httpx.post(f"{url}{path}", json=body, headers={"X-Kubemoot-Wait": "false"})
    assert refused.status_code == 400, refused.text
    answer = refused.json()
    assert (answer["error"]["message"], answer["reason"], answer["model"]) == (
        message, "bad-request", body["model"])
    assert "x-kubemoot-provider" not in refused.headers
    assert (gpu.sim.stats.requests, gpu.sim.stats.loads) == (0, 0)


def _openai_empty_messages(url: str) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="qwen3:8b", messages=[], timeout=10)
    assert caught.value.response.json()["error"]["message"] == "[] is too short - 'messages'"


def _native_tool_parameters_as_a_string(url: str) -> None:
    refused = httpx.post(f"{url}/api/chat", timeout=10, json={
        "model": "qwen3:8b", "messages": HI, "stream": False, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": "{}"}}]})
    assert refused.status_code == 400


@pytest.mark.parametrize("malformed", [_openai_empty_messages,
                                       _native_tool_parameters_as_a_string],
                         ids=["openai-empty-messages", "native-tool-parameters"])
def test_a_malformed_call_gets_its_400_while_every_gpu_is_busy(
        sim_factory: Sims, sidecar_factory: Sidecars, malformed: Any) -> None:
    """A malformed call does not wait behind a running one for a refusal it could have had
    at once."""
    import threading

    from tests.e2e.test_scheduling import stream_in_background

    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[2:3], time_scale=0.05)
    url = sidecar_factory([gpu], discuss_gpu_wait_limit_seconds=60).url
    _ready(url)
    leave = threading.Event()  # the running call ends once the refusal is checked
    running = stream_in_background(url, "qwen3:8b", 4000, threading.Event(), leave)
    try:
        assert eventually(lambda: gpu.sim.stats.inference_requests == 1, timeout_s=20)
        malformed(url)
        assert gpu.sim.stats.requests == 1
    finally:
        leave.set()
        running.join(60)


# What Ollama's own API refuses when it binds the body (a typed field of the wrong type, an
# image that is not base64), before it looks for the model.
NATIVE_REFUSALS = [
    ("/api/chat", {"messages": [{**HI[0], "images": ["aGk="]}, {**HI[0], "images": ["!!"]}]},
     "illegal base64 data at input byte 0"),
    ("/api/generate", {"prompt": "hi", "images": ["aGVsbG8=", "aGVsbG8"]},
     "illegal base64 data at input byte 4"),
    ("/api/generate", {"prompt": "hi", "raw": "yes"},
     "json: cannot unmarshal string into Go struct field GenerateRequest.raw of type bool"),
    ("/api/generate", {"prompt": "hi", "suffix": 5},
     "json: cannot unmarshal number into Go struct field GenerateRequest.suffix of type string"),
    ("/api/chat", {"messages": HI, "truncate": "no"},
     "json: cannot unmarshal string into Go struct field ChatRequest.truncate of type bool"),
    ("/api/chat", {"messages": HI, "top_logprobs": 1.5},
     "json: cannot unmarshal number 1.5 into Go struct field ChatRequest.top_logprobs of type "
     "int"),
    ("/api/embed", {"model": "nomic-embed-text", "input": "hi", "dimensions": "8"},
     "json: cannot unmarshal string into Go struct field EmbedRequest.dimensions of type int"),
    ("/api/embed", {"model": "nomic-embed-text", "input": ["hi", 5]}, "invalid input type"),
    ("/api/chat", {"messages": HI, "options": "temperature=0"},
     "json: cannot unmarshal string into Go struct field ChatRequest.options of type "
     "map[string]interface {}"),
    ("/api/embeddings", {"model": "nomic-embed-text", "prompt": "hi", "options": [1]},
     "json: cannot unmarshal array into Go struct field EmbeddingRequest.options of type "
     "map[string]interface {}"),
    ("/api/embed", {"model": "nomic-embed-text", "input": {"text": "hi"}}, "invalid input type"),
    # nested fields: tools, a message's tool calls and thinking, generate's images
    ("/api/chat", {"messages": HI, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "json: cannot unmarshal string into Go struct field ToolFunction.tools.function.parameters"
     " of type api.ToolFunctionParameters"),
    ("/api/chat", {"messages": HI, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "required": "city"}}}]},
     "json: cannot unmarshal string into Go struct field "
     "ToolFunctionParameters.tools.function.parameters.required of type []string"),
    ("/api/chat", {"messages": HI, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": ["city"]}}}]},
     "Value looks like object, but can't find closing '}' symbol"),
    ("/api/chat", {"messages": HI, "tools": [{"type": "function", "function": {"name": 5}}]},
     "json: cannot unmarshal number into Go struct field ToolFunction.tools.function.name of "
     "type string"),
    ("/api/chat", {"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": '{"city": "Paris"}'}}]}, *HI]},
     "Value looks like object, but can't find closing '}' symbol"),
    ("/api/chat", {"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"index": "0", "name": "f", "arguments": {}}}]}, *HI]},
     "json: cannot unmarshal string into Go struct field "
     "ChatRequest.messages.tool_calls.function.index of type int"),
    ("/api/chat", {"messages": [{**HI[0], "thinking": 5}]},
     "json: cannot unmarshal number into Go struct field ChatRequest.messages.thinking of type "
     "string"),
    ("/api/generate", {"prompt": "hi", "images": [5]},
     "json: cannot unmarshal number into Go struct field GenerateRequest.images of type "
     "api.ImageData"),
]


@pytest.mark.parametrize(("path", "body", "message"), NATIVE_REFUSALS)
def test_a_body_ollama_cannot_bind_is_its_400_before_any_placement(
        sim_factory: Sims, sidecar_factory: Sidecars, path: str, body: dict[str, Any],
        message: str) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[1:3] + CATALOG[5:6])
    url = sidecar_factory([gpu]).url
    _ready(url)
    body = {"model": "qwen3:8b", "stream": False, **body}
    refused = httpx.post(f"{url}{path}", json=body, headers={"X-Kubemoot-Wait": "false"})
    assert refused.status_code == 400, refused.text
    assert refused.json() == {"error": message, "reason": "bad-request", "model": body["model"]}
    assert "x-kubemoot-provider" not in refused.headers
    assert (gpu.sim.stats.requests, gpu.sim.stats.loads) == (0, 0)


def test_raw_with_a_system_is_ollamas_400_once_the_model_is_found(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama looks for the model before it refuses `raw` with a system (server/routes.go:
    422-424), and unloads before both."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[1:3])
    url = sidecar_factory([gpu]).url
    _ready(url)
    client = ollama.Client(host=url)
    with pytest.raises(ollama.ResponseError) as caught:
        client.generate(model="qwen3:8b", prompt="hi", raw=True, system="be brief")
    assert (caught.value.status_code, caught.value.error) == (
        400, "raw mode does not support template, system, or context")
    assert (gpu.sim.stats.requests, gpu.sim.stats.loads) == (0, 0)
    with pytest.raises(ollama.ResponseError) as missing:
        client.generate(model="nosuch:1b", prompt="hi", raw=True, system="be brief")
    assert missing.value.status_code == 404
    unloaded = client.generate(model="qwen3:8b", raw=True, system="be brief", keep_alive=0)
    assert unloaded.done_reason == "unload"


# What Go binds to a field's zero value (a field left out or null), which Ollama answers
ZERO_VALUES = [
    ("/api/chat", {"messages": [{"content": "hello there"}]}),  # no role
    ("/api/chat", {"messages": [{"role": None, "content": "hello there"}]}),
    ("/api/chat", {"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1"}, {"function": None},
        {"function": {"name": None, "arguments": None}}]}, *HI]}),
    ("/api/chat", {"messages": HI, "tools": [None]}),
    ("/api/generate", {"prompt": "hi", "context": [1, None, 3]}),
]


@pytest.mark.parametrize(("path", "body"), ZERO_VALUES)
def test_a_field_go_reads_as_its_zero_value_is_not_refused(
        sim_factory: Sims, sidecar_factory: Sidecars, path: str, body: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[1:3])
    url = sidecar_factory([gpu]).url
    _ready(url)
    answer = httpx.post(f"{url}{path}", timeout=30,
                        json={"model": "qwen3:8b", "stream": False, **body})
    assert answer.status_code == 200, answer.text
    assert answer.json()["done"]


def test_a_format_ollama_cannot_use_is_its_refusal_once_the_model_is_found(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama refuses a `format` that is neither "json" nor a schema object only once the
    model is loaded (a 500, llm/server.go Completion); the sidecar refuses it before placing
    the call, with Ollama's words, after the model's 404 and never for a load."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[1:3])
    url = sidecar_factory([gpu]).url
    _ready(url)
    for path, body in (("/api/chat", {"messages": HI}), ("/api/generate", {"prompt": "hi"})):
        refused = httpx.post(f"{url}{path}", json={
            "model": "qwen3:8b", "stream": False, "format": "yaml", **body})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == \
            'invalid format: "\\"yaml\\""; expected "json" or a valid JSON Schema object'
    schema = httpx.post(f"{url}/v1/chat/completions", json={
        "model": "qwen3:8b", "messages": HI, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}})
    assert schema.status_code == 400, schema.text
    assert schema.json()["error"]["message"] == \
        'invalid format: "\\"object\\""; expected "json" or a valid JSON Schema object'
    # (openai.ResponseFormat and its JsonSchema are Go structs: any case of their keys)
    folded = httpx.post(f"{url}/v1/chat/completions", json={
        "model": "qwen3:8b", "messages": HI, "response_format": {
            "Type": "json_schema", "JSON_SCHEMA": {"Name": "x", "Schema": "object"}}})
    assert folded.json()["error"]["message"] == schema.json()["error"]["message"]
    assert (gpu.sim.stats.requests, gpu.sim.stats.loads) == (0, 0)
    assert httpx.post(f"{url}/api/chat", json={
        "model": "nosuch:1b", "messages": HI, "format": 5}).status_code == 404
    client = ollama.Client(host=url)
    assert client.chat(model="qwen3:8b", messages=HI, format={"type": "object"}).done
    loaded = httpx.post(f"{url}/api/generate", json={"model": "qwen3:8b", "format": [1]})
    assert loaded.json()["done_reason"] == "load"


@pytest.mark.parametrize("raw", [
    # half an emoji, as a JavaScript client that cut a string writes it (JSON.stringify)
    b'{"model":"qwen3:8b","stream":false,"messages":[{"role":"user","content":"hi \\ud83d"}]}',
    # text in Latin-1, not UTF-8
    b'{"model":"qwen3:8b","stream":false,"messages":[{"role":"user","content":"caf\xe9"}]}',
    # something after the object, which Go's json.Decoder leaves unread
    b'{"model":"qwen3:8b","stream":false,"messages":[{"role":"user","content":"hi"}]}\n\n{}',
])
def test_a_body_ollama_reads_is_read(sim_factory: Sims, sidecar_factory: Sidecars,
                                     raw: bytes) -> None:
    """Ollama reads bodies with Go's encoding/json (gin's ShouldBindJSON): invalid UTF-8 and
    lone surrogates become U+FFFD and what follows the first value is ignored, so the call is
    answered, not refused as invalid JSON."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[2:3])
    url = sidecar_factory([gpu]).url
    _ready(url)
    answer = httpx.post(f"{url}/api/chat", content=raw, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["done"] is True
    still_refused = httpx.post(f"{url}/api/chat", content=b'{"model": NaN}', timeout=30)
    assert still_refused.status_code == 400


@pytest.mark.parametrize("extra", [{}, {"suffix": [None]}])
def test_a_completion_with_an_odd_tools_field_is_answered_as_ollama_does(
        sim_factory: Sims, sidecar_factory: Sidecars, extra: dict[str, object]) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    url = sidecar_factory([gpu]).url
    body = {"model": "qwen3:8b", "prompt": "hi", "tools": 1.5, **extra}
    direct = httpx.post(f"{gpu.url}/v1/completions", json=body, timeout=30)
    answered = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert answered.status_code == direct.status_code, (direct.text, answered.text)


def _said(r: httpx.Response) -> tuple[int, str]:
    error = r.json()["error"]
    return r.status_code, error if isinstance(error, str) else error["message"]


@pytest.mark.parametrize(("path", "raw"), [
    ("/api/generate", b"{nope}"),
    ("/api/chat", b'{"model": "qwen3:8b", "messages": ['),
    ("/api/generate", b'[{"model": "qwen3:8b"}]'),
    ("/api/show", b'"qwen3:8b"'),
    ("/api/embed", b" \n"),
    ("/v1/chat/completions", b"{nope}"),
    ("/v1/completions", b"12"),
    ("/v1/embeddings", b"  "),
    ("/v1/messages", b'{"model": tru}'),
])
def test_a_body_ollama_cannot_decode_is_refused_in_its_words(
        sim_factory: Sims, sidecar_factory: Sidecars, path: str, raw: bytes) -> None:
    """gin's ShouldBindJSON's words, as the provider's Ollama answers the same body (real
    0.12.6 and 0.24.0: "invalid character 'n' looking for beginning of object key string",
    "unexpected EOF", "json: cannot unmarshal array into Go value of type
    api.GenerateRequest"), in the caller's dialect, before any placement."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[1:3])
    url = sidecar_factory([gpu]).url
    ollamas = httpx.post(f"{gpu.url}{path}", content=raw)
    assert _said(httpx.post(f"{url}{path}", content=raw)) == _said(ollamas)
    assert gpu.sim.stats.inference_requests == gpu.sim.stats.loads == 0


def test_a_local_model_is_retrieved_as_the_providers_ollama_retrieves_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """RetrieveMiddleware over ShowHandler (v0.12.6 server/routes.go:1492, openai.go:406-413
    ToModel): the name as asked, show's modified_at, its namespace (real 0.12.6: 200)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[1:3])
    url = sidecar_factory([gpu]).url
    for name in ("qwen3:8b", "QWEN3:8b"):
        mine, ollamas = (httpx.get(f"{base}/v1/models/{name}") for base in (url, gpu.url))
        assert (mine.status_code, mine.json()) == (200, ollamas.json()), name
    mine, ollamas = (httpx.get(f"{base}/v1/models/nope:1b") for base in (url, gpu.url))
    assert _said(mine) == _said(ollamas) == (404, "model 'nope:1b' not found")
