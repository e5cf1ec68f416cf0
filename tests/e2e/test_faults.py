"""Faults with real processes: a sidecar killed mid-call. (The rest of the fault suite lives
beside the behaviour it breaks: NATS stopped and restarted and a provider failing before its
answer, mid-stream or going away in test_scheduling.py and test_relay.py; the cluster losing
the node that leads the buckets in test_nats_cluster.py; longer soaks of each in
loadtest/fleet_soak.py, with figures in BENCHMARKS.md §5.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from loadtest.loadgen import wait_http
from loadtest.ollama_sim import SimServer
from loadtest.relay_bench import free_port
from loadtest.serving import ThreadedServer
from loadtest.sim_output import answer_options
from tests.conftest import provider_entry
from tests.e2e.test_scheduling import chat

ROOT = Path(__file__).resolve().parents[2]
TTL_S = 5  # the least KUBEMOOT_TICKET_TTL_SECONDS may be


def test_a_sidecar_killed_mid_call_holds_its_memory_only_until_its_ticket_expires(
        sim_factory: Callable[..., SimServer], sidecar_factory: Callable[..., ThreadedServer],
        nats_url: str) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, context_length=4096, tokens_per_s=5,
                      time_scale=0.05)
    port = free_port()
    env = {**os.environ, "KUBEMOOT_NATS_URL": nats_url, "KUBEMOOT_LISTEN": f"127.0.0.1:{port}",
           "KUBEMOOT_TICKET_TTL_SECONDS": str(TTL_S), "KUBEMOOT_AGENT_NAME": "doomed",
           "KUBEMOOT_PROVIDERS": json.dumps([provider_entry(gpu)])}
    doomed = subprocess.Popen([sys.executable, "-m", "proxy", "serve"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        streaming = threading.Event()

        def long_call() -> None:  # qwen3:32b fills the card; its answer would take minutes
            body: dict[str, Any] = {"model": "qwen3:32b",
                                    "options": answer_options(5000),
                                    "messages": [{"role": "user", "content": "hi"}]}
            try:
                with httpx.stream("POST", f"http://127.0.0.1:{port}/api/chat", json=body,
                                  timeout=60) as r:
                    for _ in r.iter_lines():
                        streaming.set()
            except httpx.HTTPError:
                pass  # its sidecar is killed under it

        threading.Thread(target=long_call, daemon=True).start()
        assert streaming.wait(30)
        doomed.send_signal(signal.SIGKILL)  # no release, no goodbye
        killed_at = time.monotonic()
        doomed.wait(10)
    finally:
        doomed.kill()
    survivor = sidecar_factory([gpu], nats_url=nats_url, ticket_ttl_seconds=TTL_S,
                               agent_name="survivor").url
    r = chat(survivor, "qwen3:14b", timeout=60)  # no room while the dead call's ticket counts
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-evicted"] == "qwen3:32b"
    assert int(r.headers["x-kubemoot-waited-ms"]) > 500  # the dead call's ticket counted
    assert time.monotonic() - killed_at < TTL_S + 5  # it counted until its TTL, no longer
    stats = gpu.sim.stats
    assert (stats.oom_events, stats.self_evictions, stats.spills) == (0, 0, 0)
