"""A copy whose unload has been asked for, in the simulator as in Ollama's scheduler
(docs/engine.md, "The simulator's loads and unloads"): it stays in `s.loaded`, and so takes
calls, until the unloader (processCompleted) finds it idle; an expiry in the unloader's queue
unloads it whatever keep_alive a call gives it meanwhile, but an unload asked of a busy copy
(its sessionDuration set to 0, nothing queued) is undone by a call that sets keep_alive, and a
load waiting for that copy waits for some other copy's unload."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from loadtest.ollama_sim import SimServer
from tests.conftest import eventually

Sims = Callable[..., SimServer]
QUICK_LOADS = {"startup_s": 0.0, "load_mib_per_s": 1e6}  # every load 0.25 s (the poll grid)


def load(sim: SimServer, model: str) -> None:
    r = httpx.post(f"{sim.url}/api/generate", json={"model": model}, timeout=30)
    assert r.json()["done_reason"] == "load"


def unload(sim: SimServer, model: str) -> None:
    r = httpx.post(f"{sim.url}/api/generate", json={"model": model, "keep_alive": 0}, timeout=30)
    assert r.json()["done_reason"] == "unload"


def chat(sim: SimServer, model: str, tokens: int = 16, keep_alive: Any = None
         ) -> dict[str, Any]:
    """A complete answer of `tokens` tokens (its final message)."""
    body: dict[str, Any] = {"model": model, "stream": False,
                            "messages": [{"role": "user", "content": "hi"}],
                            "options": {"sim_answer_tokens": tokens}}
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    r = httpx.post(f"{sim.url}/api/chat", json=body, timeout=60)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def ps(sim: SimServer) -> dict[str, dict[str, Any]]:
    return {m["model"]: m for m in httpx.get(f"{sim.url}/api/ps").json()["models"]}


def expires_in_s(sim: SimServer, model: str) -> float:
    """Real seconds until `/api/ps` says `model` expires."""
    stamp = ps(sim)[model]["expires_at"].replace("Z", "+00:00")
    return (datetime.fromisoformat(stamp) - datetime.now(UTC)).total_seconds()


def busy(sim: SimServer, model: str, count: int = 1) -> bool:
    runner = sim.sim.runners.get(model)
    return runner is not None and runner.refcount == count


@pytest.mark.parametrize(("keep_alive", "tokens"), [
    (None, 16),  # served while its expiry waits its turn
    ("1h", 16),  # a keep_alive of its own does not take the expiry back
    ("1h", 150),  # still busy when the unloader takes the expiry: put back until it is idle
])
def test_a_copy_waiting_its_turn_to_unload_serves_a_call_and_unloads_after_it(
        sim_factory: Sims, keep_alive: str | None, tokens: int) -> None:
    """The copy stays in s.loaded until processCompleted unloads it, and getRunner's fast path
    hands it to any call whose options match (server/sched.go:197-209, needsReload
    :1381-1431 looks at no expiry; v0.12.6 :106-117, :586-618). Its expiry, popped while a
    call holds it, goes back to expiredCh every 10 ms and unloads it once idle, whatever
    sessionDuration the call set (:414-427; v0.12.6 :314-327)."""
    # 0.12 waits 5 s after each unload here (the driver gives the memory back after 5 s):
    # 2 s real, while the second copy's expiry waits behind the first's
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, version="0.12.6",
                      vram_release_s=5.0, tokens_per_s=20, time_scale=0.4, **QUICK_LOADS)
    load(sim, "phi3:mini")
    load(sim, "llama3.2:3b")
    unload(sim, "phi3:mini")  # gone at once; the unloader waits 5 s
    unload(sim, "llama3.2:3b")  # listed until then
    assert set(ps(sim)) == {"llama3.2:3b"}
    answer = chat(sim, "llama3.2:3b", tokens, keep_alive)  # 150 tokens: 7.5 s, past the wait
    assert answer["load_duration"] < 0.1e9  # no load: the copy was there
    assert eventually(lambda: ps(sim) == {}, timeout_s=5)
    s = sim.sim.stats
    assert (s.loads, s.reloads, s.unloads) == (2, 0, 2)


@pytest.mark.parametrize(("keep_alive", "stays"), [(None, False), ("1h", True)])
def test_an_unload_of_a_busy_copy_is_undone_by_a_call_that_sets_keep_alive(
        sim_factory: Sims, keep_alive: str | None, stays: bool) -> None:
    """expireRunner (called at server/routes.go:404-405, 2505-2506; v0.12.6 :292-293,
    1840-1841) sets a busy copy's sessionDuration to 0 and queues nothing (server/sched.go:
    1713-1731; v0.12.6 :809-826). The copy keeps taking calls; one that sets keep_alive
    sets sessionDuration again (:483-485), so when the last call ends the copy gets a
    keep-alive timer instead of its expiry (:383-410; v0.12.6 :283-310)."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, tokens_per_s=20,
                      time_scale=0.1, **QUICK_LOADS)
    load(sim, "llama3.2:3b")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(chat, sim, "llama3.2:3b", 200)  # 10 s: 1 s real
        assert eventually(lambda: busy(sim, "llama3.2:3b"))
        unload(sim, "llama3.2:3b")
        assert "llama3.2:3b" in ps(sim)
        second = chat(sim, "llama3.2:3b", keep_alive=keep_alive)  # after the first's slot
        assert second["load_duration"] < 0.1e9
        first.result()
    if stays:
        assert "llama3.2:3b" in ps(sim) and expires_in_s(sim, "llama3.2:3b") > 300  # 360
    else:
        assert eventually(lambda: ps(sim) == {})
    s = sim.sim.stats
    assert (s.loads, s.reloads, s.unloads) == (1, 0, 0 if stays else 1)


def test_an_own_eviction_of_a_busy_copy_waits_for_any_unload_once_a_call_keeps_the_copy(
        sim_factory: Sims) -> None:
    """processPending expires a busy victim by setting its sessionDuration to 0 and waits
    for unloadedCh (server/sched.go:326-358; v0.12.6 :229-259). The victim keeps taking
    calls; one that sets keep_alive gives it a keep-alive timer when it goes idle, so the
    load waits until some unload sends unloadedCh: here the other copy's keep-alive, 5 s
    after its call ended. The victim is never reloaded."""
    sim = sim_factory("gpu", total_vram_mib=49152, context_length=4096, max_loaded_models=2,
                      tokens_per_s=20, time_scale=0.1, **QUICK_LOADS)
    load(sim, "llama3.2:3b")
    load(sim, "phi3:mini")
    with ThreadPoolExecutor(3) as pool:
        # both busy for 15 s; the 3b's keep-alive the shorter: Ollama's victim
        victim = pool.submit(chat, sim, "llama3.2:3b", 300, "2s")
        other = pool.submit(chat, sim, "phi3:mini", 300, "5s")
        assert eventually(lambda: busy(sim, "llama3.2:3b") and busy(sim, "phi3:mini"))
        evicting = pool.submit(chat, sim, "qwen3:8b")  # two loaded: one must go
        assert eventually(lambda: sim.sim.runners["llama3.2:3b"].keep_alive_s == 0)
        kept = chat(sim, "llama3.2:3b", keep_alive="1h")  # the victim serves it
        assert kept["load_duration"] < 0.1e9
        victim.result()
        other.result()
        answer = evicting.result()
    # it waited for the phi3's keep-alive: its 5 s from its call's end, after the 8b's start
    assert answer["load_duration"] / 1e9 / 0.1 > 5
    assert set(ps(sim)) == {"llama3.2:3b", "qwen3:8b"}
    assert expires_in_s(sim, "llama3.2:3b") > 300
    s = sim.sim.stats
    assert (s.loads, s.reloads, s.self_evictions) == (3, 0, 1)


def test_a_busy_copy_shows_the_expiry_it_had_when_it_last_went_idle(sim_factory: Sims) -> None:
    """expiresAt is set when a runner goes idle (server/sched.go:405, 409; v0.12.6 :305, 309)
    and by an unload (:1720; v0.12.6 :815), never when a call takes it: a call that outlasts
    the keep-alive shows a past expiry in /api/ps (sched.go:1767; v0.12.6 routes.go:1778); a
    copy never idle yet shows now + its keep-alive (sched.go:1775-1780; v0.12.6 routes.go:
    1783-1789)."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, tokens_per_s=20,
                      time_scale=0.1, **QUICK_LOADS)
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(chat, sim, "llama3.2:3b", 200, "10s")  # 10 s: 1 s real
        assert eventually(lambda: "llama3.2:3b" in ps(sim))
        assert 0.5 < expires_in_s(sim, "llama3.2:3b") <= 1.0  # never idle: 10 s from now
        loading.result()
        working = pool.submit(chat, sim, "llama3.2:3b", 600)  # 30 s: outlasts the 10
        assert eventually(lambda: busy(sim, "llama3.2:3b"))
        assert eventually(lambda: expires_in_s(sim, "llama3.2:3b") < -0.1)
        working.result()
    assert 0.0 < expires_in_s(sim, "llama3.2:3b") <= 1.0  # idle again: 10 s on


def test_a_call_that_ends_while_the_unloader_waits_still_holds_its_copy(
        sim_factory: Sims) -> None:
    """processCompleted reads a call's end (finishedReqCh) in the loop that blocks on the wait
    for freed memory after an unload (server/sched.go:374-413, 463; v0.12.6 :275-313, 363):
    until that wait is over the copy still counts the call, so Ollama's own eviction passes
    it over for an idle copy that sorts after it by name (findRunnerToUnload, :1663-1693;
    v0.12.6 :760-789)."""
    # 0.12 admits the 14b beside one of the 3b (2573 MiB) and 8b (5876 MiB), not both
    sim = sim_factory("gpu", total_vram_mib=18432, context_length=4096, version="0.12.6",
                      vram_release_s=5.0, tokens_per_s=20, time_scale=0.4, **QUICK_LOADS)
    for model in ("phi3:mini", "llama3.2:3b", "qwen3:8b"):
        load(sim, model)
    unload(sim, "phi3:mini")  # the unloader waits 5 s (2 s real)
    chat(sim, "llama3.2:3b")  # ends within the wait
    assert busy(sim, "llama3.2:3b")  # to Ollama
    chat(sim, "qwen3:14b")  # one must go: the 8b, idle
    assert set(ps(sim)) == {"llama3.2:3b", "qwen3:14b"}
    assert busy(sim, "llama3.2:3b", 0) and sim.sim.stats.self_evictions == 1


def test_a_restarted_server_still_unloads_an_idle_copy_at_its_expiry(sim_factory: Sims) -> None:
    """A restart of the simulator's server (a provider outage in the tests) ends the event
    loop that held the keep-alive timers; the copy still goes when its keep-alive runs out,
    with nobody asking /api/ps."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, time_scale=0.1,
                      **QUICK_LOADS)
    chat(sim, "llama3.2:3b", keep_alive="10s")  # 1 s real
    sim.stop()
    sim.start()
    assert "llama3.2:3b" in sim.sim.runners
    assert eventually(lambda: not sim.sim.runners, timeout_s=5)
    assert sim.sim.stats.unloads == 1


def test_a_restart_during_the_wait_for_freed_memory_leaves_the_next_expiry_to_go(
        sim_factory: Sims) -> None:
    """processCompleted takes the next expiry once its wait for freed memory is over
    (server/sched.go:414-470; v0.12.6 :314-370); a restart cutting that wait short leaves the
    queued expiry to the restarted server's unloader."""
    sim = sim_factory("gpu", total_vram_mib=24564, context_length=4096, version="0.12.6",
                      vram_release_s=5.0, time_scale=0.4, **QUICK_LOADS)
    load(sim, "phi3:mini")
    load(sim, "llama3.2:3b")
    unload(sim, "phi3:mini")  # the unloader waits 5 s (2 s real)
    unload(sim, "llama3.2:3b")  # queued behind that wait
    sim.stop()
    sim.start()
    assert eventually(lambda: not sim.sim.runners, timeout_s=5)
    assert sim.sim.stats.unloads == 2
