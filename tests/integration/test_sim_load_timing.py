"""A load and an unload take as long in the simulator as in Ollama (docs/engine.md, "The
simulator's loads and unloads"): a load is the runner's start-up and the read of the weights
file, seen on WaitUntilRunning's 250 ms poll grid; unloads go one at a time, each followed by
waitForVRAMRecovery, which an own eviction waits for and a later call does not.

The wall-clock tests measure against the known simulated figure: a busy machine can only
make a wait longer, so the lower bounds are tight and the upper ones generous (SLACK)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from loadtest.ollama_sim import SimServer
from tests.conftest import eventually

Sims = Callable[..., SimServer]
SCALE = 0.1  # simulated seconds -> real seconds, for the wall-clock tests
SLACK = 0.08  # real seconds a busy machine may add to a wait
HTTP = httpx.Client(timeout=60)  # one connection pool: a round trip takes no new TLS context


@pytest.fixture(autouse=True, scope="module")
def _close_client() -> Iterator[None]:
    yield
    HTTP.close()


def call(sim: SimServer, model: str, **body: Any) -> dict[str, Any]:
    """A one-token answer (its final message, with load_duration)."""
    options = {"num_predict": 1, **body.pop("options", {})}
    r = HTTP.post(f"{sim.url}/api/generate", json={
        "model": model, "prompt": "hi", "stream": False, "options": options, **body})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def load_s(answer: dict[str, Any]) -> float:
    """The answer's load_duration in simulated seconds."""
    return float(answer["load_duration"]) / 1e9 / SCALE


def unload(sim: SimServer, model: str) -> None:
    r = HTTP.post(f"{sim.url}/api/generate", json={"model": model, "keep_alive": 0})
    assert r.json()["done_reason"] == "unload"


def ps(sim: SimServer) -> set[str]:
    return {m["model"] for m in HTTP.get(f"{sim.url}/api/ps").json()["models"]}


def stats(sim: SimServer) -> dict[str, Any]:
    answer: dict[str, Any] = HTTP.get(f"{sim.url}/_sim/stats").json()
    return answer


def near(seconds: float, expected: float) -> bool:
    """`seconds` (simulated) is `expected`, or later by what a busy machine adds."""
    return expected - 0.01 <= seconds <= expected + SLACK / SCALE


@pytest.mark.serial
def test_a_load_reads_the_weights_file_not_the_footprint(sim_factory: Sims) -> None:
    """The KV cache is allocated, never read: qwen3:8b loads in 1 s + 5200 MiB / 1024 MiB/s
    = 6.08 s (seen at 6.25) at 2048 or 40960 tokens (5.5 or 12.8 GiB); llama3.2:3b at
    131072 tokens takes 16 GiB of the card yet loads in 1 + 1926 / 1024 = 2.88 s (3.0)."""
    figures = {}
    for model, num_ctx in (("qwen3:8b", 2048), ("qwen3:8b", 40960), ("llama3.2:3b", 131072)):
        sim = sim_factory(f"gpu-{num_ctx}", total_vram_mib=49152, time_scale=SCALE)
        figures[model, num_ctx] = load_s(call(sim, model, options={"num_ctx": num_ctx}))
    assert near(figures["qwen3:8b", 2048], 6.25) and near(figures["qwen3:8b", 40960], 6.25)
    assert near(figures["llama3.2:3b", 131072], 3.0)


@pytest.mark.serial
def test_a_load_is_seen_ready_on_the_250_ms_poll_grid(sim_factory: Sims) -> None:
    """WaitUntilRunning polls at once, then every 250 ms (llm/llama_server.go:1368-1381): a
    load of 1.01 s and one of 1.24 s are both seen ready at 1.25 s."""
    for read_s in (0.01, 0.24):
        sim = sim_factory(f"gpu-{read_s}", total_vram_mib=24564, time_scale=SCALE,
                          load_mib_per_s=1926 / read_s)
        assert near(load_s(call(sim, "llama3.2:3b")), 1.25)


@pytest.mark.serial
def test_a_second_unload_waits_for_the_first_ones_recovery(sim_factory: Sims) -> None:
    """processCompleted blocks on waitForVRAMRecovery before it takes the next expiry
    (server/sched.go:458-463): on 0.12 the first tick after the driver gave the memory back
    (here 3.9 s, so 4.0 s). The first copy leaves /api/ps at once, the second only then."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, version="0.12.6",
                      vram_release_s=3.9, time_scale=SCALE)
    call(sim, "llama3.2:3b")
    call(sim, "phi3:mini")
    sent = time.perf_counter()
    unload(sim, "llama3.2:3b")
    assert ps(sim) == {"phi3:mini"}
    unload(sim, "phi3:mini")
    assert ps(sim) == {"phi3:mini"}  # queued behind the first's recovery
    assert eventually(lambda: ps(sim) == set(), timeout_s=3.0, step_s=0.005)
    assert near((time.perf_counter() - sent) / SCALE, 4.0)
    assert stats(sim)["recovery_s"] == 8.0


@pytest.mark.serial
def test_an_own_eviction_waits_for_the_recovery_and_a_call_after_an_unload_does_not(
        sim_factory: Sims) -> None:
    """processPending waits for unloadedCh, sent after the recovery (server/sched.go:
    326-357): with no other runner to read the memory from, HEAD's recovery is a tick and a
    bootstrap discovery (0.25 + 1.5 s), part of the load_duration. A call after a
    keep_alive 0 unload loads at once: processPending does not wait for processCompleted."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, max_loaded_models=1,
                      discovery_s=1.5, time_scale=SCALE)
    call(sim, "llama3.2:3b")
    evicting = call(sim, "phi3:mini")  # 1 + 2176 / 1024 = 3.13 s: 3.25
    assert near(load_s(evicting), 1.75 + 3.25)
    unload(sim, "phi3:mini")
    assert near(load_s(call(sim, "llama3.2:3b")), 3.0)
    assert stats(sim)["recovery_s"] == 3.5


def test_the_recovery_wait_is_the_versions(sim_factory: Sims) -> None:
    """The wait after an unload, with another copy on the card: 0.12 reads the real memory
    (the first tick after the driver's 0.3 s: 0.5 s every time); HEAD reads runners' static
    accounting in Go's map order (server/sched.go:1441-1497, discover/runner.go:285-331): the
    survivor's reading for the baseline and the tick is no change (5 s), the victim's
    baseline against the survivor's tick more than 0.75 x its VRAM freed (a tick). The
    order is the seed's: the same seed, the same waits."""
    def waits(version: str, seed: int) -> float:
        sim = sim_factory(f"gpu-{version}-{seed}", total_vram_mib=24564, context_length=4096,
                          version=version, seed=seed)
        call(sim, "phi3:mini")  # the survivor, loaded first
        call(sim, "llama3.2:3b")
        unload(sim, "llama3.2:3b")
        assert eventually(lambda: ps(sim) == {"phi3:mini"})
        recovered: float = stats(sim)["recovery_s"]
        return recovered

    assert {waits("0.12.6", seed) for seed in range(4)} == {0.5}
    newest = [waits("0.33.0", seed) for seed in range(8)]
    assert set(newest) == {0.25, 5.0}
    assert [waits("0.33.0", seed) for seed in range(8)] == newest


@pytest.mark.serial
def test_a_reload_waits_for_its_own_recovery(sim_factory: Sims) -> None:
    """A reload for other load options is an eviction of the copy itself (processPending,
    server/sched.go:326-357): alone on the card, HEAD's recovery is a tick and a discovery
    (0.25 + 0.5 s) before the 3 s load."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, time_scale=SCALE)
    call(sim, "llama3.2:3b")
    assert near(load_s(call(sim, "llama3.2:3b", options={"num_ctx": 8192})), 0.75 + 3.0)
    s = stats(sim)
    assert (s["reloads"], s["recovery_s"]) == (1, 0.75)


@pytest.mark.serial  # the second unload must still wait its turn when the eviction comes
def test_an_own_eviction_takes_a_copy_waiting_to_unload_first(sim_factory: Sims) -> None:
    """An unload sets the copy's sessionDuration to 0 (server/sched.go:1725), which
    findRunnerToUnload sorts first: a copy still listed while its unload waits for the
    unloader is Ollama's victim before an idle copy that sorts first by name. Going anyway,
    it is not counted as one of Ollama's own evictions."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, version="0.12.6",
                      max_loaded_models=2, vram_release_s=5.0, startup_s=0.0,
                      load_mib_per_s=1e6, time_scale=0.2)  # loads 0.25 s, each wait 5 s
    call(sim, "phi3:mini")
    call(sim, "qwen3:8b")
    unload(sim, "phi3:mini")  # gone, and the unloader waits 5 s
    unload(sim, "qwen3:8b")  # listed until then
    call(sim, "llama3.2:3b")  # beside it: two loaded
    assert ps(sim) == {"qwen3:8b", "llama3.2:3b"}
    call(sim, "qwen3:14b")  # a third: one must go
    assert ps(sim) == {"llama3.2:3b", "qwen3:14b"}
    assert (stats(sim)["unloads"], stats(sim)["self_evictions"]) == (2, 0)


def first_listing(sim: SimServer, model: str) -> tuple[float, bool]:
    """Simulated seconds from a call that loads `model` to /api/ps first listing it, and
    whether the copy was still loading then."""
    with ThreadPoolExecutor(1) as pool:
        sent = time.perf_counter()
        loading = pool.submit(call, sim, model)
        assert eventually(lambda: model in ps(sim), timeout_s=3.0, step_s=0.002)
        listed = (time.perf_counter() - sent) / SCALE
        reading = not sim.sim.runners[model].loaded.is_set()
        loading.result()
    return listed, reading


@pytest.mark.serial
@pytest.mark.parametrize(("version", "model", "new_engine", "listed_at"), [
    ("0.12.6", "qwen3:8b", False, 1.0),  # qwen3 requires Ollama's own engine: at its commit
    ("0.12.6", "llama3.2:3b", False, 3.0),  # the llama engine's Load waits for the runner
    ("0.12.6", "llama3.2:3b", True, 1.0),  # OLLAMA_NEW_ENGINE: llama on its own engine
    ("0.33.0", "qwen3:8b", False, 6.25),  # llama-server: listed once it runs
])
def test_a_copy_is_listed_once_it_runs_or_on_0_12s_own_engine_once_committed(
        sim_factory: Sims, version: str, model: str, new_engine: bool, listed_at: float
        ) -> None:
    """v0.12.6's own engine returns from Load at the commit of its memory (llm/server.go:
    827-841) and the runner joins s.loaded, which /api/ps reads unlocked (server/sched.go:
    472-483, server/routes.go:1758-1800), while it reads the weights (runner/ollamarunner/
    runner.go:1260-1262); the llama engine's Load waits for it (llm/server.go:596-600), and
    HEAD's llama-server copy joins s.loaded once it runs (server/sched.go:627, 727)."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, version=version,
                      new_engine=new_engine, time_scale=SCALE)
    listed, reading = first_listing(sim, model)
    assert listed >= listed_at - 0.01 and reading is (listed_at < 2.0)


@pytest.mark.serial
def test_the_next_load_waits_for_a_copy_0_12_lists_while_it_reads_its_weights(
        sim_factory: Sims) -> None:
    """Loads do not overlap on 0.12's own engine either: the next request's updateFreeSpace
    locks every loaded runner's refMu, held until it runs (v0.12.6 server/sched.go:211,
    519-520; 470, 485-487). qwen3:14b, asked once qwen3:8b is listed (~1 s into its 6.25 s),
    waits for the rest of it, then loads in 10.25 s."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, version="0.12.6",
                      time_scale=SCALE)
    with ThreadPoolExecutor(1) as pool:
        sent = time.perf_counter()
        first = pool.submit(call, sim, "qwen3:8b")
        assert eventually(lambda: "qwen3:8b" in ps(sim), timeout_s=3.0, step_s=0.002)
        asked = (time.perf_counter() - sent) / SCALE
        assert not sim.sim.runners["qwen3:8b"].loaded.is_set()
        second = call(sim, "qwen3:14b")
        ready = load_s(first.result())
    # either request's trip to the server moves the figure, so the slack goes both ways
    # (overlapping loads would give 10.25 s)
    assert abs(load_s(second) - (ready - asked + 10.25)) <= SLACK / SCALE


@pytest.mark.serial
@pytest.mark.parametrize(("version", "status"), [("0.12.6", 200), ("0.33.0", 503)])
def test_a_call_for_a_copy_0_12_lists_waits_for_it_outside_the_load_queue(
        sim_factory: Sims, version: str, status: int) -> None:
    """With OLLAMA_MAX_QUEUE 0, a second call for qwen3:8b while it loads: 0.12's GetRunner
    finds the listed copy and waits in needsReload for its refMu (v0.12.6 server/sched.go:
    106-110, 588), then joins it; HEAD's copy is not in s.loaded yet, so the call needs the
    queue, which is full (server/sched.go:197-208): 503."""
    scale = 0.3  # the load: 1.9 s, the start-up 0.3 s
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, version=version,
                      max_queue=0, time_scale=scale)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(call, sim, "qwen3:8b")
        assert eventually(lambda: "qwen3:8b" in sim.sim.runners, step_s=0.002)
        time.sleep(2.0 * scale)  # past the start-up: 0.12 lists it
        r = HTTP.post(f"{sim.url}/api/generate", json={
            "model": "qwen3:8b", "prompt": "hi", "stream": False, "options": {"num_predict": 1}})
        assert first.result()["done"]
    assert r.status_code == status, r.text
    assert stats(sim)["loads"] == 1
