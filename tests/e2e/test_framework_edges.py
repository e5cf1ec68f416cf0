"""What the web framework and the server would answer on their own, answered in the
sidecar's shape; connections that never finish a request closed; no input that makes the
sidecar work for long."""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from proxy.api import protocol, routes
from proxy.app import build_app
from proxy.core.durations import DurationError, parse_duration
from proxy.settings import load_settings
from tests.conftest import eventually, provider_entry

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]


@pytest.mark.parametrize(("method", "path", "shape"), [
    ("GET", "/api/chat", "error"), ("PUT", "/v1/chat/completions", "openai"),
    ("GET", "/v1/messages", "anthropic"), ("POST", "/api/tags", "error"),
    ("PATCH", "/kubemoot/v1/explain", "error")])
def test_a_wrong_method_is_405_in_the_callers_shape(sim_factory: Sims,
                                                    sidecar_factory: Sidecars, method: str,
                                                    path: str, shape: str) -> None:
    url = sidecar_factory([sim_factory("gpu")]).url
    r = httpx.request(method, f"{url}{path}")
    assert r.status_code == 405 and r.headers["allow"]
    body = r.json()
    assert body["reason"] == "method-not-allowed"
    if shape == "openai":
        assert (body["error"]["type"], body["error"]["code"]) == ("api_error", None)
    elif shape == "anthropic":
        assert body["type"] == "error" and body["error"]["message"]
    else:
        assert method in body["error"]


def test_no_redirect_is_made_for_a_trailing_slash(sim_factory: Sims,
                                                  sidecar_factory: Sidecars) -> None:
    url = sidecar_factory([sim_factory("gpu")]).url
    r = httpx.post(f"{url}/api/chat/", json={}, headers={"Host": "localhost"})
    assert r.status_code == 404 and "location" not in r.headers
    assert r.json()["reason"] == "not-found"


def test_a_path_not_served_is_a_404_naming_every_path_that_is(sim_factory: Sims,
                                                              sidecar_factory: Sidecars) -> None:
    url = sidecar_factory([sim_factory("gpu")]).url
    r = httpx.get(f"{url}/kubemoot/v1/explian")
    assert (r.status_code, r.json()["reason"]) == (404, "not-found")
    for served in ("/api/*", "/v1/messages/count_tokens", "/kubemoot/v1/*", "/kubemoot/ui",
                   "/metrics", "/healthz", "/readyz"):
        assert served in r.json()["error"], served


@pytest.mark.parametrize("value", ["١٢", "1" * 12, "-3", "12abc", "²"])
def test_explain_refuses_a_malformed_number_plainly(sim_factory: Sims,
                                                   sidecar_factory: Sidecars,
                                                   value: str) -> None:
    url = sidecar_factory([sim_factory("gpu")]).url
    r = httpx.get(f"{url}/kubemoot/v1/explain", params={"model": "qwen3:8b",
                                                        "promptChars": value})
    assert r.status_code == 400 and r.json()["reason"] == "bad-request"
    assert "promptChars" in r.json()["error"] and r.json()["model"] == "qwen3:8b"


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_explain_refuses_a_phase_out_of_its_values_as_the_header_is(
        sim_factory: Sims, sidecar_factory: Sidecars, method: str) -> None:
    url = sidecar_factory([sim_factory("gpu")]).url
    ask = {"params": {"model": "qwen3:8b", "phase": "lunch"}} if method == "GET" else {
        "params": {"phase": "lunch"}, "json": {"model": "qwen3:8b", "messages": []}}
    r = httpx.request(method, f"{url}/kubemoot/v1/explain", **ask)  # type: ignore[arg-type]
    assert r.status_code == 400, r.text
    assert r.json() == {"error": "query parameter 'phase': 'lunch' is not a phase; use one of "
                                 "mulling, triage", "reason": "bad-request",
                        "model": "qwen3:8b"}
    for phase in ("triage", "Mulling", ""):  # as the header takes them
        taken = httpx.get(f"{url}/kubemoot/v1/explain",
                          params={"model": "qwen3:8b", "phase": phase})
        assert taken.status_code == 200, taken.text


def test_a_fault_is_a_500_in_the_sidecars_shape(sim_factory: Sims,
                                                sidecar_factory: Sidecars) -> None:
    app = build_app(load_settings(providers=[provider_entry(sim_factory("gpu"))]))

    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug")

    app.state.scheduler.explain = broken
    server = ThreadedServer(app, name="sidecar").start()
    try:
        r = httpx.get(f"{server.url}/kubemoot/v1/explain", params={"model": "qwen3:8b"})
        assert r.status_code == 500 and r.json()["reason"] == "internal-error"
        assert "a bug" not in r.text  # nothing of the internals leaks
    finally:
        server.stop()


def test_a_keep_alive_string_never_makes_the_sidecar_work_long(sim_factory: Sims,
                                                              sidecar_factory: Sidecars) -> None:
    """Twenty zeros and one other character froze the whole sidecar for seconds (a regular
    expression that backtracked); the parse is now one pass over the text."""
    started = time.thread_time()  # the CPU it takes (0.08 s), not a loaded machine's clock
    with pytest.raises(DurationError):
        parse_duration("0" * 100_000 + "x")
    with pytest.raises(DurationError):
        parse_duration("1" * 100_000 + "s")
    assert time.thread_time() - started < 0.5
    url = sidecar_factory([sim_factory("gpu", context_length=2048)]).url
    started = time.perf_counter()
    r = httpx.post(f"{url}/api/generate", json={"model": "qwen3:8b", "prompt": "hi",
                                                "stream": False, "keep_alive": "0" * 30 + "x"})
    assert r.status_code == 400 and r.json()["error"] == (  # Go's words, as Ollama gives them
        'time: unknown unit "x" in duration "' + "0" * 30 + 'x"')
    assert time.perf_counter() - started < 5


def test_a_connection_that_never_finishes_its_request_is_closed(
        sim_factory: Sims, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "HEAD_TIMEOUT_S", 0.5)
    monkeypatch.setattr(routes, "BODY_TIMEOUT_S", 0.5)
    app = build_app(load_settings(providers=[provider_entry(sim_factory("gpu"))]))
    server = ThreadedServer(app, name="sidecar", http=protocol.HeadTimeoutProtocol,
                            timeout_keep_alive=protocol.KEEP_ALIVE_TIMEOUT_S).start()
    try:
        idle = socket.create_connection((server.host, server.port))
        idle.sendall(b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\n")  # and the head never ends
        idle.settimeout(5)
        started = time.monotonic()
        assert idle.recv(100) == b""  # closed, after about the head limit
        assert time.monotonic() - started < 3
        slow = socket.create_connection((server.host, server.port))
        slow.sendall(b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{")
        slow.settimeout(5)
        answer = slow.recv(1000)
        assert b"408" in answer.split(b"\r\n")[0] and b'"reason":"request-timeout"' in answer
        # and closed: a body cut half-way leaves the stream unusable (it stayed open 300 s)
        assert b"connection: close" in answer.lower()
        assert slow.recv(1000) == b""
    finally:
        server.stop()


def test_a_head_over_gos_limit_is_its_431_and_is_not_kept(sim_factory: Sims) -> None:
    """Go's net/http (Ollama's server) reads at most 1 MiB + 4 KiB of a request's head and
    answers 431 as plain text; the sidecar held a head of any size in memory (50 MB grew it
    by 42 MiB). A head just within the limit is served."""
    app = build_app(load_settings(providers=[provider_entry(sim_factory("gpu"))]))
    server = ThreadedServer(app, name="sidecar", http=protocol.HeadTimeoutProtocol).start()
    try:
        big = socket.create_connection((server.host, server.port))
        big.settimeout(5)
        big.sendall(b"GET /api/version HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (2 << 20))
        answer = big.recv(1000)
        assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
        assert answer.endswith(b"\r\n\r\n431 Request Header Fields Too Large")
        fits = httpx.get(f"{server.url}/", headers={"X-Big": "a" * 1_000_000})
        assert fits.status_code == 200
    finally:
        server.stop()


CALLS = {"/api/chat": {"model": "qwen3:8b", "stream": False,
                       "messages": [{"role": "user", "content": "hi"}]},
         "/v1/chat/completions": {"model": "qwen3:8b", "max_tokens": 2,
                                  "messages": [{"role": "user", "content": "hi"}]},
         "/v1/messages": {"model": "qwen3:8b", "max_tokens": 2,
                          "messages": [{"role": "user", "content": "hi"}]}}


@pytest.mark.parametrize(("path", "header", "value", "named"), [
    ("/api/chat", "X-Kubemoot-Thread", "t" * 257, "256 characters"),
    ("/v1/chat/completions", "X-Kubemoot-Thread", "t" * 3000, "256 characters"),
    ("/api/chat", "X-Kubemoot-Phase", "tirage", "mulling, triage"),
    ("/v1/messages", "X-Kubemoot-Phase", "tirage", "mulling, triage"),
    ("/api/chat", "X-Kubemoot-Wait", "off", "true or false"),
    ("/v1/chat/completions", "X-Kubemoot-Wait", "off", "true or false")])
def test_a_kubemoot_header_out_of_its_values_is_refused_naming_it(
        sim_factory: Sims, sidecar_factory: Sidecars, path: str, header: str, value: str,
        named: str) -> None:
    url = sidecar_factory([sim_factory("gpu", time_scale=0.001)]).url
    r = httpx.post(f"{url}{path}", json=CALLS[path], headers={header: value}, timeout=30)
    assert r.status_code == 400, r.text
    body = r.json()
    assert (body["reason"], body["model"]) == ("bad-request", "qwen3:8b")
    message = {"/api/chat": lambda: body["error"],
               "/v1/chat/completions": lambda: body["error"]["message"],
               "/v1/messages": lambda: body["error"]["message"]}[path]()
    assert header in message and named in message


@pytest.mark.parametrize("headers", [{"X-Kubemoot-Thread": "t" * 256},
                                     {"X-Kubemoot-Phase": "Mulling"},
                                     {"X-Kubemoot-Wait": "FALSE"}, {"X-Kubemoot-Wait": "1"}])
def test_kubemoot_headers_within_their_values_are_taken(
        sim_factory: Sims, sidecar_factory: Sidecars, headers: dict[str, str]) -> None:
    url = sidecar_factory([sim_factory("gpu", time_scale=0.001)]).url
    r = httpx.post(f"{url}/api/chat", json=CALLS["/api/chat"], headers=headers, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("method", "path", "body", "command"), [
    ("DELETE", "/api/delete", {"model": "qwen3:8b"}, "ollama rm <model>"),
    ("POST", "/api/copy", {"source": "qwen3:8b", "destination": "mine"},
     "ollama cp <source> <destination>"),
    ("POST", "/api/push", {"model": "qwen3:8b"}, "ollama push <model>"),
    ("POST", "/api/create", {"model": "mine"}, "ollama create <model>"),
    ("POST", "/api/blobs/sha256:ab12", {}, "ollama create <model>")])
def test_model_management_names_the_command_to_run_on_each_provider(
        sim_factory: Sims, sidecar_factory: Sidecars, method: str, path: str,
        body: dict[str, str], command: str) -> None:
    url = sidecar_factory([sim_factory("gpu")]).url
    r = httpx.request(method, f"{url}{path}", json=body)
    assert r.status_code == 501 and r.json()["reason"] == "not-supported"
    assert f"OLLAMA_HOST=<provider> {command}" in r.json()["error"]
    if path.startswith("/api/blobs/"):  # `ollama create` asks whether the server has it
        assert httpx.head(f"{url}{path}").status_code == 501


def test_an_idle_connection_outlives_the_agents_own_keep_alive(sim_factory: Sims) -> None:
    """httpx keeps an idle connection 5 s: a sidecar closing it at that mark races the
    agent's next request on it, which the client does not retry. Ollama closes none."""
    app = build_app(load_settings(providers=[provider_entry(sim_factory("gpu"))]))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = protocol.listener(app, "127.0.0.1", sock.getsockname()[1], "on")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert eventually(lambda: server.started)
        agent = socket.create_connection(sock.getsockname())
        agent.settimeout(5)
        request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
        agent.sendall(request)
        assert agent.recv(1000).startswith(b"HTTP/1.1 200")
        time.sleep(6)
        agent.sendall(request)
        assert agent.recv(1000).startswith(b"HTTP/1.1 200")
    finally:
        server.should_exit = True
        thread.join(timeout=5)


def test_a_connection_reset_after_its_answer_is_not_kept(sim_factory: Sims) -> None:
    """An agent killed (or a proxy purging its pool) resets its idle connection: uvicorn left
    the idle timer armed, and its handle kept each such connection (protocol, request,
    headers) alive for the 300 s keep-alive."""
    import gc

    app = build_app(load_settings(providers=[provider_entry(sim_factory("gpu"))]))
    server = ThreadedServer(app, name="sidecar", http=protocol.HeadTimeoutProtocol,
                            timeout_keep_alive=protocol.KEEP_ALIVE_TIMEOUT_S).start()

    assert server._server is not None
    ours = server._server.server_state

    def kept() -> int:  # this server's connections still in memory
        gc.collect()
        return sum(isinstance(o, protocol.HeadTimeoutProtocol) and o.server_state is ours
                   for o in gc.get_objects())

    try:
        for _ in range(20):
            agent = socket.create_connection((server.host, server.port))
            agent.settimeout(5)
            agent.sendall(b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert agent.recv(1000).startswith(b"HTTP/1.1 200")
            agent.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            agent.close()  # a reset, not a FIN
        assert eventually(lambda: kept() == 0, timeout_s=2), kept()
    finally:
        server.stop()


def test_head_is_answered_where_ollama_answers_it(sim_factory: Sims,
                                                  sidecar_factory: Sidecars) -> None:
    """Ollama's router registers HEAD for /, /api/version and /api/tags alone, and answers
    it with 405 elsewhere (server/routes.go:1870-1887)."""
    url = sidecar_factory([sim_factory("gpu")]).url
    for path in ("/", "/api/version", "/api/tags"):
        assert httpx.head(f"{url}{path}").status_code == 200, path
    for path in ("/api/ps", "/v1/models", "/v1/models/qwen3:8b"):
        r = httpx.head(f"{url}{path}")
        assert (r.status_code, r.headers["allow"]) == (405, "GET"), path


def test_a_pipelining_client_that_leaves_is_not_answered_for_nobody(sim_factory: Sims) -> None:
    """A client sends a second request before the first's answer (HTTP/1.1 pipelining), then
    leaves: uvicorn stopped reading once the second was queued and told only that one of the
    loss, so the first went on generating its 8 s answer on the GPU for nobody."""
    gpu = sim_factory("gpu", tokens_per_s=0.4, time_scale=0.2, context_length=4096)
    httpx.post(f"{gpu.url}/api/generate", json={"model": "llama3.2:3b"}, timeout=10)
    app = build_app(load_settings(providers=[provider_entry(gpu)]))
    server = ThreadedServer(app, name="sidecar", http=protocol.HeadTimeoutProtocol).start()
    try:
        body = b'{"model":"llama3.2:3b","stream":false,"messages":[{"role":"user","content":"hi"}]}'
        call = (b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body))
        client = socket.create_connection((server.host, server.port))
        client.sendall(call + b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert eventually(lambda: gpu.sim.runners["llama3.2:3b"].refcount == 1)
        client.close()
        assert eventually(lambda: gpu.sim.stats.abandoned == 1, timeout_s=2)
        assert eventually(lambda: not httpx.get(f"{server.url}/kubemoot/v1/state")
                          .json()["tickets"], timeout_s=2)
        # the same when the call began behind an answered one
        version = b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\n"
        client = socket.create_connection((server.host, server.port))
        client.sendall(version + call + version)
        assert eventually(lambda: gpu.sim.runners["llama3.2:3b"].refcount == 1)
        client.close()
        assert eventually(lambda: gpu.sim.stats.abandoned == 2, timeout_s=2)
        again = socket.create_connection((server.host, server.port))  # pipelining still works
        again.settimeout(5)
        again.sendall(version + version)
        answers = b""
        while answers.count(b"HTTP/1.1 200") < 2:
            answers += again.recv(65536)
        again.close()
    finally:
        server.stop()


def _status_lines(answers: bytes) -> list[bytes]:  # answers follow each other's bodies
    return re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", answers)


@pytest.mark.parametrize(("behind", "refusal"), [
    (b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\nGET / HTTP/1.1\r\nHost\x01: x\r\n\r\n",
     b"HTTP/1.1 400 Bad Request"),
    (b"GET / HTTP/1.1\r\nHost\x01: x\r\n\r\n", b"HTTP/1.1 400 Bad Request"),
    (b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\nGET / HTTP/1.1\r\nX-Big: "
     + b"a" * (2 << 20), b"HTTP/1.1 431 Request Header Fields Too Large")])
def test_a_bad_request_pipelined_behind_a_call_is_refused_after_its_answer(
        sim_factory: Sims, behind: bytes, refusal: bytes) -> None:
    """A malformed or oversized request queued behind a call in flight was parsed at once
    (the read-ahead): its 400 or 431 went out and the connection closed under the call.
    As stock uvicorn and Go's net/http do, the calls ahead are answered first."""
    gpu = sim_factory("gpu", time_scale=0.01)
    app = build_app(load_settings(providers=[provider_entry(gpu)]))
    server = ThreadedServer(app, name="sidecar", http=protocol.HeadTimeoutProtocol).start()
    try:
        body = b'{"model":"qwen3:8b","stream":false,"messages":[{"role":"user","content":"hi"}]}'
        client = socket.create_connection((server.host, server.port))
        client.settimeout(5)
        client.sendall(b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(body), body) + behind)
        answers = b""
        while chunk := client.recv(65536):
            answers += chunk
        expected = [b"HTTP/1.1 200 OK"] * (1 + behind.count(b"/api/version")) + [refusal]
        assert _status_lines(answers) == expected, answers[:2000]
        assert b'"done":true' in answers
    finally:
        server.stop()


def test_a_slow_head_pipelined_behind_a_call_does_not_cut_it(
        sim_factory: Sims, monkeypatch: pytest.MonkeyPatch) -> None:
    """The head limit counted a request read ahead from its first byte: part of a head
    queued behind a call longer than the limit closed the connection under that call. Its
    clock starts once the calls before it are answered (Go reads the next head only then)."""
    monkeypatch.setattr(protocol, "HEAD_TIMEOUT_S", 0.3)
    gpu = sim_factory("gpu", tokens_per_s=3.2, time_scale=0.2, context_length=4096)
    httpx.post(f"{gpu.url}/api/generate", json={"model": "llama3.2:3b"}, timeout=10)
    app = build_app(load_settings(providers=[provider_entry(gpu)]))
    server = ThreadedServer(app, name="sidecar", http=protocol.HeadTimeoutProtocol).start()
    try:
        body = b'{"model":"llama3.2:3b","stream":false,"messages":[{"role":"user","content":"hi"}]}'
        client = socket.create_connection((server.host, server.port))
        client.settimeout(5)
        started = time.monotonic()
        client.sendall(b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(body), body) + b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n")
        answers = b""
        while chunk := client.recv(65536):
            answers += chunk
        assert time.monotonic() - started > 0.6  # the call outlived the head limit
        assert _status_lines(answers) == [b"HTTP/1.1 200 OK"] and b'"done":true' in answers
    finally:
        server.stop()
