"""The Ollama adapter's queries as the model-server port types them (respx)."""

from __future__ import annotations

import httpx
import pytest
import respx

from proxy.adapters.ollama import OllamaClient
from proxy.ports import ShowAnswer, Timeouts, UpstreamError

BASE = "http://ollama.test:11434"


@pytest.fixture
def upstream() -> respx.Router:
    return respx.Router(base_url=BASE)


def _client(upstream: respx.Router) -> OllamaClient:
    return OllamaClient(BASE, Timeouts(1, 1, 1), httpx.MockTransport(upstream.async_handler))


async def test_version_is_the_string_the_server_names(upstream: respx.Router) -> None:
    upstream.get("/api/version").respond(json={"version": "0.12.3"})
    assert await _client(upstream).version() == "0.12.3"


async def test_an_answer_that_names_no_version_is_none(upstream: respx.Router) -> None:
    upstream.get("/api/version").respond(json={})
    assert await _client(upstream).version() is None


@pytest.mark.parametrize("path", ["/api/ps", "/api/tags"])
async def test_model_lists_are_the_entries_as_sent(upstream: respx.Router, path: str) -> None:
    entry = {"model": "qwen3:8b", "size": 5, "digest": "d", "details": {"family": "qwen3"}}
    upstream.get(path).respond(json={"models": [entry]})
    client = _client(upstream)
    listed = await (client.ps() if path == "/api/ps" else client.tags())
    assert listed == [entry]


@pytest.mark.parametrize("answer", [{"models": None}, {}])
async def test_an_answer_without_models_is_an_empty_list(upstream: respx.Router,
                                                         answer: dict[str, object]) -> None:
    upstream.get("/api/ps").respond(json=answer)
    assert await _client(upstream).ps() == []


@pytest.mark.parametrize("response", [
    httpx.Response(500, text="boom"),
    httpx.Response(200, text="<html>"),
    httpx.Response(200, json=["not", "an", "object"]),
])
async def test_an_error_or_garbage_is_an_upstream_error(upstream: respx.Router,
                                                        response: httpx.Response) -> None:
    upstream.get("/api/tags").mock(return_value=response)
    with pytest.raises(UpstreamError):
        await _client(upstream).tags()


async def test_show_keeps_an_error_answer_as_sent(upstream: respx.Router) -> None:
    upstream.post("/api/show").respond(404, content=b'{"error":"model \'x\' not found"}')
    shown = await _client(upstream).show({"model": "x"})
    assert shown == ShowAnswer(404, b'{"error":"model \'x\' not found"}')
    with pytest.raises(UpstreamError, match="404"):
        shown.details()


async def test_show_sends_the_body_and_parses_the_details(upstream: respx.Router) -> None:
    route = upstream.post("/api/show").respond(json={"model_info": {"a": 1}})
    shown = await _client(upstream).show({"model": "qwen3:8b", "verbose": True})
    assert route.calls.last.request.content == b'{"model":"qwen3:8b","verbose":true}'
    assert shown.status_code == 200 and shown.details() == {"model_info": {"a": 1}}


async def test_unreachable_show_is_an_upstream_error(upstream: respx.Router) -> None:
    upstream.post("/api/show").mock(side_effect=httpx.ConnectError("refused"))
    with pytest.raises(UpstreamError, match="/api/show"):
        await _client(upstream).show({"model": "x"})
