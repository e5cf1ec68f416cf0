"""Demand board, publisher and bucket setup against a real NATS and simulators."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import nats
import orjson
import pytest

from loadtest.nats_server import NatsServer
from proxy.adapters.dcgm import DcgmExporter
from proxy.adapters.memory_kv import MemoryStore
from proxy.adapters.nats_kv import NatsOptions, NatsStore
from proxy.adapters.ollama import OllamaClient
from proxy.core.conversations import Held
from proxy.core.types import WaitNeed
from proxy.ports import BUCKETS, MODEL_DEMAND, PROVIDER_STATE
from proxy.service import demand as demand_module
from proxy.service.codec import ProviderState, escape_key, unescape_key
from proxy.service.demand import HALF_LIFE_S, DemandBoard, aggregate, without_waiter
from proxy.service.prober import Prober
from proxy.settings import ProviderConfig
from tests.nats_auth import tls_files


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, at: float = 1_000_000.0) -> None:
        self.at = at

    def now(self) -> float:
        return self.at

    def monotonic(self) -> float:
        return self.at


def test_escaped_keys_are_kv_safe_and_reversible() -> None:
    for name in ["qwen3:32b", "crew-a/kubectl-agent", "hf.co/org/model:Q4_K_M", "plain"]:
        encoded = escape_key(name)
        assert all(c.isalnum() or c in "_-=" for c in encoded)
        assert unescape_key(encoded) == name


async def test_demand_counts_waiters_intents_use_and_prediction() -> None:
    store, clock = MemoryStore(), Clock()
    a = DemandBoard(store, "crew/a", clock)
    b = DemandBoard(store, "crew/b", clock)
    await a.waiting("qwen3:14b")
    theirs = await b.waiting("qwen3:14b")
    await a.intend("qwen3:8b")
    a.note_use("qwen3:8b")
    a.note_use("qwen3:8b")
    await a.flush_uses()
    await b.selected(["qwen3:32b", "qwen3:8b"])
    d = a.view()
    assert d["qwen3:14b"].waiters == 2
    assert d["qwen3:8b"].intents == 1 and d["qwen3:8b"].recent_use == pytest.approx(2.0)
    assert d["qwen3:32b"].predicted == pytest.approx(1.0)
    await b.done_waiting(theirs)
    assert a.view()["qwen3:14b"].waiters == 1
    # two plans of one agent for one model: the intent stays until both are gone
    await a.intend("qwen3:8b")
    await a.drop_intent("qwen3:8b")
    assert a.view()["qwen3:8b"].intents == 1
    await a.drop_intent("qwen3:8b")
    assert a.view()["qwen3:8b"].intents == 0


async def test_every_demand_entry_names_the_crew_of_its_agent_when_it_has_one() -> None:
    store, clock = MemoryStore(), Clock()
    crewed = DemandBoard(store, "ns/a", clock, crew="homelab-pilot")
    alone = DemandBoard(store, "ns/b", clock)
    await crewed.waiting("qwen3:14b")
    await crewed.intend("qwen3:8b")
    await alone.intend("qwen3:8b")
    entries = store.view(MODEL_DEMAND).items()
    crews = {agent: [orjson.loads(e.value).get("crew") for key, e in entries
                     if escape_key(agent) in key] for agent in ("ns/a", "ns/b")}
    assert crews == {"ns/a": ["homelab-pilot", "homelab-pilot"], "ns/b": [None]}


async def test_each_waiting_call_has_its_own_entry_carrying_its_turn() -> None:
    store, clock = MemoryStore(), Clock()
    a = DemandBoard(store, "crew/a", clock)
    b = DemandBoard(store, "crew/b", clock)
    first = await a.waiting("qwen3:8b", since=clock.at - 3, turn=clock.at + 4)
    theirs = await b.waiting("qwen3:8b", since=clock.at - 2)  # no slack: due at arrival
    await a.waiting("qwen3:8b", since=clock.at - 1, turn=clock.at)
    seen = b.view()["qwen3:8b"]
    assert seen.waiters == 3  # two calls of one sidecar are two waiters
    assert seen.turns == (clock.at - 2, clock.at, clock.at + 4)
    assert without_waiter(b.view(), "qwen3:8b", clock.at - 2)["qwen3:8b"].turns == (
        clock.at, clock.at + 4)
    assert b.others_waiting("qwen3:8b") and a.others_waiting("qwen3:8b")
    assert not b.others_waiting("qwen3:14b")
    assert a.stop_waiting(first)  # gone from its own sidecar's view before the delete
    assert a.view()["qwen3:8b"].turns == (clock.at - 2, clock.at)
    await a.done_waiting(first)
    assert b.view()["qwen3:8b"].waiters == 2
    await b.done_waiting(theirs)
    assert not a.others_waiting("qwen3:8b")  # only its own call waits
    await a.close()
    await b.close()



async def test_a_waiting_calls_entry_says_what_it_needs_of_a_copy_to_the_others() -> None:
    """num_ctx, prompt tokens and the providers a retry may not go to, written only when it
    has them; an entry without them (an older sidecar's) needs nothing of a copy."""
    store, clock = MemoryStore(), Clock()
    a = DemandBoard(store, "crew/a", clock)
    b = DemandBoard(store, "crew/b", clock)
    await a.waiting("qwen3:8b", need=WaitNeed(8192, 5715, frozenset({"gpu-b"})))
    await a.waiting("qwen3:8b")
    written = sorted(list(orjson.loads(e.value)) for e in store.view(MODEL_DEMAND).values())
    assert written == [["expiresAt", "since", "turn"],
                       ["expiresAt", "since", "turn", "ctx", "tokens", "not"]]
    assert sorted(b.view()["qwen3:8b"].needs, key=lambda n: n.num_ctx) == [
        WaitNeed(), WaitNeed(8192, 5715, frozenset({"gpu-b"}))]
    await a.close()
    await b.close()

async def test_a_waiting_call_backs_the_other_models_it_could_run_on_without_a_place_in_their_line(
) -> None:
    """Its entry stays in its preferred model's line (waiters, turns) and names the other
    models it could run on (`also`, left out when none): those show as `backing`, with its
    needs, never as waiters or turns. The call's own view is without it in both."""
    store, clock = MemoryStore(), Clock()
    a = DemandBoard(store, "crew/a", clock)
    b = DemandBoard(store, "crew/b", clock)
    need = WaitNeed(8192, 500)
    entry = await a.waiting("qwen3:32b", turn=clock.at + 2, need=need, also=("qwen3:14b",))
    await a.waiting("qwen3:32b")
    written = sorted(orjson.loads(e.value).get("also", []) for e in
                     store.view(MODEL_DEMAND).values())
    assert written == [[], ["qwen3:14b"]]
    seen = b.view()
    assert (seen["qwen3:32b"].waiters, seen["qwen3:32b"].turns) == (2, (clock.at, clock.at + 2))
    backed = seen["qwen3:14b"]
    assert (backed.waiters, backed.turns, backed.backing) == (0, (), (need,))
    assert b.others_waiting("qwen3:14b") and not a.others_waiting("qwen3:14b")
    own = without_waiter(seen, "qwen3:32b", entry.turn, entry.also, entry.need)
    assert (own["qwen3:32b"].waiters, own["qwen3:14b"].backing) == (1, ())
    await a.done_waiting(entry)
    assert "qwen3:14b" not in b.view()
    await a.close()
    await b.close()


async def test_a_call_cancelled_while_its_wait_entry_is_written_leaves_no_waiter_behind(
) -> None:
    """The caller gets no entry to end when it is cancelled during the first write (a
    shutdown, a store slow to answer): the entry leaves this sidecar's view at once and the
    board with its delete, and is not refreshed for ever, counted a waiter and backing the
    copies of its `also` (before, it stayed)."""
    answered = asyncio.Event()

    class SlowStore(MemoryStore):
        async def put(self, bucket: str, key: str, value: bytes) -> int:
            written = await super().put(bucket, key, value)  # (it lands, its answer is late)
            await answered.wait()
            return written

    store, clock = SlowStore(), Clock()
    a = DemandBoard(store, "crew/a", clock)
    b = DemandBoard(store, "crew/b", clock)
    waiting = asyncio.ensure_future(a.waiting("qwen3:32b", also=("qwen3:14b",)))
    for _ in range(3):
        await asyncio.sleep(0)
    assert b.view()["qwen3:32b"].waiters == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert "qwen3:32b" not in a.view() and "qwen3:14b" not in a.view()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not store.view(MODEL_DEMAND) and "qwen3:32b" not in b.view()
    await a.close()
    await b.close()


async def test_waiting_calls_one_after_another_leave_no_marker_each_in_the_bucket(
        nats_url: str) -> None:
    """A deleted key leaves a marker in the bucket for its max age (6 h): a key per waiting
    call ever made would leave one per call, in the stream and in every watch's replay. The
    numbers are used again, so the markers are as many as calls that waited at once."""
    store = NatsStore(NatsOptions(nats_url), BUCKETS)
    await store.start()
    assert await store.replayed(5)
    board = DemandBoard(store, "crew/a")
    together = [await board.waiting("qwen3:8b") for _ in range(3)]
    assert len({e.key for e in together}) == 3  # calls waiting at once: an entry each
    for entry in together:
        await board.done_waiting(entry)
    for _ in range(100):
        await board.done_waiting(await board.waiting("qwen3:8b"))
    await board.close()
    await store.close()
    nc = await nats.connect(nats_url)
    info = await nc.jetstream().stream_info(f"KV_{MODEL_DEMAND}")
    await nc.close()
    assert info.state.messages <= 3, info.state


async def test_the_demand_view_is_reused_only_while_the_board_is_unchanged() -> None:
    store, clock = MemoryStore(), Clock()
    board = DemandBoard(store, "crew/a", clock)
    await board.waiting("qwen3:14b")
    first = board.view()
    assert board.view() is first  # nothing changed: no second pass over the board
    await DemandBoard(store, "crew/b", clock).waiting("qwen3:14b")
    assert board.view()["qwen3:14b"].waiters == 2  # another agent's write shows at once
    again = board.view()
    clock.at += 1.5  # rates decay and entries expire: not reused past VIEW_REUSE_S
    assert board.view() is not again


async def test_use_counts_are_written_once_per_flush_not_per_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demand_module, "USE_FLUSH_S", 0.02)
    store, clock = MemoryStore(), Clock()
    board = DemandBoard(store, "crew/a", clock)
    writes_before = store.changes.value
    for _ in range(5):
        board.note_use("m")
    assert "m" not in board.view()  # counted, not yet written
    await asyncio.sleep(0.1)
    assert board.view()["m"].recent_use == pytest.approx(5.0)
    assert store.changes.value == writes_before + 1


async def test_a_loops_end_and_cadence_are_shared_with_the_prompts_each_sidecar_sent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demand_module, "USE_FLUSH_S", 0.02)
    store, clock = MemoryStore(), Clock()
    one, two = DemandBoard(store, "crew/one", clock), DemandBoard(store, "crew/two", clock)
    live = Held(1, 2, 3, 4, 5000, 100, clock.now(), pause=12.5)
    one.note_held([(("a", "m"), live), (("b", "m"), replace(live, ident=7, finished=True))])
    await asyncio.sleep(0.1)
    shared = two.shared_caches()
    assert [(h.finished, h.pause) for h in shared[("a", "m")]] == [(False, 12.5)]
    assert [(h.finished, h.pause) for h in shared[("b", "m")]] == [(True, 12.5)]
    assert one.shared_caches() == {}  # its own are not echoed back
    # a row from a sidecar that does not say it (seven fields): a live loop, cadence unknown
    await store.put(MODEL_DEMAND, "cache.crew/old", orjson.dumps({
        "expiresAt": clock.now() + 60, "copies": [["c", "m", [[1, 9, 3, 4, 5000, 100, 0.0]]]]}))
    assert [(h.finished, h.pause) for h in two.shared_caches()[("c", "m")]] == [(False, 0)]


async def test_copies_no_cache_holds_any_more_leave_what_a_sidecar_shares(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each model ever run (agents create and remove them) kept its copy's prompts in every
    write of the sidecar's cache entry, long after no cache was expected to hold them."""
    monkeypatch.setattr(demand_module, "USE_FLUSH_S", 0.01)
    store, clock = MemoryStore(), Clock()
    board = DemandBoard(store, "crew/one", clock)
    for i in range(50):
        board.note_held([(("a", f"custom-{i}"), Held(1, 2, 3, 4, 500, 0, clock.now()))])
    await board.flush_uses()
    clock.at += demand_module.CACHE_TTL_S + 1
    board.note_held([(("a", "qwen3:8b"), Held(1, 2, 3, 4, 500, 0, clock.now()))])
    await board.flush_uses()
    written = orjson.loads(store.view(MODEL_DEMAND)["cache.crew=2Fone"].value)
    assert [row[1] for row in written["copies"]] == ["qwen3:8b"]
    await board.close()


async def test_demand_rates_decay_and_entries_expire() -> None:
    store, clock = MemoryStore(), Clock()
    board = DemandBoard(store, "crew/a", clock)
    board.note_use("m")
    await board.flush_uses()
    await board.intend("m")
    clock.at += HALF_LIFE_S  # one half-life later
    assert board.view()["m"].recent_use == pytest.approx(0.5)
    assert board.view()["m"].intents == 0  # intents live 3 minutes
    board.note_use("m")
    await board.close()  # writes what it counted
    assert board.view()["m"].recent_use == pytest.approx(1.5)
    clock.at += 7 * 3600
    assert aggregate(store.view(MODEL_DEMAND), clock.now()) == {}


def test_trained_context_is_read_from_model_info() -> None:
    from proxy.service.prober import trained_context

    info = {"general.architecture": "llama", "llama.context_length": 131072}
    assert trained_context({"model_info": info}) == 131072
    assert trained_context({"model_info": {"bert.context_length": 512}}) == 512
    assert trained_context({"model_info": {}}) == 0 and trained_context("x") == 0


async def test_publisher_probes_simulators_and_writes_state(sim_factory, nats_url: str
                                                            ) -> None:  # type: ignore[no-untyped-def]
    up = sim_factory("up", total_vram_mib=24564, context_length=8192)
    down = sim_factory("down")
    configs = [ProviderConfig(name="up", endpoint=up.url, totalVramMiB=24564,
                              contextLength=8192, maxParallel=2, maxLoadedModels=4, gpus=2),
               ProviderConfig(name="down", endpoint=down.url)]
    down.stop()
    client = OllamaClient(up.url)
    await client.load("qwen3:8b")
    store = NatsStore(NatsOptions(nats_url))
    await store.start()
    assert await store.replayed(5)
    clients = {c.name: OllamaClient(c.endpoint) for c in configs}
    prober = Prober(configs, clients, store, gpu_memory=DcgmExporter(2.0))
    await prober.round()
    raw_up = await store.get(PROVIDER_STATE, "up")
    raw_down = await store.get(PROVIDER_STATE, "down")
    assert raw_up and raw_down
    state = ProviderState.decode(raw_up.value)
    assert state.ready and state.total_vram_mib == 24564 and state.max_parallel == 2
    assert state.max_loaded == 4 and ProviderState.decode(raw_down.value).max_loaded == 3
    assert state.gpus == 2 and ProviderState.decode(raw_down.value).gpus == 1
    footprint = up.config.model("qwen3:8b").footprint_mib(8192, 1, batch=1024)
    assert state.loaded_mib == state.loaded_size_mib == {"qwen3:8b": footprint}
    assert state.loaded_ctx == {"qwen3:8b": 8192}
    assert state.loaded_expiry["qwen3:8b"] > state.last_probed_at  # its keep-alive expiry
    assert state.available_mib["qwen3:32b"] == 20200
    assert state.models["phi3:mini"].trained_context == 4096
    qwen3 = state.models["qwen3:8b"]
    assert (qwen3.trained_context, qwen3.kv_bytes_per_token) == (40960, 144 * 1024)
    assert state.models["nomic-embed-text:latest"].embedding
    assert state.observed == {"qwen3:8b": {8192: footprint}}
    assert not ProviderState.decode(raw_down.value).ready
    # unchanged state within the interval is not written again; a change is, at once
    assert not await prober.publish(await prober.probe("up"))
    await client.unload("qwen3:8b")
    assert await prober.publish(await prober.probe("up"))
    assert prober.observed["up"] == {"qwen3:8b": {8192: footprint}}  # kept once unloaded
    for c in [client, *clients.values()]:
        await c.close()
    await store.close()


async def test_init_buckets_is_idempotent(nats_url: str) -> None:
    command = [sys.executable, "-m", "proxy", "init-buckets", "--nats-url", nats_url]
    first = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True,
                                    timeout=60)
    second = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True,
                                     timeout=60)
    assert first.returncode == 0 and "created" in first.stdout
    assert second.returncode == 0 and "exists" in second.stdout
    assert "created" not in second.stdout
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for spec in BUCKETS:
        status = await (await js.key_value(spec.name)).status()
        assert status.ttl == pytest.approx(spec.ttl_s)
    await nc.close()


def test_init_buckets_without_nats_names_the_setting() -> None:
    done = subprocess.run([sys.executable, "-m", "proxy", "init-buckets"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin"})
    assert done.returncode != 0 and "KUBEMOOT_NATS_URL" in done.stderr


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("command", ["init-buckets", "publish"])
def test_an_unreachable_nats_is_one_line_naming_the_url_and_why(command: str) -> None:
    url = f"nats://127.0.0.1:{_unused_port()}"
    env = {"PATH": "/usr/bin", "KUBEMOOT_NATS_URL": url,
           "KUBEMOOT_PROVIDERS": '[{"name": "gpu-x", "endpoint": "http://127.0.0.1:9"}]'}
    args = ["--once"] if command == "publish" else []
    done = subprocess.run([sys.executable, "-m", "proxy", command, *args], env=env,
                          capture_output=True, text=True, timeout=15)
    lines = done.stderr.splitlines()
    assert done.returncode == 1
    assert len(lines) == 1, done.stderr
    prefix = f"kubemoot-proxy {command}: cannot connect to NATS at {url}: "
    assert lines[0].startswith(prefix) and lines[0][len(prefix):].strip(), lines[0]


def test_publish_once(sim_factory, nats_server: NatsServer) -> None:  # type: ignore[no-untyped-def]
    sim = sim_factory("gpu-x")
    env = {"PATH": "/usr/bin", "KUBEMOOT_NATS_URL": nats_server.url,
           "KUBEMOOT_PROVIDERS": f'[{{"name": "gpu-x", "endpoint": "{sim.url}"}}]'}
    done = subprocess.run([sys.executable, "-m", "proxy", "publish", "--once"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "gpu-x: ready=True" in done.stdout


def test_dcgm_exporter_gives_the_vram_total() -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from loadtest.serving import ThreadedServer

    dcgm_total_mib = DcgmExporter(2.0).total_mib

    text = (
        "# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).\n"
        "# TYPE DCGM_FI_DEV_FB_FREE gauge\n"
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-1"} 20000\n'
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n"
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1"} 4000\n'
        "# HELP DCGM_FI_DEV_FB_RESERVED Framebuffer memory reserved (in MiB).\n"
        "# TYPE DCGM_FI_DEV_FB_RESERVED gauge\n"
        'DCGM_FI_DEV_FB_RESERVED{gpu="0",UUID="GPU-1"} 564\n')

    async def metrics(request):  # type: ignore[no-untyped-def]
        return PlainTextResponse(text)

    server = ThreadedServer(Starlette(routes=[Route("/metrics", metrics)])).start()
    try:
        assert asyncio.run(dcgm_total_mib(f"{server.url}/metrics")) == 24564
        assert asyncio.run(dcgm_total_mib("http://127.0.0.1:9/metrics")) is None
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("server_args", "options"),
    [
        (["--user", "agent", "--pass", "s3cret"],
         {"user": "agent", "password": "s3cret"}),
        (["--auth", "t0ken"], {"token": "t0ken"}),
    ],
)
def test_nats_credentials(server_args: list[str], options: dict[str, str]) -> None:
    server = NatsServer(extra_args=server_args).start()
    try:
        assert asyncio.run(_usable(NatsOptions(server.url, timeout_s=0.5, **options)))  # type: ignore[arg-type]
        assert not asyncio.run(_usable(NatsOptions(server.url, timeout_s=0.5)))  # refused
    finally:
        server.cleanup()


async def _usable(options: NatsOptions) -> bool:
    """Can a store connect with these options and write?"""
    store = NatsStore(options)
    try:
        await store.start()
    except Exception:
        await store.close()
        return False
    await store.put(PROVIDER_STATE, "probe", b"1")
    await store.close()
    return True


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")
def test_nats_over_tls(tmp_path: Path) -> None:
    files = tls_files(tmp_path)
    ca, cert, key = files.ca, files.cert, files.key
    server = NatsServer(extra_args=["--tls", "--tlscert", str(cert), "--tlskey", str(key)]
                        ).start()
    url = f"tls://127.0.0.1:{server.port}"
    try:
        assert asyncio.run(_usable(NatsOptions(url, tls_ca=ca, timeout_s=0.5)))
        assert not asyncio.run(_usable(NatsOptions(url, timeout_s=0.5)))  # unknown CA: refused
    finally:
        server.cleanup()
