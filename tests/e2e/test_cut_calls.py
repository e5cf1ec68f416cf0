"""Clients that leave while their call is in flight: wherever they leave (waiting for a GPU,
while a victim is unloaded or a copy loads for them, before the first chunk, mid-stream on
each dialect), the call leaves nothing behind: no ticket, waiter or call in flight in the
sidecar, no call running or queued on the GPU; and the next calls are placed as usual.
(`python -m loadtest.cancel_soak --cancel` runs thousands of them against `serve`.)"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from typing import Any

import httpx

from loadtest.ollama_sim import SimServer
from loadtest.sim_output import answer_options
from tests.conftest import eventually
from tests.e2e.test_scheduling import HI, Sidecars, Sims


def held(url: str, sims: list[SimServer]) -> dict[str, Any]:
    """What is still held for calls, in the sidecar and on its GPUs (all zero when idle)."""
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    metrics = httpx.get(f"{url}/metrics").text
    return {
        "tickets": len(state["tickets"]),
        "waiters": sum(d["waiters"] for d in state["demand"].values()),
        "in_flight": sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                         if line.startswith("kubemoot_in_flight{")),
        "running": sum(r.refcount for s in sims for r in s.sim.runners.values()),
        "decoding": sum(s.sim.decoding for s in sims),
        "loads_queued": sum(s.sim._pending for s in sims),
    }


def nothing_held(url: str, sims: list[SimServer], timeout_s: float = 2.0) -> None:
    assert eventually(lambda: not any(held(url, sims).values()), timeout_s=timeout_s), \
        held(url, sims)


def request(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n\r\n").encode() + data


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(10)
    return sock


def test_a_client_leaving_mid_stream_leaves_nothing_on_any_dialect(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, time_scale=0.2, tokens_per_s=5)
    url = sidecar_factory([gpu]).url
    httpx.post(f"{gpu.url}/api/generate", json={"model": "llama3.2:3b"}, timeout=10)
    for path, body in [
            ("/api/chat", {"messages": HI, "options": answer_options(4000)}),
            ("/v1/chat/completions", {"stream": True, "messages": HI}),
            ("/v1/messages", {"stream": True, "messages": HI, "max_tokens": 4000}),
            ("/v1/responses", {"stream": True, "input": "hi"})]:
        sock = connect(url)
        sock.sendall(request(path, {"model": "llama3.2:3b", **body}))
        assert b" 200 " in sock.recv(100)
        assert eventually(lambda: gpu.sim.decoding == 1)  # mid-answer
        sock.close()
        nothing_held(url, [gpu])
    assert gpu.sim.stats.abandoned == 0  # (each one's stream stopped, none answered whole)


def test_a_client_leaving_while_its_victim_goes_or_its_copy_loads_leaves_nothing(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=0.2)
    url = sidecar_factory([gpu]).url
    httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"}, timeout=30)
    for cut_s in (0.02, 0.3):  # unloading qwen3:8b, then loading qwen3:14b
        sock = connect(url)
        sock.sendall(request("/api/chat", {"model": "qwen3:14b", "messages": HI}))
        time.sleep(cut_s)
        sock.close()
        nothing_held(url, [gpu], timeout_s=3)
    r = httpx.post(f"{url}/api/chat", json={"model": "llama3.2:3b", "messages": HI,
                                            "stream": False}, timeout=30)
    assert r.status_code == 200 and gpu.sim.stats.aborted_loads >= 1


def test_fifty_clients_leaving_at_random_moments_leave_nothing_behind(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """Waiting for a GPU, during loads, before and during their answers, at once; then the
    next calls are placed as usual."""
    gpu = sim_factory("gpu", total_vram_mib=24564, time_scale=0.05, num_parallel=2)
    url = sidecar_factory([gpu], **mode).url
    host, port = url.removeprefix("http://").split(":")
    draw = random.Random(3)
    cuts = [(draw.choice(["llama3.2:3b", "qwen3:8b", "qwen3:14b", "phi3:mini"]),
             draw.uniform(0, 0.5)) for _ in range(50)]

    async def leave(model: str, after_s: float) -> None:
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(request("/api/chat", {"model": model, "messages": HI,
                                           "options": answer_options(200)}))
        await asyncio.sleep(after_s)
        writer.transport.abort()  # as a killed agent

    async def leave_all() -> None:
        await asyncio.gather(*(leave(model, after_s) for model, after_s in cuts))

    asyncio.run(leave_all())
    nothing_held(url, [gpu], timeout_s=3)
    with httpx.Client(timeout=30) as client:
        for _ in range(3):
            r = client.post(f"{url}/api/chat", json={"model": "llama3.2:3b", "messages": HI,
                                                     "stream": False})
            assert r.status_code == 200, r.text
    nothing_held(url, [gpu])
