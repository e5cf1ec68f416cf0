"""A provider that is not quite Ollama: something else answering at its endpoint (an
ingress's or a sign-in proxy's HTML page, a body that is no JSON), or a stream that ends
cleanly without its last line. The caller gets the contract's status in its dialect, and
another card takes the call where one can."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from loadtest.sim_model import CATALOG
from proxy.app import build_app
from proxy.settings import load_settings
from tests.conftest import eventually, provider_entry

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]
ROOT = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "hi"}]
LOGIN_PAGE = "<html><head><title>Sign in</title></head><body>sign in first</body></html>"
PARTIAL = b'{"model":"qwen3:8b","message":{"role":"assistant","content":"the"},"done":false}\n'


def fronted(backend: SimServer, answer: Callable[[], Response]) -> Starlette:
    """Ollama's probes and /api/show answered by `backend`; every call answered `answer()`."""

    async def relay(request: Request) -> Response:
        async with httpx.AsyncClient() as client:
            got = await client.request(request.method, backend.url + request.url.path,
                                       content=await request.body())
        return Response(got.content, got.status_code,
                        media_type=got.headers.get("content-type"))

    async def call(request: Request) -> Response:
        await request.body()
        return answer()

    return Starlette(routes=[
        *(Route(path, call, methods=["POST"]) for path in (
            "/api/chat", "/api/generate", "/v1/chat/completions")),
        Route("/{path:path}", relay, methods=["GET", "POST", "HEAD"])])


def login_page() -> Response:
    return HTMLResponse(LOGIN_PAGE)


def no_json() -> Response:
    return Response(b"this is not json\n", media_type="application/json")


def cut_clean() -> Response:
    """A stream closed in good order after its first line: no `done: true`, no error."""

    async def lines() -> object:
        yield PARTIAL

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@pytest.mark.parametrize(("answer", "stream"), [(login_page, True), (login_page, False),
                                                (no_json, False)])
def test_a_provider_answering_no_ollama_answer_hands_the_call_to_another(
        answer: Callable[[], Response], stream: bool, sim_factory: Sims,
        sidecar_factory: Sidecars) -> None:
    behind, good = sim_factory("behind"), sim_factory("good")
    httpx.post(f"{behind.url}/api/generate", json={"model": "qwen3:8b"})  # warm: first choice
    front = ThreadedServer(fronted(behind, answer), name="front").start()
    try:
        sidecar = ThreadedServer(build_app(load_settings(providers=[
            {**provider_entry(behind), "name": "fronted", "endpoint": front.url},
            provider_entry(good)])), name="sidecar").start()
        try:
            r = httpx.post(f"{sidecar.url}/api/chat", json={
                "model": "qwen3:8b", "messages": HI, "stream": stream}, timeout=30)
        finally:
            sidecar.stop()
        assert r.status_code == 200, r.text
        assert r.headers["x-kubemoot-provider"] == "good"
        assert r.text.splitlines()[-1].startswith('{"model":"qwen3:8b"')
    finally:
        front.stop()


@pytest.mark.parametrize(("path", "stream"), [("/api/chat", True), ("/api/chat", False),
                                              ("/v1/chat/completions", True),
                                              ("/v1/chat/completions", False)])
def test_an_html_page_from_the_only_engine_is_a_502_in_the_callers_dialect(
        path: str, stream: bool, sidecar_factory: Sidecars) -> None:
    engine = ThreadedServer(Starlette(routes=[Route(
        path, lambda request: HTMLResponse(LOGIN_PAGE), methods=["POST"]),
        Route("/api/version", lambda request: PlainTextResponse("404 page not found", 404))]),
        name="engine").start()
    try:
        url = sidecar_factory(model_endpoint=engine.url, model_model="qwen3:8b").url
        r = httpx.post(url + path, json={"model": "qwen3:8b", "messages": HI,
                                         "stream": stream}, timeout=30)
        assert r.status_code == 502, r.text
        body = r.json()
        assert body["reason"] == "upstream-failed"
        error = body["error"]["message"] if path.startswith("/v1") else body["error"]
        assert "text/html, not Ollama's JSON" in error
    finally:
        engine.stop()


def test_a_stream_closed_without_its_last_line_ends_with_an_error_line(
        sidecar_factory: Sidecars) -> None:
    # Ollama ends every stream with `"done":true` or its error line: one closed in good order
    # without either (a proxy in the way, a runner gone) is a failure the agent must hear of.
    engine = ThreadedServer(Starlette(routes=[Route(
        "/api/chat", lambda request: cut_clean(), methods=["POST"])]), name="engine").start()
    try:
        url = sidecar_factory(model_endpoint=engine.url, model_model="qwen3:8b").url
        r = httpx.post(f"{url}/api/chat", json={"model": "qwen3:8b", "messages": HI},
                       timeout=30)
        assert r.status_code == 200, r.text
        first, last = r.text.splitlines()
        assert first.encode() + b"\n" == PARTIAL
        assert orjson.loads(last) == {
            "error": 'provider static ended the stream without "done":true: the engine failed '
                     "mid-answer", "reason": "upstream-failed"}
        with pytest.raises(ollama.ResponseError, match="without"):
            for _ in ollama.Client(host=url).chat(model="qwen3:8b", messages=HI, stream=True):
                pass
    finally:
        engine.stop()


def test_a_provider_that_is_no_ollama_is_logged_with_what_it_answered() -> None:
    web = ThreadedServer(Starlette(routes=[Route("/{path:path}", lambda request: HTMLResponse(
        "<html><head><title>Error response</title></head><body>404</body></html>", 404))]),
        name="web").start()  # a web server that is no Ollama: its HTML 404 to every path
    env = {"PATH": "/usr/bin:/bin", "KUBEMOOT_LISTEN": "127.0.0.1:0",
           "KUBEMOOT_PROVIDERS": f'[{{"name": "gpu-a", "endpoint": "{web.url}"}}]'}
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # (the first probe's warning comes within a second)
            if "provider unreachable" in line:
                break
        logged = json.loads(line)
        assert logged["endpoint"] == web.url
        assert logged["error"] == (f"{web.url}/api/version: HTTP 404: Error response (an "
                                   "HTML page, not Ollama's)")
    finally:
        proc.kill()
        proc.communicate()
        web.stop()


def test_an_ingress_error_page_is_named_by_its_title(sidecar_factory: Sidecars) -> None:
    page = ("<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad "
            "Gateway</h1></center><hr><center>nginx</center></body></html>")
    engine = ThreadedServer(Starlette(routes=[Route(
        "/api/chat", lambda request: HTMLResponse(page, 502), methods=["POST"])]),
        name="engine").start()
    try:
        url = sidecar_factory(model_endpoint=engine.url, model_model="qwen3:8b").url
        r = httpx.post(f"{url}/api/chat", json={"model": "qwen3:8b", "messages": HI},
                       timeout=30)
        assert r.status_code == 502, r.text
        assert r.json() == {"error": "provider static failed before answering: HTTP 502: 502 "
                                     "Bad Gateway (an HTML page, not Ollama's)",
                            "reason": "upstream-failed", "model": "qwen3:8b"}
    finally:
        engine.stop()


def test_a_card_that_accepts_and_never_answers_holds_no_listing_once_probed(
        sim_factory: Sims) -> None:
    # A hung node: its port takes connections (the kernel's backlog) and says nothing.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    try:
        gpu = sim_factory("gpu")
        sidecar = ThreadedServer(build_app(load_settings(providers=[
            provider_entry(gpu), {"name": "hung", "endpoint":
                                  f"http://127.0.0.1:{hole.getsockname()[1]}"}])),
            name="sidecar").start()
        try:
            url = sidecar.url
            assert eventually(lambda: [p["ready"] for p in httpx.get(
                f"{url}/kubemoot/v1/state").json()["providers"]] == [True, False], 15)
            for path in ("/api/tags", "/api/ps", "/api/version", "/v1/models"):
                started = time.monotonic()
                r = httpx.get(url + path, timeout=30)
                assert r.status_code == 200, (path, r.text)
                assert time.monotonic() - started < 1.5, path  # not the 3 s of the hung card
            assert "qwen3:8b" in {m["name"] for m in httpx.get(f"{url}/api/tags").json()[
                "models"]}
        finally:
            sidecar.stop()
    finally:
        hole.close()


def test_an_unreachable_provider_is_fresh_and_not_ready_in_metrics() -> None:
    # What deploy/monitoring's KubemootProviderDown reads (tests/unit/test_monitoring.py
    # feeds promtool these series): a provider that never answers is probed all the same,
    # so its state is fresh and says down, and the staleness alert never sees it.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # (nothing listens once it is closed)
    sidecar = ThreadedServer(build_app(load_settings(providers=[
        {"name": "gone", "endpoint": f"http://127.0.0.1:{port}"}])), name="sidecar").start()
    url = sidecar.url

    def figures() -> dict[str, float]:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if 'provider="gone"' in line and line.startswith(
                    ("kubemoot_provider_ready", "kubemoot_provider_state_age_seconds"))}

    try:
        assert eventually(lambda: len(figures()) == 2)
        seen = figures()
        assert seen["kubemoot_provider_ready"] == 0
        assert seen["kubemoot_provider_state_age_seconds"] < 15  # KUBEMOOT_STATE_STALE_SECONDS
    finally:
        sidecar.stop()


@pytest.mark.parametrize(("version", "reloaded"), [("0.32.14", True), ("0.32.15", False)])
def test_a_copy_whose_engine_failed_a_call_is_reloaded_where_the_failure_keeps_its_slot(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str, reloaded: bool) -> None:
    """Before 0.32.15 a built-in parser's error mid-answer kept the call's llama-server slot
    for good (Ollama e0c95a5ff, issue 17825): on a single-slot card every later call to the
    copy waited until its client gave up. The sidecar unloads such a copy; the next call
    reloads it and is answered."""
    gpu = sim_factory("gpu", num_parallel=1, version=version, time_scale=0.05)
    url = sidecar_factory([gpu]).url
    assert httpx.post(f"{url}/api/generate", json={"model": "llama3.2:3b"},
                      timeout=30).status_code == 200
    httpx.post(f"{gpu.url}/_sim/fault", json={"mode": "parser", "count": 1, "after_chunks": 1})
    client = ollama.Client(host=url, timeout=10)
    with pytest.raises(ollama.ResponseError):
        for _ in client.chat("llama3.2:3b", [{"role": "user", "content": "hi"}], stream=True):
            pass
    answer = client.chat("llama3.2:3b", [{"role": "user", "content": "again"}],
                         options={"num_predict": 4})
    assert answer.message.content
    assert gpu.sim.stats.wedged_slots == int(reloaded)
    assert gpu.sim.stats.loads == 1 + int(reloaded)


@pytest.mark.parametrize(("stream", "after_chunks"), [(False, 0), (True, 0), (True, 2)])
def test_a_copy_whose_engine_failed_the_call_that_loaded_it_is_reloaded_too(
        sim_factory: Sims, sidecar_factory: Sidecars, stream: bool, after_chunks: int) -> None:
    """The same failure on the call that loaded the copy, before its first piece or after
    it: no probe has listed the copy yet (the view counts it as the load's), but the engine
    ran the call, so the copy is there, its slot kept."""
    gpu = sim_factory("gpu", num_parallel=1, version="0.15.5", time_scale=0.05)
    url = sidecar_factory([gpu]).url
    httpx.post(f"{gpu.url}/_sim/fault", json={"mode": "parser", "count": 1,
                                             "after_chunks": after_chunks})
    client = ollama.Client(host=url, timeout=10)
    with pytest.raises(ollama.ResponseError):
        for _ in client.chat("llama3.2:3b", HI, stream=True) if stream else \
                [client.chat("llama3.2:3b", HI)]:
            pass
    answer = client.chat("llama3.2:3b", [{"role": "user", "content": "again"}],
                         options={"num_predict": 4})
    assert answer.message.content
    assert (gpu.sim.stats.wedged_slots, gpu.sim.stats.loads) == (1, 2)


def test_a_copy_whose_runner_died_on_the_call_that_loaded_it_counts_until_unloaded(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """The engine loaded the copy, then its runner died on the first call, before any answer
    (a 500). Ollama keeps the dead copy listed and counts its memory until it is unloaded
    (server/sched.go:1426): a call waiting for that memory is placed once the card has been
    read, evicting the copy, not beside it, where Ollama would unload it itself."""
    gpu = sim_factory("gpu", total_vram_mib=24564, num_parallel=1, time_scale=0.05)
    url = sidecar_factory([gpu]).url
    httpx.post(f"{gpu.url}/_sim/fault", json={"mode": "midstream", "count": 1,
                                             "after_chunks": 0})
    with ThreadPoolExecutor(2) as pool:
        dying = pool.submit(httpx.post, f"{url}/api/chat", timeout=60, json={
            "model": "gemma3:27b", "messages": HI, "stream": False})
        assert eventually(lambda: gpu.sim.runners.get("gemma3:27b") is not None)
        waiting = pool.submit(httpx.post, f"{url}/api/chat", timeout=60, json={
            "model": "qwen3:14b", "messages": HI, "stream": False})
        assert dying.result().status_code == 502
        assert waiting.result().status_code == 200
    assert gpu.sim.stats.crashes == 1
    assert gpu.sim.stats.self_evictions == 0


def test_a_copy_whose_runner_ollama_closed_mid_answer_is_loaded_again_as_planned(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """A runner that broke off an answer is closed by Ollama ("an error was encountered
    while running the model", llm/llama_server.go:1759-1766) and stays listed; the next call
    to it reloads it (its Ping fails, server/sched.go:1426), fitted beside phi3:mini, whose
    runner loaded beside the first copy and still counts it. The sidecar unloads the closed
    copy, so that load is its own, planned: Ollama never unloads phi3 itself."""
    gpu = sim_factory("gpu", total_vram_mib=9500, num_parallel=1, time_scale=0.05)
    url = sidecar_factory([gpu]).url
    for model in ("llama3.2:3b", "phi3:mini"):
        assert httpx.post(f"{url}/api/generate", json={"model": model},
                          timeout=30).status_code == 200
    httpx.post(f"{gpu.url}/_sim/fault", json={"mode": "midstream", "count": 1,
                                             "after_chunks": 1})
    client = ollama.Client(host=url, timeout=30)
    with pytest.raises(ollama.ResponseError):
        for _ in client.chat("llama3.2:3b", HI, stream=True):
            pass
    answer = client.chat("llama3.2:3b", [{"role": "user", "content": "again"}],
                         options={"num_predict": 4})
    assert answer.message.content
    assert gpu.sim.stats.crashes == 1
    assert gpu.sim.stats.self_evictions == 0


def test_a_model_no_card_listed_is_404_at_once_while_a_card_that_lacked_it_is_down(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """A mistyped name while a card is down: every card's /api/tags was seen (the down
    one's before it went) and none listed it, so Ollama's 404 comes at once in the call's
    dialect, not a 503 at the wait limit. A model only the down card listed is waited for."""
    a = sim_factory("a", models=CATALOG)  # qwen3:32b is on this card only
    b = sim_factory("b", models=tuple(m for m in CATALOG if m.name != "qwen3:32b"))
    url = sidecar_factory([a, b], probe_interval_seconds=0.1,
                          discuss_gpu_wait_limit_seconds=3.0).url
    assert eventually(lambda: all(p["ready"] for p in httpx.get(
        f"{url}/kubemoot/v1/state").json()["providers"]))
    a.stop()
    assert eventually(lambda: not httpx.get(f"{url}/kubemoot/v1/state").json()[
        "providers"][0]["ready"])
    agent = ollama.Client(host=url)
    gpt = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    took = []  # each call's time: one that waited for the down card takes the 3 s limit
    started = time.monotonic()
    with pytest.raises(ollama.ResponseError) as said:
        agent.chat(model="qwen3:8bb", messages=HI)
    assert (said.value.status_code, said.value.error) == (404, "model 'qwen3:8bb' not found")
    took.append(time.monotonic() - started)
    started = time.monotonic()
    with pytest.raises(openai.NotFoundError) as told:
        gpt.chat.completions.create(model="qwen3:8bb",
                                    messages=[{"role": "user", "content": "hi"}])
    assert told.value.body["type"] == "not_found_error"  # type: ignore[index]
    took.append(time.monotonic() - started)
    started = time.monotonic()
    embed = httpx.post(f"{url}/api/embed", json={"model": "qwen3:8bb", "input": "hi"})
    assert (embed.status_code, embed.json()["error"]) == (
        404, 'model "qwen3:8bb" not found, try pulling it first')
    took.append(time.monotonic() - started)
    assert max(took) < 2.0, took  # none of them waited for the down card
    only_there = httpx.post(f"{url}/api/chat", json={"model": "qwen3:32b", "messages": HI},
                            timeout=30)
    assert (only_there.status_code, only_there.json()["reason"]) == (503, "gpu-busy")


def test_a_card_never_listed_may_have_any_model(sim_factory: Sims) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # (down since before the sidecar started)
    sidecar = ThreadedServer(build_app(load_settings(providers=[
        provider_entry(sim_factory("b")), {"name": "gone", "endpoint": f"http://127.0.0.1:{port}"}],
        probe_interval_seconds=0.1, discuss_gpu_wait_limit_seconds=0.3)), name="sidecar").start()
    try:
        url = sidecar.url
        assert eventually(lambda: [p["ready"] for p in httpx.get(
            f"{url}/kubemoot/v1/state").json()["providers"]] == [True, False])
        r = httpx.post(f"{url}/api/chat", json={"model": "qwen3:8bb", "messages": HI})
        assert (r.status_code, r.json()["reason"]) == (503, "gpu-busy")  # it may be there
    finally:
        sidecar.stop()


def test_a_card_that_lists_no_model_has_none_until_a_probe_lists_one(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """An Ollama with no models answers `{"models": []}` (server/routes.go ListHandler), and
    a call for a model it lacks is its 404 at once: so is the sidecar's, in each dialect,
    not a 503 at the wait limit. The model pulled, the next probe's listing places it; a
    cloud model is still sent on (it takes no GPU)."""
    empty = sim_factory("gpu", models=())
    url = sidecar_factory([empty], probe_interval_seconds=0.1,
                          discuss_gpu_wait_limit_seconds=2.0).url
    assert httpx.get(f"{empty.url}/api/tags").json() == {"models": []}
    assert eventually(lambda: httpx.get(f"{url}/kubemoot/v1/state").json()[
        "providers"][0]["ready"])
    agent = ollama.Client(host=url)
    gpt = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    took = []  # each call's time: one that waited would take the 2 s limit
    started = time.monotonic()
    with pytest.raises(ollama.ResponseError) as said:
        agent.chat(model="qwen3:8b", messages=HI)
    assert (said.value.status_code, said.value.error) == (404, "model 'qwen3:8b' not found")
    took.append(time.monotonic() - started)
    started = time.monotonic()
    with pytest.raises(openai.NotFoundError):
        gpt.chat.completions.create(model="qwen3:8b",
                                    messages=[{"role": "user", "content": "hi"}])
    took.append(time.monotonic() - started)
    started = time.monotonic()
    embed = httpx.post(f"{url}/api/embed", json={"model": "qwen3:8b", "input": "hi"})
    assert (embed.status_code, embed.json()["error"]) == (
        404, 'model "qwen3:8b" not found, try pulling it first')
    took.append(time.monotonic() - started)
    assert max(took) < 1.5, took  # none of it waited
    refused = httpx.post(f"{url}/api/generate", json={"model": "qwen3:8b", "prompt": "hi"})
    assert (refused.status_code, refused.json()["reason"]) == (404, "model-not-found")
    assert "x-kubemoot-provider" not in refused.headers  # no card was given it
    assert empty.sim.stats.requests == 0
    cloud = httpx.post(f"{url}/api/chat", json={"model": "gpt-oss:120b-cloud", "messages": HI,
                                                "stream": False})
    assert cloud.headers["x-kubemoot-placement"] == "cloud"
    empty.sim.config = replace(empty.sim.config, models=(CATALOG[2],))  # qwen3:8b pulled
    assert eventually(lambda: httpx.post(f"{url}/api/chat", json={
        "model": "qwen3:8b", "messages": HI, "stream": False}).status_code == 200)


def test_a_card_that_listed_no_model_is_not_waited_for_while_it_is_down(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """Its last listing was empty: while it is down a model no card listed is 404 at once,
    as with a card that listed others."""
    a = sim_factory("a")
    b = sim_factory("b", models=())
    url = sidecar_factory([a, b], probe_interval_seconds=0.1,
                          discuss_gpu_wait_limit_seconds=2.0).url
    assert eventually(lambda: all(p["ready"] for p in httpx.get(
        f"{url}/kubemoot/v1/state").json()["providers"]))
    b.stop()
    assert eventually(lambda: not httpx.get(f"{url}/kubemoot/v1/state").json()[
        "providers"][1]["ready"])
    started = time.monotonic()
    r = httpx.post(f"{url}/api/chat", json={"model": "qwen3:8bb", "messages": HI})
    assert (r.status_code, r.json()["error"]) == (404, "model 'qwen3:8bb' not found")
    assert time.monotonic() - started < 1.0


def test_a_cards_404_for_a_model_it_no_longer_has_is_no_card_failure_and_no_answer(
        sim_factory: Sims, sidecar_factory: Sidecars, capsys: pytest.CaptureFixture[str]
) -> None:
    """The card listed qwen3:8b, since deleted there: the call placed on it gets Ollama's
    404. The card did its part: no upstream error is counted and its latency is not taught
    by the 404's milliseconds; but the call was not answered, which its `call` log line
    (`answered=False`, `healthy=True`) and the status feed's call (no `ok`) say."""
    from tests.e2e.test_status_page import views

    gpu = sim_factory("a", time_scale=0.05)  # (a keep-alive of 15 s)
    assert httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"}).status_code == 200
    sidecar = sidecar_factory([gpu], probe_interval_seconds=30)
    url = sidecar.url
    body = {"model": "qwen3:8b", "messages": HI, "stream": False}
    assert eventually(lambda: [r["model"] for r in httpx.get(
        f"{url}/kubemoot/v1/state").json()["providers"][0]["residents"]] == ["qwen3:8b"])
    answered = httpx.post(f"{url}/api/chat", json=body, timeout=30)  # warm: no probe follows
    assert answered.headers["x-kubemoot-placement"] == "warm"
    health = sidecar.app.state.api.calls.scheduler.experience.stats  # type: ignore[attr-defined]
    latency = health["a"].latency
    gpu.sim.config = replace(gpu.sim.config, models=tuple(
        m for m in gpu.sim.config.models if m.name != "qwen3:8b"))
    capsys.readouterr()
    gone = httpx.post(f"{url}/api/chat", json=body, timeout=30)
    assert gone.status_code == 404 and "not found" in gone.json()["error"]
    logged = [line for line in capsys.readouterr().out.splitlines() if "] call  " in line]
    assert len(logged) == 1 and "HTTP 404" in logged[0], logged
    assert " answered=False " in logged[0] and " healthy=True " in logged[0], logged
    assert health["a"].latency == latency
    metrics = httpx.get(f"{url}/metrics").text
    assert 'kubemoot_upstream_errors_total{provider="a"}' not in metrics
    with httpx.stream("GET", f"{url}/kubemoot/v1/events", timeout=10) as feed:
        calls = next(views(feed))["calls"]
    assert [(c["ok"], "404" in str(c["error"])) for c in calls] == [(False, True), (True, False)]


def test_a_model_removed_from_a_card_is_served_elsewhere_and_not_placed_there_again(
        sim_factory: Sims, sidecar_factory: Sidecars, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ollama rm` on the card that has the model loaded: its copy runs on, but Ollama answers
    404 to every call for it. The call is served by the other card, and the sidecar reads
    the card's listing again at once: the next call goes straight to the other card (it was
    placed warm on the first one again, until the next scheduled probe, 30 s here)."""
    a = sim_factory("a", time_scale=0.05)
    b = sim_factory("b", time_scale=0.05)
    assert httpx.post(f"{a.url}/api/generate", json={"model": "qwen3:8b"}).status_code == 200
    url = sidecar_factory([a, b], probe_interval_seconds=30).url
    assert eventually(lambda: [r["model"] for r in httpx.get(
        f"{url}/kubemoot/v1/state").json()["providers"][0]["residents"]] == ["qwen3:8b"])
    client = ollama.Client(host=url, timeout=30)
    assert client.chat(model="qwen3:8b", messages=HI).message.content
    assert ollama.Client(host=a.url).delete("qwen3:8b").status == "success"
    capsys.readouterr()
    for _ in range(2):  # neither call sees the 404
        assert client.chat(model="qwen3:8b", messages=HI).message.content
    refused = [line for line in capsys.readouterr().out.splitlines()
               if "] call  " in line and "HTTP 404" in line]
    assert len(refused) == 1, refused  # only the first found the model gone from `a`
    assert b.sim.stats.inference_requests == 2


def test_what_one_sidecar_learns_of_a_removed_model_reaches_the_others(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    """With NATS, the card's listing read again after its 404 is published: the other
    sidecar places the model on the card no more either, before its own next probe."""
    import asyncio

    from tests.conftest import empty_buckets

    asyncio.run(empty_buckets(nats_server.url))
    a = sim_factory("a", time_scale=0.05)
    b = sim_factory("b", time_scale=0.05)
    assert httpx.post(f"{a.url}/api/generate", json={"model": "qwen3:8b"}).status_code == 200
    one, two = (sidecar_factory([a, b], nats_url=nats_server.url, agent_name=name,
                                probe_interval_seconds=30).url for name in ("one", "two"))

    def residents(url: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = httpx.get(
            f"{url}/kubemoot/v1/state").json()["providers"][0]["residents"]
        return found

    assert eventually(lambda: [r["model"] for r in residents(two)] == ["qwen3:8b"])
    assert ollama.Client(host=a.url).delete("qwen3:8b").status == "success"
    capsys.readouterr()
    assert ollama.Client(host=one, timeout=30).chat(model="qwen3:8b", messages=HI).message.content
    assert eventually(lambda: all(r.get("leaving") for r in residents(two)))
    assert ollama.Client(host=two, timeout=30).chat(model="qwen3:8b", messages=HI).message.content
    refused = [line for line in capsys.readouterr().out.splitlines()
               if "] call  " in line and "HTTP 404" in line]
    assert len(refused) == 1, refused  # sidecar two's call went to `b` at once
    assert b.sim.stats.inference_requests == 2
