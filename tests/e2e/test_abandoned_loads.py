"""A cold load its sidecar abandons (the agent left before the answer began, or a held plan
was released while loading): Ollama aborts it, and the shared state drops the copy at the
next probe rather than counting a phantom for minutes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import ollama
import pytest

from loadtest.nats_server import NatsServer
from tests.conftest import empty_buckets, eventually
from tests.e2e.test_scheduling import HI, Sidecars, Sims

SLOW = 0.5  # qwen3:14b loads in ~5 s


def copies(url: str) -> dict[str, list[str]]:
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    return {p["name"]: [r["model"] for r in p["residents"]] for p in state["providers"]}


def test_an_agent_leaving_during_a_cold_load_leaves_no_copy_counted(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, time_scale=SLOW)
    url = sidecar_factory([gpu], probe_interval_seconds=0.5, **mode).url
    with pytest.raises(httpx.TimeoutException):
        ollama.Client(host=url, timeout=1.0).chat(model="qwen3:14b", messages=HI)
    assert eventually(lambda: gpu.sim.stats.aborted_loads == 1)
    assert eventually(lambda: copies(url) == {"gpu": []}, timeout_s=4)
    verdict = httpx.get(f"{url}/kubemoot/v1/explain", params={"model": "qwen3:32b"}).json()
    assert verdict["verdicts"][0]["feasible"], verdict  # the whole card is free again


def test_a_plan_released_during_its_load_leaves_no_copy_counted(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, time_scale=SLOW)
    url = sidecar_factory([gpu], probe_interval_seconds=0.5, **mode).url
    made = httpx.post(f"{url}/kubemoot/v1/plans", timeout=10,
                      json={"thread": "t", "model": "qwen3:14b", "promptChars": 100})
    assert made.status_code == 201, made.text
    time.sleep(0.5)  # the plan's load under way
    httpx.delete(f"{url}/kubemoot/v1/plans/t")
    assert eventually(lambda: gpu.sim.stats.aborted_loads == 1)
    assert eventually(lambda: copies(url) == {"gpu": []}, timeout_s=4)
    assert gpu.sim.used_vram_mib() == 0


def test_an_agent_leaving_the_call_that_took_a_loading_plan_leaves_no_copy(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """The thread's call joins the plan's load, then its agent leaves: the plan's own
    preload went on, so the copy finished loading for nobody and stayed for its keep-alive
    (a victim unloaded for it, its memory held)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, time_scale=SLOW)
    url = sidecar_factory([gpu], probe_interval_seconds=0.5, **mode).url
    made = httpx.post(f"{url}/kubemoot/v1/plans", timeout=10,
                      json={"thread": "t", "model": "qwen3:14b", "promptChars": 100})
    assert made.status_code == 201, made.text
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{url}/api/chat", headers={"X-Kubemoot-Thread": "t"}, timeout=1.0,
                   json={"model": "qwen3:14b", "messages": HI, "stream": False})
    assert eventually(lambda: gpu.sim.stats.aborted_loads >= 1)
    assert eventually(lambda: copies(url) == {"gpu": []}, timeout_s=4)
    assert gpu.sim.used_vram_mib() == 0 and "qwen3:14b" not in gpu.sim.runners
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert (state["tickets"], state["plans"]) == ([], [])


def test_every_sidecar_drops_a_load_another_abandoned(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    """Four plans released at once, on one sidecar: the other sees the cards free too."""
    asyncio.run(empty_buckets(nats_server.url))
    gpus = [sim_factory(name, total_vram_mib=24564, time_scale=SLOW) for name in "abc"]
    first, second = (sidecar_factory(gpus, nats_url=nats_server.url, plan_memory_share=1.0).url
                     for _ in range(2))
    for thread, model in zip("wxyz", ("qwen3:14b", "qwen3:8b", "phi3:mini", "llama3.2:3b"),
                             strict=True):
        made = httpx.post(f"{first}/kubemoot/v1/plans", timeout=10,
                          json={"thread": thread, "model": model, "promptChars": 100})
        assert made.status_code == 201, made.text
    time.sleep(0.5)
    for thread in "wxyz":
        httpx.delete(f"{first}/kubemoot/v1/plans/{thread}")
    assert eventually(lambda: sum(g.sim.stats.aborted_loads for g in gpus) >= 2)
    assert eventually(lambda: all(g.sim.used_vram_mib() == 0 for g in gpus))
    free = {"a": [], "b": [], "c": []}
    for url in (first, second):
        assert eventually(lambda url=url: copies(url) == free, timeout_s=4), url


def test_a_loading_plan_another_call_joined_loads_on_when_its_own_call_leaves(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """A call of another thread joins the plan's load; the plan's thread's call then
    leaves: the copy is still wanted, so the plan's preload goes on (stopping it made
    Ollama abort the load the other call waits on)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, time_scale=SLOW)
    url = sidecar_factory([gpu], probe_interval_seconds=0.5, **mode).url
    made = httpx.post(f"{url}/kubemoot/v1/plans", timeout=10,
                      json={"thread": "t", "model": "qwen3:14b", "promptChars": 100})
    assert made.status_code == 201, made.text

    async def both() -> httpx.Response:
        async with httpx.AsyncClient(base_url=url) as client:
            other = asyncio.create_task(client.post(
                "/api/chat", headers={"X-Kubemoot-Thread": "u"}, timeout=30,
                json={"model": "qwen3:14b", "messages": HI, "stream": False}))
            with pytest.raises(httpx.TimeoutException):
                await client.post("/api/chat", headers={"X-Kubemoot-Thread": "t"},
                                  timeout=1.0, json={"model": "qwen3:14b", "messages": HI,
                                                     "stream": False})
            return await other

    answered = asyncio.run(both())
    assert answered.status_code == 200, answered.text
    assert gpu.sim.stats.loads == 1  # (stopped, it was loaded again for the other call)
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert (state["tickets"], state["plans"]) == ([], [])


def test_a_plan_load_kept_for_another_call_stops_when_that_call_leaves_too(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    """The plan's preload went on for the call that joined it (above); that call's agent
    leaves as well before the load ends: nobody wants the copy, so the preload stops and
    Ollama aborts the load (it went on and held the copy for its keep-alive)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, time_scale=SLOW)
    url = sidecar_factory([gpu], probe_interval_seconds=0.5, **mode).url
    made = httpx.post(f"{url}/kubemoot/v1/plans", timeout=10,
                      json={"thread": "t", "model": "qwen3:14b", "promptChars": 100})
    assert made.status_code == 201, made.text

    async def both_leave() -> None:
        async with httpx.AsyncClient(base_url=url) as client:
            other = asyncio.create_task(client.post(
                "/api/chat", headers={"X-Kubemoot-Thread": "u"}, timeout=1.5,
                json={"model": "qwen3:14b", "messages": HI, "stream": False}))
            with pytest.raises(httpx.TimeoutException):
                await client.post("/api/chat", headers={"X-Kubemoot-Thread": "t"},
                                  timeout=1.0, json={"model": "qwen3:14b", "messages": HI,
                                                     "stream": False})
            with pytest.raises(httpx.TimeoutException):
                await other

    asyncio.run(both_leave())
    assert eventually(lambda: gpu.sim.stats.aborted_loads >= 1)
    assert eventually(lambda: copies(url) == {"gpu": []}, timeout_s=4)
    assert gpu.sim.used_vram_mib() == 0 and "qwen3:14b" not in gpu.sim.runners
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert (state["tickets"], state["plans"]) == ([], [])
