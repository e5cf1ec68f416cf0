"""The other dialects Ollama speaks, through the sidecar with their official clients:
`openai` (chat, completions, Responses, embeddings, models) and `anthropic` (messages).
The sidecar places each like a native call and answers refusals in the dialect's shape.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
import zstandard

from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from tests.conftest import eventually
from tests.e2e.test_scheduling import stream_in_background

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]
SCALE = 0.02
HI: Any = [{"role": "user", "content": "hello there"}]


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def anthropic_for(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)


def no_tickets(url: str) -> bool:
    return not httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"]


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
    httpx.post(f"{big.url}/api/generate", json={"model": "llama3.2:3b"})  # warm on the big card
    httpx.post(f"{big.url}/api/embed", json={"model": "nomic-embed-text", "input": ""})
    client = client_for(sidecar_factory([big, small], **mode).url)

    raw = client.completions.with_raw_response.create(model="llama3.2:3b", prompt="say hi",
                                                      max_tokens=5)
    assert (raw.headers["x-kubemoot-provider"], raw.headers["x-kubemoot-placement"]) == (
        "big", "warm")
    done = raw.parse()
    assert done.choices[0].text.rstrip() == "the answer is forty two"
    assert done.usage is not None and done.usage.completion_tokens == 5

    parts = list(client.completions.create(model="llama3.2:3b", prompt="say hi", max_tokens=5,
                                           stream=True, stream_options={"include_usage": True}))
    text = "".join(p.choices[0].text for p in parts if p.choices)
    assert text.rstrip() == "the answer is forty two"
    assert parts[-1].usage is not None and parts[-1].usage.prompt_tokens > 0

    embedder = "nomic-embed-text:latest"
    vectors = client.embeddings.create(model=embedder, input=["first text", "second"])
    assert [d.index for d in vectors.data] == [0, 1] and vectors.model == embedder
    assert small.sim.stats.inference_requests == 0  # every call went to the warm copy
    assert big.sim.stats.inference_requests == 4  # the embedding model's load counted


def test_one_model_is_looked_up_by_name(sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    client = client_for(sidecar_factory([gpu]).url)
    found = client.models.retrieve("qwen3:8b")
    assert (found.id, found.object, found.owned_by) == ("qwen3:8b", "model", "library")
    assert found.created > 0  # the model's modification time, as Ollama gives it
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("nothing:1b")
    assert info.value.message.endswith("- model 'nothing:1b' not found")  # Ollama's words


def test_a_completion_prompt_no_context_holds_is_refused_unseen(sim_factory: Sims,
                                                                sidecar_factory: Sidecars
                                                                ) -> None:
    gpu = sim_factory("gpu", context_length=4096, time_scale=SCALE)
    client = client_for(sidecar_factory([gpu]).url)
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(model="qwen3:8b", prompt="word " * 20000)
    assert info.value.status_code == 413
    body: Any = info.value.body  # the error object, in Ollama's shape
    assert (body["type"], body["code"]) == ("api_error", None)
    assert "OLLAMA_CONTEXT_LENGTH" in body["message"]
    assert info.value.response.json()["reason"] == "prompt-too-large"  # at the top level
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
    # the engine counted 2004 tokens for 8000 characters; one prompt's count leaves a little
    # of the starting line in the fit (core/token_ratio.py). (A complete answer is learned
    # from just after its last byte is sent: SettlingResponse.)
    assert eventually(lambda: 1990 < estimate() < 2040, timeout_s=2)


def test_an_unknown_path_is_named_in_the_error(sim_factory: Sims, sidecar_factory: Sidecars
                                               ) -> None:
    url = sidecar_factory([sim_factory("gpu", time_scale=SCALE)]).url
    answer = httpx.post(f"{url}/v1/images/generations", json={"model": "x", "prompt": "hi"})
    assert answer.status_code == 404
    assert "/v1/images/generations" in answer.json()["error"]["message"]
    native = httpx.get(f"{url}/api/nothing")
    assert native.status_code == 404 and native.json()["reason"] == "not-found"


def test_anthropic_messages_are_placed(sim_factory: Sims, sidecar_factory: Sidecars,
                                       mode: dict[str, Any]) -> None:
    big = sim_factory("big", total_vram_mib=32768, time_scale=SCALE)
    small = sim_factory("small", total_vram_mib=16376, time_scale=SCALE)
    httpx.post(f"{big.url}/api/generate", json={"model": "llama3.2:3b"})  # warm on the big card
    httpx.post(f"{big.url}/api/embed", json={"model": "nomic-embed-text", "input": ""})
    url = sidecar_factory([big, small], **mode).url
    client = anthropic_for(url)

    raw = client.messages.with_raw_response.create(
        model="llama3.2:3b", max_tokens=5, system="be brief", messages=HI)
    assert (raw.headers["x-kubemoot-provider"], raw.headers["x-kubemoot-placement"]) == (
        "big", "warm")
    message = raw.parse()
    assert message.content[0].type == "text"
    assert message.content[0].text.rstrip() == "the answer is forty two"
    assert message.usage.input_tokens > 0

    with client.messages.stream(model="llama3.2:3b", max_tokens=5, messages=HI) as stream:
        assert "".join(stream.text_stream).rstrip() == "the answer is forty two"
        assert stream.get_final_message().usage.output_tokens == 5
    assert small.sim.stats.inference_requests == 0
    assert no_tickets(url)


def test_anthropic_tool_results_count_toward_the_prompt(sim_factory: Sims,
                                                        sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", context_length=4096, time_scale=SCALE)
    client = anthropic_for(sidecar_factory([gpu]).url)
    # Nearly all of this prompt is inside blocks: a tool call's input and its result.
    turns: Any = [
        {"role": "user", "content": "read the file"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read",
                                           "input": {"path": "/big"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "line " * 8000}]}]},
    ]
    with pytest.raises(anthropic.APIStatusError) as info:
        client.messages.create(model="qwen3:8b", max_tokens=5, messages=turns)
    assert info.value.status_code == 413
    body: Any = info.value.body
    assert body["error"]["type"] == "request_too_large"
    assert body["reason"] == "prompt-too-large"
    assert gpu.sim.stats.inference_requests == 0 and gpu.sim.stats.truncations == 0


def test_an_anthropic_stream_cut_by_its_provider_raises_in_the_client(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    gpu.sim.fault.mode, gpu.sim.fault.after_chunks, gpu.sim.fault.count = "midstream", 2, 1
    client = anthropic_for(url)
    with pytest.raises(anthropic.APIStatusError) as info, client.messages.stream(
            model="qwen3:8b", max_tokens=8, messages=HI) as stream:
        for _ in stream.text_stream:
            pass
    # Ollama's Anthropic layer ends it without message_stop (middleware/anthropic.go:53-70)
    assert "without event: message_stop" in str(info.value.message)
    body: Any = info.value.body  # Anthropic's error event, with the sidecar's reason
    assert (body["error"]["type"], body["reason"]) == ("api_error", "upstream-failed")
    assert eventually(lambda: no_tickets(url))


def test_an_openai_stream_cut_by_its_provider_raises_in_the_client_with_the_reason(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    gpu.sim.fault.mode, gpu.sim.fault.after_chunks, gpu.sim.fault.count = "midstream", 2, 1
    with pytest.raises(openai.APIError) as info:
        for _ in client_for(url).chat.completions.create(model="qwen3:8b", messages=HI,
                                                         stream=True, max_tokens=8):
            pass
    # Ollama's OpenAI layer ends it without [DONE] (middleware/openai.go:80-160)
    assert "without [DONE]" in info.value.message
    body: Any = info.value.body
    assert (body["code"], body["type"]) == (None, "api_error")
    assert eventually(lambda: no_tickets(url))


def test_a_responses_stream_cut_by_its_provider_ends_with_response_failed(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama's Responses layer ends a stream its engine cut without `response.completed`;
    the sidecar ends it in that API's own form, `response.failed` for the response opened,
    with OpenAI's `error` beside it, which the openai client raises."""
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    gpu.sim.fault.mode, gpu.sim.fault.after_chunks, gpu.sim.fault.count = "midstream", 2, 1
    with pytest.raises(openai.APIError) as info:
        for _ in client_for(url).responses.create(model="qwen3:8b", input="hello",
                                                  stream=True, max_output_tokens=8):
            pass
    assert "without event: response.completed" in info.value.message
    assert eventually(lambda: no_tickets(url))
    gpu.sim.fault.count = 1
    answer = httpx.post(f"{url}/v1/responses", timeout=30, json={
        "model": "qwen3:8b", "input": "hello", "stream": True, "max_output_tokens": 8})
    events = [block.split("\n") for block in answer.text.strip().split("\n\n")]
    opened, last = orjson.loads(events[0][1][6:]), orjson.loads(events[-1][1][6:])
    assert (events[-1][0], last["type"]) == ("event: response.failed", "response.failed")
    assert last["response"]["id"] == opened["response"]["id"]
    assert last["sequence_number"] == orjson.loads(events[-2][1][6:])["sequence_number"] + 1


def test_the_responses_api_is_placed(sim_factory: Sims, sidecar_factory: Sidecars,
                                     mode: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", context_length=4096, time_scale=SCALE)
    url = sidecar_factory([gpu], **mode).url
    client = client_for(url)
    reply = client.responses.create(model="llama3.2:3b", input="hello", instructions="be brief",
                                    max_output_tokens=5)
    assert reply.output_text.rstrip() == "the answer is forty two"
    events = list(client.responses.create(model="llama3.2:3b", input=HI, stream=True,
                                          max_output_tokens=5))
    assert events[-1].type == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas).rstrip() == "the answer is forty two"
    # A function's output, not a message, makes this prompt too long for the context.
    items: Any = [{"role": "user", "content": "run it"},
                  {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "x " * 10000}]
    with pytest.raises(openai.APIStatusError) as info:
        client.responses.create(model="llama3.2:3b", input=items)
    assert info.value.status_code == 413
    assert gpu.sim.stats.inference_requests == 2 and gpu.sim.stats.truncations == 0
    assert no_tickets(url)


def test_anthropic_token_counts_come_from_the_sidecars_own_sizing(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    client = anthropic_for(sidecar_factory([sim_factory("gpu")]).url)
    short = client.messages.count_tokens(
        model="qwen3:8b", messages=[{"role": "user", "content": "hi"}])
    long = client.messages.count_tokens(
        model="qwen3:8b", system="You are terse.",
        messages=[{"role": "user", "content": "tell me about GPUs " * 200}])
    assert 0 < short.input_tokens < long.input_tokens
    assert 700 < long.input_tokens < 2000  # ~3,800 characters at 3-4 per token
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="qwen3:8b", messages="not a list")  # type: ignore[arg-type]


def test_capitalised_keys_of_messages_and_blocks_count_as_go_binds_them(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Anthropic's blocks and OpenAI's messages are Go structs in Ollama's layers: `Content`
    and `Text` are their content and text. (OpenAI's content parts are maps: not folded.)"""
    url = sidecar_factory([sim_factory("gpu")]).url
    text = "tell me about GPUs " * 200

    def counted(message: dict[str, Any]) -> int:
        r = httpx.post(f"{url}/v1/messages/count_tokens",
                       json={"model": "qwen3:8b", "messages": [message]}, timeout=30)
        assert r.status_code == 200, r.text
        return int(r.json()["input_tokens"])

    lower = counted({"role": "user", "content": [{"type": "text", "text": text}]})
    assert lower > 700
    assert counted({"Role": "user", "CONTENT": [{"Type": "text", "Text": text}]}) == lower
    assert counted({"ROLE": "user", "Content": text}) == lower
    chat = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
        "model": "qwen3:8b", "max_tokens": 1, "messages": [{"Role": "user", "Content": text}]})
    assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] > 700, chat.text


def test_a_streamed_chat_teaches_the_sidecar_its_count_without_the_agent_asking(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """The sidecar asks Ollama for the usage event the agent did not ask for, learns the
    prompt's count from it (its characters per token) and drops it from the agent's stream."""
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    client = client_for(url)

    def chars_per_token() -> float:
        explained = httpx.get(f"{url}/kubemoot/v1/explain", params={"model": "qwen3:8b"})
        ratio: float = explained.json()["charsPerToken"]
        return ratio

    before = chars_per_token()
    prompt: Any = [{"role": "user", "content": "tokenizer " * 400}]
    parts = list(client.chat.completions.create(model="qwen3:8b", messages=prompt, stream=True))
    assert parts and all(p.choices and p.usage is None for p in parts)
    assert eventually(lambda: chars_per_token() != before)  # (learnt once released)
    asked = list(client.chat.completions.create(model="qwen3:8b", messages=HI, stream=True,
                                                stream_options={"include_usage": True}))
    assert asked[-1].choices == [] and asked[-1].usage is not None  # asked for: kept


def test_a_capitalised_include_usage_keeps_the_agents_usage_event(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama binds stream_options' keys without case (openai.StreamOptions), so
    `"Stream_Options":{"Include_Usage":true}` asks for the usage event: the sidecar took it for
    unasked and dropped the event from the agent's stream."""
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    answer = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
        "model": "qwen3:8b", "messages": HI, "stream": True,
        "Stream_Options": {"Include_Usage": True}})
    events = [orjson.loads(line[6:]) for line in answer.text.split("\n\n")
              if line.startswith("data: {")]
    assert answer.status_code == 200 and events, answer.text
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] > 0


class ZstdBodies(httpx.HTTPTransport):
    """Sends every request body zstd-compressed, as Codex does to /v1/responses."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = zstandard.ZstdCompressor().compress(request.read())
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        return super().handle_request(httpx.Request(
            request.method, request.url, content=body,
            headers={**headers, "Content-Encoding": "zstd"}, extensions=request.extensions))


def test_a_zstd_body_on_the_responses_api_is_read_as_ollama_reads_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama's Responses layer decompresses a `Content-Encoding: zstd` body (0.16.3 on,
    for Codex) up to 20 MiB; the sidecar refused it as no JSON."""
    gpu = sim_factory("gpu", context_length=4096, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                           http_client=httpx.Client(transport=ZstdBodies()))
    reply = client.responses.create(model="llama3.2:3b", input="hello", max_output_tokens=5)
    assert reply.output_text.rstrip() == "the answer is forty two"
    events = list(client.responses.create(model="llama3.2:3b", input=HI, stream=True,
                                          max_output_tokens=5))
    assert events[-1].type == "response.completed"
    huge = zstandard.ZstdCompressor().compress(
        b'{"model": "llama3.2:3b", "input": "' + b"a" * (21 << 20) + b'"}')
    refused = httpx.post(f"{url}/v1/responses", content=huge, timeout=60,
                         headers={"Content-Encoding": "zstd"})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "http: request body too large"
    assert gpu.sim.stats.inference_requests == 2 and no_tickets(url)


def _version_known(url: str) -> None:
    """The sidecar has heard its provider's version (its rules depend on it)."""
    assert httpx.get(f"{url}/api/version").status_code == 200
    assert eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200)


def test_a_reasoning_effort_is_read_as_the_providers_ollama_reads_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Before 0.22 Ollama's Responses API ignores `reasoning.effort`, so a model that cannot
    think takes the call (Codex sends an effort with every call); its chat takes high,
    medium, low and none, and refuses any other effort before any model is looked at."""
    gpu = sim_factory("gpu", version="0.21.2", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _version_known(url)
    client = client_for(url)
    reply = client.responses.create(model="llama3.2:3b", input="hello", max_output_tokens=5,
                                    reasoning={"effort": "medium"})
    assert reply.output_text.rstrip() == "the answer is forty two"
    served = gpu.sim.stats.requests
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="qwen3:8b", messages=HI,
                                       reasoning_effort="minimal")
    assert info.value.response.json()["error"]["message"] == (
        "invalid reasoning value: 'minimal' (must be \"high\", \"medium\", \"low\", or \"none\")")
    assert gpu.sim.stats.requests == served  # refused before any placement


@pytest.mark.parametrize(("given", "message"), [
    ({"input": [{"type": "item_reference", "id": "msg_1"}]},
     'input[0]: unknown input item type: "item_reference"'),
    ({"input": [{"content": "hello"}]}, "input[0]: input item missing required 'type' field"),
    ({"input": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]},
     "input[0]: content[0]: unknown content type: text"),
    ({"input": [{"type": "function_call_output", "call_id": "c1", "output": {"ok": True}}]},
     "input[0]: output must be a string or array: json: cannot unmarshal object into Go "
     "value of type []json.RawMessage"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "detail": "auto", "image_url": "https://example.com/a.png"}]}]},
     "image URLs are not currently supported, please use base64 encoded data instead"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_file", "filename": "a.txt", "file_data": "aGk="}]}]},
     "file inputs are not currently supported"),
    # a function call's arguments in Go's words: its syntax check, then the ordered map's
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "ls",
                 "arguments": '{"path": "/tmp",}'}]},
     "failed to parse function call arguments: invalid character '}' looking for beginning "
     "of object key string"),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "ls",
                 "arguments": {"path": "/tmp"}}]},
     "input[0]: json: cannot unmarshal object into Go struct field ResponsesFunctionCall."
     "arguments of type string"),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "[1]"}]},
     "failed to parse function call arguments: Value looks like object, but can't find "
     "closing '}' symbol"),
    # a tool's and the text format's fields bound as openai.ResponsesTool and
    # ResponsesTextFormat bind them, Go naming the path from the root
    ({"input": "hello", "tools": [{"type": "function", "name": "ls", "parameters": "{}"}]},
     "json: cannot unmarshal string into Go struct field ResponsesTool.tools.parameters of "
     "type map[string]interface {}"),
    ({"input": "hello", "text": {"format": {"type": "json_schema", "strict": "yes"}}},
     "json: cannot unmarshal string into Go struct field ResponsesTextFormat.text.format."
     "strict of type bool"),
    ({"input": "hello", "instructions": ["be brief"]},
     "json: cannot unmarshal array into Go struct field ResponsesRequest.instructions of "
     "type string"),
    ({"input": "hello", "reasoning": {"effort": "extreme"}},
     'invalid reasoning value: "extreme" (must be "minimal", "low", "medium", "high", '
     '"xhigh", "ultra", "max", or "none")'),
    # items, parts and `reasoning` are Go structs: their keys match case-insensitively
    ({"input": [{"Role": "user", "Content": [
        {"Type": "input_file", "filename": "a.txt", "file_data": "aGk="}]}]},
     "file inputs are not currently supported"),
    ({"input": "hello", "reasoning": {"EFFORT": "extreme"}},
     'invalid reasoning value: "extreme" (must be "minimal", "low", "medium", "high", '
     '"xhigh", "ultra", "max", or "none")'),
])
def test_a_responses_body_ollama_cannot_read_is_its_400_before_any_placement(
        sim_factory: Sims, sidecar_factory: Sidecars, given: dict[str, Any],
        message: str) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _version_known(url)
    with pytest.raises(openai.BadRequestError) as info:
        client_for(url).responses.create(model="llama3.2:3b", **given)
    body = info.value.response.json()
    assert (body["error"]["message"], body["reason"]) == (message, "bad-request")
    assert gpu.sim.stats.requests == 0
    # the simulator, as Ollama, refuses it alike
    direct = httpx.post(f"{gpu.url}/v1/responses", json={"model": "llama3.2:3b", **given})
    assert (direct.status_code, direct.json()["error"]["message"]) == (400, message)


def test_a_responses_input_with_capitalised_keys_is_sized_as_ollama_binds_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama reads an input item's `Role` and `Content` and a part's `Type` and `Text` as
    their fields (openai/responses.go unmarshalResponsesInputItem): the sidecar places the
    item, and sizes it, as it does the lower-case one."""
    gpu = sim_factory("gpu", context_length=4096, time_scale=SCALE)
    url = sidecar_factory([gpu]).url

    def ask(words: int) -> httpx.Response:
        return httpx.post(f"{url}/v1/responses", timeout=30, json={
            "model": "qwen3:8b", "max_output_tokens": 5, "input": [{"Role": "user", "Content": [
                {"Type": "input_text", "Text": "word " * words}]}]})

    too_long = ask(8000)  # ~11k tokens
    assert (too_long.status_code, too_long.json()["reason"]) == (413, "prompt-too-large")
    assert gpu.sim.stats.inference_requests == 0
    ok = ask(500)
    assert ok.status_code == 200 and ok.json()["usage"]["input_tokens"] > 500, ok.text


def test_a_message_go_reads_as_its_zero_value_is_answered(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama's OpenAI and Anthropic layers read a message without a role, a null tool, an
    Anthropic `system` of another type (ignored) or message content that is null as Go's
    zero values, and answer the call."""
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    roleless: Any = [{"content": "hello"}]
    reply = client_for(url).chat.completions.create(
        model="llama3.2:3b", max_tokens=5, messages=roleless, extra_body={"tools": [None]})
    assert reply.choices[0].message.content
    turns: Any = [*roleless, {"role": "assistant", "content": None},
                  {"role": "user", "content": "go on"}]
    system: Any = 7
    message = anthropic_for(url).messages.create(
        model="llama3.2:3b", max_tokens=5, system=system, messages=turns,
        extra_body={"tools": [None]})
    assert message.content[0].type == "text"


def test_the_answer_is_capped_only_by_the_field_ollama_reads(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """`max_tokens` is not a field of the Responses API (its cap is `max_output_tokens`):
    Ollama does not cap the answer by it, so the sidecar keeps no room for it either, and a
    prompt that fits its context with room for an uncapped answer's start is placed."""
    gpu = sim_factory("gpu", context_length=4096, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    reply = client_for(url).responses.create(
        model="llama3.2:3b", input="word " * 1600, extra_body={"max_tokens": 4000})
    assert reply.output_text
    assert gpu.sim.stats.truncations == 0


@pytest.mark.parametrize(("messages", "message"), [
    ([{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}],
     "image URLs are not currently supported, please use base64 encoded data instead"),
    ([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lGOD"}}]}],
     "invalid image input"),
    ([*HI, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": ""}}]}],
     "invalid tool call arguments"),
    ([{"role": "user"}], "invalid message content type: <nil>"),
    ([{"role": "user", "content": 42}], "invalid message content type: float64"),
    ([{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}],
     "invalid message format"),
])
def test_a_chat_message_ollama_cannot_convert_is_its_400_before_any_placement(
        sim_factory: Sims, sidecar_factory: Sidecars, messages: Any, message: str) -> None:
    """Ollama's OpenAI layer converts each message before the call reaches a model
    (openai/openai.go FromChatRequest): one it cannot is its 400, never placed."""
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _version_known(url)
    with pytest.raises(openai.BadRequestError) as info:
        client_for(url).chat.completions.create(model="llama3.2:3b", messages=messages)
    body = info.value.response.json()
    assert (body["error"]["message"], body["reason"]) == (message, "bad-request")
    assert gpu.sim.stats.requests == 0
    direct = httpx.post(f"{gpu.url}/v1/chat/completions",
                        json={"model": "llama3.2:3b", "messages": messages})
    assert (direct.status_code, direct.json()["error"]["message"]) == (400, message)


PNG = "iVBORw0KGgo="


@pytest.mark.parametrize(("content", "message"), [
    ([{"type": "text", "text": "what is this?"},
      {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}],
     "invalid image source type: url. Only base64 images are supported."),
    ([{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                   "data": "not base64!"}}],
     "invalid base64 image data: illegal base64 data at input byte 3"),
    ([{"type": "tool_result", "tool_use_id": "t1", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}],
     "invalid image source type: url. Only base64 images are supported."),
])
def test_an_anthropic_block_ollama_cannot_convert_is_its_400_before_any_placement(
        sim_factory: Sims, sidecar_factory: Sidecars, content: Any, message: str) -> None:
    """Ollama's Anthropic layer takes only base64 images (anthropic.go resolveImageSource),
    in a tool's result too from 0.23.4, and refuses any other before the call reaches a
    model; a base64 one is answered."""
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _version_known(url)
    client = anthropic_for(url)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="llama3.2:3b", max_tokens=5,
                               messages=[{"role": "user", "content": content}])
    body = info.value.response.json()
    assert (body["error"]["type"], body["error"]["message"], body["reason"]) == (
        "invalid_request_error", message, "bad-request")
    assert gpu.sim.stats.requests == 0
    direct = httpx.post(f"{gpu.url}/v1/messages", json={
        "model": "llama3.2:3b", "max_tokens": 5,
        "messages": [{"role": "user", "content": content}]})
    assert (direct.status_code, direct.json()["error"]["message"]) == (400, message)
    image: Any = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                              "data": PNG}}
    assert client.messages.create(model="llama3.2:3b", max_tokens=5, messages=[
        {"role": "user", "content": [image, {"type": "text", "text": "what is this?"}]}])


def test_a_completion_ollama_cannot_convert_is_its_400_before_any_placement(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _version_known(url)
    stops: Any = ["\n", 0]
    with pytest.raises(openai.BadRequestError) as info:
        client_for(url).completions.create(model="llama3.2:3b", prompt="hi", stop=stops)
    body = info.value.response.json()
    assert body["error"]["message"] == "invalid type for 'stop' field: float64"
    assert gpu.sim.stats.requests == 0
    direct = httpx.post(f"{gpu.url}/v1/completions",
                        json={"model": "llama3.2:3b", "prompt": "hi", "stop": stops})
    assert direct.json()["error"]["message"] == "invalid type for 'stop' field: float64"


def test_a_replayed_reasoning_item_is_sized_as_ollama_reads_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Codex sends each reasoning item of Ollama's answers back whole: its thinking is in
    the summary and in encrypted_content, and Ollama reads only encrypted_content. Counted
    once, this conversation fits the context; twice, it was refused as too long."""
    gpu = sim_factory("gpu", context_length=4096, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    thinking = "the user wants a file listed so I list it " * 180  # ~2200 tokens
    items: Any = [
        {"role": "user", "content": "list the files"},
        {"type": "reasoning", "id": "rs_1", "encrypted_content": thinking,
         "summary": [{"type": "summary_text", "text": thinking}]},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt b.txt"}]
    reply = client_for(url).responses.create(model="llama3.2:3b", input=items)
    assert reply.output_text


def test_a_missing_field_ollamas_layer_requires_is_refused_in_its_words(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _version_known(url)
    for path, body, message in [
        ("/v1/chat/completions", {}, "[] is too short - 'messages'"),
        ("/v1/messages", {"max_tokens": 5}, "messages is required"),
        ("/v1/messages", {"max_tokens": 5.0, "messages": HI},
         "json: cannot unmarshal number 5.0 into Go struct field MessagesRequest.max_tokens "
         "of type int")]:
        body = {"model": "llama3.2:3b", **body}
        for server in (url, gpu.url):
            refused = httpx.post(f"{server}{path}", json=body)
            assert refused.status_code == 400
            assert refused.json()["error"]["message"] == message
    assert gpu.sim.stats.requests == 3  # the ones sent to it directly: none placed


def test_a_responses_schema_ollama_cannot_use_is_its_refusal_before_any_placement(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """As on OpenAI's chat: a json_schema whose `schema` is no object is Ollama's 500 once
    the model is loaded; the sidecar answers it as a 400 before placing the call."""
    gpu = sim_factory("gpu", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _version_known(url)
    text: Any = {"format": {"type": "json_schema", "name": "answer", "schema": "object"}}
    with pytest.raises(openai.BadRequestError) as info:
        client_for(url).responses.create(model="llama3.2:3b", input="hello", text=text)
    assert info.value.response.json()["error"]["message"] == \
        'invalid format: "\\"object\\""; expected "json" or a valid JSON Schema object'
    assert (gpu.sim.stats.requests, gpu.sim.stats.loads) == (0, 0)


@pytest.mark.parametrize(("version", "path", "body"), [
    ("0.13.2", "/v1/responses", {"input": "hello"}),
    ("0.12.6", "/v1/messages", {"max_tokens": 5, "messages": HI}),
])
def test_a_dialect_the_providers_ollama_lacks_is_its_404_before_any_placement(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str, path: str,
        body: dict[str, Any]) -> None:
    """Before 0.13.3 Ollama has no Responses API, before 0.14 no Anthropic messages: its
    router's 404, which the sidecar gives without placing (and loading) anything."""
    gpu = sim_factory("gpu", version=version, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _version_known(url)
    body = {"model": "llama3.2:3b", **body}
    direct = httpx.post(f"{gpu.url}{path}", json=body)
    assert (direct.status_code, direct.text) == (404, "404 page not found")
    answer = httpx.post(f"{url}{path}", json=body)
    assert answer.status_code == 404
    assert answer.json()["reason"] == "not-found"
    assert f"the providers run {version}" in str(answer.json()["error"])
    assert (gpu.sim.stats.requests, gpu.sim.stats.loads) == (1, 0)  # the direct call only


def _residents(url: str, provider: str) -> list[str]:
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    return [r["model"] for p in state["providers"] if p["name"] == provider
            for r in p["residents"]]


def test_in_a_fleet_of_mixed_versions_a_dialect_goes_to_a_card_that_serves_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Anthropic's messages on a fleet of an Ollama 0.12.6 (no such path: its router's 404)
    and a newer one: the call is served by the newer card, even where the old one holds the
    model warm, whichever card was probed last (the sidecar's own 404 came and went with the
    probes), and none is sent to the old card to be refused there."""
    old = sim_factory("old", version="0.12.6", time_scale=SCALE)
    new = sim_factory("new", time_scale=SCALE)
    url = sidecar_factory([old, new]).url
    _version_known(url)
    warm = httpx.post(f"{old.url}/api/generate", json={"model": "llama3.2:3b"})
    assert warm.status_code == 200
    assert eventually(lambda: _residents(url, "old") == ["llama3.2:3b"])
    before = old.sim.stats.requests
    for _ in range(3):
        message = anthropic_for(url).messages.create(model="llama3.2:3b", max_tokens=5,
                                                     messages=HI)
        assert message.content[0].type == "text"
    # none was sent to the old card first (its 404, then another attempt elsewhere)
    assert (old.sim.stats.requests - before, new.sim.stats.inference_requests) == (0, 3)


def test_in_a_fleet_of_mixed_versions_a_dialect_is_served_whichever_card_was_probed_last(
        sim_factory: Sims, sidecar_factory: Sidecars, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path is a 404 before placement only when no provider's version serves it: with
    a card of 0.12.6 and a newer one, the old card being the one probed last (pinned here;
    in a fleet it is so about one probe round in two) does not make it a 404."""
    monkeypatch.setattr("proxy.app.newest_version", lambda prober: "0.12.6")
    old = sim_factory("old", version="0.12.6", time_scale=SCALE)
    new = sim_factory("new", time_scale=SCALE)
    url = sidecar_factory([old, new]).url
    _version_known(url)
    message = anthropic_for(url).messages.create(model="llama3.2:3b", max_tokens=5,
                                                 messages=HI)
    assert message.content[0].type == "text"
    assert new.sim.stats.inference_requests == 1


def test_a_dialect_only_a_stopped_card_serves_waits_for_it_rather_than_a_404(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Anthropic's messages on a fleet of an Ollama 0.12.6 and a newer one that has stopped
    answering: the path is still served by the fleet (the newer card keeps the version last
    heard from it), so the call is one for a card that is down, as a model only that card
    holds would be: a call that cannot wait has the 503, not a 404 telling the agent (the
    anthropic client: NotFoundError, not retried) that no provider ever serves it."""
    old = sim_factory("old", version="0.12.6", time_scale=SCALE)
    new = sim_factory("new", time_scale=SCALE)
    url = sidecar_factory([old, new], probe_interval_seconds=0.2).url
    _version_known(url)
    new.stop()
    assert eventually(lambda: not next(p for p in httpx.get(f"{url}/kubemoot/v1/state").json()[
        "providers"] if p["name"] == "new")["ready"])
    body = {"model": "llama3.2:3b", "max_tokens": 5, "messages": HI}
    answer = httpx.post(f"{url}/v1/messages", json=body, headers={"X-Kubemoot-Wait": "false"})
    assert answer.status_code == 503, answer.text
    assert answer.json()["reason"] == "gpu-busy"
    # why: the card that serves it is down (the old card's being up does not make it "busy")
    assert "no provider that could run the model is reachable (new: provider not ready)" in \
        answer.json()["error"]["message"]
    assert old.sim.stats.inference_requests == 0


def test_in_a_fleet_of_mixed_versions_a_body_one_version_refuses_goes_to_a_card_that_takes_it(
        sim_factory: Sims, sidecar_factory: Sidecars, monkeypatch: pytest.MonkeyPatch) -> None:
    """`think: "max"` is a level from Ollama 0.22 (an older one refuses it, 400): with a card
    of 0.12.6 probed last (pinned here) and holding the model warm, and a newer card, the
    call is not refused before placement and goes to the newer card; on a fleet of 0.12.6
    alone it is the old version's 400."""
    monkeypatch.setattr("proxy.app.newest_version", lambda prober: "0.12.6")
    old = sim_factory("old", version="0.12.6", time_scale=SCALE)
    new = sim_factory("new", time_scale=SCALE)
    url = sidecar_factory([old, new]).url
    _version_known(url)
    assert httpx.post(f"{old.url}/api/generate", json={"model": "qwen3:8b"}).status_code == 200
    assert eventually(lambda: _residents(url, "old") == ["qwen3:8b"])
    before = old.sim.stats.requests
    body = {"model": "qwen3:8b", "messages": HI, "think": "max", "stream": False}
    answer = httpx.post(f"{url}/api/chat", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert (old.sim.stats.requests - before, new.sim.stats.inference_requests) == (0, 1)
    alone = sidecar_factory([old]).url
    _version_known(alone)
    refused = httpx.post(f"{alone}/api/chat", json=body, timeout=30)
    assert refused.status_code == 400 and "think" in refused.json()["error"]


def test_in_a_mixed_fleet_a_body_one_versions_layer_refuses_goes_to_a_card_that_takes_it(
        sim_factory: Sims, sidecar_factory: Sidecars, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Responses layer reads a reasoning effort from 0.22 and refuses "extreme"; 0.20
    reads none (openai/responses.go FromResponsesRequest). With the newer card probed last
    (pinned here), the call is not refused before placement: it goes to the 0.20 card, even
    where the newer one holds the model warm, and a fleet of the newer alone refuses it."""
    monkeypatch.setattr("proxy.app.newest_version", lambda prober: "0.33.0")
    old = sim_factory("old", version="0.20.0", time_scale=SCALE)
    new = sim_factory("new", time_scale=SCALE)
    url = sidecar_factory([old, new]).url
    _version_known(url)
    assert httpx.post(f"{new.url}/api/generate", json={"model": "qwen3:8b"}).status_code == 200
    assert eventually(lambda: _residents(url, "new") == ["qwen3:8b"])
    before = new.sim.stats.requests
    body = {"model": "qwen3:8b", "input": "hello", "max_output_tokens": 5,
            "reasoning": {"effort": "extreme"}}
    answer = httpx.post(f"{url}/v1/responses", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert (new.sim.stats.requests - before, old.sim.stats.inference_requests) == (0, 1)
    alone = sidecar_factory([new]).url
    _version_known(alone)
    refused = httpx.post(f"{alone}/v1/responses", json=body, timeout=30)
    assert refused.status_code == 400 and "invalid reasoning value" in refused.text


def test_a_waiting_call_is_not_placed_on_a_card_heard_since_whose_version_refuses_its_body(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """A card of 0.12.6 (which refuses `think: "max"`) is down when the call is checked, so
    only the newer card's version is known; the call waits for that card's one slot. The
    old card comes back holding the model warm and idle: it is left out once its version
    is heard, and the call waits for the card that takes it, not for the old one's 400."""
    old = sim_factory("old", version="0.12.6", time_scale=SCALE)
    new = sim_factory("new", time_scale=SCALE)
    assert httpx.post(f"{old.url}/api/generate", json={"model": "qwen3:8b"}).status_code == 200
    old.stop()
    url = sidecar_factory([old, new], probe_interval_seconds=0.1).url
    _version_known(url)
    leave = threading.Event()
    # 8 s of answer, left once checked: 5000 tokens (2 s) could end under load before the
    # wait was looked at, and the call rightly took the slot it freed
    holding = stream_in_background(url, "qwen3:8b", 20000, threading.Event(), leave)
    answers: list[httpx.Response] = []
    body = {"model": "qwen3:8b", "messages": HI, "think": "max", "stream": False}
    caller = threading.Thread(target=lambda: answers.append(
        httpx.post(f"{url}/api/chat", json=body, timeout=30)), daemon=True)
    caller.start()
    assert eventually(lambda: _waiters(url, "qwen3:8b") == 1)  # checked, and waiting
    before = old.sim.stats.requests
    old.start()
    assert eventually(lambda: _residents(url, "old") == ["qwen3:8b"])
    assert not eventually(lambda: bool(answers), timeout_s=1.0)  # still waiting for `new`
    leave.set()
    caller.join(30)
    holding.join(30)
    assert answers[0].status_code == 200, answers[0].text
    assert old.sim.stats.requests == before  # none was sent to the old card
    assert new.sim.stats.inference_requests == 2


def _waiters(url: str, model: str) -> int:
    demand = httpx.get(f"{url}/kubemoot/v1/state").json()["demand"]
    return int(demand.get(model, {}).get("waiters", 0))


def test_thinking_ollama_drops_is_not_counted_against_the_context(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama keeps one thinking text a message, an Anthropic message's last thinking block
    (anthropic.go convertMessage), and a Responses reasoning item only when no other comes
    before the turn it belongs to (responses.go FromResponsesRequest): thinking it drops
    does not reach the prompt, so a conversation that fits once it is dropped is placed
    (not refused `prompt-too-large`), and the simulator, as Ollama, reads it alike."""
    gpu = sim_factory("gpu", context_length=4096, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _version_known(url)
    old = "earlier thoughts " * 1200  # ~20k characters: far beyond 4096 tokens twice over
    blocks: Any = [{"type": "thinking", "thinking": old, "signature": "s1"},
                   {"type": "thinking", "thinking": old, "signature": "s2"},
                   {"type": "thinking", "thinking": "so: hello", "signature": "s3"},
                   {"type": "text", "text": "hello"}]
    message = anthropic_for(url).messages.create(
        model="llama3.2:3b", max_tokens=5, messages=[
            *HI, {"role": "assistant", "content": blocks}, {"role": "user", "content": "go on"}])
    assert message.content[0].type == "text"
    items: Any = [*HI, {"type": "reasoning", "summary": [], "encrypted_content": old},
                  {"type": "reasoning", "summary": [], "encrypted_content": old},
                  {"type": "reasoning", "summary": [], "encrypted_content": "so: hello"},
                  {"role": "assistant", "content": "hello"},
                  {"role": "user", "content": "go on"}]
    assert client_for(url).responses.create(model="llama3.2:3b", input=items,
                                            max_output_tokens=5).output_text
    assert gpu.sim.stats.truncations == 0


def test_a_responses_web_search_tool_is_placed_and_sent_on_as_it_came(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama refuses no `web_search` tool on the Responses API (from 0.32.10 it offers the
    model its own function and runs the searches itself, middleware/openai.go
    WebSearchResponsesWriter): the call is placed as any other, the tool sent on untouched."""
    gpu = sim_factory("gpu", version="0.32.10", time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _version_known(url)
    reply = client_for(url).responses.create(
        model="llama3.2:3b", input="what is new today?", max_output_tokens=5,
        tools=[{"type": "web_search"}])
    # (the simulator runs no search: its model's call of the tool comes back as it is)
    assert reply.status == "completed" and gpu.sim.stats.inference_requests == 1


def test_a_web_search_results_page_content_is_not_counted_against_the_context(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama's Anthropic layer reads a web search's result block as its titles and URLs
    (anthropic.go formatWebSearchToolResultContent), not the page content a result may
    carry: a conversation that fits so is placed, and the simulator reads it alike."""
    gpu = sim_factory("gpu", context_length=4096, time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    _version_known(url)
    page = "page content " * 1500  # ~20k characters, far beyond 4096 tokens
    searched: Any = [
        {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {"query": "x"}},
        {"type": "web_search_tool_result", "tool_use_id": "s1", "content": [
            {"type": "web_search_result", "title": "A", "url": "https://a.example",
             "encrypted_content": page}]},
        {"type": "text", "text": "found it"}]
    message = anthropic_for(url).messages.create(
        model="llama3.2:3b", max_tokens=5, messages=[
            *HI, {"role": "assistant", "content": searched}, {"role": "user", "content": "ok"}])
    assert message.content[0].type == "text" and gpu.sim.stats.truncations == 0


@pytest.mark.parametrize(("version", "estimate"), [("0.15.4", 0), ("0.32.10", 20)])
def test_a_streamed_message_starts_with_ollamas_estimate_of_its_input(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str, estimate: int) -> None:
    # anthropic.go EstimateInputTokens (from 0.15.5): bytes over 4 of the system (29), each
    # role and text (4 + 9, 9 + 2, 4 + 5) and each tool's name, description and schema
    # (4 + 0 + 17, compact): 83 // 4; the counted prompt comes only in message_delta
    gpu = sim_factory("gpu", version=version, time_scale=SCALE)
    client = anthropic_for(sidecar_factory([gpu]).url)
    events = list(client.messages.create(
        model="qwen3:8b", max_tokens=20, stream=True, system="you answer in one short line.",
        tools=[{"name": "look", "input_schema": {"type": "object"}}], messages=[
            {"role": "user", "content": "hello you"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": [{"type": "text", "text": "again"}]}]))
    assert events[0].type == "message_start"
    assert events[0].message.usage.input_tokens == estimate
    assert events[-2].type == "message_delta" and events[-2].usage.input_tokens not in (
        None, 0, estimate)


REQUEST_ID = re.compile(r"req_[0-9a-f]{24}")
URL_IMAGE: Any = [{"role": "user", "content": [
    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]


def test_an_anthropic_error_names_its_request_as_ollamas_layer_does(sim_factory: Sims) -> None:
    # anthropic.go NewError: the type by status and a request_id, on every error answer
    client = anthropic_for(sim_factory("gpu", time_scale=SCALE).url)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="qwen3:8b", max_tokens=5, messages=URL_IMAGE)
    body: Any = info.value.body
    assert body["error"]["type"] == "invalid_request_error"
    assert REQUEST_ID.fullmatch(body["request_id"])


def test_the_sidecars_anthropic_errors_name_their_request_as_ollama_would(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    # its 400 in Ollama's words, its 404 and its own 507: each names a request, as Ollama's
    # anthropic layer and Anthropic's API do (and an agent reports it)
    client = anthropic_for(sidecar_factory([sim_factory("gpu", time_scale=SCALE)]).url)
    refusals: list[tuple[type[anthropic.APIStatusError], str, Any]] = [
        (anthropic.BadRequestError, "qwen3:8b", URL_IMAGE),
        (anthropic.NotFoundError, "nope:1b", HI), (anthropic.InternalServerError, "qwen3:32b", HI)]
    for kind, model, messages in refusals:
        with pytest.raises(kind) as info:
            client.messages.create(model=model, max_tokens=5, messages=messages)
        body: Any = info.value.body
        assert REQUEST_ID.fullmatch(body["request_id"]), body


def test_openai_logprobs_come_as_ollamas_layer_gives_them(sim_factory: Sims,
                                                          sidecar_factory: Sidecars) -> None:
    # openai.go:718-719 asks the native call for them, ToChatCompletion, toChunk and
    # ToCompletion give each choice's tokens as `logprobs.content` (0.12.11+)
    client = client_for(sidecar_factory([sim_factory("gpu", time_scale=SCALE)]).url)
    whole = client.chat.completions.create(model="llama3.2:3b", messages=HI, max_tokens=3,
                                           logprobs=True, top_logprobs=2).choices[0]
    assert whole.logprobs is not None and whole.logprobs.content is not None
    assert "".join(t.token for t in whole.logprobs.content) == whole.message.content
    assert {len(t.top_logprobs) for t in whole.logprobs.content} == {2}
    parts = [c.choices[0] for c in client.chat.completions.create(
        model="llama3.2:3b", messages=HI, max_tokens=3, logprobs=True, stream=True)]
    streamed = [t for p in parts if p.logprobs and p.logprobs.content for t in p.logprobs.content]
    assert "".join(t.token for t in streamed) == "".join(p.delta.content or "" for p in parts)
    done = client.completions.create(model="llama3.2:3b", prompt="hi", max_tokens=2,
                                     logprobs=1).choices[0]
    assert done.logprobs is not None and done.logprobs.model_extra is not None
    assert "".join(t["token"] for t in done.logprobs.model_extra["content"]) == done.text
    plain = client.chat.completions.create(model="llama3.2:3b", messages=HI, max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_a_list_of_prompts_is_ollamas_binding_400_alike_from_the_sidecar_and_the_engine(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    # CompletionRequest.Prompt is a string (openai/openai.go); OpenAI's list of prompts
    # does not bind, on the engine as in the sidecar's check before placing
    gpu = sim_factory("gpu", time_scale=SCALE)
    said = ("json: cannot unmarshal array into Go struct field CompletionRequest.prompt of "
            "type string")
    for url in (sidecar_factory([gpu]).url, gpu.url):
        with pytest.raises(openai.BadRequestError) as info:
            client_for(url).completions.create(model="llama3.2:3b", prompt=["a", "b"])
        assert info.value.response.json()["error"]["message"] == said
    assert gpu.sim.stats.inference_requests == 0


@pytest.mark.parametrize(("version", "last"), [
    ("0.12.6", {"role": "assistant", "content": ""}), ("0.32.6", {})])
def test_an_openai_stream_ends_as_the_providers_ollama_ends_it(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str, last: dict[str, str]
        ) -> None:
    """The finish chunk's delta is the version's (v0.12.6 openai/openai.go:295 ToChunk's
    Message, real 0.12.6 and 0.24.0; FinishChunk's `Delta{}` from 0.32.6), relayed as is."""
    gpu = sim_factory("gpu", time_scale=SCALE, version=version)
    url = sidecar_factory([gpu]).url
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30, json={
            "model": "qwen3:8b", "stream": True, "max_tokens": 2, "messages": HI}) as r:
        chunks = [orjson.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["delta"] == last
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
