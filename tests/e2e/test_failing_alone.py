"""The only card that can hold the model fails: the official client, the sidecar and
simulated GPUs on loopback. A 24 GiB card holds qwen3:14b; an 8 GiB one (context 4096)
has it on disk but could never hold it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from tests.conftest import eventually, provider_entry
from tests.e2e.test_scheduling import HI, SCALE, chat

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]
MODEL = "qwen3:14b"
ROOT = Path(__file__).resolve().parents[2]


def fleet(sim_factory: Sims) -> tuple[SimServer, SimServer]:
    big = sim_factory("big", total_vram_mib=24564, num_parallel=4, context_length=8192,
                      time_scale=SCALE)
    small = sim_factory("small", total_vram_mib=8192, context_length=4096, time_scale=SCALE)
    return big, small


def publisher(nats_url: str, sims: list[SimServer], interval: float,
              request: pytest.FixtureRequest) -> None:
    env = {**os.environ, "KUBEMOOT_NATS_URL": nats_url,
           "KUBEMOOT_PROVIDERS": json.dumps([provider_entry(s) for s in sims])}
    process = subprocess.Popen([sys.executable, "-m", "proxy", "publish", "--interval",
                                str(interval)], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    request.addfinalizer(lambda: (process.kill(), process.wait(10)))


def provider_ready(url: str, name: str) -> bool:
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    return bool(next(p["ready"] for p in state["providers"] if p["name"] == name))


def circuits(url: str) -> dict[str, str]:
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    return {p["name"]: p["circuit"] for p in state["providers"]}


def test_one_500_from_the_only_card_that_holds_the_model_is_a_prompt_502(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    big, small = fleet(sim_factory)
    url = sidecar_factory([big, small], discuss_gpu_wait_limit_seconds=20).url
    assert chat(url, MODEL).status_code == 200  # warm on big
    big.sim.fault.mode, big.sim.fault.count, big.sim.fault.status = "error", 1, 500
    started = time.monotonic()
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=url).chat(model=MODEL, messages=HI)
    assert time.monotonic() - started < 2
    assert info.value.status_code == 502
    assert "provider big failed before answering: HTTP 500" in info.value.error
    r = chat(url, MODEL)
    assert (r.status_code, r.headers["x-kubemoot-provider"]) == (200, "big")
    assert small.sim.stats.inference_requests == 0


def test_the_only_card_back_from_a_crash_takes_calls_within_a_probe_interval_or_two(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any],
        request: pytest.FixtureRequest) -> None:
    """Three calls break off as it goes down (the circuit opens); it is back 1 s later.
    Once the prober has seen it down and then ready, a trial call goes there, not after the
    circuit's 60 s."""
    big, small = fleet(sim_factory)
    interval = 0.5
    url = sidecar_factory([big, small], discuss_gpu_wait_limit_seconds=10,
                          probe_interval_seconds=interval, **mode).url
    if mode:  # shared state: a `publish` process probes the cards, as deployed
        publisher(mode["nats_url"], [big, small], interval, request)
    assert chat(url, MODEL).status_code == 200
    big.sim.fault.mode, big.sim.fault.count = "midstream", 3
    client = ollama.Client(host=url)
    for _ in range(3):
        with pytest.raises(ollama.ResponseError):
            for _chunk in client.chat(model=MODEL, messages=HI, stream=True):
                pass
    assert circuits(url)["big"] == "open"
    big.stop()
    # a probe finds it down, and the sidecar reads it (here through its state page; a call
    # or a scrape does the same)
    assert eventually(lambda: not provider_ready(url, "big"), timeout_s=15)
    big.start()
    back = time.monotonic()
    r = chat(url, MODEL)
    assert (r.status_code, r.headers.get("x-kubemoot-provider")) == (200, "big"), r.text
    assert time.monotonic() - back < 8  # a probe interval or two, not the circuit's 60 s
    assert eventually(lambda: circuits(url)["big"] == "closed")
