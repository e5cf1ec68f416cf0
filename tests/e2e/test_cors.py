"""CORS as Ollama answers it: browser pages on localhost (any port) and local app schemes may
call the sidecar; other origins only when KUBEMOOT_ORIGINS lets them."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]


@pytest.mark.parametrize(("origin", "allowed"), [
    ("http://localhost:3000", True), ("https://127.0.0.1", True), ("http://0.0.0.0:8080", True),
    ("app://obsidian.md", True), ("chrome-extension://abcdef", False),
    ("https://evil.example", False), ("http://localhost.evil.example", False),
    ("http://127.0.0.1:80/path", False)])
def test_origins_as_ollama_allows_them(origin: str, allowed: bool, sim_factory: Sims,
                                       sidecar_factory: Sidecars) -> None:
    url = sidecar_factory([sim_factory("gpu")]).url
    r = httpx.get(f"{url}/api/tags", headers={"Origin": origin})
    assert r.status_code == (200 if allowed else 403)
    assert r.headers.get("access-control-allow-origin") == (origin if allowed else None)


def test_browser_extensions_only_when_named(sim_factory: Sims, sidecar_factory: Sidecars
                                           ) -> None:
    """Ollama allows extensions only through OLLAMA_ORIGINS (envconfig.AllowedOrigins)."""
    url = sidecar_factory([sim_factory("gpu")], origins=["chrome-extension://*"]).url
    extension = {"Origin": "chrome-extension://abcdef"}
    r = httpx.get(f"{url}/api/tags", headers=extension)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "chrome-extension://abcdef"
    assert httpx.get(f"{url}/api/tags", headers={"Origin": "moz-extension://x"}
                     ).status_code == 403


def test_a_call_from_an_origin_not_allowed_is_403_as_ollama_answers_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """gin-contrib/cors aborts any request from such an origin, not only its preflight."""
    gpu = sim_factory("gpu")
    url = sidecar_factory([gpu]).url
    evil = {"Origin": "https://evil.example.com"}
    tags = httpx.get(f"{url}/api/tags", headers=evil)
    assert tags.status_code == 403
    assert tags.json()["reason"] == "origin-not-allowed"
    assert "https://evil.example.com" in tags.json()["error"]
    assert not [h for h in tags.headers if h.startswith("access-control-")]
    chat = httpx.post(f"{url}/v1/chat/completions", headers=evil, json={
        "model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 403 and chat.json()["reason"] == "origin-not-allowed"
    assert chat.json()["error"]["type"] == "api_error"  # Ollama's OpenAI shape there
    assert gpu.sim.stats.inference_requests == 0  # refused before it reached a GPU
    host = url.removeprefix("http://")
    for headers in ({}, {"Origin": f"http://{host}"}, {"Origin": "http://localhost:3000"}):
        for path in ("/api/tags", "/api/version", "/healthz", "/readyz", "/metrics"):
            assert httpx.get(f"{url}{path}", headers=headers).status_code == 200, (path, headers)


def test_every_origin_with_a_lone_star_as_ollama_origins_allows(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    url = sidecar_factory([sim_factory("gpu")], origins="*").url
    r = httpx.get(f"{url}/api/tags", headers={"Origin": "https://anywhere.example.org"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://anywhere.example.org"


def preflight(url: str, origin: str, headers: str | None = None) -> httpx.Response:
    """What a browser asks before a cross-origin POST to /api/chat."""
    asked = {"Origin": origin, "Access-Control-Request-Method": "POST"}
    if headers is not None:
        asked["Access-Control-Request-Headers"] = headers
    return httpx.options(f"{url}/api/chat", headers=asked)


def test_a_browser_preflight_for_a_chat_call_is_answered(sim_factory: Sims,
                                                         sidecar_factory: Sidecars) -> None:
    url = sidecar_factory([sim_factory("gpu")]).url
    r = preflight(url, "http://localhost:5173", "content-type,x-kubemoot-phase")
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert "POST" in r.headers["access-control-allow-methods"]
    chat = httpx.post(f"{url}/api/chat", headers={"Origin": "http://localhost:5173"}, json={
        "model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    assert chat.status_code == 200
    assert "X-Kubemoot-Provider" in chat.headers["access-control-expose-headers"]


def test_more_origins_from_the_setting_and_no_work_for_a_huge_one(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    url = sidecar_factory([sim_factory("gpu")], origins="https://*.example.com").url
    ok = httpx.get(f"{url}/api/tags", headers={"Origin": "https://app.example.com"})
    assert ok.headers.get("access-control-allow-origin") == "https://app.example.com"
    other = httpx.get(f"{url}/api/tags", headers={"Origin": "https://example.com.evil.net"})
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    started = time.perf_counter()
    huge = httpx.get(f"{url}/api/tags", headers={"Origin": "https://" + "a." * 3000 + "x"})
    assert huge.status_code == 403 and "access-control-allow-origin" not in huge.headers
    assert time.perf_counter() - started < 1.0


def test_a_preflight_from_an_origin_not_allowed_is_403_without_cors_headers(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    url = sidecar_factory([sim_factory("gpu")]).url
    r = preflight(url, "https://evil.example.com")
    assert r.status_code == 403
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["reason"] == "origin-not-allowed"
    assert "https://evil.example.com" in r.json()["error"]
    assert not [h for h in r.headers if h.startswith("access-control-")]


def test_a_preflight_for_a_header_not_allowed_is_a_json_400(sim_factory: Sims,
                                                            sidecar_factory: Sidecars) -> None:
    url = sidecar_factory([sim_factory("gpu")]).url
    r = preflight(url, "http://localhost:5173", "x-not-allowed")
    assert r.status_code == 400 and r.json()["reason"] == "bad-request"
    assert "headers" in r.json()["error"]
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"


@pytest.mark.parametrize(("path", "body"), [
    ("/api/tags", None), ("/v1/models", None),
    ("/v1/messages", {"model": "m", "max_tokens": 1, "messages": []})])
def test_a_host_not_local_is_refused_on_loopback(path: str, body: object, sim_factory: Sims,
                                                 sidecar_factory: Sidecars) -> None:
    """DNS rebinding: a page whose name resolves to 127.0.0.1 sends its own name as Host;
    Ollama answers 403 (allowedHostsMiddleware), here in the path's dialect."""
    url = sidecar_factory([sim_factory("gpu")]).url
    evil = {"Host": "rebind.example:11434"}
    r = httpx.request("POST" if body else "GET", f"{url}{path}", json=body, headers=evil)
    assert r.status_code == 403 and r.json()["reason"] == "host-not-allowed"
    error = r.json()["error"]
    message = error if path.startswith("/api") else error["message"]
    assert "rebind.example" in message
    if path == "/v1/messages":
        assert error["type"] == "permission_error"
    for local in ("localhost", "127.0.0.1:1", "app.localhost"):
        assert httpx.get(f"{url}/api/tags", headers={"Host": local}).status_code == 200


def test_hosts_are_not_checked_off_loopback(sim_factory: Sims, sidecar_factory: Sidecars
                                            ) -> None:
    url = sidecar_factory([sim_factory("gpu")], listen="0.0.0.0:11434").url
    assert httpx.get(f"{url}/api/tags", headers={"Host": "rebind.example"}).status_code == 200


def test_an_options_that_is_no_preflight_is_204_on_loopback(sim_factory: Sims,
                                                            sidecar_factory: Sidecars) -> None:
    """Ollama's Host check answers an OPTIONS it lets through as a local name: 204, no
    body, any path; one to a local IP goes on to the routes; a preflight is CORS's."""
    url = sidecar_factory([sim_factory("gpu")]).url
    for path in ("/api/chat", "/v1/models", "/nope"):
        r = httpx.options(f"{url}{path}", headers={"Host": "localhost:11434"})
        assert (r.status_code, r.content) == (204, b"")
    assert httpx.options(f"{url}/api/chat").status_code == 405  # Host 127.0.0.1:port
    preflight = httpx.options(f"{url}/api/chat", headers={
        "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:5173"
