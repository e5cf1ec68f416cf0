"""Two sidecars on one real nats-server that goes away and comes back: with its storage, or
without it (restarted on an empty JetStream store directory, its buckets created anew).

Whatever a sidecar holds is in the shared book again once NATS is back (a ticket claimed
during the outage, one lost with the storage), what it released meanwhile is not, and a
sidecar counts as connected only once its views are the new server's.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from tests.conftest import eventually
from tests.e2e.test_scheduling import chat, stream_in_background

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]
SLOW = 0.5  # simulated seconds -> real: 10 ms a token, so 2000 tokens hold a slot ~20 s
LONG = 2000
BACK_S = 5.0  # "within a few seconds" of NATS answering again


@pytest.fixture
def server() -> Iterator[NatsServer]:
    """A nats-server of the test's own: it is stopped and started again."""
    nats = NatsServer().start()
    yield nats
    nats.cleanup()


def _state(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/kubemoot/v1/state", timeout=10).json()  # type: ignore[no-any-return]


def _tickets(url: str, holder: str) -> list[str]:
    return [t["id"] for t in _state(url)["tickets"] if t["holder"].endswith(f"/{holder}")]


def _connected(url: str) -> bool:
    return "kubemoot_nats_connected 1.0" in httpx.get(f"{url}/metrics", timeout=10).text


def _stop(server: NatsServer, *urls: str) -> None:
    server.stop()
    for url in urls:
        assert eventually(lambda u=url: not _connected(u), timeout_s=10)  # type: ignore[misc]


def test_a_call_started_while_nats_is_down_is_in_the_shared_book_once_it_is_back(
        sim_factory: Sims, sidecar_factory: Sidecars, server: NatsServer) -> None:
    gpu = sim_factory("gpu", time_scale=SLOW)  # one slot
    one = sidecar_factory([gpu], nats_url=server.url, agent_name="one").url
    two = sidecar_factory([gpu], nats_url=server.url, agent_name="two").url
    assert chat(one, "qwen3:8b", options={"num_predict": 4}).status_code == 200
    assert eventually(lambda: _tickets(two, "one") == [])  # its release written
    _stop(server, one, two)
    # During the outage: a call that ends (released in-process), then one that goes on.
    assert chat(one, "qwen3:8b", options={"num_predict": 4}).status_code == 200
    leave = threading.Event()
    streaming = stream_in_background(one, "qwen3:8b", LONG, threading.Event(), leave)
    held = _tickets(one, "one")
    assert len(held) == 1
    assert _tickets(two, "one") == []  # the other sidecar cannot know it yet
    server.start()
    back = time.monotonic()
    assert eventually(lambda: _tickets(two, "one") == held, timeout_s=BACK_S), \
        _state(two)["tickets"]
    seen_after = time.monotonic() - back
    assert streaming.is_alive(), "the call ended before the check: make it longer"
    assert _connected(one) and _connected(two)
    # Only the held ticket went back: the released one was not resurrected.
    assert _tickets(one, "one") == held
    # Its release now goes to the shared book: the other sidecar sees the slot free.
    leave.set()
    streaming.join(60)
    assert eventually(lambda: _tickets(two, "one") == [], timeout_s=BACK_S), \
        _state(two)["tickets"]
    assert eventually(lambda: _tickets(one, "one") == [], timeout_s=BACK_S)
    assert seen_after < BACK_S


def test_after_nats_comes_back_empty_a_sidecar_places_from_the_new_views_only(
        sim_factory: Sims, sidecar_factory: Sidecars, server: NatsServer) -> None:
    gpu = sim_factory("gpu", time_scale=SLOW, num_parallel=2)
    one = sidecar_factory([gpu], nats_url=server.url, agent_name="one").url
    two = sidecar_factory([gpu], nats_url=server.url, agent_name="two").url
    assert chat(one, "qwen3:8b", options={"num_predict": 4}).status_code == 200
    leave = threading.Event()
    long_call = stream_in_background(one, "qwen3:8b", LONG, threading.Event(), leave)
    short_call = stream_in_background(one, "qwen3:8b", 300, threading.Event())  # ~3 s
    assert eventually(lambda: len(_tickets(two, "one")) == 2, timeout_s=BACK_S)
    held = [t for t in _tickets(one, "one")]
    _stop(server, one, two)
    shutil.rmtree(server.dir / "js")  # the server comes back without its storage
    short_call.join(30)  # its release is owed to a store that will not have the ticket
    still = [t for t in _tickets(one, "one")]
    assert len(still) == 1 and still[0] in held
    released = next(t for t in held if t not in still)
    assert released in _tickets(two, "one")  # the other sidecar's old view, during the outage
    server.start()
    # From the moment it says connected, the other sidecar's view is the new server's: the
    # released ticket is gone, and the held one is back (written again by its holder).
    deadline = time.monotonic() + BACK_S
    said_connected = False
    while time.monotonic() < deadline:
        state = _state(two)
        if state["sharedStateConnected"]:
            said_connected = True
            assert released not in [t["id"] for t in state["tickets"]], state["tickets"]
            if [t["id"] for t in state["tickets"]] == still:
                break
        time.sleep(0.02)
    assert said_connected
    assert _tickets(two, "one") == still, _state(two)["tickets"]
    # It places from that view: the slot the released ticket held is free, so a call of
    # the other sidecar's runs at once beside the long call, on the copy.
    began = time.monotonic()
    r = chat(two, "qwen3:8b", options={"num_predict": 4}, timeout=30)
    assert r.status_code == 200
    assert r.headers["x-kubemoot-placement"] == "warm"
    assert int(r.headers["x-kubemoot-waited-ms"]) < 1000
    assert time.monotonic() - began < 5
    assert long_call.is_alive()
    leave.set()
    long_call.join(60)
    assert eventually(lambda: _tickets(two, "one") == [], timeout_s=BACK_S)


def _waiting(url: str) -> bool:
    """A call of the sidecar's has waited for a GPU."""
    return any(line.startswith("kubemoot_placements_total{") and 'placement="waiting"' in line
               for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines())


def test_during_an_outage_no_sidecar_loads_unseen_so_ollama_never_evicts_on_its_own(
        sim_factory: Sims, sidecar_factory: Sidecars, server: NatsServer) -> None:
    """Two sidecars want a load each on one card that holds either model but not both, while
    NATS is away: a load shows in /api/ps only once loaded, so each would plan against a card
    the other is already loading onto, and Ollama would evict the first copy for the second
    itself. They wait for the shared book instead (and a loaded copy still serves), then load
    one after the other, the eviction planned."""
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=0.1)  # 8b: a load of ~0.6 s
    # (16 GiB holds the catalogue's qwen3:8b or qwen3:14b, not both)
    one = sidecar_factory([gpu], nats_url=server.url, agent_name="one").url
    two = sidecar_factory([gpu], nats_url=server.url, agent_name="two").url
    assert chat(two, "phi3:mini", options={"num_predict": 1}).status_code == 200
    assert eventually(lambda: _tickets(one, "two") == [] and "phi3:mini" in _residents(one))
    _stop(server, one, two)
    # A loaded copy goes on serving calls during the outage.
    warm = chat(one, "phi3:mini", options={"num_predict": 1})
    assert (warm.status_code, warm.headers["x-kubemoot-placement"]) == (200, "warm")
    results: dict[str, httpx.Response] = {}

    def call(name: str, url: str, model: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.__setitem__(name, chat(
            url, model, options={"num_predict": 8}, timeout=60)), daemon=True)
        thread.start()
        return thread

    first = call("one", one, "qwen3:8b")
    # Its load begun (the old way: in-process, against a probe) or the call queued
    assert eventually(lambda: gpu.sim.stats.loads >= 2 or _waiting(one), timeout_s=10)
    second = call("two", two, "qwen3:14b")
    assert eventually(lambda: gpu.sim.stats.loads >= 3 or _waiting(two), timeout_s=10)
    server.start()
    first.join(60)
    second.join(60)
    assert gpu.sim.stats.self_evictions == 0, "Ollama evicted a copy nobody planned to"
    assert [results[n].status_code for n in ("one", "two")] == [200, 200]
    assert gpu.sim.stats.peak_vram_mib <= 16376


def _residents(url: str) -> dict[str, bool]:
    """The models the sidecar counts loaded, each with whether it is marked leaving."""
    return {r["model"]: r.get("leaving", False)
            for p in _state(url)["providers"] for r in p["residents"]}


def test_during_an_outage_a_keep_alive_0_call_leaves_its_copy_loaded_for_another_sidecar(
        sim_factory: Sims, sidecar_factory: Sidecars, server: NatsServer) -> None:
    """The other sidecars cannot be told the copy is leaving: their calls to it would make
    Ollama load it again on its own (before the driver gave its memory back, evicting another
    copy for it). As for an explicit unload then, the copy stays while NATS is away; and
    after, as another sidecar's call (unseen) ran on it since: its expiry in /api/ps moved."""
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=0.1)  # keep-alive: 30 s
    one = sidecar_factory([gpu], nats_url=server.url, agent_name="one").url
    two = sidecar_factory([gpu], nats_url=server.url, agent_name="two").url
    assert chat(two, "phi3:mini", options={"num_predict": 1}).status_code == 200
    assert eventually(lambda: _tickets(one, "two") == [] and "phi3:mini" in _residents(one))
    _stop(server, one, two)
    loads = gpu.sim.stats.loads
    r = chat(one, "phi3:mini", options={"num_predict": 1}, keep_alive=0)
    assert (r.status_code, r.headers["x-kubemoot-placement"]) == (200, "warm")
    assert eventually(lambda: _tickets(one, "one") == [])  # released in-process
    assert _residents(one) == {"phi3:mini": False}  # neither leaving nor gone
    time.sleep(0.3)  # (a call ending within 0.1 s of the first is not told apart from it)
    again = chat(two, "phi3:mini", options={"num_predict": 1})
    assert (again.status_code, again.headers["x-kubemoot-placement"]) == (200, "warm")
    assert (gpu.sim.stats.loads, gpu.sim.stats.unloads) == (loads, 0)
    server.start()
    assert eventually(lambda: _connected(one), timeout_s=BACK_S)
    time.sleep(2)  # twice the wait before a deferred unload
    assert (gpu.sim.stats.loads, gpu.sim.stats.unloads) == (loads, 0)
    assert _residents(one) == {"phi3:mini": False}


def test_a_call_waiting_out_an_outage_takes_a_copy_its_own_probe_finds(
        server: NatsServer, sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """While NATS is away no load is sent, and a call for a model not loaded waits; a copy
    the sidecar's own probe then finds (loaded by a client around it) serves it at once, as
    a probe published to NATS would have woken it."""
    gpu = sim_factory("gpu", time_scale=0.02)
    url = sidecar_factory([gpu], nats_url=server.url, probe_interval_seconds=0.2,
                          discuss_gpu_wait_limit_seconds=20).url
    server.stop()
    assert eventually(lambda: "kubemoot_nats_connected 0.0" in
                      httpx.get(f"{url}/metrics").text)
    seen: list[httpx.Response] = []
    waiting = threading.Thread(target=lambda: seen.append(chat(url, "qwen3:8b")))
    started = time.monotonic()
    waiting.start()
    time.sleep(0.5)
    assert not seen  # (no load while NATS is away)
    assert httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"},
                      timeout=30).status_code == 200
    waiting.join(30)
    assert seen and seen[0].status_code == 200, seen and seen[0].text
    assert seen[0].headers["x-kubemoot-placement"] == "warm"
    assert time.monotonic() - started < 5


def test_an_unload_asked_during_an_outage_is_done_once_nats_answers_again(
        sim_factory: Sims, sidecar_factory: Sidecars, server: NatsServer) -> None:
    """A keep_alive-0 call and an explicit unload while NATS is away: each copy stays until
    the other sidecars can be told it leaves, then goes, about a second after NATS is back
    (their tickets claimed meanwhile written back first)."""
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=0.1)  # keep-alive: 30 s
    one = sidecar_factory([gpu], nats_url=server.url, agent_name="one").url
    two = sidecar_factory([gpu], nats_url=server.url, agent_name="two").url
    for model in ("phi3:mini", "qwen3:8b"):
        assert chat(two, model, options={"num_predict": 1}).status_code == 200
    assert eventually(lambda: _tickets(one, "two") == [] and
                      _residents(one) == {"phi3:mini": False, "qwen3:8b": False})
    _stop(server, one, two)
    loads = gpu.sim.stats.loads
    r = chat(one, "phi3:mini", options={"num_predict": 1}, keep_alive=0)
    assert (r.status_code, r.headers["x-kubemoot-placement"]) == (200, "warm")
    stop = httpx.post(f"{one}/api/generate", json={"model": "qwen3:8b", "keep_alive": 0},
                      timeout=10)  # what `ollama stop` sends
    assert stop.json()["done_reason"] == "unload"
    time.sleep(1)
    assert (gpu.sim.stats.unloads, sorted(gpu.sim.runners)) == (0, ["phi3:mini", "qwen3:8b"])
    server.start()
    back = time.monotonic()
    assert eventually(lambda: not gpu.sim.runners, timeout_s=BACK_S)
    assert time.monotonic() - back >= 1.0  # not before the others' tickets were written back
    assert eventually(lambda: _residents(two) == {}, timeout_s=BACK_S)  # told they left
    assert (gpu.sim.stats.loads, gpu.sim.stats.unloads) == (loads, 2)


def test_an_unload_asked_during_an_outage_is_dropped_if_a_call_kept_the_copy_since(
        sim_factory: Sims, sidecar_factory: Sidecars, server: NatsServer) -> None:
    """A call with a keep-alive of its own after the keep_alive-0 one keeps the copy, as
    Ollama keeps it at its last call's keep_alive."""
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=0.1)  # keep-alive: 30 s
    one = sidecar_factory([gpu], nats_url=server.url, agent_name="one").url
    assert chat(one, "phi3:mini", options={"num_predict": 1}).status_code == 200
    assert eventually(lambda: _tickets(one, "one") == [] and "phi3:mini" in _residents(one))
    _stop(server, one)
    assert chat(one, "phi3:mini", options={"num_predict": 1}, keep_alive=0).status_code == 200
    assert chat(one, "phi3:mini", options={"num_predict": 1}).status_code == 200
    server.start()
    assert eventually(lambda: _connected(one), timeout_s=BACK_S)
    time.sleep(2)  # twice the wait before a deferred unload
    assert (gpu.sim.stats.unloads, list(gpu.sim.runners)) == (0, ["phi3:mini"])
    assert _residents(one) == {"phi3:mini": False}
