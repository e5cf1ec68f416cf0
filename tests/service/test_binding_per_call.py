"""A call's log line and attempt name the binding its candidates came from when it was
placed, even when the binding moves while it waits."""

from __future__ import annotations

import asyncio

import orjson

from proxy.ports import BINDINGS
from proxy.service.codec import escape_key
from tests.service.fakes import Answer
from tests.service.harness import Fleet


def binding(generation: int, model: str) -> bytes:
    return orjson.dumps({
        "namespace": "crew", "agent": "tooler", "generation": generation,
        "phases": {"mulling": {"model": model, "provider": "a"}},
        "candidates": {"mulling": [{"model": model, "score": 100}]},
        "tolerance": None, "unschedulable": []})


async def test_a_waiting_call_keeps_the_binding_it_was_placed_with(fleet: Fleet) -> None:
    a = fleet.gpu("a", total_vram_mib=24564)
    a.preload("qwen3:8b")
    sidecar = await fleet.sidecar(namespace="crew", agent_name="tooler")
    store = sidecar.services.store
    key = escape_key("crew/tooler")
    await store.put(BINDINGS, key, binding(1, "qwen3:8b"))
    a.script(Answer(seconds=3), Answer(seconds=1), Answer(seconds=1))
    busy = sidecar.start_chat(None)  # type: ignore[arg-type]
    await asyncio.sleep(0.1)
    waiting = sidecar.start_chat(None)  # type: ignore[arg-type]
    await asyncio.sleep(0.1)
    await store.put(BINDINGS, key, binding(2, "qwen3:8b"))
    later = sidecar.start_chat(None)  # type: ignore[arg-type]
    first, second, third = await asyncio.gather(busy, waiting, later)
    assert [r.status for r in (first, second, third)] == [200, 200, 200]
    assert first.last.binding == second.last.binding == "agent@1"
    assert third.last.binding == "agent@2"
