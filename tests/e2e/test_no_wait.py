"""Calls that cannot wait (X-Kubemoot-Wait: false, or every call of role coordinator), end to
end with the simulator: never queued inside a busy engine. With the only copy busy and no
room to load, the static endpoint takes the call, or it is refused 503 gpu-busy with
Retry-After at once (CONTRACT.md); a free slot or room for a load still serves it."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests.e2e.test_scheduling import SCALE, Sidecars, Sims, chat, stream_in_background

CANNOT_WAIT = [pytest.param({}, {"X-Kubemoot-Wait": "false"}, id="header"),
               pytest.param({"role": "coordinator"}, {}, id="coordinator"),
               # the role is the sidecar's: "calls never wait", whatever a call asks
               pytest.param({"role": "coordinator"}, {"X-Kubemoot-Wait": "true"},
                            id="coordinator-asking-to-wait")]


@pytest.mark.parametrize(("role", "headers"), CANNOT_WAIT)
def test_the_only_copy_busy_and_no_static_endpoint_is_gpu_busy_at_once(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any],
        role: dict[str, str], headers: dict[str, str]) -> None:
    # the 8b's one slot stays busy for ~10 s (1000 tokens at 2/s, time x 0.02) unless left;
    # the card holds one copy of a model, and nothing idle can be unloaded
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE, tokens_per_s=2)
    url = sidecar_factory([gpu], **mode, **role).url
    leave = threading.Event()  # the busy call ends once the answer is checked
    worker = stream_in_background(url, "qwen3:8b", 1000, threading.Event(), leave)
    # explain weighs the call as one with the same header and role would be placed
    explained = httpx.get(f"{url}/kubemoot/v1/explain", params={"model": "qwen3:8b"},
                          headers=headers).json()["decision"]["reason"]
    assert "this call cannot wait" in explained, explained
    asked = time.monotonic()
    r = chat(url, "qwen3:8b", headers=headers)
    took = time.monotonic() - asked
    assert r.status_code == 503, r.text
    assert r.json()["reason"] == "gpu-busy" and r.headers["retry-after"] == "5"
    assert took < 4.0 and worker.is_alive()  # not after the running call
    assert gpu.sim.stats.inference_requests == 1  # only the running call reached the GPU
    leave.set()
    worker.join(30)


@pytest.mark.parametrize(("role", "headers"), CANNOT_WAIT)
def test_the_only_copy_busy_goes_to_the_static_endpoint(
        sim_factory: Sims, sidecar_factory: Sidecars, role: dict[str, str],
        headers: dict[str, str]) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE, tokens_per_s=10)
    static = sim_factory("static", total_vram_mib=49152, time_scale=SCALE)
    url = sidecar_factory([gpu], model_endpoint=static.url, **role).url
    leave = threading.Event()  # the busy call ends once the answer is checked
    worker = stream_in_background(url, "qwen3:8b", 1000, threading.Event(), leave)
    r = chat(url, "qwen3:8b", headers=headers)
    assert r.status_code == 200, r.text
    assert (r.headers["x-kubemoot-provider"], r.headers["x-kubemoot-placement"]) == (
        "static", "static")
    assert static.sim.stats.inference_requests == 1 and worker.is_alive()
    leave.set()
    worker.join(30)


@pytest.mark.parametrize(("role", "headers"), CANNOT_WAIT)
def test_a_free_slot_or_room_for_a_load_still_serves_it(
        sim_factory: Sims, sidecar_factory: Sidecars, role: dict[str, str],
        headers: dict[str, str]) -> None:
    a = sim_factory("a", total_vram_mib=16376, time_scale=SCALE, tokens_per_s=10)
    b = sim_factory("b", total_vram_mib=16376, time_scale=SCALE, tokens_per_s=10)
    static = sim_factory("static", total_vram_mib=49152, time_scale=SCALE)
    url = sidecar_factory([a, b], model_endpoint=static.url, **role).url
    r = chat(url, "qwen3:8b", headers=headers)  # a free card: a load onto its room
    assert (r.status_code, r.headers["x-kubemoot-placement"]) == (200, "cold"), r.text
    home = r.headers["x-kubemoot-provider"]
    r = chat(url, "qwen3:8b", headers=headers)  # the copy's free slot
    assert (r.headers["x-kubemoot-provider"], r.headers["x-kubemoot-placement"]) == (
        home, "warm")
    leave = threading.Event()  # the busy call ends once the answer is checked
    worker = stream_in_background(url, "qwen3:8b", 1000, threading.Event(), leave)
    r = chat(url, "qwen3:8b", headers=headers)  # its copy busy: a load on the other card
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-provider"] not in (home, "static")
    assert r.headers["x-kubemoot-placement"] == "cold" and worker.is_alive()
    assert static.sim.stats.inference_requests == 0
    leave.set()
    worker.join(30)
