"""`kubemoot-proxy bind` against a real nats-server: the binder as a process, sidecars on
loopback in front of simulated GPUs, the official ollama client as the agent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import ollama
import orjson
import pytest

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from proxy.adapters.nats_kv import ensure_buckets
from proxy.operator.binding import agent_key, thread_key, thread_subject
from proxy.ports import BINDINGS, PROVIDER_STATE
from proxy.service.codec import escape_key
from tests.binding_docs import AGENT, NAMESPACE, state, write_documents

ROOT = Path(__file__).resolve().parents[2]
KEY = agent_key(NAMESPACE, AGENT)


class BinderProcess:
    """`kubemoot-proxy bind` in its own process, stopped by its pid."""

    def __init__(self, documents: Path, nats_url: str, log: Path) -> None:
        self.args = [sys.executable, "-m", "proxy", "bind", "-f", str(documents),
                     "--poll-interval", "0.5"]
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin"), "KUBEMOOT_NATS_URL": nats_url,
                    "PYTHONPATH": str(ROOT)}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BinderProcess:
        out = open(self.log, "ab")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(self.args, env=self.env, cwd=ROOT, stdout=out,
                                     stderr=subprocess.STDOUT)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


@pytest.fixture
def binder_factory(tmp_path: Path) -> Iterator[Callable[[Path, str], BinderProcess]]:
    started: list[BinderProcess] = []

    def make(documents: Path, nats_url: str) -> BinderProcess:
        binder = BinderProcess(documents, nats_url, tmp_path / f"binder-{len(started)}.log")
        started.append(binder.start())
        return binder

    yield make
    for binder in started:
        binder.stop()


async def read(url: str, key: str) -> dict[str, Any] | None:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(BINDINGS)
        with contextlib.suppress(Exception):
            return dict(orjson.loads((await kv.get(key)).value))
        return None
    finally:
        await nc.close()


async def until(check: Callable[[], Any], timeout_s: float = 20.0, step_s: float = 0.02
                ) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(step_s)


async def binding_where(url: str, key: str, test: Callable[[dict[str, Any]], bool],
                        timeout_s: float = 45.0) -> dict[str, Any]:
    # (a binder process's first bind: ~3 s alone, over 20 s once on a host at a load of 4)
    async def check() -> dict[str, Any] | None:
        value = await read(url, key)
        return value if value is not None and test(value) else None

    found = await until(check, timeout_s)
    assert found, f"no binding {key} as expected; last: {await read(url, key)}"
    return dict(found)


async def publish_states(url: str, *states: Any) -> None:
    nc = await nats.connect(url)
    try:
        await ensure_buckets(nc.jetstream())  # what init-buckets does
        kv = await nc.jetstream().key_value(PROVIDER_STATE)
        for st in states:
            await kv.put(escape_key(st.name), st.encode())
    finally:
        await nc.close()


async def model_of(client: ollama.AsyncClient, text: str = "hi") -> str:
    """The model that answered: the agent names the model it was deployed with."""
    answer = await client.chat(model="phi3:mini", messages=[{"role": "user", "content": text}],
                               options={"num_predict": 4})
    return str(answer.model)


def explain(sidecar: str, thread: str | None = None) -> dict[str, Any]:
    params = {"phase": "mulling", **({"thread": thread} if thread else {})}
    answer = httpx.get(f"{sidecar}/kubemoot/v1/explain", params=params, timeout=10)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def first_candidate(sidecar: str, thread: str | None = None) -> tuple[str, str]:
    body = explain(sidecar, thread)
    return body["candidates"][0]["model"], body["binding"]["source"]


@pytest.fixture
def crew(sim_factory: Callable[..., SimServer], sidecar_factory: Callable[..., ThreadedServer],
         nats_url: str, tmp_path: Path) -> tuple[str, str, Path]:
    """Two GPUs, the documents, and the agent's sidecar on NATS (which publishes the GPUs'
    state, as a sidecar does when no publisher does); the env prefers phi3 mini."""
    gpus = [sim_factory(name, total_vram_mib=49152) for name in ("gpu-a", "gpu-b")]
    documents = tmp_path / "documents"
    documents.mkdir()
    write_documents(documents)
    sidecar = sidecar_factory(gpus, nats_url=nats_url, namespace=NAMESPACE, agent_name=AGENT,
                              model_model="phi3:mini").url
    return sidecar, nats_url, documents


async def test_a_new_score_reaches_the_sidecars_next_call_within_a_second(
        crew: tuple[str, str, Path], binder_factory: Callable[[Path, str], BinderProcess]
        ) -> None:
    sidecar, url, documents = crew
    assert await asyncio.to_thread(first_candidate, sidecar) == ("phi3:mini", "env")
    binder = binder_factory(documents, url)
    bound = await binding_where(url, KEY, lambda v: v["preferred"] == "qwen3:14b")
    assert bound["generation"] == 1 and bound["unschedulable"] == []
    assert await until(lambda: asyncio.to_thread(
        lambda: first_candidate(sidecar) == ("qwen3:14b", "agent")), 5)
    client = ollama.AsyncClient(host=sidecar)
    assert await model_of(client) == "qwen3:14b"

    write_documents(documents, big=20, small=100)
    changed_at = time.monotonic()
    assert await until(lambda: asyncio.to_thread(
        lambda: first_candidate(sidecar) == ("qwen3:8b", "agent")), 5), binder.output()
    elapsed = time.monotonic() - changed_at
    assert await model_of(client) == "qwen3:8b"
    assert elapsed < 1.0, f"took {elapsed:.2f} s"
    print(f"document change -> sidecar's candidates: {elapsed * 1000:.0f} ms")
    rebound = await read(url, KEY)
    assert rebound is not None and rebound["generation"] == 2
    body = await asyncio.to_thread(explain, sidecar)
    assert body["binding"] == {"source": "agent", "revision": 2}


async def test_losing_the_preferred_models_provider_rebinds_and_unchanged_is_not_rewritten(
        nats_url: str, tmp_path: Path, binder_factory: Callable[[Path, str], BinderProcess]
        ) -> None:
    write_documents(tmp_path)
    now = time.time()
    await publish_states(nats_url, state("gpu-a", now), state("gpu-b", now))
    binder = binder_factory(tmp_path, nats_url)
    first = await binding_where(nats_url, KEY, lambda v: v["preferred"] == "qwen3:14b")
    # the providers' state is written again, unchanged: the binding is not rewritten
    for _ in range(3):
        await publish_states(nats_url, state("gpu-a", time.time()), state("gpu-b", time.time()))
        await asyncio.sleep(0.3)
    again = await read(nats_url, KEY)
    assert again is not None and again["generation"] == first["generation"] == 1
    # the 14B's provider drops (its probe fails): re-bound to the 8B on the other one
    await publish_states(nats_url, state("gpu-a", time.time(), ready=False))
    moved = await binding_where(nats_url, KEY, lambda v: v["preferred"] == "qwen3:8b", 5)
    assert moved["generation"] == 2 and moved["phases"]["mulling"]["provider"] == "gpu-b"
    # then the other one goes silent too: unschedulable, logged once
    await publish_states(nats_url, state("gpu-b", time.time(), ready=False))
    failed = await binding_where(nats_url, KEY, lambda v: v["preferred"] is None, 5)
    assert {u["phase"] for u in failed["unschedulable"]} == {"mulling", "triage"}
    await asyncio.sleep(1.5)
    assert binder.output().count("agent unschedulable") == 2  # once per phase, not per round
    # it comes back: bound again
    await publish_states(nats_url, state("gpu-a", time.time()), state("gpu-b", time.time()))
    back = await binding_where(nats_url, KEY, lambda v: v["preferred"] == "qwen3:14b", 5)
    assert back["unschedulable"] == []


async def test_a_discussion_binding_overrides_for_its_thread_only(
        crew: tuple[str, str, Path], binder_factory: Callable[[Path, str], BinderProcess]
        ) -> None:
    sidecar, url, documents = crew
    binder_factory(documents, url)
    await binding_where(url, KEY, lambda v: v["preferred"] == "qwen3:14b")
    nc = await nats.connect(url)
    heard: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def on_message(msg: Any) -> None:
        await heard.put(orjson.loads(msg.data))

    await nc.subscribe(thread_subject("thread-1", "mulling"), cb=on_message)
    try:
        client = ollama.AsyncClient(host=sidecar, headers={"X-Kubemoot-Thread": "thread-1"})
        assert await model_of(client) == "qwen3:14b"
        pinned = await binding_where(url, thread_key("thread-1", "mulling"),
                                     lambda v: bool(v["agents"]), 5)
        mine = pinned["agents"][f"{NAMESPACE}/{AGENT}"]
        assert (mine["model"], mine["provider"]) == ("qwen3:14b", "gpu-a")
        message = await asyncio.wait_for(heard.get(), 5)
        assert message["agents"] == pinned["agents"]

        # the policy now prefers the 8B: the agent, and any other thread, move; thread-1 not
        write_documents(documents, big=20, small=100)
        await binding_where(url, KEY, lambda v: v["preferred"] == "qwen3:8b", 5)
        assert await until(lambda: asyncio.to_thread(
            lambda: first_candidate(sidecar) == ("qwen3:8b", "agent")), 5)
        assert await asyncio.to_thread(first_candidate, sidecar, "thread-1") == \
            ("qwen3:14b", "thread")
        assert await model_of(client, "again") == "qwen3:14b"
        other = ollama.AsyncClient(host=sidecar, headers={"X-Kubemoot-Thread": "thread-2"})
        assert await model_of(other, "hi") == "qwen3:8b"
    finally:
        await nc.close()


async def test_neither_a_binder_restart_nor_a_nats_restart_loses_a_binding(
        tmp_path: Path, binder_factory: Callable[[Path, str], BinderProcess],
        sim_factory: Callable[..., SimServer],
        sidecar_factory: Callable[..., ThreadedServer]) -> None:
    server = NatsServer().start()  # its own, file-stored JetStream, restarted below
    try:
        documents = tmp_path / "documents"
        documents.mkdir()
        write_documents(documents)
        gpus = [sim_factory(name, total_vram_mib=49152) for name in ("gpu-a", "gpu-b")]
        sidecar = sidecar_factory(gpus, nats_url=server.url, namespace=NAMESPACE,
                                  agent_name=AGENT, model_model="phi3:mini").url
        binder = binder_factory(documents, server.url)
        first = await binding_where(server.url, KEY, lambda v: v["preferred"] == "qwen3:14b")

        binder.stop()  # a binder restart: the binding stays, and is not written again
        assert await read(server.url, KEY) == first
        binder = binder_factory(documents, server.url)
        await asyncio.sleep(3)
        assert await read(server.url, KEY) == first
        assert "agent bound" not in binder.output()

        server.stop()  # NATS restarts with its store: the binding is still there
        server.start()
        assert await read(server.url, KEY) == first
        # the sidecar and the binder reconnect by themselves and keep following
        write_documents(documents, big=20, small=100)
        moved = await binding_where(server.url, KEY, lambda v: v["preferred"] == "qwen3:8b")
        assert moved["generation"] == first["generation"] + 1
        assert await until(lambda: asyncio.to_thread(
            lambda: first_candidate(sidecar) == ("qwen3:8b", "agent")), 15)
    finally:
        server.cleanup()


async def put_raw(url: str, key: str, value: dict[str, Any]) -> None:
    nc = await nats.connect(url)
    try:
        await ensure_buckets(nc.jetstream())
        kv = await nc.jetstream().key_value(BINDINGS)
        await kv.put(key, orjson.dumps(value))
    finally:
        await nc.close()


async def test_an_agent_gone_from_the_documents_loses_its_binding_and_nothing_else(
        nats_url: str, tmp_path: Path, binder_factory: Callable[[Path, str], BinderProcess]
        ) -> None:
    # Left by an earlier binder with more agents, and a value no binder writes
    earlier = agent_key(NAMESPACE, "retired")
    await put_raw(nats_url, earlier, {"namespace": NAMESPACE, "agent": "retired",
                                      "phases": {}, "generation": 4})
    foreign = agent_key(NAMESPACE, "handmade")
    await put_raw(nats_url, foreign, {"namespace": NAMESPACE, "agent": "handmade"})
    # another crew's, bound by its own binder on the same bucket
    other_crew = agent_key("crew-b", "synth")
    others = {"namespace": "crew-b", "agent": "synth", "phases": {}, "generation": 2}
    await put_raw(nats_url, other_crew, others)
    write_documents(tmp_path, others=("reviewer",))
    now = time.time()
    await publish_states(nats_url, state("gpu-a", now), state("gpu-b", now))
    binder = binder_factory(tmp_path, nats_url)
    reviewer = agent_key(NAMESPACE, "reviewer")
    await binding_where(nats_url, reviewer, lambda v: v["preferred"] == "qwen3:14b")
    first = await binding_where(nats_url, KEY, lambda v: v["preferred"] == "qwen3:14b")
    assert await until(lambda: _absent(nats_url, earlier), 5)

    write_documents(tmp_path)  # the reviewer's Agent document is deleted
    assert await until(lambda: _absent(nats_url, reviewer), 5), binder.output()
    assert "agent binding dropped" in binder.output() and "crew/reviewer" in binder.output()
    assert await read(nats_url, KEY) == first  # the agent still declared: untouched
    assert await read(nats_url, foreign) == {"namespace": NAMESPACE, "agent": "handmade"}
    assert await read(nats_url, other_crew) == others


async def _absent(url: str, key: str) -> bool:
    return await read(url, key) is None


async def test_the_binder_purges_the_markers_its_deletes_leave(nats_url: str,
                                                               tmp_path: Path) -> None:
    """The bindings bucket has no max age: each dropped discussion's asks and binding left a
    marker for good (50 discussions, 50 markers), replayed by every sidecar's watch."""
    from dataclasses import replace

    from proxy.adapters.nats_bus import NatsBus
    from proxy.adapters.nats_kv import NatsOptions, NatsStore
    from proxy.operator.binder import Binder, BinderTiming, DocumentSource
    from proxy.operator.scheduling import Options
    from proxy.ports import BUCKETS

    now = time.time()
    await publish_states(nats_url, state("gpu-a", now), state("gpu-b", now))
    store = NatsStore(NatsOptions(nats_url),
                      tuple(b for b in BUCKETS if b.name in (PROVIDER_STATE, BINDINGS)))
    await store.start()
    assert await store.replayed(5)
    try:
        for i in range(50):  # discussions that last asked two hours ago
            await store.put(BINDINGS, f"ask.t{i}.mulling.{KEY}", orjson.dumps(
                {"thread": f"t{i}", "phase": "mulling", "namespace": NAMESPACE,
                 "agent": AGENT, "at": now - 7200}))
        source = DocumentSource([str(write_documents(tmp_path))])
        source.poll()
        binder = Binder(store, NatsBus(), source, Options(),
                        replace(BinderTiming(), markers_s=0.0))
        await binder.evaluate()
        assert set(store.view(BINDINGS)) == {KEY}  # the asks dropped, the agent bound
        nc = await nats.connect(nats_url)
        info = await nc.jetstream().stream_info(f"KV_{BINDINGS}")
        await nc.close()
        assert info.state.messages == 1, info.state  # the agent's binding, no markers
    finally:
        await store.close()
