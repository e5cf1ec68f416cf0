"""Call lengths learned from the answers: a model's short calls make its queue short, whatever
else the card ran, and explain says where each figure comes from."""

from __future__ import annotations

import asyncio

from proxy.api.kubemoot import verdict_json
from tests.service.fakes import Answer
from tests.service.harness import Fleet, Sidecar


async def _long_14b_then_short_8b(fleet: Fleet) -> Sidecar:
    """Card "a" holds both models and has answered a 40 s 14b call, then a 1 s 8b call: its
    calls average 24 s, the 8b's own 1 s. Card "b" has room for a copy of the 8b."""
    a = fleet.gpu("a", total_vram_mib=32768)
    fleet.gpu("b", total_vram_mib=24564)
    a.preload("qwen3:14b", "qwen3:8b")
    sidecar = await fleet.sidecar()
    a.script(Answer(seconds=40), Answer(seconds=1))
    assert (await sidecar.chat("qwen3:14b")).provider == "a"
    assert (await sidecar.chat("qwen3:8b")).provider == "a"
    return sidecar


async def test_one_short_call_seen_makes_the_model_wait_for_a_slot_instead_of_loading_a_copy(
        fleet: Fleet) -> None:
    sidecar = await _long_14b_then_short_8b(fleet)
    fleet.servers["a"].script(Answer(seconds=1), Answer(seconds=1))
    working = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(0.2)
    r = await sidecar.chat("qwen3:8b")  # the one slot is taken for another 0.8 s or so
    # It waits in the sidecar for that slot and takes it once free
    assert (r.status, r.provider, r.placement) == (200, "a", "warm")
    assert 500 <= r.last.waited_ms <= 1000
    assert fleet.servers["b"].stats.loads == 0  # no second copy to dodge a 1 s queue
    assert (await working).status == 200


async def test_explain_shows_where_each_call_length_comes_from(fleet: Fleet) -> None:
    sidecar = await _long_14b_then_short_8b(fleet)
    explained = sidecar.services.scheduler.explain("mulling", "qwen3:8b", 100, None)
    assert explained is not None
    _, verdicts, _ = explained
    shown = {v.provider: verdict_json(v) for v in verdicts if v.model == "qwen3:8b"}
    assert (shown["a"]["callSeconds"], shown["a"]["callSource"]) == (1.0, "qwen3:8b on a")
    # Never run on "b": the 8b's calls on "a" (the cards share no model to scale by).
    assert (shown["b"]["callSeconds"], shown["b"]["callSource"]) == (1.0, "qwen3:8b on a")
    # A model never answered on a card that never answered: the default.
    explained = sidecar.services.scheduler.explain("mulling", "phi3:mini", 100, None)
    assert explained is not None
    b_phi = next(v for v in explained[1] if v.provider == "b" and v.model == "phi3:mini")
    assert verdict_json(b_phi)["callSource"] == "default"
