"""Which models a call may run: its discussion's binding, its agent's, or the environment's
(over the embedded store, which holds a bucket the same way as NATS)."""

from __future__ import annotations

import asyncio

import orjson

from proxy.adapters.memory_kv import MemoryStore
from proxy.core.models import CallModels
from proxy.core.types import Candidate
from proxy.ports import BINDINGS
from proxy.service.bindings import DECODED_KEPT, Bindings

ENV = CallModels((Candidate("qwen3:32b"),), "phi3:mini")  # as deployed


def agent_binding(generation: int = 1, **extra: object) -> bytes:
    return orjson.dumps({
        "namespace": "crew", "agent": "tooler", "generation": generation,
        "phases": {"mulling": {"model": "qwen3:14b", "provider": "gpu-a"},
                   "triage": {"model": "qwen3:8b", "provider": "gpu-b"}},
        "candidates": {"mulling": [{"model": "qwen3:14b", "score": 100, "vramMib": 9300},
                                   {"model": "qwen3:8b", "score": 50}],
                       "triage": [{"model": "qwen3:8b", "score": 0}]},
        "tolerance": None, "unschedulable": [], **extra})


def bindings(store: MemoryStore, shared: bool = False) -> Bindings:
    return Bindings(store, "crew", "tooler", ENV, 10.0, shared=shared)


async def test_without_a_binding_the_environment_applies() -> None:
    resolved = bindings(MemoryStore()).resolve("mulling")
    assert resolved.source == "env" and resolved.revision is None
    assert resolved.models == ENV and resolved.tolerance == 10.0


async def test_the_agents_binding_applies_to_the_next_call_when_it_changes() -> None:
    store = MemoryStore()
    chooser = bindings(store)
    await store.put(BINDINGS, "crew=2Ftooler", agent_binding())
    assert [c.model for c in chooser.for_call("mulling", None) or ()] == \
        ["qwen3:14b", "qwen3:8b"]
    assert chooser.for_call("triage", None) == (Candidate("qwen3:8b"),)
    assert chooser.resolve("mulling").label() == "agent@1"
    await store.put(BINDINGS, "crew=2Ftooler", agent_binding(
        2, candidates={"mulling": [{"model": "qwen3:8b", "score": 50},
                                   {"model": "qwen3:14b", "score": 100}]}, tolerance=0))
    assert [c.model for c in chooser.for_call("mulling", None) or ()] == \
        ["qwen3:8b", "qwen3:14b"]
    assert chooser.resolve("mulling").label() == "agent@2"
    assert chooser.tolerance("mulling") == 0.0
    # a call naming a model still runs that model first; the deployed one follows the binding
    assert (chooser.for_call("mulling", "qwen3:14b") or ())[0].model == "qwen3:14b"
    assert (chooser.for_call("mulling", "qwen3:32b") or ())[0].model == "qwen3:8b"
    assert (chooser.for_call("triage", "phi3:mini") or ())[0].model == "qwen3:8b"


async def test_an_empty_phase_falls_back_to_the_environment_and_says_why() -> None:
    store = MemoryStore()
    await store.put(BINDINGS, "crew=2Ftooler", agent_binding(
        phases={"mulling": None}, candidates={"mulling": []},
        unschedulable=[{"phase": "mulling", "reason": "no Model matches require selectors"}]))
    resolved = bindings(store).resolve("mulling")
    assert resolved.source == "env" and resolved.models == ENV
    assert resolved.unschedulable == "no Model matches require selectors"


async def test_a_discussion_binding_overrides_for_its_thread_and_phase_only() -> None:
    store = MemoryStore()
    chooser = bindings(store)
    await store.put(BINDINGS, "crew=2Ftooler", agent_binding())
    await store.put(BINDINGS, "thread.t=2E1.mulling", orjson.dumps({
        "thread": "t.1", "phase": "mulling", "generation": 4, "agents": {
            "crew/tooler": {"model": "qwen3:8b", "provider": "gpu-b", "tolerance": 0,
                            "candidates": [{"model": "qwen3:8b", "score": 50}]},
            "crew/other": {"model": "qwen3:32b", "candidates": [{"model": "qwen3:32b"}]}}}))
    assert chooser.for_call("mulling", None, "t.1") == (Candidate("qwen3:8b", 50.0),)
    assert chooser.resolve("mulling", "t.1").label() == "thread@4"
    assert chooser.tolerance("mulling", "t.1") == 0.0
    assert chooser.resolve("mulling", "t.2").label() == "agent@1"
    assert chooser.resolve("triage", "t.1").label() == "agent@1"


async def test_a_thread_asks_once_and_only_with_shared_state() -> None:
    store = MemoryStore()
    bindings(store).for_call("mulling", None, "t.1")
    await asyncio.sleep(0)
    assert not store.view(BINDINGS)  # embedded: no binder to ask
    shared = bindings(store, shared=True)
    await store.put(BINDINGS, "crew=2Ftooler", agent_binding())  # a binder binds the agent
    shared.for_call("mulling", None, "t.1", ask=False)  # explain only looks
    await asyncio.sleep(0.01)
    assert set(store.view(BINDINGS)) == {"crew=2Ftooler"}
    for _ in range(3):
        shared.for_call("mulling", None, "t.1")
    await asyncio.sleep(0.01)
    [key] = set(store.view(BINDINGS)) - {"crew=2Ftooler"}
    assert key == "ask.t=2E1.mulling.crew=2Ftooler"
    ask = orjson.loads(store.view(BINDINGS)[key].value)
    assert (ask["thread"], ask["phase"], ask["namespace"], ask["agent"]) == \
        ("t.1", "mulling", "crew", "tooler")
    assert store.view(BINDINGS)[key].revision == 2  # written once (after the agent's binding)


async def test_threads_of_an_agent_no_binder_binds_leave_no_ask_behind() -> None:
    """The bindings bucket has no max age: an ask no binder answers (none runs, or its
    documents do not declare the agent) would stay for good, one per thread ever called."""
    store = MemoryStore()
    shared = bindings(store, shared=True)
    for i in range(300):
        shared.for_call("mulling", None, f"thread-{i}")
    await asyncio.sleep(0.01)
    assert not store.view(BINDINGS)
    await store.put(BINDINGS, "crew=2Ftooler", agent_binding())  # now a binder binds it
    shared.for_call("mulling", None, "thread-0")
    await asyncio.sleep(0.01)
    assert set(store.view(BINDINGS)) == {"crew=2Ftooler", "ask.thread-0.mulling.crew=2Ftooler"}


async def test_bindings_the_binder_pruned_are_not_kept_decoded() -> None:
    store = MemoryStore()
    chooser = bindings(store)
    for i in range(DECODED_KEPT + 10):
        await store.put(BINDINGS, f"thread.t{i}.mulling", orjson.dumps({"agents": {}}))
        chooser.resolve("mulling", f"t{i}")
    for i in range(DECODED_KEPT + 10):
        await store.delete(BINDINGS, f"thread.t{i}.mulling")
    await store.put(BINDINGS, "thread.last.mulling", orjson.dumps({"agents": {}}))
    chooser.resolve("mulling", "last")
    assert len(chooser._decoded) <= 2  # "last" and the agent's key, not the pruned ones
