"""An Ollama restarted under traffic: it comes back on its port with nothing loaded. The
stream it was answering ends with the error line, and no copy of it is counted after that:
the next call that needs the card's memory is placed as soon as a probe finds it back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from loadtest.sim_output import answer_options
from tests.conftest import eventually
from tests.e2e.test_scheduling import HI, chat

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]


def test_a_copy_ollama_lost_in_a_restart_is_not_counted_after_it(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, tokens_per_s=5, time_scale=0.05)
    url = sidecar_factory([gpu], discuss_gpu_wait_limit_seconds=20,
                          probe_interval_seconds=0.5, **mode).url
    streaming, last = threading.Event(), []

    def long_call() -> None:  # qwen3:14b loads cold and takes most of the card
        body = {"model": "qwen3:14b", "messages": HI, "options": answer_options(5000)}
        with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=60) as r:
            for line in r.iter_lines():
                streaming.set()
                last[:] = [line]

    caller = threading.Thread(target=long_call, daemon=True)
    caller.start()
    assert streaming.wait(30)
    gpu.stop()
    gpu.sim.reset()  # back empty, as a restarted `ollama serve`
    gpu.start()
    caller.join(30)
    assert orjson.loads(last[0])["reason"] == "upstream-failed"
    started = time.monotonic()
    # gemma3:27b does not fit beside the lost copy: counted, it would wait for it to go
    r = chat(url, "gemma3:27b", timeout=60)
    assert r.status_code == 200, r.text
    assert "x-kubemoot-evicted" not in r.headers
    assert time.monotonic() - started < 15  # a few probes, not the 120 s a load may take

    def nothing_held() -> bool:  # (released just after the answer's last byte)
        state = httpx.get(f"{url}/kubemoot/v1/state").json()
        return bool(state["tickets"] == [] and state["plans"] == [])

    assert eventually(nothing_held, timeout_s=2)
    assert eventually(lambda: [c["model"] for c in httpx.get(f"{url}/kubemoot/v1/state").json()[
        "providers"][0]["residents"]] == ["gemma3:27b"])
    stats = gpu.sim.stats
    assert (stats.oom_events, stats.self_evictions, stats.spills) == (0, 0, 0)
