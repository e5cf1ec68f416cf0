"""Late binding across sidecars: two sidecars sharing a real NATS serve the waiting calls for
a shared model by their turns, whichever sidecar each came through: in the order they
arrived when alike, a short call before a long one that arrived just before it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from loadtest.sim_output import answer_options
from tests.conftest import empty_buckets
from tests.e2e.test_scheduling import chat, stream_in_background

pytestmark = pytest.mark.serial  # arrival order and dispatch gaps, in wall-clock time

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]


def two_sidecars_on_one_card(sim_factory: Sims, sidecar_factory: Sidecars,
                             nats_server: NatsServer) -> tuple[str, str]:
    """Sidecars "one" and "two" sharing NATS and one card with one slot of the 8b."""
    asyncio.run(empty_buckets(nats_server.url))
    gpu = sim_factory("a", total_vram_mib=24564, time_scale=0.2)
    return (sidecar_factory([gpu], nats_url=nats_server.url, agent_name="one").url,
            sidecar_factory([gpu], nats_url=nats_server.url, agent_name="two").url)


def test_two_sidecars_serve_a_shared_models_waiting_calls_in_arrival_order(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    one, two = two_sidecars_on_one_card(sim_factory, sidecar_factory, nats_server)
    assert chat(one, "qwen3:8b").status_code == 200  # a warm copy with one slot
    holding = stream_in_background(one, "qwen3:8b", 600, threading.Event())  # ~2.4 s
    ended: dict[int, float] = {}
    answers: dict[int, httpx.Response] = {}

    def call(i: int, url: str) -> None:
        answers[i] = chat(url, "qwen3:8b", options=answer_options(50))  # ~0.2 s each
        ended[i] = time.monotonic()

    threads = []
    # alternating sidecars, each well after the previous one: more than a call's slack
    # (three quarters of its ~0.2 s), so turns keep arrival order
    for i in range(6):
        threads.append(threading.Thread(target=call, args=(i, (two, one)[i % 2])))
        threads[-1].start()
        time.sleep(0.3)
    for thread in threads:
        thread.join(30)
    holding.join(30)
    assert all(r.status_code == 200 for r in answers.values())
    assert all(int(r.headers["x-kubemoot-waited-ms"]) > 0 for r in answers.values())
    # One slot: each call starts after the previous one ended, so the answers end in the
    # order the calls were served, which must be the order they arrived.
    assert sorted(ended, key=ended.__getitem__) == list(range(6)), {
        i: (answers[i].headers["x-kubemoot-waited-ms"], round(ended[i], 3)) for i in answers}


def test_a_short_call_through_one_sidecar_passes_a_long_one_waiting_on_another(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    one, two = two_sidecars_on_one_card(sim_factory, sidecar_factory, nats_server)
    for url in (one, two):  # each sidecar learns the 8b's token rate from an answer
        assert chat(url, "qwen3:8b", options=answer_options(20)).status_code == 200
    slack = httpx.post(f"{one}/kubemoot/v1/explain", timeout=10, json={
        "model": "qwen3:8b", "messages": [], "options": answer_options(400)}).json()
    assert slack["waitSlack"]["seconds"] > 0.5  # the long call's turn: 0.5 s after it or more
    holding = stream_in_background(one, "qwen3:8b", 600, threading.Event())  # ~2.4 s
    ended: dict[str, float] = {}
    answers: dict[str, httpx.Response] = {}

    def call(name: str, url: str, tokens: int) -> None:
        answers[name] = chat(url, "qwen3:8b", options=answer_options(tokens))
        ended[name] = time.monotonic()

    long = threading.Thread(target=call, args=("long", one, 400))
    long.start()
    time.sleep(0.3)
    short = threading.Thread(target=call, args=("short", two, 20))
    short.start()
    for thread in (long, short, holding):
        thread.join(30)
    assert answers["long"].status_code == answers["short"].status_code == 200
    assert int(answers["long"].headers["x-kubemoot-waited-ms"]) > 0
    assert int(answers["short"].headers["x-kubemoot-waited-ms"]) > 0
    # One slot: the short call, arrived 0.3 s after the long one but within its slack,
    # took the slot first and ended first
    assert ended["short"] < ended["long"], {n: r.headers["x-kubemoot-waited-ms"]
                                            for n, r in answers.items()}
