"""Conversation cache affinity end to end: the official `ollama` client running two tool
loops through the sidecar onto simulated GPUs that keep a prompt cache per slot as Ollama
does (loadtest/sim_cache.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import ollama
from prometheus_client.parser import text_string_to_metric_families

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import SimServer, start_fleet
from loadtest.serving import ThreadedServer
from loadtest.sim_model import demo_fleet
from tests.conftest import empty_buckets, eventually

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]
SCALE = 0.02
SYSTEM = {"role": "system", "content": "You are a careful agent with tools. " * 40}


def task(topic: str) -> list[dict[str, Any]]:
    return [SYSTEM, {"role": "user", "content": f"{topic}: " + "read this file " * 1500}]


def test_two_interleaved_tool_loops_each_go_back_to_the_copy_holding_its_history(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    gpus = [sim_factory(name, total_vram_mib=24564, context_length=16384, time_scale=SCALE)
            for name in ("a", "b")]
    for gpu in gpus:  # the 8b warm on both cards, one slot each
        httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"}, timeout=30)
    sidecar = sidecar_factory(gpus, **mode)
    client = ollama.Client(host=sidecar.url, timeout=60)
    histories = {"x": task("x"), "y": task("y")}
    where: dict[str, list[str]] = {"x": [], "y": []}
    for turn in range(3):
        for loop, history in histories.items():
            before = [g.sim.stats.inference_requests for g in gpus]
            response = client.chat(model="qwen3:8b", messages=history,
                                   options={"num_predict": 8})
            where[loop] += [g.config.name for g, n in zip(gpus, before, strict=True)
                            if g.sim.stats.inference_requests > n]
            history += [{"role": "assistant", "content": response.message.content or ""},
                        {"role": "tool", "content": f"{loop} result {turn} " + "data " * 200}]
    # each loop stayed on one card, not the other's
    assert len(set(where["x"])) == 1 and len(set(where["y"])) == 1
    assert where["x"][0] != where["y"][0]
    # and every call after its first found its history there: 2 turns x 2 loops
    assert sum(g.sim.stats.cache_hits for g in gpus) >= 4
    evaluated = sum(g.sim.stats.evaluated_tokens for g in gpus)
    cached = sum(g.sim.stats.cached_tokens for g in gpus)
    assert cached > evaluated
    # explain shows the next call's prefill and what each copy is expected to hold of it
    r = httpx.post(f"{sidecar.url}/kubemoot/v1/explain", timeout=30,
                   json={"model": "qwen3:8b", "messages": histories["x"]})
    assert r.status_code == 200, r.text
    verdicts = {v["provider"]: v for v in r.json()["verdicts"]}
    home, away = where["x"][0], where["y"][0]
    # the other card holds the other loop: only the agent's system prompt is shared
    shared = verdicts[away]["expectedCachedTokens"]
    assert 0 < shared < 1000 < verdicts[home]["expectedCachedTokens"]
    assert verdicts[home]["terms"]["prefill"] < verdicts[away]["terms"]["prefill"]
    assert r.json()["decision"]["provider"] == home
    # where it would stand among waiting calls: half its expected length after its arrival
    slack = r.json()["waitSlack"]
    assert slack["lengthSource"] == "this agent's qwen3:8b answers at qwen3:8b's token rate"
    assert 0 < slack["seconds"] < slack["lengthSeconds"]
    # /metrics: what the copies were expected to hold and what the answers say they held
    metrics = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(
                   httpx.get(f"{sidecar.url}/metrics", timeout=10).text)
               for s in f.samples}

    def total(name: str, **labels: str) -> float:
        return sum(v for (n, got), v in metrics.items()
                   if n == name and labels.items() <= dict(got).items())

    assert total("kubemoot_prompt_tokens_total", result="cached") > \
        total("kubemoot_prompt_tokens_total", result="evaluated") > 0
    assert total("kubemoot_prompt_cache_expected_tokens_total") > 0
    assert total("kubemoot_prompt_cache_lost_total") == 0


def test_docs_demo_loops_on_the_demo_fleet_each_keep_a_slot_of_one_copy(
        sidecar_factory: Sidecars) -> None:
    """docs/demo.md's two loops, as written there, on a fresh `serve --demo` fleet."""
    fleet = start_fleet(demo_fleet(time_scale=0.05))
    try:
        sidecar = sidecar_factory(fleet, model_model="qwen3:8b")
        client = ollama.Client(host=sidecar.url, timeout=60)
        loops = {n: task(n) for n in ("x", "y")}
        for turn in range(3):
            for n, history in loops.items():
                r = client.chat(model="qwen3:8b", messages=history, options={"num_predict": 8})
                history += [{"role": "assistant", "content": r.message.content or ""},
                            {"role": "tool", "content": f"{n} result {turn} " + "data " * 200}]
        explain = httpx.post(f"{sidecar.url}/kubemoot/v1/explain", timeout=30,
                             json={"model": "qwen3:8b", "messages": loops["x"]}).json()
        expected = {v["provider"]: v["expectedCachedTokens"] for v in explain["verdicts"]}
        assert expected == {"gpu-5090": 0, "gpu-4090": 6525, "gpu-4080": 0}
        cached = [g.sim.stats.cached_tokens for g in fleet]
        evaluated = [g.sim.stats.evaluated_tokens for g in fleet]
        assert cached[0] == cached[2] == 0 and cached[1] > 1.5 * sum(evaluated)
    finally:
        for server in fleet:
            server.stop()


def test_sidecars_on_nats_send_a_conversation_back_to_the_copy_another_sent_it_to(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    asyncio.run(empty_buckets(nats_server.url))
    nats_mode = {"nats_url": nats_server.url}
    gpus = [sim_factory(name, total_vram_mib=24564, context_length=16384, time_scale=SCALE)
            for name in ("a", "b")]
    for gpu in gpus:
        httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"}, timeout=30)
    first, second = (sidecar_factory(gpus, agent_name=name, **nats_mode)
                     for name in ("one", "two"))
    history = task("x")
    answer = ollama.Client(host=first.url, timeout=60).chat(
        model="qwen3:8b", messages=history, options={"num_predict": 8})
    home = next(g.config.name for g in gpus if g.sim.stats.inference_requests)
    history += [{"role": "assistant", "content": answer.message.content or ""},
                {"role": "tool", "content": "x result 0 " + "data " * 200}]

    def expected_home() -> bool:  # the first sidecar's flush reached the second
        r = httpx.post(f"{second.url}/kubemoot/v1/explain", timeout=30,
                       json={"model": "qwen3:8b", "messages": history})
        return {v["provider"]: v["expectedCachedTokens"] for v in r.json()["verdicts"]
                }[home] > 1000

    assert eventually(expected_home, timeout_s=10)
    ollama.Client(host=second.url, timeout=60).chat(model="qwen3:8b", messages=history,
                                                   options={"num_predict": 8})
    assert sum(g.sim.stats.cache_hits for g in gpus) == 1


def test_another_sidecars_reload_wipes_what_a_copy_was_expected_to_hold(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    """Sidecar one sends a conversation to a copy; sidecar two, serving only that card,
    reloads the copy with a larger context (Ollama empties every slot on a reload). Sidecar
    one then expects the copy to hold nothing of the conversation, not its whole history."""
    asyncio.run(empty_buckets(nats_server.url))
    nats_mode = {"nats_url": nats_server.url}
    gpus = [sim_factory(name, total_vram_mib=24564, context_length=8192, num_parallel=2,
                        time_scale=SCALE) for name in ("a", "b")]
    for gpu in gpus:
        httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"}, timeout=30)
    one = sidecar_factory(gpus, agent_name="one", **nats_mode)
    history = [SYSTEM, {"role": "user", "content": "x: " + "read this file " * 700}]
    answer = ollama.Client(host=one.url, timeout=60).chat(
        model="qwen3:8b", messages=history, options={"num_predict": 8})
    home = next(g for g in gpus if g.sim.stats.inference_requests)
    history += [{"role": "assistant", "content": answer.message.content or ""},
                {"role": "tool", "content": "x result 0 " + "data " * 100}]

    def expected_at_home() -> int:
        r = httpx.post(f"{one.url}/kubemoot/v1/explain", timeout=30,
                       json={"model": "qwen3:8b", "messages": history})
        return int({v["provider"]: v["expectedCachedTokens"]
                    for v in r.json()["verdicts"]}[home.config.name])

    assert expected_at_home() > 1000
    two = sidecar_factory([home], agent_name="two", **nats_mode)
    loads = home.sim.stats.loads
    ollama.Client(host=two.url, timeout=60).chat(
        model="qwen3:8b", messages=[{"role": "user", "content": "hi"}],
        options={"num_predict": 8, "num_ctx": 16384})
    assert home.sim.stats.loads > loads  # the copy was loaded again, its slots empty

    def one_sees_it_back() -> bool:  # warm again, with the new context, its load claim gone
        state = httpx.get(f"{one.url}/kubemoot/v1/state", timeout=10).json()
        card = next(p for p in state["providers"] if p["name"] == home.config.name)
        return any(r["model"] == "qwen3:8b" and r["contextLength"] == 16384
                   for r in card["residents"]) and \
            not any(t["provider"] == home.config.name for t in state["tickets"])

    assert eventually(one_sees_it_back, timeout_s=10)
    assert expected_at_home() < 1000  # the agent's system prompt at most, not the history


PAUSE_S = 4.0
LIST_FILES = {"type": "function", "function": {
    "name": "list_files", "description": "List the files of a directory",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}


def test_a_loop_ended_by_an_answer_without_a_tool_call_frees_its_slot_on_every_sidecar(
        sim_factory: Sims, sidecar_factory: Sidecars, nats_server: NatsServer) -> None:
    """Two tool loops through sidecar one, each on its own card's one slot, a call every
    PAUSE_S: loop x ends (a tool's result comes back and the model answers), loop y calls a
    tool again. Within that cadence (so neither has ended by its silence) sidecar two
    expects a new conversation to push y's history out, not x's."""
    asyncio.run(empty_buckets(nats_server.url))
    nats_mode = {"nats_url": nats_server.url}
    gpus = [sim_factory(name, total_vram_mib=24564, context_length=16384, time_scale=SCALE)
            for name in ("a", "b")]
    for gpu in gpus:
        httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b", "keep_alive": -1},
                   timeout=30)
    one_url = sidecar_factory(gpus, agent_name="one", **nats_mode).url
    one = ollama.Client(host=one_url, timeout=60)
    two = sidecar_factory(gpus, agent_name="two", **nats_mode)
    histories = {"x": task("x"), "y": task("y")}
    home: dict[str, str] = {}
    for loop, history in histories.items():
        before = [g.sim.stats.inference_requests for g in gpus]
        asked = one.chat(model="qwen3:8b", messages=history, tools=[LIST_FILES], keep_alive=-1)
        assert asked.message.tool_calls
        home[loop] = next(g.config.name for g, n in zip(gpus, before, strict=True)
                          if g.sim.stats.inference_requests > n)
        history += [asked.message.model_dump(exclude_none=True),
                    {"role": "tool", "content": f"{loop}: " + "main.py " * 300}]
    assert home["x"] != home["y"]
    time.sleep(PAUSE_S)
    histories["y"].append({"role": "user", "content": "list the files of src too"})
    # x's final answer streamed, y's whole: the relay reads both
    streamed = list(one.chat(model="qwen3:8b", messages=histories["x"], tools=[LIST_FILES],
                             stream=True, keep_alive=-1))
    assert "".join(c.message.content or "" for c in streamed)
    assert not any(c.message.tool_calls for c in streamed)
    assert one.chat(model="qwen3:8b", messages=histories["y"], tools=[LIST_FILES],
                    keep_alive=-1).message.tool_calls

    def displaces() -> dict[str, float | None]:
        """A new loop's cost of pushing a history out of each warm copy."""
        r = httpx.post(f"{two.url}/kubemoot/v1/explain", timeout=30,
                       json={"model": "qwen3:8b", "messages": task("z"),
                             "tools": [LIST_FILES]})
        return {v["provider"]: v["terms"].get("cache_eviction", 0.0)
                if v["reason"] == "warm" else None for v in r.json()["verdicts"]}

    assert eventually(lambda: displaces()[home["x"]] == 0, timeout_s=3)  # once shared
    assert (displaces()[home["y"]] or 0) > 0
    ended = [s for f in text_string_to_metric_families(
        httpx.get(f"{one_url}/metrics", timeout=10).text) for s in f.samples
        if s.name == "kubemoot_tool_loops_ended_total"]
    assert [(s.labels["provider"], s.value) for s in ended] == [(home["x"], 1.0)]
