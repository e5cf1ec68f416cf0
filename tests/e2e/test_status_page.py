"""The status page and its live feed, over real sockets: the page is served, the feed sends
the fleet at once and again after a call, and a client leaving ends its stream; with NATS,
one page shows every sidecar's calls, and sidecars nobody watches publish nothing."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import nats
import orjson
import pytest

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from proxy.service import fleet_calls
from tests.conftest import empty_buckets, eventually, provider_entry

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]
MODEL = "qwen3:8b"


def views(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The `view` events of a server-sent event stream, as they come."""
    event, data = "message", b""
    for line in response.iter_lines():
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            data += line.split(":", 1)[1].strip().encode()
        elif line == "":
            if event == "view" and data:
                yield orjson.loads(data)
            event, data = "message", b""


def call(url: str) -> httpx.Response:
    return httpx.post(f"{url}/api/chat", timeout=30, json={
        "model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}]})


def test_ui_is_one_self_contained_page(sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    url = sidecar_factory([sim_factory("a")]).url
    r = httpx.get(f"{url}/kubemoot/ui")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "EventSource" in r.text
    assert "http://" not in r.text and "https://" not in r.text  # nothing from outside


def test_events_send_the_fleet_then_a_view_after_a_call(sim_factory: Sims,
                                                        sidecar_factory: Sidecars,
                                                        mode: dict[str, Any]) -> None:
    a, b = sim_factory("a", total_vram_mib=32768), sim_factory("b", total_vram_mib=16376)
    sidecar = sidecar_factory([a, b], **mode)
    status = sidecar.app.state.status
    with httpx.stream("GET", f"{sidecar.url}/kubemoot/v1/events", timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        stream = views(r)
        first = next(stream)
        assert {g["name"] for g in first["gpus"]} == {"a", "b"}
        assert all(g["totalMiB"] and g["freeMiB"] and g["reserveMiB"] for g in first["gpus"])
        assert first["calls"] == []
        assert first["state"] == ("shared" if mode else "embedded")
        answered = threading.Thread(target=lambda: call(sidecar.url).raise_for_status())
        answered.start()
        after = next(v for v in stream if v["calls"])
        answered.join()
        assert after["calls"][0]["model"] == MODEL and after["calls"][0]["ok"]
        placed = after["calls"][0]["provider"]
        assert after["calls"][0]["placement"] == "cold"
        # The copy it loaded shows on its GPU, in this view or one soon after.
        gpu = next(g for g in after["gpus"] if g["name"] == placed)
        if not [c for c in gpu["copies"] if c["model"] == MODEL]:
            later = next(v for v in stream if any(
                c["model"] == MODEL for g in v["gpus"] if g["name"] == placed
                for c in g["copies"]))
            assert later["calls"]
        assert status.watchers == 1
    assert eventually(lambda: status.watchers == 0)  # the client left: its stream ended


def test_refusals_show_with_their_reason(sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    sidecar = sidecar_factory([sim_factory("small", total_vram_mib=4096)])
    with httpx.stream("GET", f"{sidecar.url}/kubemoot/v1/events", timeout=10) as r:
        stream = views(r)
        assert next(stream)["refusals"] == []
        assert call(sidecar.url).status_code >= 400  # fits on no GPU
        refused = next(v for v in stream if v["refusals"])["refusals"][0]
        assert refused["model"] == MODEL and refused["reason"] and refused["message"]


def test_ops_listener_serves_the_status_page(sim_factory: Sims) -> None:
    from proxy.app import build_app, build_ops_app
    from proxy.settings import load_settings

    app = build_app(load_settings(providers=[provider_entry(sim_factory("a"))]))
    main = ThreadedServer(app, name="sidecar").start()
    ops = ThreadedServer(build_ops_app(app), name="ops").start()
    try:
        assert "EventSource" in httpx.get(f"{ops.url}/kubemoot/ui").text
        with httpx.stream("GET", f"{ops.url}/kubemoot/v1/events", timeout=10) as r:
            assert [g["name"] for g in next(views(r))["gpus"]] == ["a"]
    finally:
        ops.stop()
        main.stop()


@pytest.mark.parametrize("path", ["/kubemoot/ui", "/kubemoot/v1/events"])
def test_status_paths_answer_get_only(sim_factory: Sims, sidecar_factory: Sidecars,
                                      path: str) -> None:
    url = sidecar_factory([sim_factory("a")]).url
    assert httpx.post(f"{url}{path}").status_code == 405


def test_a_sidecar_shutting_down_ends_its_event_streams(sim_factory: Sims) -> None:
    """uvicorn waits for open responses when it stops, and an event stream never ends by
    itself: the sidecar's own listener closes it, so a watched sidecar still stops."""
    from proxy.api.protocol import listener
    from proxy.app import build_app
    from proxy.settings import load_settings

    app = build_app(load_settings(providers=[provider_entry(sim_factory("a"))]))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = listener(app, "127.0.0.1", port, "on")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert eventually(lambda: server.started)
        with httpx.stream("GET", f"http://127.0.0.1:{port}/kubemoot/v1/events",
                          timeout=10) as r:
            stream = views(r)
            next(stream)
            server.should_exit = True
            thread.join(timeout=5)
            assert not thread.is_alive()
            with pytest.raises(httpx.RemoteProtocolError):  # closed with the server
                next(stream)
    finally:
        server.force_exit = True
        thread.join(timeout=5)


def two_sidecars(nats_server: NatsServer, sim_factory: Sims, sidecar_factory: Sidecars
                 ) -> tuple[str, str]:
    """Two agents' sidecars on one shared fleet of two GPUs."""
    asyncio.run(empty_buckets(nats_server.url))
    gpus = [sim_factory("a", total_vram_mib=32768), sim_factory("b", total_vram_mib=32768)]
    return (sidecar_factory(gpus, nats_url=nats_server.url, agent_name="one").url,
            sidecar_factory(gpus, nats_url=nats_server.url, agent_name="two").url)


def subjects_during(url: str, action: Callable[[], None]) -> list[str]:
    """The subjects of every kubemoot.* message a bystander saw while `action` ran."""
    async def listen() -> list[str]:
        seen: list[str] = []
        nc = await nats.connect(url)

        async def note(msg: Any) -> None:
            seen.append(msg.subject)

        await nc.subscribe("kubemoot.>", cb=note)
        await nc.flush()
        await asyncio.to_thread(action)
        await asyncio.sleep(0.3)  # anything still in flight arrives
        await nc.close()
        return seen

    return asyncio.run(listen())


def test_a_page_shows_every_sidecars_calls_with_nats(nats_server: NatsServer,
                                                     sim_factory: Sims,
                                                     sidecar_factory: Sidecars) -> None:
    one, two = two_sidecars(nats_server, sim_factory, sidecar_factory)
    call(two).raise_for_status()  # before any page: in two's ring only
    with httpx.stream("GET", f"{one}/kubemoot/v1/events", timeout=10) as r:
        stream = views(r)
        gathered = next(v for v in stream if v["calls"])  # asked of the fleet when it opened
        assert [(c["sidecar"], c["model"], c["ok"]) for c in gathered["calls"]] == [
            ("default/two", MODEL, True)]
        assert gathered["sidecars"] == ["default/one", "default/two"]
        call(one).raise_for_status()
        call(two).raise_for_status()  # pushed by two while the page watches
        both = next(v for v in stream if len(v["calls"]) == 3)
        assert sorted(c["sidecar"] for c in both["calls"]) == [
            "default/one", "default/two", "default/two"]
        assert [c["at"] for c in both["calls"]] == sorted(
            (c["at"] for c in both["calls"]), reverse=True)


def test_sidecars_publish_nothing_unless_a_page_watches(nats_server: NatsServer,
                                                        sim_factory: Sims,
                                                        sidecar_factory: Sidecars,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.setattr(fleet_calls, "WATCHED_S", 1.0)  # pushes stop a second after a page
    one, two = two_sidecars(nats_server, sim_factory, sidecar_factory)

    def unwatched_calls() -> None:
        for url in (one, two, one, two):
            call(url).raise_for_status()

    assert subjects_during(nats_server.url, unwatched_calls) == []

    def watched_call() -> None:
        with httpx.stream("GET", f"{one}/kubemoot/v1/events", timeout=10) as r:
            stream = views(r)
            # Two answered the page's gather: from now on it pushes.
            seen = len(next(v for v in stream if "default/two" in v["sidecars"])["calls"])
            call(two).raise_for_status()
            next(v for v in stream if len(v["calls"]) > seen
                 and v["calls"][0]["sidecar"] == "default/two")

    watched = subjects_during(nats_server.url, watched_call)
    assert "kubemoot.recent" in watched and watched.count("kubemoot.calls") == 1

    def after_the_page_left() -> None:
        time.sleep(1.2)  # past WATCHED_S since the page's last word
        call(two).raise_for_status()

    assert subjects_during(nats_server.url, after_the_page_left) == []
