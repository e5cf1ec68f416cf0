"""Late binding across sidecars: two sidecars sharing a real NATS serve the waiting calls for
a shared model in the order they arrived, whichever sidecar each came through."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import httpx

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from tests.conftest import empty_buckets
from tests.e2e.test_scheduling import chat, stream_in_background

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]


def test_two_sidecars_serve_a_shared_models_waiting_calls_in_arrival_order(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    asyncio.run(empty_buckets(nats_server.url))
    gpu = sim_factory("a", total_vram_mib=24564, time_scale=0.2)
    one = sidecar_factory([gpu], nats_url=nats_server.url, agent_name="one").url
    two = sidecar_factory([gpu], nats_url=nats_server.url, agent_name="two").url
    assert chat(one, "qwen3:8b").status_code == 200  # a warm copy with one slot
    holding = stream_in_background(one, "qwen3:8b", 600, threading.Event())  # ~2.4 s
    ended: dict[int, float] = {}
    answers: dict[int, httpx.Response] = {}

    def call(i: int, url: str) -> None:
        answers[i] = chat(url, "qwen3:8b", options={"num_predict": 50})  # ~0.2 s each
        ended[i] = time.monotonic()

    threads = []
    for i in range(6):  # alternating sidecars, each well after the previous one
        threads.append(threading.Thread(target=call, args=(i, (two, one)[i % 2])))
        threads[-1].start()
        time.sleep(0.15)
    for thread in threads:
        thread.join(30)
    holding.join(30)
    assert all(r.status_code == 200 for r in answers.values())
    assert all(int(r.headers["x-kubemoot-waited-ms"]) > 0 for r in answers.values())
    # One slot: each call starts after the previous one ended, so the answers end in the
    # order the calls were served, which must be the order they arrived.
    assert sorted(ended, key=ended.__getitem__) == list(range(6)), {
        i: (answers[i].headers["x-kubemoot-waited-ms"], round(ended[i], 3)) for i in answers}
