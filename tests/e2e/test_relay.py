"""The official `ollama` client talks to the sidecar, which talks to simulators on loopback."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import ollama
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from loadtest.sim_model import CATALOG
from tests.conftest import eventually

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]
HI = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def fleet(sim_factory: Sims) -> list[SimServer]:
    return [sim_factory("gpu-a", total_vram_mib=24564, models=CATALOG[1:3]),
            sim_factory("gpu-b", total_vram_mib=16376, models=CATALOG[2:4])]


@pytest.fixture
def client(fleet: list[SimServer], sidecar_factory: Sidecars) -> ollama.Client:
    return ollama.Client(host=sidecar_factory(fleet).url)


def test_chat_non_streaming(client: ollama.Client) -> None:
    reply = client.chat(model="qwen3:8b", messages=HI, think=False)
    assert reply.done and reply.model == "qwen3:8b"
    assert reply.message.content.startswith("the answer")
    assert reply.prompt_eval_count and reply.eval_count == 16
    thought = client.chat(model="qwen3:8b", messages=HI)  # qwen3 thinks unless told not to
    assert thought.message.thinking and thought.eval_count and thought.eval_count > 16


def test_chat_streams_chunk_by_chunk(client: ollama.Client) -> None:
    chunks = list(client.chat(model="qwen3:8b", messages=HI, stream=True, think=False))
    assert len(chunks) == 17
    assert not chunks[0].done and chunks[-1].done and chunks[-1].eval_count == 16


def test_generate_both_ways(client: ollama.Client) -> None:
    assert client.generate(model="qwen3:8b", prompt="hi").response.startswith("the answer")
    parts = list(client.generate(model="qwen3:8b", prompt="hi", stream=True))
    assert parts[-1].done and parts[-1].context


def test_generate_answers_the_tokens_of_its_prompt_and_answer_as_context(
        client: ollama.Client) -> None:
    """Ollama's `context` is Tokenize(prompt + answer), none in raw mode
    (server/routes.go:712-719): a client that sends it back sends a longer prompt."""
    first = client.generate(model="qwen3:8b", prompt="hi", think=False)
    assert first.context and first.prompt_eval_count and first.eval_count
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    second = client.generate(model="qwen3:8b", prompt="go on", context=first.context,
                             think=False)
    assert second.context and len(second.context) > len(first.context) + (second.eval_count or 0)
    assert client.generate(model="qwen3:8b", prompt="hi", raw=True).context is None


def test_a_streamed_answer_whose_last_line_outgrows_the_relays_tail_still_gives_its_counts(
        client: ollama.Client) -> None:
    """A streamed /api/generate ends with its `context` (the tokens of the whole prompt and
    answer) and then its metrics, one line longer than the tail the relay keeps for a long
    prompt: the engine's count still reaches the sidecar, whose estimate learns from it."""
    prompt = "word " * 3000
    base = client._client.base_url  # type: ignore[attr-defined]
    ask = {"model": "qwen3:8b", "promptChars": len(prompt)}
    guessed = httpx.get(base.join("/kubemoot/v1/explain"), params=ask).json()["promptTokens"]
    parts = list(client.generate(model="qwen3:8b", prompt=prompt, stream=True, think=False,
                                 options={"num_predict": 5}))
    counted = parts[-1].prompt_eval_count
    assert parts[-1].context and len(str(parts[-1].context)) > 8192 and counted
    assert abs(guessed - counted) > 0.1 * counted  # the default ratio is off for this text
    learnt = httpx.get(base.join("/kubemoot/v1/explain"), params=ask).json()["promptTokens"]
    assert abs(learnt - counted) < 0.02 * counted


def test_logprobs_come_with_each_token_as_ollama_gives_them(client: ollama.Client) -> None:
    """From 0.12.11 a call asking `logprobs` gets each generated token's, with `top_logprobs`
    alternatives (server/logprob.go), per chunk or gathered in a whole answer
    (server/routes.go:2391-2427); through the sidecar as from Ollama."""
    whole = client.chat(model="qwen3:8b", messages=HI, logprobs=True, top_logprobs=3)
    assert whole.logprobs and len(whole.logprobs) == whole.eval_count
    assert all(len(lp.top_logprobs or ()) == 3 for lp in whole.logprobs)
    tokens = "".join(lp.token for lp in whole.logprobs)
    assert tokens == (whole.message.thinking or "") + whole.message.content
    parts = list(client.generate(model="qwen3:8b", prompt="hi", think=False, stream=True,
                                 logprobs=True))
    said = [part for part in parts if not part.done]
    assert all(part.logprobs and part.logprobs[0].token == part.response for part in said)
    assert not said[0].logprobs[0].top_logprobs  # type: ignore[index]
    assert client.chat(model="qwen3:8b", messages=HI).logprobs is None


def test_ps_lists_the_longest_time_left_first_across_providers(client: ollama.Client) -> None:
    """Each Ollama lists its copies longest time left first (server/routes.go:2297-2300);
    the union does too, whichever provider holds them."""
    client.chat(model="qwen3:14b", messages=HI, keep_alive="10h")  # only gpu-a has it
    client.chat(model="llama3.2:3b", messages=HI, keep_alive=-1)  # only gpu-b, kept forever
    raw = httpx.get(client._client.base_url.join("/api/ps")).json()  # type: ignore[attr-defined]
    assert [(m["model"], m["provider"]) for m in raw["models"]] == [
        ("llama3.2:3b", "gpu-b"), ("qwen3:14b", "gpu-a")]


def test_list_is_the_union_of_providers(client: ollama.Client) -> None:
    names = sorted(m.model for m in client.list().models if m.model)
    assert names == ["llama3.2:3b", "qwen3:14b", "qwen3:8b"]


def test_ps_and_show(client: ollama.Client, fleet: list[SimServer]) -> None:
    client.chat(model="llama3.2:3b", messages=HI)  # only gpu-b has it
    running = client.ps().models
    assert [m.model for m in running] == ["llama3.2:3b"]
    assert running[0].size_vram and running[0].context_length
    raw = httpx.get(client._client.base_url.join("/api/ps")).json()  # type: ignore[attr-defined]
    assert raw["models"][0]["provider"] == "gpu-b"
    shown = client.show("qwen3:14b")
    assert shown.modelinfo and shown.modelinfo["qwen3.context_length"] == 40960


def test_unknown_model_is_ollamas_404(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="no-such-model:1b", messages=HI)
    assert info.value.status_code == 404 and "not found" in info.value.error
    with pytest.raises(ollama.ResponseError) as shown:
        client.show("no-such-model:1b")
    assert shown.value.status_code == 404 and "not found" in shown.value.error
    raw = httpx.post(client._client.base_url.join("/api/show"),  # type: ignore[attr-defined]
                     json={"model": "no-such-model:1b"})
    assert raw.json()["reason"] == "model-not-found"
    assert raw.json()["model"] == "no-such-model:1b"


def test_a_show_with_a_mistyped_field_is_ollamas_400(client: ollama.Client) -> None:
    raw = httpx.post(client._client.base_url.join("/api/show"),  # type: ignore[attr-defined]
                     json={"model": "qwen3:14b", "verbose": "x"})
    assert raw.status_code == 400
    assert raw.json()["error"] == ("json: cannot unmarshal string into Go struct field "
                                   "ShowRequest.verbose of type bool")


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/api/show", {}, "model is required"), ("/api/show", {"name": ""}, "model is required"),
    ("/api/pull", {}, "invalid model name"), ("/api/pull", {"name": "", "stream": False},
                                              "invalid model name")])
def test_a_show_or_pull_without_a_model_is_ollamas_400(client: ollama.Client, path: str,
                                                       body: dict[str, Any],
                                                       message: str) -> None:
    """ShowHandler's `model is required`; PullHandler's `invalid model name` (no name is
    one it cannot parse; 0.24.0 parseNormalizePullModelRef, 0.12.6 ParseName)."""
    raw = httpx.post(client._client.base_url.join(path),  # type: ignore[attr-defined]
                     json=body)
    assert raw.status_code == 400
    assert raw.json() == {"error": message, "reason": "bad-request"}


def test_response_headers_say_where_it_ran(fleet: list[SimServer],
                                           sidecar_factory: Sidecars) -> None:
    url = sidecar_factory(fleet).url
    r = httpx.post(f"{url}/api/chat", json={"model": "llama3.2:3b", "messages": HI,
                                            "stream": False})
    assert r.status_code == 200
    assert r.headers["x-kubemoot-provider"] == "gpu-b"
    assert r.headers["x-kubemoot-model"] == "llama3.2:3b"
    assert r.headers["x-kubemoot-placement"]
    assert r.json()["model"] == "llama3.2:3b"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"model": 7, "messages": []}', "model"),
        (b'{"model": "qwen3:8b", "messages": [{"role": "user", "content": 5}]}',
         "messages.0.content"),
        (b'{"model": "qwen3:8b", "messages": [], "stream": "yes"}', "stream"),
        (b'{"model": "qwen3:8b", "messages": [], "options": []}',
         "Go struct field ChatRequest.options"),  # Ollama's binding's words
        (b'{"model": "qwen3:8b", "messages": [], "options": {"num_ctx": "big"}}',
         'option "num_ctx"'),  # Ollama's own words for it
    ],
)
def test_malformed_body_is_400_naming_the_field(body: bytes, field: str | None,
                                                fleet: list[SimServer],
                                                sidecar_factory: Sidecars) -> None:
    url = sidecar_factory(fleet).url
    r = httpx.post(f"{url}/api/chat", content=body)
    assert r.status_code == 400
    data = r.json()
    assert data["reason"] == "bad-request" and data["error"]
    # the request's model, when the body names one (CONTRACT.md's refusal body)
    assert data.get("model") == ("qwen3:8b" if b'"qwen3:8b"' in body else None)
    if field:
        assert (field if field.startswith(("option ", "Go ")) else f"'{field}'") in \
            data["error"]
    assert sum(s.sim.stats.requests for s in fleet) == 0  # nothing reached a GPU


def test_a_client_gone_before_its_body_arrived_is_no_server_error(
        fleet: list[SimServer], sidecar_factory: Sidecars) -> None:
    server = sidecar_factory(fleet)
    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # type: ignore[method-assign]
    uvicorn_errors = logging.getLogger("uvicorn.error")  # where a handler's crash is logged
    uvicorn_errors.addHandler(handler)
    try:
        with socket.create_connection((server.host, server.port)) as raw:
            raw.sendall(b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n"
                        b"\r\n{\"model\": \"qwen3:8b\"")
            time.sleep(0.1)  # the handler is reading the body when the client goes
        assert httpx.get(f"{server.url}/api/tags").status_code == 200  # answered after it
        time.sleep(0.1)
    finally:
        uvicorn_errors.removeHandler(handler)
    assert not errors, [e.getMessage() for e in errors]
    assert sum(s.sim.stats.requests for s in fleet) == 0


def test_body_over_the_cap_is_413(fleet: list[SimServer], sidecar_factory: Sidecars) -> None:
    url = sidecar_factory(fleet, max_request_bytes=1000).url
    big = {"model": "qwen3:8b", "messages": [{"role": "user", "content": "x" * 2000}]}
    r = httpx.post(f"{url}/api/chat", json=big)
    assert r.status_code == 413 and r.json()["reason"] == "request-too-large"
    r = httpx.post(f"{url}/v1/messages", json={**big, "max_tokens": 5})
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    r = httpx.post(f"{url}/api/show", json={"model": "x" * 2000})
    assert r.status_code == 413 and "KUBEMOOT_MAX_REQUEST_BYTES" in r.json()["error"]


BODY_PATHS = ["/api/chat", "/api/generate", "/api/embed", "/v1/chat/completions",
              "/v1/messages", "/v1/messages/count_tokens", "/api/show", "/api/pull",
              "/kubemoot/v1/plans", "/kubemoot/v1/explain"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_every_body_is_held_to_the_one_cap(chunked: bool, fleet: list[SimServer],
                                           sidecar_factory: Sidecars) -> None:
    """KUBEMOOT_MAX_REQUEST_BYTES holds on every path that reads a body, also when the body
    comes in chunks with no Content-Length to refuse it by."""
    url = sidecar_factory(fleet, max_request_bytes=1000).url
    body = b'{"model": "qwen3:8b", "thread": "t", "messages": []' + b" " * 2000 + b"}"

    def pieces() -> Iterator[bytes]:
        yield from (body[i:i + 100] for i in range(0, len(body), 100))

    for path in BODY_PATHS:
        r = httpx.post(f"{url}{path}", content=pieces() if chunked else body,
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 413, (path, r.status_code, r.text)
        assert r.json()["reason"] == "request-too-large", path
        message = r.json()["error"]
        message = message["message"] if isinstance(message, dict) else message
        assert "KUBEMOOT_MAX_REQUEST_BYTES" in message and "1000" in message, (path, message)
    assert sum(s.sim.stats.requests for s in fleet) == 0


def test_a_plan_is_small_by_design(fleet: list[SimServer], sidecar_factory: Sidecars) -> None:
    """A plan is four fields: under the default cap its body still stops at 64 KiB."""
    url = sidecar_factory(fleet).url
    r = httpx.post(f"{url}/kubemoot/v1/plans", headers={"Content-Type": "application/json"},
                   content=b'{"thread": "t"' + b" " * 70_000 + b"}")
    assert r.status_code == 413 and r.json()["reason"] == "request-too-large"
    assert "65536" in r.json()["error"]


@pytest.mark.parametrize("stream", [False, True])
def test_ollamas_own_refusals_are_answered_before_placement_in_its_words(
        stream: bool, sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Ollama's 400s that come before it schedules anything (server/routes.go ChatHandler:
    think on a model that cannot, a keep_alive it cannot parse) the sidecar gives itself,
    before placing the call: the same status and words, shaped as its own refusals are in
    each dialect; nothing reaches the provider, and its health is untouched. (A provider's
    own refusal, relayed: tests/unit/test_relay.py.)"""
    gpu = sim_factory("gpu")
    url = sidecar_factory([gpu]).url
    assert eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200)  # /api/show read
    ask = {"messages": HI, "stream": stream}
    think = httpx.post(f"{url}/api/chat", json={**ask, "model": "phi3:mini", "think": True})
    assert think.status_code == 400, think.text
    assert think.json() == {"error": '"phi3:mini" does not support thinking',
                            "reason": "bad-request", "model": "phi3:mini"}
    assert "x-kubemoot-provider" not in think.headers
    for keep_alive, error in (("forever", 'time: invalid duration "forever"'),
                              ("300", 'time: missing unit in duration "300"'),
                              ("-1", 'time: missing unit in duration "-1"'),
                              (True, "Unsupported type: 'bool'"),
                              ([300], "Unsupported type: '[]interface {}'"),
                              ({"s": 1}, "Unsupported type: 'map[string]interface {}'")):
        refused = httpx.post(f"{url}/api/generate", json={
            "model": "qwen3:8b", "prompt": "hi", "keep_alive": keep_alive, "stream": stream})
        assert refused.status_code == 400
        assert refused.json() == {"error": error, "reason": "bad-request", "model": "qwen3:8b"}
    with pytest.raises(ollama.ResponseError) as info:  # the official client reads it so
        ollama.Client(host=url).chat(model="phi3:mini", messages=HI, think=True)
    assert info.value.status_code == 400 and "does not support thinking" in info.value.error
    openai = httpx.post(f"{url}/v1/chat/completions", json={
        **ask, "model": "phi3:mini", "reasoning_effort": "high"})
    assert openai.status_code == 400, openai.text
    assert openai.json() == {"error": {"message": '"phi3:mini" does not support thinking',
                                       "type": "invalid_request_error",
                                       "param": None, "code": None},
                             "reason": "bad-request", "model": "phi3:mini"}
    for _ in range(4):  # more than the failures that open a circuit
        httpx.post(f"{url}/api/chat", json={**ask, "model": "phi3:mini", "think": True})
    assert gpu.sim.stats.inference_requests == 0
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert [p["circuit"] for p in state["providers"]] == ["closed"]
    assert "kubemoot_upstream_errors_total{" not in httpx.get(f"{url}/metrics").text
    ok = httpx.post(f"{url}/api/chat", json={**ask, "model": "phi3:mini", "stream": False})
    assert ok.status_code == 200 and ok.headers["x-kubemoot-provider"] == "gpu"


async def failing_show(request: Request) -> Response:
    return JSONResponse({"error": "boom"}, status_code=500)


async def openai_unauthorized(request: Request) -> Response:
    """Ollama's OpenAI layer on a cloud model without a sign-in (openai.NewError: api_error
    for any status but 400 and 404)."""
    return JSONResponse({"error": {"message": "unauthorized", "type": "api_error",
                                   "param": None, "code": None}}, status_code=401)


def test_a_providers_failure_and_refusals_keep_their_kind(sidecar_factory: Sidecars) -> None:
    engine = ThreadedServer(Starlette(routes=[
        Route("/api/show", failing_show, methods=["POST"]),
        Route("/v1/chat/completions", openai_unauthorized, methods=["POST"])]),
        name="engine").start()
    try:
        url = sidecar_factory(model_endpoint=engine.url, model_model="qwen3:8b").url
        shown = httpx.post(f"{url}/api/show", json={"model": "qwen3:8b"})
        assert shown.status_code == 502, shown.text  # a failure, not the provider's refusal
        assert shown.json()["reason"] == "upstream-failed" and "500" in shown.json()["error"]
        denied = httpx.post(f"{url}/v1/chat/completions",
                            json={"model": "qwen3:8b", "messages": HI})
        assert denied.status_code == 401, denied.text
        assert denied.json() == {"error": {"message": "unauthorized", "type": "api_error",
                                           "param": None, "code": None},
                                 "reason": "provider-refused", "model": "qwen3:8b"}
    finally:
        engine.stop()


async def anthropic_refusals(request: Request) -> Response:
    """What Ollama's Anthropic layer answers a request it cannot take (anthropic.NewError,
    middleware/anthropic.go:738-759), and a 401 as for a cloud model without a sign-in."""
    status = 401 if (await request.json())["model"].endswith("-cloud") else 400
    kind = {400: "invalid_request_error", 401: "authentication_error"}[status]
    return JSONResponse({"type": "error", "request_id": "req_1", "error": {
        "type": kind, "message": "unauthorized" if status == 401 else
        "json: cannot unmarshal string into Go struct field"}}, status_code=status)


def test_an_engines_refusal_on_anthropics_path_in_anthropics_shape(
        sidecar_factory: Sidecars) -> None:
    engine = ThreadedServer(Starlette(routes=[
        Route("/v1/messages", anthropic_refusals, methods=["POST"])]), name="engine").start()
    try:
        url = sidecar_factory(model_endpoint=engine.url, model_model="qwen3:8b").url
        ask = {"model": "qwen3:8b", "max_tokens": 5, "messages": HI}
        bad = httpx.post(f"{url}/v1/messages", json=ask)
        assert bad.status_code == 400, bad.text
        assert bad.json() == {"type": "error", "request_id": "req_1", "error": {
            "type": "invalid_request_error",
            "message": "json: cannot unmarshal string into Go struct field"},
            "reason": "bad-request", "model": "qwen3:8b"}
        denied = httpx.post(f"{url}/v1/messages", json={**ask, "model": "glm-4.6:355b-cloud"})
        assert denied.status_code == 401, denied.text
        assert denied.json()["error"] == {"type": "authentication_error",
                                          "message": "unauthorized"}
        assert denied.json()["reason"] == "provider-refused"
    finally:
        engine.stop()


def test_a_providers_refusal_names_the_model_as_sent_and_as_its_header_does(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    # CONTRACT.md: the refusal's `model` is the model sent, which X-Kubemoot-Model names
    # too; "nosuch" was answered as "nosuch:latest", a name the call never used
    static = sim_factory("static")
    url = sidecar_factory(model_endpoint=static.url).url
    r = httpx.post(f"{url}/api/chat", json={"model": "nosuch", "messages": HI}, timeout=30)
    assert r.status_code == 404, r.text
    assert r.json()["model"] == r.headers["x-kubemoot-model"] == "nosuch"
    assert r.json()["error"] == "model 'nosuch' not found"


def test_mid_stream_failure_ends_with_an_error_line(fleet: list[SimServer],
                                                    sidecar_factory: Sidecars) -> None:
    fleet[0].sim.fault.mode, fleet[0].sim.fault.count = "midstream", 1
    client = ollama.Client(host=sidecar_factory(fleet).url)
    seen = []
    with pytest.raises(ollama.ResponseError) as info:
        for chunk in client.chat(model="qwen3:14b", messages=HI, stream=True, think=False):
            seen.append(chunk.message.content)
    assert seen == ["the ", "answer "]
    # the engine's own error line (server/routes.go:2116-2124), relayed
    assert info.value.error.startswith("an error was encountered while running the model")


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_mid_stream_error_line_is_ndjson_with_reason(fleet: list[SimServer],
                                                     sidecar_factory: Sidecars, path: str
                                                     ) -> None:
    fleet[0].sim.fault.mode, fleet[0].sim.fault.count = "midstream", 1
    url = sidecar_factory(fleet).url
    with httpx.stream("POST", f"{url}{path}", json={"model": "qwen3:14b", "messages": HI,
                                                    "prompt": "hi"}) as r:
        lines = [line for line in r.iter_lines() if line]
    # Ollama's own line for an engine that died (server/routes.go:2116-2124), its message
    # kept, with the reason of a failure after the stream began (CONTRACT.md)
    assert r.status_code == 200 and len(lines) == 3
    assert orjson.loads(lines[-1]) == {
        "error": "an error was encountered while running the model: unexpected EOF",
        "reason": "upstream-failed"}


def test_a_provider_silent_mid_stream_is_cut_off_at_the_chunk_timeout(
        fleet: list[SimServer], sidecar_factory: Sidecars) -> None:
    fault = fleet[0].sim.fault
    fault.mode, fault.count, fault.delay_s = "stall", 1, 5.0
    url = sidecar_factory(fleet, chunk_timeout_seconds=0.3).url
    client = ollama.Client(host=url)
    seen = []
    started = time.monotonic()
    with pytest.raises(ollama.ResponseError) as info:
        for chunk in client.chat(model="qwen3:14b", messages=HI, stream=True, think=False):
            seen.append(chunk.message.content)
    assert seen == ["the ", "answer "]
    assert "no data for 0.3 s" in info.value.error
    assert time.monotonic() - started < 3  # not the provider's 5 s of silence
    # The call was settled as a provider failure: its ticket is gone.
    assert eventually(lambda: not httpx.get(f"{url}/kubemoot/v1/state").json()["tickets"])


def test_provider_down_before_any_byte_is_502(fleet: list[SimServer],
                                              sidecar_factory: Sidecars) -> None:
    url = sidecar_factory(fleet).url
    httpx.get(f"{url}/api/tags")  # catalog learns who has what
    fleet[0].stop()
    r = httpx.post(f"{url}/api/chat", json={"model": "qwen3:14b", "messages": HI})
    assert r.status_code == 502 and r.json()["reason"] == "upstream-failed"


def test_slow_first_byte_of_a_stream_times_out_as_502(fleet: list[SimServer],
                                                      sidecar_factory: Sidecars) -> None:
    fleet[0].sim.fault.mode, fleet[0].sim.fault.count = "slow_first_byte", 1
    fleet[0].sim.fault.delay_s = 3.0
    url = sidecar_factory(fleet, first_byte_timeout_seconds=0.3).url
    started = time.monotonic()
    r = httpx.post(f"{url}/api/chat", json={"model": "qwen3:14b", "messages": HI}, timeout=10)
    assert r.status_code == 502 and time.monotonic() - started < 2.5
    assert r.json()["reason"] == "upstream-failed"


def test_client_disconnect_cancels_the_upstream_call(sim_factory: Sims,
                                                     sidecar_factory: Sidecars) -> None:
    slow = sim_factory("slow", total_vram_mib=24564, tokens_per_s=0.5, time_scale=0.1)
    url = sidecar_factory([slow]).url
    with httpx.stream("POST", f"{url}/api/chat",
                      json={"model": "llama3.2:3b", "messages": HI}, timeout=30) as r:
        lines = r.iter_lines()  # kept alive: a dropped iterator closes the response
        assert "the" in next(lines)
    deadline = time.monotonic() + 5
    while slow.sim.runners["llama3.2:3b"].refcount and time.monotonic() < deadline:
        time.sleep(0.02)
    assert slow.sim.runners["llama3.2:3b"].refcount == 0


def test_root_version_health_and_metrics(fleet: list[SimServer],
                                         sidecar_factory: Sidecars) -> None:
    url = sidecar_factory(fleet).url
    assert httpx.get(url).text == "Ollama is running"
    assert httpx.head(url).status_code == 200
    assert httpx.get(f"{url}/api/version").json()["version"]
    assert httpx.get(f"{url}/healthz").status_code == 200
    assert httpx.get(f"{url}/readyz").status_code == 200
    httpx.post(f"{url}/api/chat", json={"model": "qwen3:8b", "messages": HI})
    metrics = httpx.get(f"{url}/metrics").text
    assert "kubemoot_placements_total" in metrics
    assert "process_cpu_seconds_total" in metrics  # a saturated core shows as a rate near 1


def test_version_is_the_one_a_provider_last_reported(sim_factory: Sims,
                                                     sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", version="0.13.4")
    heard_by_probe = sim_factory("probed", version="0.13.2")
    asked = sidecar_factory([gpu]).url
    probed = sidecar_factory([heard_by_probe], probe_interval_seconds=60).url
    assert httpx.get(f"{asked}/api/version").json() == {"version": "0.13.4"}
    gpu.stop()
    heard_by_probe.stop()
    assert httpx.get(f"{asked}/api/version").json() == {"version": "0.13.4"}
    assert httpx.get(f"{probed}/api/version").json() == {"version": "0.13.2"}


def test_version_is_503_while_no_provider_ever_answered(sim_factory: Sims,
                                                        sidecar_factory: Sidecars) -> None:
    gone = sim_factory("gone")
    gone.stop()
    url = sidecar_factory([gone]).url
    r = httpx.get(f"{url}/api/version")
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert r.json()["reason"] == "no-provider" and "no provider" in r.json()["error"]
    assert httpx.head(f"{url}/api/version").status_code == 503


def test_not_ready_when_no_provider_answers(sim_factory: Sims,
                                            sidecar_factory: Sidecars) -> None:
    gone = sim_factory("gone")
    url = sidecar_factory([gone], probe_interval_seconds=0.1).url
    assert httpx.get(f"{url}/readyz").status_code == 200
    gone.stop()
    assert eventually(lambda: httpx.get(f"{url}/readyz").status_code == 503)
    body = httpx.get(f"{url}/readyz").json()  # the documented error shape, as every refusal
    assert body["reason"] == "no-provider" and "no provider" in body["error"]


def test_ops_listener_serves_probes_and_metrics_only(fleet: list[SimServer]) -> None:
    from loadtest.serving import ThreadedServer as Served
    from proxy.app import build_app, build_ops_app
    from proxy.settings import load_settings
    from tests.conftest import provider_entry

    app = build_app(load_settings(providers=[provider_entry(s) for s in fleet]))
    main = Served(app, name="sidecar").start()
    ops = Served(build_ops_app(app), name="ops").start()
    try:
        assert httpx.get(f"{ops.url}/healthz").status_code == 200
        assert httpx.get(f"{ops.url}/readyz").status_code == 200
        assert "kubemoot_decision_seconds" in httpx.get(f"{ops.url}/metrics").text
        assert httpx.get(f"{ops.url}/api/tags").status_code == 404  # no inference API here
        assert httpx.post(f"{ops.url}/api/chat", json={}).status_code == 404
    finally:
        ops.stop()
        main.stop()
