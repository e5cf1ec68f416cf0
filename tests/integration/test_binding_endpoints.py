"""A live binding chooses among the sidecar's configured providers, never adds an endpoint.

Anyone with write access to NATS (or a ModelProvider document whose endpoint differs from
KUBEMOOT_PROVIDERS') can put an `endpoint` or a `provider` into kubemoot_bindings and
kubemoot_provider_state. The sidecar sends calls, prompts, pulls and unloads only to the
endpoints of its own settings: a listener that is not configured gets no request at all.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import nats
import ollama
import orjson
import pytest

from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from proxy.adapters.nats_kv import ensure_buckets
from proxy.ports import BINDINGS, PROVIDER_STATE
from proxy.service.codec import ProviderState, escape_key
from tests.binding_docs import AGENT, NAMESPACE

ME = f"{NAMESPACE}/{AGENT}"


class Recorder(BaseHTTPRequestHandler):
    """An endpoint nobody configured: records whatever reaches it."""

    seen: list[str]

    def _any(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_HEAD = do_DELETE = _any

    def log_message(self, *args: Any) -> None:  # quiet
        pass


@pytest.fixture
def rogue() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Rogue", (Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


async def put(url: str, bucket: str, entries: dict[str, Any]) -> None:
    nc = await nats.connect(url)
    try:
        await ensure_buckets(nc.jetstream())
        kv = await nc.jetstream().key_value(bucket)
        for key, value in entries.items():
            await kv.put(key, value if isinstance(value, bytes) else orjson.dumps(value))
    finally:
        await nc.close()


def explain(sidecar: str, thread: str | None = None) -> dict[str, Any]:
    params = {"phase": "mulling", **({"thread": thread} if thread else {})}
    return dict(httpx.get(f"{sidecar}/kubemoot/v1/explain", params=params, timeout=10).json())


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_bindings_and_states_naming_other_endpoints_send_nothing_there(
        sim_factory: Callable[..., SimServer], sidecar_factory: Callable[..., ThreadedServer],
        nats_url: str, rogue: tuple[str, list[str]]) -> None:
    elsewhere, seen = rogue
    gpu = sim_factory("gpu-a", total_vram_mib=49152)
    sidecar = sidecar_factory([gpu], nats_url=nats_url, namespace=NAMESPACE,
                              agent_name=AGENT, model_model="phi3:mini").url
    # the agent's binding: its configured provider's name with another endpoint, and a
    # provider the sidecar does not know; a discussion's binding on that unknown provider
    chosen = {"model": "qwen3:8b", "modelRef": "small", "provider": "gpu-a",
              "endpoint": elsewhere, "score": 100, "reasons": []}
    now = time.time()
    await put(nats_url, BINDINGS, {
        escape_key(ME): {
            "namespace": NAMESPACE, "agent": AGENT, "generation": 1, "preferred": "qwen3:8b",
            "phases": {"mulling": chosen,
                       "triage": {**chosen, "provider": "rogue", "modelRef": "r"}},
            "candidates": {"mulling": [{"model": "qwen3:8b", "score": 100,
                                        "provider": "rogue", "endpoint": elsewhere}],
                           "triage": []},
            "tolerance": None, "unschedulable": []},
        f"thread.t-1.{escape_key('mulling')}": {
            "thread": "t-1", "phase": "mulling", "generation": 1,
            "agents": {ME: {"model": "qwen3:8b", "provider": "rogue", "endpoint": elsewhere,
                            "candidates": [{"model": "qwen3:8b", "score": 100}],
                            "tolerance": None, "unschedulable": None}}}})
    # states: one for a provider the sidecar does not configure, one for its own name
    # with another endpoint, both fresh and Ready with the bound model loaded
    for name in ("rogue", "gpu-a"):
        await put(nats_url, PROVIDER_STATE, {escape_key(name): ProviderState(
            name=name, endpoint=elsewhere, ready=True, last_probed_at=now,
            total_vram_mib=49152, max_parallel=4, loaded_mib={"qwen3:8b": 5200},
            available_mib={"qwen3:8b": 5200}).encode()})
    assert await until(lambda: explain(sidecar)["binding"]["source"] == "agent"), \
        explain(sidecar)
    assert explain(sidecar, "t-1")["binding"]["source"] == "thread"

    client = ollama.AsyncClient(host=sidecar)
    answer = await client.chat(model="phi3:mini", messages=[{"role": "user", "content": "hi"}],
                               options={"num_predict": 2})
    assert answer.model == "qwen3:8b"  # the binding chose the model ...
    threaded = ollama.AsyncClient(host=sidecar, headers={"X-Kubemoot-Thread": "t-1"})
    answer = await threaded.chat(model="phi3:mini",
                                 messages=[{"role": "user", "content": "hi"}],
                                 options={"num_predict": 2})
    assert answer.model == "qwen3:8b"
    await client.show("qwen3:8b")
    await client.pull("qwen3:8b")
    await client.generate(model="qwen3:8b", keep_alive=0)  # unload everywhere

    def stats() -> Any:
        return httpx.get(f"{gpu.url}/_sim/stats", timeout=5).json()

    assert stats()["requests_by_model"].get("qwen3:8b") == 2  # ... the configured GPU ran it
    # and unloaded it there (asked once the answer is out, as Ollama answers at once)
    assert await until(lambda: stats()["loaded"] == [])
    assert seen == []  # and the endpoint nobody configured heard nothing at all
