"""Live bindings gone wrong: bound to a model no provider has, malformed, or written often."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from proxy.ports import BINDINGS
from proxy.service.codec import escape_key
from tests.service.fakes import Answer
from tests.service.harness import Fleet


def binding(generation: int, model: str, score: object = 100, tolerance: object = None
            ) -> bytes:
    return orjson.dumps({
        "namespace": "crew", "agent": "tooler", "generation": generation,
        "phases": {"mulling": {"model": model, "provider": "a"}},
        "candidates": {"mulling": [{"model": model, "score": score}]},
        "tolerance": tolerance, "unschedulable": []})


async def bound(fleet: Fleet, written: bytes) -> Any:
    """A sidecar deployed with qwen3:8b, warm on its one card, and bound as `written` says."""
    a = fleet.gpu("a", total_vram_mib=24564)
    a.preload("qwen3:8b")
    sidecar = await fleet.sidecar(namespace="crew", agent_name="tooler",
                                  model_candidates_mulling='[{"model": "qwen3:8b", "score": 1}]')
    await sidecar.services.store.put(BINDINGS, escape_key("crew/tooler"), written)
    return sidecar


async def test_a_binding_to_a_model_no_provider_has(fleet: Fleet) -> None:
    sidecar = await bound(fleet, binding(1, "nosuch:1b"))
    r = await sidecar.chat(None)  # type: ignore[arg-type]
    named = await sidecar.chat("qwen3:8b")  # the deployed model's name: follows the binding
    for refused in (r, named):  # the 404 names the model that is missing, the bound one
        assert (refused.status, refused.error) == (404, "model 'nosuch:1b' not found")


async def test_a_malformed_binding_does_not_break_every_call(fleet: Fleet) -> None:
    sidecar = await bound(fleet, binding(1, "llama3.2:3b", score="high"))
    r = await sidecar.chat(None)  # type: ignore[arg-type]
    assert (r.status, r.last.model) == (200, "qwen3:8b")  # the environment's, not a 500


async def test_binding_writes_do_not_wake_waiting_calls(fleet: Fleet) -> None:
    a = fleet.gpu("a", total_vram_mib=24564)
    a.preload("qwen3:8b")
    sidecar = await fleet.sidecar(discuss_gpu_wait_limit_seconds=120)
    a.script(Answer(seconds=60), Answer(seconds=1))
    busy = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(0.5)
    waiting = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    before = sidecar.decisions()
    store = sidecar.services.store
    for i in range(50):  # other agents' discussions asking for their bindings
        await store.put(BINDINGS, f"ask.t{i}.mulling.crew%2Fother", b'{"thread": "x"}')
        await asyncio.sleep(0.05)
    woken = sidecar.decisions() - before
    assert woken <= 2, f"{woken} decisions for 50 writes to the bindings bucket"
    await busy
    await waiting
