"""A load takes as long in the simulator as in Ollama: the runner's start-up and the read
of the weights file, seen on WaitUntilRunning's 250 ms poll grid.

The wall-clock tests measure against the known simulated figure: a busy machine can only
make a wait longer, so the lower bounds are tight and the upper ones generous (SLACK)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from loadtest.ollama_sim import SimServer

Sims = Callable[..., SimServer]
SCALE = 0.1  # simulated seconds -> real seconds, for the wall-clock tests
SLACK = 0.08  # real seconds a busy machine may add to a wait
HTTP = httpx.Client(timeout=60)  # one connection pool: a round trip takes no new TLS context


@pytest.fixture(autouse=True, scope="module")
def _close_client() -> Iterator[None]:
    yield
    HTTP.close()


def call(sim: SimServer, model: str, **body: Any) -> dict[str, Any]:
    """A one-token answer (its final message, with load_duration)."""
    options = {"num_predict": 1, **body.pop("options", {})}
    r = HTTP.post(f"{sim.url}/api/generate", json={
        "model": model, "prompt": "hi", "stream": False, "options": options, **body})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def load_s(answer: dict[str, Any]) -> float:
    """The answer's load_duration in simulated seconds."""
    return float(answer["load_duration"]) / 1e9 / SCALE


def unload(sim: SimServer, model: str) -> None:
    r = HTTP.post(f"{sim.url}/api/generate", json={"model": model, "keep_alive": 0})
    assert r.json()["done_reason"] == "unload"


def ps(sim: SimServer) -> set[str]:
    return {m["model"] for m in HTTP.get(f"{sim.url}/api/ps").json()["models"]}


def stats(sim: SimServer) -> dict[str, Any]:
    answer: dict[str, Any] = HTTP.get(f"{sim.url}/_sim/stats").json()
    return answer


def near(seconds: float, expected: float) -> bool:
    """`seconds` (simulated) is `expected`, or later by what a busy machine adds."""
    return expected - 0.01 <= seconds <= expected + SLACK / SCALE


@pytest.mark.serial
def test_a_load_reads_the_weights_file_not_the_footprint(sim_factory: Sims) -> None:
    """The KV cache is allocated, never read: qwen3:8b loads in 1 s + 5200 MiB / 1024 MiB/s
    = 6.08 s (seen at 6.25) at 2048 or 40960 tokens (5.5 or 12.8 GiB); llama3.2:3b at
    131072 tokens takes 16 GiB of the card yet loads in 1 + 1926 / 1024 = 2.88 s (3.0)."""
    figures = {}
    for model, num_ctx in (("qwen3:8b", 2048), ("qwen3:8b", 40960), ("llama3.2:3b", 131072)):
        sim = sim_factory(f"gpu-{num_ctx}", total_vram_mib=49152, time_scale=SCALE)
        figures[model, num_ctx] = load_s(call(sim, model, options={"num_ctx": num_ctx}))
    assert near(figures["qwen3:8b", 2048], 6.25) and near(figures["qwen3:8b", 40960], 6.25)
    assert near(figures["llama3.2:3b", 131072], 3.0)


@pytest.mark.serial
def test_a_load_is_seen_ready_on_the_250_ms_poll_grid(sim_factory: Sims) -> None:
    """WaitUntilRunning polls at once, then every 250 ms (llm/llama_server.go:1368-1381): a
    load of 1.01 s and one of 1.24 s are both seen ready at 1.25 s."""
    for read_s in (0.01, 0.24):
        sim = sim_factory(f"gpu-{read_s}", total_vram_mib=24564, time_scale=SCALE,
                          load_mib_per_s=1926 / read_s)
        assert near(load_s(call(sim, "llama3.2:3b")), 1.25)
